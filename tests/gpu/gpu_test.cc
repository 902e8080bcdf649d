// The GPU tier: the committed Triton 3.6 test pack (kernels/testpack, see tools/README.md
// for each kernel's math) launched through kpack on a real device and checked against
// host references. Skipped when no CUDA driver loads, unless KPACK_REQUIRE_GPU=1, in
// which case a missing GPU is a failure.

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "driver/driver.h"
#include "gpu_env.h"
#include "gtest/gtest.h"
#include "kpack/kpack.h"

namespace kpack {
namespace {

using internal::Driver;

#define CU_ASSERT(expr)                                                     \
  do {                                                                      \
    CUresult r_ = (expr);                                                   \
    ASSERT_EQ(r_, CUDA_SUCCESS) << #expr << " -> " << static_cast<int>(r_); \
  } while (0)

#define KP_ASSERT_OK(expr)                       \
  do {                                           \
    absl::Status s_ = (expr);                    \
    ASSERT_TRUE(s_.ok()) << #expr << ": " << s_; \
  } while (0)

uint32_t Cdiv(uint32_t a, uint32_t b) { return (a + b - 1) / b; }

class GpuTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto d = Driver::Load("");
    if (!d.ok()) {
      load_status_ = new absl::Status(d.status());
      return;
    }
    driver_ = new std::shared_ptr<const Driver>(*d);
    CUdevice dev;
    (*driver_)->DeviceGet(&dev, 0);
    (*driver_)->DevicePrimaryCtxRetain(&ctx_, dev);
  }

  void SetUp() override {
    if (driver_ == nullptr) KPACK_SKIP_WITHOUT_GPU(*load_status_);
    CU_ASSERT(d().CtxSetCurrent(ctx_));
    auto rt = Runtime::Open(KPACK_TEST_PACK_DIR);
    ASSERT_TRUE(rt.ok()) << rt.status();
    rt_ = std::make_unique<Runtime>(std::move(*rt));
    // A blocking stream: it orders after the synchronous copies and memsets of the
    // legacy default stream that fill its inputs.
    CU_ASSERT(d().StreamCreate(&stream_, CU_STREAM_DEFAULT));
  }

  void TearDown() override {
    if (driver_ == nullptr) return;
    for (CUdeviceptr p : allocations_) d().MemFree(p);
    if (stream_ != nullptr) d().StreamDestroy(stream_);
    rt_.reset();
  }

  const Driver& d() { return **driver_; }

  // Device copy of `host`, freed at TearDown.
  template <typename T>
  CUdeviceptr Upload(const std::vector<T>& host) {
    CUdeviceptr p = Alloc(host.size() * sizeof(T));
    EXPECT_EQ(d().MemcpyHtoD(p, host.data(), host.size() * sizeof(T)), CUDA_SUCCESS);
    return p;
  }
  // Device buffer filled with 0xff bytes (NaN for floats), so unwritten outputs show.
  CUdeviceptr Alloc(size_t bytes) {
    CUdeviceptr p = 0;
    EXPECT_EQ(d().MemAlloc(&p, bytes), CUDA_SUCCESS);
    EXPECT_EQ(d().MemsetD8(p, 0xff, bytes), CUDA_SUCCESS);
    allocations_.push_back(p);
    return p;
  }
  template <typename T>
  std::vector<T> Download(CUdeviceptr p, size_t n) {
    std::vector<T> host(n);
    EXPECT_EQ(d().StreamSynchronize(stream_), CUDA_SUCCESS);
    EXPECT_EQ(d().MemcpyDtoH(host.data(), p, n * sizeof(T)), CUDA_SUCCESS);
    return host;
  }

  static std::vector<float> RandomFloats(size_t n, uint32_t seed) {
    std::mt19937 gen(seed);
    std::uniform_real_distribution<float> dist(-4.0f, 4.0f);
    std::vector<float> v(n);
    for (float& x : v) x = dist(gen);
    return v;
  }

  static inline std::shared_ptr<const Driver>* driver_ = nullptr;
  static inline absl::Status* load_status_ = nullptr;
  static inline CUcontext ctx_ = nullptr;
  std::unique_ptr<Runtime> rt_;
  CUstream stream_ = nullptr;
  std::vector<CUdeviceptr> allocations_;
};

