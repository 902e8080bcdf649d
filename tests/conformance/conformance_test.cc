// The conformance suite's test bodies (see conformance.h): opening, launching on every
// path, scalars, dispatch, errors, scratch memory, contexts, capture and replay. Results
// are computed by the kernels (kernels/testpack, dispatchpack, scalarpack, archpack; their
// math is in tools/README.md) and checked against host references.

#include <atomic>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "conformance.h"
#include "gmock/gmock.h"

namespace kpack::conformance {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

std::string Msg(const absl::Status& s) { return std::string(s.message()); }

size_t CountMismatches(const std::vector<float>& got, const std::vector<float>& want) {
  size_t bad = 0;
  for (size_t i = 0; i < want.size(); ++i) bad += std::memcmp(&got[i], &want[i], 4) != 0;
  return bad;
}

// fp16 <-> float for the host references (exact for every half).
float HalfToFloat(uint16_t h) {
  const int e = (h >> 10) & 0x1f, m = h & 0x3ff;
  float v = e == 0 ? std::ldexp(static_cast<float>(m), -24)
                   : (e == 31 ? (m ? NAN : INFINITY) : std::ldexp(1024.0f + m, e - 25));
  return (h & 0x8000) ? -v : v;
}
uint16_t SmallIntToHalf(int v) {  // |v| <= 2048, exact
  if (v == 0) return 0;
  const int a = std::abs(v);
  const int e = std::bit_width(static_cast<unsigned>(a)) - 1;
  const int mantissa = (a << (10 - e)) & 0x3ff;
  return static_cast<uint16_t>((v < 0 ? 0x8000 : 0) | ((e + 15) << 10) | mantissa);
}

// ---- opening ---------------------------------------------------------------------------

TEST_P(ConformanceTest, OpensThePackAndDescribesItsKernels) {
  auto rt = Open(KPACK_TEST_PACK_DIR);
  ASSERT_NE(rt, nullptr);
  EXPECT_THAT(rt->kernel_names(), ::testing::ElementsAre("add", "scalars", "matmul", "cluster",
                                                         "pdl", "scratch", "softmax"));
  EXPECT_EQ(rt->stats().libraries_loaded, 0u) << "Open loads nothing into the driver";
  auto add = rt->Find("add");
  ASSERT_TRUE(add.ok());
  EXPECT_EQ(add->num_args(), 4u);
  EXPECT_EQ(add->arg_name(3), "n");
  EXPECT_EQ(add->arg_type(0), "*fp32");
  EXPECT_EQ(*add->ArgIndex("out_ptr"), 2u);
  EXPECT_EQ(add->ArgIndex("BLOCK").status().code(), absl::StatusCode::kNotFound);
  auto missing = rt->Find("sub");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Msg(missing.status()), AllOf(HasSubstr("'sub'"), HasSubstr("testpack")));
}

TEST_P(ConformanceTest, EachVariantLoadsOncePerContext) {
  auto rt = Open(KPACK_TEST_PACK_DIR);
  const uint32_t n = 100;
  CUdeviceptr x = Upload(RandomFloats(n, 1)), out = Alloc(n * 4);
  for (int i = 0; i < 3; ++i) {
    KP_ASSERT_OK(Run(*rt, [&](CUstream s) { return rt->Launch("add", Grid{1}, s, x, x, out, n); }));
  }
  // Eagerly the first launch loads its variant; a capture needs Preload, which loads all.
  EXPECT_EQ(rt->stats().libraries_loaded, capture() ? 7u : 1u);
  KP_ASSERT_OK(rt->Preload());
  KP_ASSERT_OK(rt->Preload());
  EXPECT_EQ(rt->stats().libraries_loaded, 7u);
}

// ---- launching -------------------------------------------------------------------------

TEST_P(ConformanceTest, VectorAddOnEveryLaunchPath) {
  auto rt = Open(KPACK_TEST_PACK_DIR);
  const uint32_t n = (1u << 16) + 17;  // a partial last block exercises the mask
  std::vector<float> x = RandomFloats(n, 1), y = RandomFloats(n, 2), want(n);
  for (uint32_t i = 0; i < n; ++i) want[i] = x[i] + y[i];
  CUdeviceptr dx = Upload(x), dy = Upload(y);
  const Grid grid{Cdiv(n, 1024)};
  auto add = rt->Find("add");
  ASSERT_TRUE(add.ok());
  auto check = [&](CUdeviceptr out, const char* path) {
    EXPECT_EQ(CountMismatches(Download<float>(out, n), want), 0u) << path;
  };

  CUdeviceptr out1 = Alloc(n * 4);
  KP_ASSERT_OK(Run(*rt, [&](CUstream s) { return rt->Launch("add", grid, s, dx, dy, out1, n); }));
  check(out1, "by name");

  CUdeviceptr out2 = Alloc(n * 4);
  KP_ASSERT_OK(Run(*rt, [&](CUstream s) {
    return add->Launch(grid, s, reinterpret_cast<float*>(dx), reinterpret_cast<const float*>(dy),
                       reinterpret_cast<void*>(out2), n);
  }));
  check(out2, "by Kernel, typed pointers");

  CUdeviceptr out3 = Alloc(n * 4);
  std::vector<Arg> args = {Arg(dx), Arg(dy), Arg(out3), Arg(int64_t{n})};
  KP_ASSERT_OK(Run(*rt, [&](CUstream s) { return add->LaunchArgs(grid, s, args); }));
  check(out3, "LaunchArgs");

  CUdeviceptr out4 = Alloc(n * 4);
  auto bound = add->BindArgs(Grid{1}, main_.stream, dx, dy, CUdeviceptr{0}, n);
  ASSERT_TRUE(bound.ok()) << bound.status();
  KP_ASSERT_OK(bound->Set(2, out4));
  bound->set_grid(grid);
  KP_ASSERT_OK(Run(*rt, [&](CUstream s) {
    bound->set_stream(s);
    return bound->Launch();
  }));
  check(out4, "BoundLaunch");

  // A grid with no programs launches nothing.
  CUdeviceptr untouched = Alloc(n * 4);
  KP_ASSERT_OK(Run(*rt, [&](CUstream s) { return add->Launch(Grid{0}, s, dx, dy, untouched, n); }));
  KP_ASSERT_OK(Run(*rt, [&](CUstream s) {
    return add->Launch(Grid{4, 0, 1}, s, dx, dy, untouched, n);
  }));
  for (uint32_t v : Download<uint32_t>(untouched, n)) ASSERT_EQ(v, 0xffffffffu);
}

