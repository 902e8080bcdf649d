// Eight threads launch 10,000 times each on a fresh Runtime whose kernels load lazily under
// the race of their first launches: vector add, a kernel with global scratch and the
// dispatch pack's axpy with n changing across its buckets. The last results of every
// thread are checked on the host. Run twice: each thread on a stream of its own (one
// scratch arena per stream), and every thread on CU_STREAM_PER_THREAD (one handle, a
// different stream per thread: one scratch arena per thread, none shared).

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "driver/driver.h"
#include "gpu_env.h"
#include "gtest/gtest.h"
#include "kpack/kpack.h"

namespace kpack {
namespace {

using internal::Driver;

class GpuStressTest : public ::testing::TestWithParam<bool> {};  // per-thread stream?

TEST_P(GpuStressTest, EightThreadsTenThousandLaunchesEachWithLazyLoadingRacing) {
  const bool per_thread = GetParam();
  auto loaded = Driver::Load("");
  KPACK_SKIP_WITHOUT_GPU(loaded.status());
  const Driver& d = **loaded;
  CUdevice dev;
  CUcontext ctx;
  ASSERT_EQ(d.DeviceGet(&dev, 0), CUDA_SUCCESS);
  ASSERT_EQ(d.DevicePrimaryCtxRetain(&ctx, dev), CUDA_SUCCESS);
  auto test_pack = Runtime::Open(KPACK_TEST_PACK_DIR);
  auto dispatch_pack = Runtime::Open(KPACK_DISPATCH_PACK_DIR);
  ASSERT_TRUE(test_pack.ok() && dispatch_pack.ok());
  Kernel add = *test_pack->Find("add"), scratch = *test_pack->Find("scratch");
  Kernel axpy = *dispatch_pack->Find("axpy");

  // 3 launches per iteration, 10,000 per thread; KPACK_STRESS_LAUNCHES sets another count
  // (e.g. fewer under compute-sanitizer, which slows every launch).
  constexpr int kThreads = 8;
  const char* launches = std::getenv("KPACK_STRESS_LAUNCHES");
  const int kIterations = (launches != nullptr ? std::atoi(launches) : 10000) / 3 + 1;
  constexpr int kN = 8192, kRows = 64, kCols = 128;         // kCols: a multiple of 4 (TMA)
  std::atomic<int> failures{0};
  std::vector<std::string> errors(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      auto fail = [&](const std::string& what) {
        if (failures.fetch_add(1) == 0 || errors[t].empty()) errors[t] = what;
      };
      if (d.CtxSetCurrent(ctx) != CUDA_SUCCESS) return fail("cuCtxSetCurrent");
      CUstream stream = CU_STREAM_PER_THREAD;
      if (!per_thread && d.StreamCreate(&stream, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS) {
        return fail("cuStreamCreate");
      }
      std::mt19937 gen(100 + t);
      std::uniform_real_distribution<float> dist(-2, 2);
      std::vector<float> x(kN), y(kN);
      for (float& v : x) v = dist(gen);
      for (float& v : y) v = dist(gen);
      CUdeviceptr dx, dy, out_add, out_scratch, out_axpy;
      for (CUdeviceptr* p : {&dx, &dy, &out_add, &out_scratch, &out_axpy}) {
        if (d.MemAlloc(p, kN * 4) != CUDA_SUCCESS) return fail("cuMemAlloc");
      }
      d.MemcpyHtoD(dx, x.data(), kN * 4);
      d.MemcpyHtoD(dy, y.data(), kN * 4);
      int32_t last_n = 0;
      for (int i = 0; i < kIterations && failures.load() == 0; ++i) {
        // n changes every launch, across axpy's first two buckets, and is often not a
        // multiple of 16, so both specialized and generic variants load and launch.
        const int32_t n = 1 + (i * 7919 + t * 131) % kN;
        absl::Status s = add.Launch(Grid{(kN + 1023) / 1024}, stream, dx, dy, out_add, kN);
        if (s.ok()) {
          s = scratch.Launch(Grid{kRows / 32, kCols / 32}, stream, dx, out_scratch, kRows, kCols,
                             kCols);
        }
        if (s.ok()) s = axpy.Launch(stream, dx, dy, out_axpy, n, 1, 0.5f);
        if (!s.ok()) return fail(std::string(s.message()));
        last_n = n;
      }
      if (d.StreamSynchronize(stream) != CUDA_SUCCESS) return fail("the kernels faulted");
      std::vector<float> got(kN);
      d.MemcpyDtoH(got.data(), out_add, kN * 4);
      for (int i = 0; i < kN; ++i) {
        if (got[i] != x[i] + y[i]) return fail("add result");
      }
      d.MemcpyDtoH(got.data(), out_scratch, kN * 4);
      for (int i = 0; i < kRows * kCols; ++i) {
        if (got[i] != x[i] * 2) return fail("scratch result");
      }
      d.MemcpyDtoH(got.data(), out_axpy, kN * 4);
      for (int i = 0; i < last_n; ++i) {
        volatile float prod = 0.5f * x[i];
        if (got[i] != prod + y[i]) return fail("axpy result");
      }
      if (!per_thread) {
        absl::Status released = test_pack->ReleaseScratch(stream);
        if (!released.ok()) return fail(std::string(released.message()));
        d.StreamDestroy(stream);
      }
      for (CUdeviceptr p : {dx, dy, out_add, out_scratch, out_axpy}) d.MemFree(p);
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) {
    EXPECT_TRUE(errors[t].empty()) << "thread " << t << ": " << errors[t];
  }
  EXPECT_EQ(failures.load(), 0);
  // Streams of their own were released before being destroyed; each thread's per-thread
  // stream's arena was freed when the thread exited.
  EXPECT_EQ(test_pack->stats().scratch_arenas, 0u);
  EXPECT_EQ(test_pack->stats().scratch_bytes, 0u);
  uint64_t axpy_launches = 0;
  for (const auto& v : axpy.variant_stats()) axpy_launches += v.launches;
  EXPECT_EQ(axpy_launches, uint64_t{kThreads} * kIterations);
  std::printf("%s: %d threads x %d iterations, %zu scratch arenas, %zu scratch bytes\n",
              per_thread ? "CU_STREAM_PER_THREAD" : "own streams", kThreads, kIterations,
              test_pack->stats().scratch_arenas, test_pack->stats().scratch_bytes);
  d.DevicePrimaryCtxRelease(dev);
}

INSTANTIATE_TEST_SUITE_P(Streams, GpuStressTest, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "PerThreadDefaultStream" : "OwnStreams";
                         });

}  // namespace
}  // namespace kpack