TEST_F(GpuTest, VectorAddEveryLaunchPath) {
  const uint32_t n = (1u << 20) + 17;  // a partial last block exercises the mask
  std::vector<float> x = RandomFloats(n, 1), y = RandomFloats(n, 2);
  CUdeviceptr dx = Upload(x), dy = Upload(y);
  std::vector<float> expect(n);
  for (uint32_t i = 0; i < n; ++i) expect[i] = x[i] + y[i];
  const Grid grid{Cdiv(n, 1024)};

  auto check = [&](CUdeviceptr out, const char* path) {
    std::vector<float> got = Download<float>(out, n);
    size_t bad = 0;
    for (uint32_t i = 0; i < n; ++i) bad += std::memcmp(&got[i], &expect[i], 4) != 0;
    EXPECT_EQ(bad, 0u) << path;
  };

  CUdeviceptr out1 = Alloc(n * 4);
  KP_ASSERT_OK(rt_->Launch("add", grid, stream_, dx, dy, out1, int32_t(n)));
  check(out1, "by name");

  auto add = rt_->Find("add");
  ASSERT_TRUE(add.ok()) << add.status();
  CUdeviceptr out2 = Alloc(n * 4);
  KP_ASSERT_OK(add->Launch(grid, stream_, reinterpret_cast<float*>(dx),
                           reinterpret_cast<const float*>(dy), reinterpret_cast<void*>(out2), n));
  check(out2, "by Kernel, typed pointers");

  CUdeviceptr out3 = Alloc(n * 4);
  std::vector<Arg> args = {Arg(dx), Arg(dy), Arg(out3), Arg(int64_t{n})};
  KP_ASSERT_OK(add->LaunchArgs(grid, stream_, args));
  check(out3, "dynamic span");

  CUdeviceptr out4 = Alloc(n * 4);
  auto bound = add->BindArgs(grid, stream_, dx, dy, CUdeviceptr{0}, n);
  ASSERT_TRUE(bound.ok()) << bound.status();
  KP_ASSERT_OK(bound->Set(2, out4));
  KP_ASSERT_OK(bound->Launch());
  check(out4, "BoundLaunch");

  // A zero-program grid launches nothing and succeeds.
  KP_ASSERT_OK(add->Launch(Grid{0}, stream_, dx, dy, out4, n));
}

TEST_F(GpuTest, ScalarWidths) {
  const uint32_t n = 5000;
  std::vector<float> x = RandomFloats(n, 3);
  CUdeviceptr dx = Upload(x);
  const double alpha = 1.1;      // a double for an fp32 parameter
  const float beta = 0.375f;     // exact in bf16
  const float gamma = -0.8125f;  // exact in fp16
  const int64_t big = (int64_t{1} << 40) + 12345;
  for (bool flag : {true, false}) {
    CUdeviceptr out = Alloc(n * 4);
    KP_ASSERT_OK(rt_->Launch("scalars", Grid{Cdiv(n, 256)}, stream_, dx, out, n, alpha, beta, gamma,
                             flag, big));
    std::vector<float> got = Download<float>(out, n);
    const float e = flag ? 12345.0f : -1.0f;
    size_t bad = 0;
    for (uint32_t i = 0; i < n; ++i) {
      volatile float t = x[i] * static_cast<float>(alpha);
      t = t + beta;
      t = t + gamma;
      t = t + e;
      bad += got[i] != t;
    }
    EXPECT_EQ(bad, 0u) << "flag=" << flag << " first: got " << got[0];
  }
}