TEST_P(ConformanceTest, ScalarsArePackedAsTritonPacksAPythonFloat) {
  auto rt = Open(KPACK_TEST_PACK_DIR);
  const uint32_t n = 5000;
  std::vector<float> x = RandomFloats(n, 3);
  CUdeviceptr dx = Upload(x);
  const double alpha = 1.1;  // a double for an fp32 parameter: a 4-byte float
  // bf16 0.1: Triton truncates the float (0x3dcc = 0.099609375); rounding gives 0x3dcd.
  const double beta = 0.1;
  const float beta_bf16 = std::bit_cast<float>(uint32_t{0x3dcc} << 16);
  // fp16 rounded once from the double: 0x3c01. Through float it would be 0x3c00 (1.0).
  const double gamma = 1.0 + std::ldexp(1.0, -11) + std::ldexp(1.0, -40);
  const float gamma_fp16 = HalfToFloat(0x3c01);
  const int64_t big = (int64_t{1} << 40) + 12345;
  for (bool flag : {true, false}) {
    CUdeviceptr out = Alloc(n * 4);
    KP_ASSERT_OK(Run(*rt, [&](CUstream s) {
      return rt->Launch("scalars", Grid{Cdiv(n, 256)}, s, dx, out, n, alpha, beta, gamma, flag,
                        big);
    }));
    std::vector<float> want(n);
    for (uint32_t i = 0; i < n; ++i) {
      volatile float t = x[i] * static_cast<float>(alpha);
      t = t + beta_bf16;
      t = t + gamma_fp16;
      t = t + (flag ? 12345.0f : -1.0f);
      want[i] = t;
    }
    EXPECT_EQ(CountMismatches(Download<float>(out, n), want), 0u) << "flag=" << flag;
  }
}

// The scalar pack's fill kernel stores each scalar's bits unconverted.
TEST_P(ConformanceTest, FloatScalarBitsReachTheKernelExactly) {
  auto rt = Open(KPACK_SCALAR_PACK_DIR);
  const uint32_t n = 128;
  struct Case {
    Arg h, b;
    double f, d;
    uint16_t want_h, want_b;
  } cases[] = {
      {Arg(1.0 + std::ldexp(1.0, -11) + std::ldexp(1.0, -40)), Arg(0.1), 0.1, 0.1, 0x3c01, 0x3dcc},
      {Arg(2049.0000001), Arg(1.0 / 3), 1.0 / 3, 1.0 / 3, 0x6801, 0x3eaa},
      {Arg(0.1f), Arg(3.14159f), 3.14159, 3.14159, 0x2e66, 0x4049},
      {Arg(65519.99), Arg(1e39), 65519.99, -2.5e-3, 0x7bff, 0x7f80},
      {Arg(std::ldexp(1.0, -25)), Arg(-0.0), 1e-30, -1e-300, 0x0000, 0x8000},
      {Arg(Half{0x1234}), Arg(BFloat16{0xabcd}), 1.0, 1.0, 0x1234, 0xabcd},
  };
  for (const Case& c : cases) {
    CUdeviceptr h = Alloc(n * 2), b = Alloc(n * 2), f = Alloc(n * 4), d = Alloc(n * 8);
    const Arg args[] = {Arg(h), Arg(b), Arg(f), Arg(d), Arg(n), c.h, c.b, Arg(c.f), Arg(c.d)};
    KP_ASSERT_OK(Run(*rt, [&](CUstream s) { return rt->LaunchArgs("fill", Grid{1}, s, args); }));
    const uint32_t want_f = std::bit_cast<uint32_t>(static_cast<float>(c.f));
    const uint64_t want_d = std::bit_cast<uint64_t>(c.d);
    SCOPED_TRACE(::testing::Message() << "case " << (&c - cases));
    EXPECT_EQ(Download<uint16_t>(h, n)[n - 1], c.want_h);
    EXPECT_EQ(Download<uint16_t>(b, n)[n - 1], c.want_b);
    EXPECT_EQ(Download<uint32_t>(f, n)[0], want_f);
    EXPECT_EQ(Download<uint64_t>(d, n)[0], want_d);
  }
  // Beyond fp16's range Triton raises OverflowError; kpack refuses and launches nothing.
  CUdeviceptr h = Alloc(n * 2);
  absl::Status s = Run(*rt, [&](CUstream st) {
    return rt->Launch("fill", Grid{1}, st, h, h, h, h, n, 65520.0, 1.0, 1.0, 1.0);
  });
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(s), AllOf(HasSubstr("('h')"), HasSubstr("65520")));
  EXPECT_EQ(Download<uint16_t>(h, n)[0], 0xffff) << "nothing was launched";
}

// Small integers make the fp16 product exact, so the check is bit-exact.
TEST_P(ConformanceTest, MatmulWithMoreThan48KiBOfSharedMemory) {
  auto rt = Open(KPACK_TEST_PACK_DIR);
  const int M = 200, N = 136, K = 256;
  std::mt19937 gen(4);
  std::uniform_int_distribution<int> dist(-2, 2);
  std::vector<int> a(M * K), b(K * N);
  for (int& v : a) v = dist(gen);
  for (int& v : b) v = dist(gen);
  std::vector<uint16_t> ha(a.size()), hb(b.size());
  for (size_t i = 0; i < a.size(); ++i) ha[i] = SmallIntToHalf(a[i]);
  for (size_t i = 0; i < b.size(); ++i) hb[i] = SmallIntToHalf(b[i]);
  CUdeviceptr da = Upload(ha), db = Upload(hb), dc = Alloc(M * N * 2);
  KP_ASSERT_OK(Run(*rt, [&](CUstream s) {
    return rt->Launch("matmul", Grid{Cdiv(M, 128), Cdiv(N, 128)}, s, da, db, dc, M, N, K, K, 1,
                      N, 1, N, 1);
  }));
  std::vector<uint16_t> c = Download<uint16_t>(dc, M * N);
  size_t bad = 0;
  for (int m = 0; m < M; ++m) {
    for (int j = 0; j < N; ++j) {
      int ref = 0;
      for (int k = 0; k < K; ++k) ref += a[m * K + k] * b[k * N + j];
      bad += HalfToFloat(c[m * N + j]) != static_cast<float>(ref);
    }
  }
  EXPECT_EQ(bad, 0u);
}

TEST_P(ConformanceTest, ClusterOfTwoCtasPerProgram) {
  auto rt = Open(KPACK_TEST_PACK_DIR);
  const uint32_t n = 100003;
  std::vector<float> x = RandomFloats(n, 5), want(n);
  for (uint32_t i = 0; i < n; ++i) want[i] = static_cast<float>(static_cast<double>(x[i]) * 3 + 1);
  CUdeviceptr dx = Upload(x), out = Alloc(n * 4);
  KP_ASSERT_OK(
      Run(*rt, [&](CUstream s) { return rt->Launch("cluster", Grid{Cdiv(n, 1024)}, s, dx, out, n); }));
  EXPECT_EQ(CountMismatches(Download<float>(out, n), want), 0u);
}

TEST_P(ConformanceTest, ProgrammaticDependentLaunchChain) {
  auto rt = Open(KPACK_TEST_PACK_DIR);
  const uint32_t n = 1 << 18;
  std::vector<float> x = RandomFloats(n, 6), want(n);
  for (uint32_t i = 0; i < n; ++i) want[i] = x[i] * 4;
  CUdeviceptr dx = Upload(x), mid = Alloc(n * 4), out = Alloc(n * 4);
  auto pdl = rt->Find("pdl");
  ASSERT_TRUE(pdl.ok());
  KP_ASSERT_OK(Run(*rt, [&](CUstream s) {
    for (int rep = 0; rep < 3; ++rep) {
      if (auto st = pdl->Launch(Grid{Cdiv(n, 1024)}, s, dx, mid, n); !st.ok()) return st;
      if (auto st = pdl->Launch(Grid{Cdiv(n, 1024)}, s, mid, out, n); !st.ok()) return st;
    }
    return absl::OkStatus();
  }));
  EXPECT_EQ(CountMismatches(Download<float>(out, n), want), 0u);
}

TEST_P(ConformanceTest, SoftmaxRowsOnACallerChosenGrid) {
  auto rt = Open(KPACK_TEST_PACK_DIR);
  const int rows = 37, cols = 1000, stride = 1024;
  std::vector<float> x = RandomFloats(rows * stride, 7, -8, 8);
  CUdeviceptr dx = Upload(x), out = Alloc(rows * stride * 4);
  KP_ASSERT_OK(Run(*rt, [&](CUstream s) {
    return rt->Launch("softmax", Grid{rows}, s, out, dx, stride, stride, cols);
  }));
  std::vector<float> got = Download<float>(out, rows * stride);
  double worst = 0;
  for (int r = 0; r < rows; ++r) {
    double m = -INFINITY, sum = 0;
    for (int c = 0; c < cols; ++c) m = std::max<double>(m, x[r * stride + c]);
    for (int c = 0; c < cols; ++c) sum += std::exp(x[r * stride + c] - m);
    for (int c = 0; c < cols; ++c) {
      const double want = std::exp(x[r * stride + c] - m) / sum;
      worst = std::max(worst, std::fabs(got[r * stride + c] - want) / want);
    }
    EXPECT_EQ(std::bit_cast<uint32_t>(got[r * stride + cols]), 0xffffffffu) << "past n_cols";
  }
  EXPECT_LT(worst, 1e-5) << "worst relative error against float64";
}

// ---- dispatch --------------------------------------------------------------------------

TEST_P(ConformanceTest, DispatchPicksTheVariantTritonWouldInEveryBucket) {
  auto rt = Open(KPACK_DISPATCH_PACK_DIR);
  Kernel axpy = *rt->Find("axpy");
  auto launches = [&](std::string_view variant) -> uint64_t {
    for (const auto& s : axpy.variant_stats()) {
      if (s.variant == variant) return s.launches;
    }
    return 0;
  };
  struct Case {
    int64_t n;
    int stride;
    int misalign;  // floats to offset x, y and out by
    const char* variant;
  } cases[] = {
      {1000, 1, 0, "b0_generic"},       {4096, 1, 0, "b0_div16_unit"},
      {4096, 3, 0, "b0_div16"},         {4096, 1, 1, "b0_generic"},
      {4112, 1, 0, "b1_div16_unit"},    {100000, 2, 0, "b1_div16"},
      {99999, 1, 0, "b1_generic"},      {262144, 1, 3, "b1_generic"},
      {262160, 1, 0, "b2_div16_unit"},  {1 << 20, 5, 0, "b2_div16"},
      {(1 << 20) + 1, 1, 0, "b2_generic"},
  };
  const float alpha = 1.7f;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.variant);
    const size_t xs = static_cast<size_t>(c.n) * c.stride + 4;
    std::vector<float> x = RandomFloats(xs, 11, -8, 8), y = RandomFloats(c.n + 4, 12, -8, 8);
    CUdeviceptr dx = Upload(x), dy = Upload(y), dout = Alloc((c.n + 4) * 4);
    const CUdeviceptr px = dx + 4 * c.misalign, py = dy + 4 * c.misalign,
                      pout = dout + 4 * c.misalign;
    const Arg args[] = {Arg(px), Arg(py), Arg(pout), Arg(c.n), Arg(c.stride), Arg(alpha)};
    auto chosen = axpy.SelectVariant(args);
    ASSERT_TRUE(chosen.ok()) << chosen.status();
    EXPECT_EQ(*chosen, c.variant);
    const uint64_t before = launches(c.variant);
    // The grid from the manifest's expression, cdiv(n, BLOCK) with the variant's BLOCK.
    KP_ASSERT_OK(Run(*rt, [&](CUstream s) { return axpy.LaunchArgs(s, args); }));
    EXPECT_EQ(launches(c.variant), before + 1);
    std::vector<float> out = Download<float>(pout, c.n), want(c.n);
    for (int64_t i = 0; i < c.n; ++i) {
      volatile float prod = alpha * x[c.misalign + i * c.stride];
      want[i] = prod + y[c.misalign + i];
    }
    EXPECT_EQ(CountMismatches(out, want), 0u);
  }
  uint64_t fallbacks = 0;
  for (const auto& s : axpy.variant_stats()) fallbacks += s.fallback_launches;
  // Five generic launches plus three strided div16 ones had a more specialized variant
  // in their bucket whose assumptions failed.
  EXPECT_EQ(fallbacks, 8u);

  // A BoundLaunch without a grid evaluates the expression at each launch, and a Set that
  // moves n to another bucket selects that bucket's variant.
  std::vector<float> x = RandomFloats(8192, 13), y = RandomFloats(8192, 14);
  CUdeviceptr dx = Upload(x), dy = Upload(y), out = Alloc(8192 * 4);
  auto bound = axpy.BindArgs(main_.stream, dx, dy, out, int64_t{1000}, 1, alpha);
  ASSERT_TRUE(bound.ok()) << bound.status();
  KP_ASSERT_OK(bound->Set(3, int64_t{8192}));
  KP_ASSERT_OK(Run(*rt, [&](CUstream s) {
    bound->set_stream(s);
    return bound->Launch();
  }));
  EXPECT_EQ(launches("b1_div16_unit"), 2u);
  std::vector<float> got = Download<float>(out, 8192), want(8192);
  for (int i = 0; i < 8192; ++i) {
    volatile float prod = alpha * x[i];
    want[i] = prod + y[i];
  }
  EXPECT_EQ(CountMismatches(got, want), 0u);
}