// Small integers make the fp16 product exact, so the check is bit-exact.
TEST_F(GpuTest, MatmulWithMoreThan48KiBShared) {
  const int M = 200, N = 136, K = 256;
  std::mt19937 gen(4);
  std::uniform_int_distribution<int> dist(-2, 2);
  std::vector<float> a(M * K), b(K * N);
  for (float& v : a) v = dist(gen);
  for (float& v : b) v = dist(gen);
  auto to_half = [](const std::vector<float>& f) {
    std::vector<uint16_t> h(f.size());
    for (size_t i = 0; i < f.size(); ++i) {
      // Integers in [-2, 2] as fp16: sign, exponent and a one-bit mantissa.
      float v = f[i];
      uint16_t bits = 0;
      if (v != 0) {
        float m = std::fabs(v);
        int e = static_cast<int>(std::floor(std::log2(m)));
        bits = static_cast<uint16_t>(((e + 15) << 10) |
                                     static_cast<int>((m / std::ldexp(1.0f, e) - 1) * 1024));
        if (v < 0) bits |= 0x8000;
      }
      h[i] = bits;
    }
    return h;
  };
  CUdeviceptr da = Upload(to_half(a)), db = Upload(to_half(b)), dc = Alloc(M * N * 2);
  KP_ASSERT_OK(rt_->Launch("matmul", Grid{Cdiv(M, 128), Cdiv(N, 128)}, stream_, da, db, dc, M, N, K,
                           K, 1, N, 1, N, 1));
  std::vector<uint16_t> c = Download<uint16_t>(dc, M * N);
  size_t bad = 0;
  for (int m = 0; m < M; ++m) {
    for (int n = 0; n < N; ++n) {
      float ref = 0;
      for (int k = 0; k < K; ++k) ref += a[m * K + k] * b[k * N + n];
      // Decode the fp16 result (integers of magnitude <= 1024 are exact).
      uint16_t h = c[m * N + n];
      float got = 0;
      int e = (h >> 10) & 0x1f;
      if (e != 0) got = std::ldexp(1.0f + (h & 0x3ff) / 1024.0f, e - 15);
      if (h & 0x8000) got = -got;
      bad += got != ref;
    }
  }
  EXPECT_EQ(bad, 0u);
}

TEST_F(GpuTest, ClusterOfTwoCtas) {
  const uint32_t n = 1000003;
  std::vector<float> x = RandomFloats(n, 5);
  CUdeviceptr dx = Upload(x), out = Alloc(n * 4);
  KP_ASSERT_OK(rt_->Launch("cluster", Grid{Cdiv(n, 1024)}, stream_, dx, out, n));
  std::vector<float> got = Download<float>(out, n);
  size_t bad = 0;
  for (uint32_t i = 0; i < n; ++i) {
    bad += got[i] != static_cast<float>(static_cast<double>(x[i]) * 3 + 1);
  }
  EXPECT_EQ(bad, 0u);
}

TEST_F(GpuTest, ProgrammaticDependentLaunchChain) {
  const uint32_t n = 1 << 22;
  std::vector<float> x = RandomFloats(n, 6);
  CUdeviceptr dx = Upload(x), mid = Alloc(n * 4), out = Alloc(n * 4);
  auto pdl = rt_->Find("pdl");
  ASSERT_TRUE(pdl.ok());
  for (int rep = 0; rep < 3; ++rep) {
    KP_ASSERT_OK(pdl->Launch(Grid{Cdiv(n, 1024)}, stream_, dx, mid, n));
    KP_ASSERT_OK(pdl->Launch(Grid{Cdiv(n, 1024)}, stream_, mid, out, n));
  }
  std::vector<float> got = Download<float>(out, n);
  size_t bad = 0;
  for (uint32_t i = 0; i < n; ++i) bad += got[i] != x[i] * 4;
  EXPECT_EQ(bad, 0u);
}

TEST_F(GpuTest, GlobalScratchFromPerStreamArena) {
  const int M = 100, N = 92, stride = 96;  // stride multiple of 4 (TMA pitch rule)
  std::vector<float> x = RandomFloats(M * stride, 7);
  CUdeviceptr dx = Upload(x), out = Alloc(M * stride * 4);
  KP_ASSERT_OK(
      rt_->Launch("scratch", Grid{Cdiv(M, 32), Cdiv(N, 32)}, stream_, dx, out, M, N, stride));
  std::vector<float> got = Download<float>(out, M * stride);
  size_t bad = 0;
  for (int m = 0; m < M; ++m) {
    for (int n = 0; n < N; ++n) bad += got[m * stride + n] != x[m * stride + n] * 2;
  }
  EXPECT_EQ(bad, 0u);
  Runtime::Stats stats = rt_->stats();
  EXPECT_EQ(stats.scratch_arenas, 1u);
  EXPECT_GE(stats.scratch_bytes, uint64_t{Cdiv(M, 32) * Cdiv(N, 32) * 128});

  // A larger grid on the same stream grows the same arena; a second launch reuses it.
  const int M2 = 300;
  std::vector<float> x2 = RandomFloats(M2 * stride, 8);
  CUdeviceptr dx2 = Upload(x2), out2 = Alloc(M2 * stride * 4);
  for (int rep = 0; rep < 2; ++rep) {
    KP_ASSERT_OK(
        rt_->Launch("scratch", Grid{Cdiv(M2, 32), Cdiv(N, 32)}, stream_, dx2, out2, M2, N, stride));
  }
  got = Download<float>(out2, M2 * stride);
  bad = 0;
  for (int m = 0; m < M2; ++m) {
    for (int n = 0; n < N; ++n) bad += got[m * stride + n] != x2[m * stride + n] * 2;
  }
  EXPECT_EQ(bad, 0u);
  EXPECT_EQ(rt_->stats().scratch_arenas, 1u);
}