// ---- errors ----------------------------------------------------------------------------

TEST_P(ConformanceTest, WrongArgumentsAreErrorsAndNeverLaunch) {
  auto rt = Open(KPACK_TEST_PACK_DIR);
  CUdeviceptr out = Alloc(1024 * 4);
  absl::Status s = Run(*rt, [&](CUstream st) { return rt->Launch("add", Grid{1}, st, out, out, out); });
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(s), AllOf(HasSubstr("kernel 'add' takes 4 arguments"), HasSubstr("n: i32"),
                            HasSubstr("got 3")));
  s = Run(*rt, [&](CUstream st) { return rt->Launch("add", Grid{1}, st, out, 3.0f, out, 1); });
  EXPECT_THAT(Msg(s), AllOf(HasSubstr("argument 1 ('y_ptr')"), HasSubstr("expects *fp32"),
                            HasSubstr("got a float")));
  s = Run(*rt, [&](CUstream st) {
    return rt->Launch("add", Grid{1}, st, out, out, out, int64_t{1} << 33);
  });
  EXPECT_THAT(Msg(s), AllOf(HasSubstr("'n'"), HasSubstr("does not fit")));
  s = Run(*rt, [&](CUstream st) {
    return rt->Launch("scalars", Grid{1}, st, out, out, 1, 1.0, 1.0, 1.0, 1, int64_t{0});
  });
  EXPECT_THAT(Msg(s), AllOf(HasSubstr("'flag'"), HasSubstr("expects i1")));
  s = Run(*rt, [&](CUstream st) { return rt->Launch("nope", Grid{1}, st); });
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  s = Run(*rt, [&](CUstream st) { return Kernel().Launch(Grid{1}, st); });
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  s = Run(*rt, [&](CUstream st) { return rt->Launch("cluster", Grid{1u << 30}, st, out, out, 1); });
  EXPECT_THAT(Msg(s), HasSubstr("2^31-1"));
  for (uint32_t v : Download<uint32_t>(out, 1024)) ASSERT_EQ(v, 0xffffffffu) << "wrote output";
}

TEST_P(ConformanceTest, CubinsForAnotherArchitectureAreRefused) {
  auto rt = Open(KPACK_ARCH_PACK_DIR);
  CUdeviceptr out = Alloc(1024 * 4);
  for (const char* kernel : {"add_sm80", "add_sm100"}) {
    absl::Status s = Run(*rt, [&](CUstream st) {
      return rt->Launch(kernel, Grid{1}, st, out, out, out, 1024);
    });
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    // Captured, the Preload before the capture fails first, on the pack's first kernel.
    EXPECT_THAT(Msg(s), HasSubstr(capture() ? "kernel 'add_sm80'" : std::string("kernel '") + kernel + "'"));
    EXPECT_THAT(Msg(s), HasSubstr("compute capability 9.0"));
  }
  for (uint32_t v : Download<uint32_t>(out, 1024)) ASSERT_EQ(v, 0xffffffffu) << "wrote output";
  EXPECT_EQ(rt->stats().libraries_loaded, 0u);
}

TEST_P(ConformanceTest, ALaunchWithoutACurrentContextIsAnError) {
  auto rt = Open(KPACK_TEST_PACK_DIR);
  absl::Status s;
  std::thread([&] {  // a new thread has no current context
    CUdeviceptr p = 0x1000;
    s = rt->Launch("add", Grid{1}, nullptr, p, p, p, 1);
  }).join();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(Msg(s), HasSubstr("no CUDA context is current"));
  std::thread([&] { s = rt->Preload(); }).join();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
}

// ---- scratch memory --------------------------------------------------------------------

// out = x * 2 through the scratch kernel (a TMA descriptor in global scratch).
struct ScratchJob {
  int M, N, stride;
  std::vector<float> x;
  CUdeviceptr dx = 0, out = 0;
  Grid grid() const { return Grid{Cdiv(M, 32), Cdiv(N, 32)}; }
  uint64_t bytes() const { return uint64_t{grid().x} * grid().y * 128; }
};

class ScratchTest : public ConformanceTest {
 protected:
  ScratchJob Job(int M, int N, uint32_t seed) {
    ScratchJob job{M, N, (N + 3) / 4 * 4, {}};  // stride: a multiple of 4 (TMA)
    job.x = RandomFloats(size_t(M) * job.stride, seed);
    job.dx = Upload(job.x);
    job.out = Alloc(size_t(M) * job.stride * 4);
    return job;
  }
  static absl::Status Launch(Kernel k, const ScratchJob& j, CUstream s) {
    return k.Launch(j.grid(), s, j.dx, j.out, j.M, j.N, j.stride);
  }
  // Waits (up to 2 s) until no destroyed graph holds scratch any more: the real driver
  // runs a user object's destructor on its own thread, shortly after the graph, its
  // executables and their work are gone, so the arena returns to the pool asynchronously.
  static void AwaitGraphScratchReturned(const Runtime& rt) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    while (rt.stats().scratch_in_graphs != 0 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    EXPECT_EQ(rt.stats().scratch_in_graphs, 0u) << "a destroyed graph kept its scratch";
  }
  // Run, then (captured) wait until the destroyed graph's scratch is back in the pool.
  absl::Status RunSettled(Runtime& rt, const std::function<absl::Status(CUstream)>& launch) {
    absl::Status s = Run(rt, launch);
    if (capture()) AwaitGraphScratchReturned(rt);
    return s;
  }
  size_t Mismatches(const ScratchJob& j) {
    std::vector<float> got = Download<float>(j.out, size_t(j.M) * j.stride);
    size_t bad = 0;
    for (int m = 0; m < j.M; ++m) {
      for (int n = 0; n < j.N; ++n) {
        bad += got[m * j.stride + n] != j.x[m * j.stride + n] * 2;
      }
    }
    return bad;
  }
};

TEST_P(ScratchTest, GlobalScratchComesFromTheStreamOrTheGraph) {
  auto rt = Open(KPACK_TEST_PACK_DIR);
  Kernel scratch = *rt->Find("scratch");
  ScratchJob small = Job(100, 92, 7), large = Job(300, 92, 8);
  KP_ASSERT_OK(RunSettled(*rt, [&](CUstream s) { return Launch(scratch, small, s); }));
  EXPECT_EQ(Mismatches(small), 0u);
  for (int rep = 0; rep < 2; ++rep) {  // a larger grid: the arena grows, then is reused
    KP_ASSERT_OK(RunSettled(*rt, [&](CUstream s) { return Launch(scratch, large, s); }));
  }
  EXPECT_EQ(Mismatches(large), 0u);
  Runtime::Stats stats = rt->stats();
  if (capture()) {
    // Scratch belonged to each graph, which gave it back when destroyed; the stream the
    // captures were made on has its own arena (ReserveScratch), never used by them.
    EXPECT_EQ(stats.scratch_in_graphs, 0u);
    EXPECT_EQ(stats.scratch_idle + stats.scratch_reserved, 1u);
    EXPECT_EQ(stats.scratch_arenas, 1u);
  } else {
    EXPECT_EQ(stats.scratch_arenas, 1u) << "one stream, one arena";
    EXPECT_GE(stats.scratch_bytes, large.bytes());
    EXPECT_EQ(stats.scratch_in_graphs + stats.scratch_idle + stats.scratch_reserved, 0u);
  }
}

TEST_P(ScratchTest, ReservedScratchMeansLaunchesAllocateNothing) {
  auto rt = Open(KPACK_TEST_PACK_DIR);
  Kernel scratch = *rt->Find("scratch");
  ScratchJob job = Job(256, 256, 9);
  KP_ASSERT_OK(rt->ReserveScratch(main_.stream, job.bytes()));
  KP_ASSERT_OK(rt->ReserveScratch(main_.capture, kCaptureScratch));
  const size_t bytes = rt->stats().scratch_bytes;
  for (int i = 0; i < 3; ++i) {
    KP_ASSERT_OK(RunSettled(*rt, [&](CUstream s) { return Launch(scratch, job, s); }));
  }
  EXPECT_EQ(Mismatches(job), 0u);
  EXPECT_EQ(rt->stats().scratch_bytes, bytes) << "nothing allocated by the launches";
}