TEST_F(GpuTest, LaunchDuringGraphCapture) {
  KP_ASSERT_OK(rt_->Preload());  // no loading allowed while capturing
  const uint32_t n = 4096 + 3;
  const int M = 64, N = 64;
  KP_ASSERT_OK(rt_->ReserveScratch(stream_, Cdiv(M, 32) * Cdiv(N, 32) * 128));
  std::vector<float> x = RandomFloats(n, 9), y = RandomFloats(n, 10);
  std::vector<float> t = RandomFloats(M * N, 11);
  CUdeviceptr dx = Upload(x), dy = Upload(y), out = Alloc(n * 4);
  CUdeviceptr dt = Upload(t), tout = Alloc(M * N * 4);
  ASSERT_EQ(d().StreamSynchronize(stream_), CUDA_SUCCESS);

  CU_ASSERT(d().StreamBeginCapture(stream_, CU_STREAM_CAPTURE_MODE_GLOBAL));
  absl::Status s1 = rt_->Launch("add", Grid{Cdiv(n, 1024)}, stream_, dx, dy, out, n);
  absl::Status s2 = rt_->Launch("scratch", Grid{2, 2}, stream_, dt, tout, M, N, N);
  CUgraph graph = nullptr;
  CU_ASSERT(d().StreamEndCapture(stream_, &graph));
  KP_ASSERT_OK(s1);
  KP_ASSERT_OK(s2);
  CUgraphExec exec = nullptr;
  CU_ASSERT(d().GraphInstantiateWithFlags(&exec, graph, 0));
  CU_ASSERT(d().GraphLaunch(exec, stream_));
  std::vector<float> got = Download<float>(out, n);
  std::vector<float> tgot = Download<float>(tout, M * N);
  size_t bad = 0;
  for (uint32_t i = 0; i < n; ++i) bad += got[i] != x[i] + y[i];
  for (int i = 0; i < M * N; ++i) bad += tgot[i] != t[i] * 2;
  EXPECT_EQ(bad, 0u);
  d().GraphExecDestroy(exec);
  d().GraphDestroy(graph);
}

TEST_F(GpuTest, EachVariantLoadsOnceAndChecksPass) {
  KP_ASSERT_OK(rt_->Preload());
  EXPECT_EQ(rt_->stats().libraries_loaded, rt_->kernel_names().size());
  KP_ASSERT_OK(rt_->Preload());  // idempotent
  EXPECT_EQ(rt_->stats().libraries_loaded, rt_->kernel_names().size());
}

TEST_F(GpuTest, Sm80AndSm100CubinsAreRefusedOnTheH200) {
  auto rt = Runtime::Open(KPACK_ARCH_PACK_DIR);
  ASSERT_TRUE(rt.ok()) << rt.status();
  CUdeviceptr out = Alloc(1024 * 4);
  for (const char* kernel : {"add_sm80", "add_sm100"}) {
    absl::Status s = rt->Launch(kernel, Grid{1}, stream_, out, out, out, 1024);
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    EXPECT_NE(std::string(s.message()).find(std::string("kernel '") + kernel + "'"),
              std::string::npos)
        << s;
  }
  std::vector<uint32_t> got = Download<uint32_t>(out, 1024);
  for (uint32_t v : got) ASSERT_EQ(v, 0xffffffffu) << "a refused launch wrote output";
  EXPECT_EQ(rt->stats().libraries_loaded, 0u);
}

TEST_F(GpuTest, WrongArgumentsNeverLaunch) {
  CUdeviceptr out = Alloc(1024 * 4);
  absl::Status s = rt_->Launch("add", Grid{1}, stream_, out, out, out);  // n missing
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  s = rt_->Launch("add", Grid{1}, stream_, out, out, out, 1.0f);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(s.message()).find("'n'"), std::string::npos) << s;
  std::vector<uint32_t> got = Download<uint32_t>(out, 1024);
  for (uint32_t v : got) ASSERT_EQ(v, 0xffffffffu) << "a refused launch wrote output";
}

}  // namespace
}  // namespace kpack