// CU_STREAM_PER_THREAD is one handle but a different stream on every thread: each
// thread's launches must get their own scratch.
TEST_P(ScratchTest, EachThreadsPerThreadStreamHasItsOwnScratch) {
  auto rt = Open(KPACK_TEST_PACK_DIR);
  Kernel scratch = *rt->Find("scratch");
  constexpr int kThreads = 4, kLaunches = 20;
  std::vector<ScratchJob> jobs;
  std::vector<Streams> streams;
  for (int t = 0; t < kThreads; ++t) {
    jobs.push_back(Job(64 + 32 * t, 96, 20 + t));
    streams.push_back(NewStreams());
  }
  std::vector<absl::Status> status(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      if (d().CtxSetCurrent(primary_) != CUDA_SUCCESS) {
        status[t] = absl::InternalError("cuCtxSetCurrent");
        return;
      }
      Streams mine = streams[t];
      mine.stream = CU_STREAM_PER_THREAD;
      for (int i = 0; i < kLaunches && status[t].ok(); ++i) {
        status[t] = Run(*rt, mine, [&](CUstream s) { return Launch(scratch, jobs[t], s); });
      }
      if (d().StreamSynchronize(CU_STREAM_PER_THREAD) != CUDA_SUCCESS) {
        status[t] = absl::InternalError("the kernels faulted");
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) {
    EXPECT_TRUE(status[t].ok()) << "thread " << t << ": " << status[t];
    EXPECT_EQ(Mismatches(jobs[t]), 0u) << "thread " << t;
  }
  // Each thread's per-thread arena went when it exited; captures used their streams'.
  EXPECT_EQ(rt->stats().scratch_arenas, capture() ? size_t{kThreads} : 0u);
}

// A thread that exits while its last launch is still queued on the GPU (behind a host
// function that waits for the test): its per-thread arena is freed as it exits, but the
// launch must still find its scratch there when it runs (cuMemFree waits for it). A first
// launch, synchronized, makes the arena and loads the kernel before the host function is
// queued: on the real driver a module load or a legacy-stream copy behind the blocked
// per-thread stream would wait for the test, which waits for the thread.
TEST_P(ScratchTest, AnExitingThreadsScratchOutlivesItsLastLaunch) {
  auto rt = Open(KPACK_TEST_PACK_DIR);
  Kernel scratch = *rt->Find("scratch");
  ScratchJob warm = Job(128, 96, 39);
  ScratchJob job = Job(128, 96, 40);
  std::atomic<bool> open{false}, launched{false};
  absl::Status status;
  std::thread t([&] {
    if (d().CtxSetCurrent(primary_) != CUDA_SUCCESS) {
      status = absl::InternalError("cuCtxSetCurrent");
    } else if (status = Launch(scratch, warm, CU_STREAM_PER_THREAD); !status.ok()) {
    } else if (d().StreamSynchronize(CU_STREAM_PER_THREAD) != CUDA_SUCCESS) {
      status = absl::InternalError("cuStreamSynchronize");
    } else if (d().LaunchHostFunc(
                   CU_STREAM_PER_THREAD,
                   [](void* open) { static_cast<std::atomic<bool>*>(open)->wait(false); },
                   &open) != CUDA_SUCCESS) {
      status = absl::InternalError("cuLaunchHostFunc");
    } else {
      status = Launch(scratch, job, CU_STREAM_PER_THREAD);
    }
    launched = true;
    launched.notify_all();
  });
  launched.wait(false);
  open = true;  // the thread may be exiting already, waiting in cuMemFree
  open.notify_all();
  t.join();
  KP_ASSERT_OK(status);
  EXPECT_EQ(Mismatches(warm), 0u);
  EXPECT_EQ(Mismatches(job), 0u);
  EXPECT_EQ(rt->stats().scratch_arenas, 0u);
  EXPECT_EQ(rt->stats().scratch_bytes, 0u);
}

TEST_P(ScratchTest, ReleasedArenasAndDestroyedStreamsLeaveNoCap) {
  auto rt = Open(KPACK_TEST_PACK_DIR);
  Kernel scratch = *rt->Find("scratch");
  ScratchJob job = Job(32, 32, 30);
  // More streams than the 1024 slots the arena table once had, none kept: half are
  // released before being destroyed, half destroyed without (a new stream may get the
  // old handle; its arena must then not be the old one's).
  for (int i = 0; i < 1100; ++i) {
    Streams s = NewStreams();
    KP_ASSERT_OK(Run(*rt, s, [&](CUstream st) { return Launch(scratch, job, st); }));
    ASSERT_EQ(d().StreamSynchronize(s.stream), CUDA_SUCCESS);
    if (i % 2 == 0) KP_ASSERT_OK(rt->ReleaseScratch(s.stream));
    DestroyStreams(s);
  }
  EXPECT_EQ(Mismatches(job), 0u);
  if (!capture()) EXPECT_LE(rt->stats().scratch_arenas, 550u) << "the released ones are gone";
}

// A ScratchAllocator is asked for each launch's scratch, as Triton's allocator is:
// bytes = programs * num_ctas * global_scratch_size, align = global_scratch_align.
struct Pool {
  CUdeviceptr base = 0;
  size_t size = 0, used = 0;
  std::mutex mu;
  std::vector<std::pair<size_t, size_t>> calls;  // (bytes, align)
  static CUdeviceptr Allocate(size_t bytes, size_t align, CUstream, void* self) {
    Pool& p = *static_cast<Pool*>(self);
    std::lock_guard<std::mutex> lock(p.mu);
    p.calls.emplace_back(bytes, align);
    const size_t start = (p.used + align - 1) / align * align;
    if (start + bytes > p.size) return 0;
    p.used = start + bytes;
    return p.base + start;
  }
  ScratchAllocator allocator() { return {&Pool::Allocate, this}; }
};

TEST_P(ScratchTest, ScratchAllocatorPerLaunchPerBoundLaunchAndRuntimeWide) {
  Pool launch_pool, bound_pool, runtime_pool;
  for (Pool* p : {&launch_pool, &bound_pool, &runtime_pool}) {
    p->size = 1 << 20;
    p->base = Alloc(p->size);
  }
  Options o = options();
  o.scratch_allocator = runtime_pool.allocator();
  auto rt = Open(KPACK_TEST_PACK_DIR, o);
  Kernel scratch = *rt->Find("scratch");
  ScratchJob a = Job(100, 92, 40), b = Job(64, 64, 41), c = Job(50, 50, 42);
  const std::vector<Arg> args = {Arg(a.dx), Arg(a.out), Arg(a.M), Arg(a.N), Arg(a.stride)};
  KP_ASSERT_OK(Run(*rt, [&](CUstream s) {
    return scratch.LaunchArgs(a.grid(), s, args, launch_pool.allocator());
  }));
  auto bound = scratch.BindArgs(b.grid(), main_.stream, b.dx, b.out, b.M, b.N, b.stride);
  ASSERT_TRUE(bound.ok());
  bound->set_scratch_allocator(bound_pool.allocator());
  KP_ASSERT_OK(Run(*rt, [&](CUstream s) {
    bound->set_stream(s);
    return bound->Launch();
  }));
  KP_ASSERT_OK(Run(*rt, [&](CUstream s) { return Launch(scratch, c, s); }));
  EXPECT_EQ(Mismatches(a), 0u);
  EXPECT_EQ(Mismatches(b), 0u);
  EXPECT_EQ(Mismatches(c), 0u);
  using Call = std::pair<size_t, size_t>;
  EXPECT_THAT(launch_pool.calls, ::testing::ElementsAre(Call{a.bytes(), 128}));
  EXPECT_THAT(bound_pool.calls, ::testing::ElementsAre(Call{b.bytes(), 128}));
  EXPECT_THAT(runtime_pool.calls, ::testing::ElementsAre(Call{c.bytes(), 128}));
  EXPECT_EQ(rt->stats().scratch_arenas, capture() ? 1u : 0u)
      << "kpack's arenas only for what ReserveScratch asked";

  // An allocator that has nothing left fails the launch, which launches nothing.
  launch_pool.used = launch_pool.size;
  absl::Status s = Run(*rt, [&](CUstream st) {
    return scratch.LaunchArgs(a.grid(), st, args, launch_pool.allocator());
  });
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_THAT(Msg(s), AllOf(HasSubstr("kernel 'scratch'"), HasSubstr("ScratchAllocator")));
}

// BoundLaunch::Prepare hands out exactly what Launch would send; sent through the raw
// driver it computes the same.
TEST_P(ConformanceTest, APreparedLaunchIsWhatLaunchWouldSend) {
  auto rt = Open(KPACK_TEST_PACK_DIR);
  Kernel cluster = *rt->Find("cluster");
  const uint32_t n = 5000;
  std::vector<float> x = RandomFloats(n, 50), want(n);
  for (uint32_t i = 0; i < n; ++i) want[i] = static_cast<float>(static_cast<double>(x[i]) * 3 + 1);
  CUdeviceptr dx = Upload(x), out = Alloc(n * 4);
  auto bound = cluster.BindArgs(Grid{Cdiv(n, 1024)}, main_.stream, dx, out, n);
  ASSERT_TRUE(bound.ok());
  KP_ASSERT_OK(Run(*rt, [&](CUstream s) -> absl::Status {
    bound->set_stream(s);
    absl::StatusOr<PreparedLaunch> p = bound->Prepare();
    if (!p.ok()) return p.status();
    EXPECT_EQ(p->config.gridDimX, 2 * Cdiv(n, 1024)) << "x times num_ctas";
    EXPECT_EQ(p->config.blockDimX, 128u);
    EXPECT_EQ(p->config.hStream, s);
    EXPECT_EQ(p->config.numAttrs, 2u) << "cluster dimension and scheduling policy";
    EXPECT_EQ(p->param_bytes, 40u);
    CUdeviceptr x_param = 0;
    std::memcpy(&x_param, p->params, 8);
    EXPECT_EQ(x_param, dx);
    const CUresult r = d().LaunchKernelEx(&p->config, p->function, nullptr, p->extra);
    return r == CUDA_SUCCESS ? absl::OkStatus() : absl::InternalError("cuLaunchKernelEx");
  }));
  EXPECT_EQ(CountMismatches(Download<float>(out, n), want), 0u);
  uint64_t launches = 0;
  for (const auto& v : cluster.variant_stats()) launches += v.launches;
  EXPECT_EQ(launches, 0u) << "Prepare counts no launch";
  bound->set_grid(Grid{0});
  auto empty = bound->Prepare();
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(empty->function, nullptr) << "an empty grid: nothing to launch";
}

// ---- contexts --------------------------------------------------------------------------

// A second context (cuCtxCreate) gets its own CUfunctions: Preload there loads there,
// and launches in both contexts compute.
TEST_P(ConformanceTest, EachContextGetsItsOwnFunctions) {
  auto rt = Open(KPACK_TEST_PACK_DIR);
  const uint32_t n = 3000;
  std::vector<float> x = RandomFloats(n, 60), y = RandomFloats(n, 61), want(n);
  for (uint32_t i = 0; i < n; ++i) want[i] = x[i] + y[i];
  CUdeviceptr dx = Upload(x), dy = Upload(y), out = Alloc(n * 4);
  KP_ASSERT_OK(Run(*rt, [&](CUstream s) {
    return rt->Launch("add", Grid{Cdiv(n, 1024)}, s, dx, dy, out, n);
  }));
  EXPECT_EQ(CountMismatches(Download<float>(out, n), want), 0u);

  CUdevice device = 0;
  CU_ASSERT(d().CtxGetDevice(&device));
  CUcontext second = nullptr;
  CU_ASSERT(d().CtxCreate(&second, nullptr, 0, device));  // now current
  {
    // Memory of this context, freed before it is destroyed (not Alloc's: TearDown would
    // free it in the primary context).
    std::vector<float> tile = RandomFloats(64 * 64, 62);
    CUdeviceptr dx2 = 0, dy2 = 0, out2 = 0, dtile = 0, tile_out = 0;
    for (CUdeviceptr* p : {&dx2, &dy2, &out2}) CU_ASSERT(d().MemAlloc(p, n * 4));
    for (CUdeviceptr* p : {&dtile, &tile_out}) CU_ASSERT(d().MemAlloc(p, 64 * 64 * 4));
    CU_ASSERT(d().MemcpyHtoD(dx2, x.data(), n * 4));
    CU_ASSERT(d().MemcpyHtoD(dy2, y.data(), n * 4));
    CU_ASSERT(d().MemcpyHtoD(dtile, tile.data(), 64 * 64 * 4));
    CU_ASSERT(d().CtxSynchronize());  // the copies' DMA, before kernels on other streams
    KP_ASSERT_OK(rt->Preload());
    Streams streams = NewStreams();
    KP_ASSERT_OK(Run(*rt, streams, [&](CUstream s) {
      return rt->Launch("add", Grid{Cdiv(n, 1024)}, s, dx2, dy2, out2, n);
    }));
    KP_ASSERT_OK(Run(*rt, streams, [&](CUstream s) {
      return rt->Launch("scratch", Grid{2, 2}, s, dtile, tile_out, 64, 64, 64);
    }));
    ASSERT_EQ(d().StreamSynchronize(streams.stream), CUDA_SUCCESS);
    ASSERT_EQ(d().StreamSynchronize(streams.replay), CUDA_SUCCESS);
    std::vector<float> got(n), got_tile(64 * 64);
    CU_ASSERT(d().MemcpyDtoH(got.data(), out2, n * 4));
    CU_ASSERT(d().MemcpyDtoH(got_tile.data(), tile_out, 64 * 64 * 4));
    EXPECT_EQ(CountMismatches(got, want), 0u) << "in the second context";
    for (int i = 0; i < 64 * 64; ++i) ASSERT_EQ(got_tile[i], tile[i] * 2) << i;
    KP_ASSERT_OK(rt->ReleaseScratch(streams.stream));
    DestroyStreams(streams);
    for (CUdeviceptr p : {dx2, dy2, out2, dtile, tile_out}) CU_ASSERT(d().MemFree(p));
  }
  CU_ASSERT(d().CtxDestroy(second));  // pops it: the primary context is current again
  CUcontext current = nullptr;
  CU_ASSERT(d().CtxGetCurrent(&current));
  ASSERT_EQ(current, primary_);
  CUdeviceptr out3 = Alloc(n * 4);
  KP_ASSERT_OK(Run(*rt, [&](CUstream s) {
    return rt->Launch("add", Grid{Cdiv(n, 1024)}, s, dx, dy, out3, n);
  }));
  EXPECT_EQ(CountMismatches(Download<float>(out3, n), want), 0u) << "back in the first";
}

// A context destroyed and a new one made, perhaps at the same address: the new one must
// not get the old one's CUfunctions or scratch (they died with it).
TEST_P(ConformanceTest, AContextReplacedAtTheSameAddressStartsAfresh) {
  auto rt = Open(KPACK_TEST_PACK_DIR);
  CUdevice device = 0;
  CU_ASSERT(d().CtxGetDevice(&device));
  const uint32_t n = 2048;
  std::vector<float> x = RandomFloats(n, 70), y = RandomFloats(n, 71), want(n);
  for (uint32_t i = 0; i < n; ++i) want[i] = x[i] + y[i];
  for (int round = 0; round < 3; ++round) {
    SCOPED_TRACE(round);
    CUcontext context = nullptr;
    CU_ASSERT(d().CtxCreate(&context, nullptr, 0, device));
    Streams streams = NewStreams();
    CUdeviceptr dx = 0, dy = 0, out = 0, tile = 0, tile_out = 0;
    for (CUdeviceptr* p : {&dx, &dy, &out}) CU_ASSERT(d().MemAlloc(p, n * 4));
    CU_ASSERT(d().MemAlloc(&tile, 32 * 32 * 4));
    CU_ASSERT(d().MemAlloc(&tile_out, 32 * 32 * 4));
    CU_ASSERT(d().MemcpyHtoD(dx, x.data(), n * 4));
    CU_ASSERT(d().MemcpyHtoD(dy, y.data(), n * 4));
    CU_ASSERT(d().MemcpyHtoD(tile, x.data(), 32 * 32 * 4));
    CU_ASSERT(d().CtxSynchronize());  // the copies' DMA, before kernels on other streams
    KP_ASSERT_OK(Run(*rt, streams, [&](CUstream s) {
      absl::Status st = rt->Launch("add", Grid{Cdiv(n, 1024)}, s, dx, dy, out, n);
      if (st.ok()) st = rt->Launch("scratch", Grid{1, 1}, s, tile, tile_out, 32, 32, 32);
      return st;
    }));
    ASSERT_EQ(d().StreamSynchronize(streams.stream), CUDA_SUCCESS);
    ASSERT_EQ(d().StreamSynchronize(streams.replay), CUDA_SUCCESS);
    std::vector<float> got(n), got_tile(32 * 32);
    CU_ASSERT(d().MemcpyDtoH(got.data(), out, n * 4));
    CU_ASSERT(d().MemcpyDtoH(got_tile.data(), tile_out, 32 * 32 * 4));
    EXPECT_EQ(CountMismatches(got, want), 0u);
    for (int i = 0; i < 32 * 32; ++i) ASSERT_EQ(got_tile[i], x[i] * 2) << i;
    DestroyStreams(streams);
    for (CUdeviceptr p : {dx, dy, out, tile, tile_out}) CU_ASSERT(d().MemFree(p));
    CU_ASSERT(d().CtxDestroy(context));  // without ReleaseScratch: the memory goes with it
  }
}

// ---- capture and replay ----------------------------------------------------------------

// Done by hand here (not through Run) in both modes: what must happen before a capture,
// and the graph owning its scratch while the capture stream goes on eagerly.
TEST_P(ScratchTest, ACapturedGraphOwnsItsScratchAndReplaysOnAnyStream) {
  auto rt = Open(KPACK_TEST_PACK_DIR);
  Kernel scratch = *rt->Find("scratch");
  ScratchJob captured = Job(96, 96, 80), eager = Job(96, 96, 81);
  const CUstream s = main_.capture;
  CUgraph graph = nullptr;

  // Nothing loaded: the launch refuses, naming Preload, and the capture stays valid.
  CU_ASSERT(d().StreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  absl::Status status = Launch(scratch, captured, s);
  CU_ASSERT(d().StreamEndCapture(s, &graph));
  CU_ASSERT(d().GraphDestroy(graph));
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
  EXPECT_THAT(Msg(status), AllOf(HasSubstr("kernel 'scratch'"), HasSubstr("Preload")));
  EXPECT_EQ(rt->stats().libraries_loaded, 0u);

  // Loaded, but no scratch reserved: refused, naming ReserveScratch and the bytes.
  KP_ASSERT_OK(rt->Preload());
  CU_ASSERT(d().StreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  status = Launch(scratch, captured, s);
  CU_ASSERT(d().StreamEndCapture(s, &graph));
  CU_ASSERT(d().GraphDestroy(graph));
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
  EXPECT_THAT(Msg(status), AllOf(HasSubstr("ReserveScratch"),
                                 HasSubstr(std::to_string(captured.bytes()))));

  // Reserved: the graph takes the arena and owns it.
  KP_ASSERT_OK(rt->ReserveScratch(s, captured.bytes()));
  EXPECT_EQ(rt->stats().scratch_reserved, 1u);
  CU_ASSERT(d().StreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  status = Launch(scratch, captured, s);
  absl::Status again = Launch(scratch, captured, s);  // same capture, same stream: shared
  CU_ASSERT(d().StreamEndCapture(s, &graph));
  KP_ASSERT_OK(status);
  KP_ASSERT_OK(again);
  EXPECT_EQ(rt->stats().scratch_in_graphs, 1u);
  EXPECT_EQ(rt->stats().scratch_reserved, 0u);
  CUgraphExec exec = nullptr;
  CU_ASSERT(d().GraphInstantiateWithFlags(&exec, graph, 0));
  CU_ASSERT(d().GraphDestroy(graph));  // the executable keeps the arena alive

  // Replays on another stream while the capture stream launches eagerly with other data:
  // the graph's scratch is its own, so neither disturbs the other.
  for (int i = 0; i < 20; ++i) {
    CU_ASSERT(d().GraphLaunch(exec, main_.replay));
    KP_ASSERT_OK(Launch(scratch, eager, s));
  }
  EXPECT_EQ(Mismatches(captured), 0u);
  EXPECT_EQ(Mismatches(eager), 0u);
  EXPECT_EQ(rt->stats().scratch_arenas, 1u) << "the capture stream's own";
  CU_ASSERT(d().GraphExecDestroy(exec));
  // The driver runs the user object's destructor once the graph's work is done: the arena
  // goes back to kpack's pool.
  Sync();
  AwaitGraphScratchReturned(*rt);
  EXPECT_EQ(rt->stats().scratch_idle, 1u);
  // The next reservation takes it instead of allocating.
  const size_t bytes = rt->stats().scratch_bytes;
  KP_ASSERT_OK(rt->ReserveScratch(s, captured.bytes()));
  EXPECT_EQ(rt->stats().scratch_bytes, bytes);
  EXPECT_EQ(rt->stats().scratch_idle, 0u);
}

}  // namespace

// Each test eagerly, and with every launch captured and replayed on another stream.
INSTANTIATE_TEST_SUITE_P(Suite, ConformanceTest,
                         ::testing::Values(Mode{TheBackend(), false}, Mode{TheBackend(), true}),
                         ModeName);
INSTANTIATE_TEST_SUITE_P(Suite, ScratchTest,
                         ::testing::Values(Mode{TheBackend(), false}, Mode{TheBackend(), true}),
                         ModeName);

}  // namespace kpack::conformance
