// One Runtime serving every GPU present: two threads per device each make that device's
// primary context current and launch the test pack's add and scratch kernels on their own
// stream;
// results are checked on the host; the kernels must have been loaded once for all
// devices (context-independent loading), and each device's stream gets its own scratch
// arena in that device's memory. Passes on one GPU; meant for two or more.

#include <cstdlib>
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

TEST(GpuMultiDeviceTest, OneRuntimeServesEveryDevice) {
  auto loaded = Driver::Load("");
  KPACK_SKIP_WITHOUT_GPU(loaded.status());
  const Driver& d = **loaded;
  int count = 0;
  ASSERT_EQ(d.DeviceGetCount(&count), CUDA_SUCCESS);
  std::vector<CUdevice> devices;
  for (int i = 0; i < count; ++i) {
    CUdevice dev;
    int major = 0, minor = 0;
    d.DeviceGet(&dev, i);
    d.DeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev);
    d.DeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev);
    if (major == 9 && minor == 0) devices.push_back(dev);  // the pack is sm_90a
  }
  ASSERT_FALSE(devices.empty()) << "no compute capability 9.0 device among " << count;
  std::printf("running on %zu device(s) of %d\n", devices.size(), count);

  auto rt = Runtime::Open(KPACK_TEST_PACK_DIR);
  ASSERT_TRUE(rt.ok()) << rt.status();
  Kernel add = *rt->Find("add"), scratch = *rt->Find("scratch");
  constexpr size_t kThreadsPerDevice = 2;
  const size_t num_threads = devices.size() * kThreadsPerDevice;
  std::vector<std::string> errors(num_threads);
  std::vector<std::thread> threads;
  for (size_t t = 0; t < num_threads; ++t) {
    threads.emplace_back([&, t] {
      std::string& error = errors[t];
      const CUdevice device = devices[t % devices.size()];
      CUcontext ctx;
      if (d.DevicePrimaryCtxRetain(&ctx, device) != CUDA_SUCCESS ||
          d.CtxSetCurrent(ctx) != CUDA_SUCCESS) {
        error = "cannot make the device's primary context current";
        return;
      }
      CUstream stream;
      d.StreamCreate(&stream, CU_STREAM_DEFAULT);
      constexpr int kN = 1 << 16, kRows = 96, kCols = 64;
      std::mt19937 gen(static_cast<unsigned>(t));
      std::uniform_real_distribution<float> dist(-3, 3);
      std::vector<float> x(kN), y(kN), got(kN);
      for (float& v : x) v = dist(gen);
      for (float& v : y) v = dist(gen);
      CUdeviceptr dx, dy, out, out2;
      for (CUdeviceptr* p : {&dx, &dy, &out, &out2}) d.MemAlloc(p, kN * 4);
      d.MemcpyHtoD(dx, x.data(), kN * 4);
      d.MemcpyHtoD(dy, y.data(), kN * 4);
      for (int i = 0; i < 100 && error.empty(); ++i) {
        absl::Status s = add.Launch(Grid{kN / 1024}, stream, dx, dy, out, kN);
        if (s.ok()) {
          s = scratch.Launch(Grid{kRows / 32, kCols / 32}, stream, dx, out2, kRows, kCols, kCols);
        }
        if (!s.ok()) error = std::string(s.message());
      }
      if (error.empty() && d.StreamSynchronize(stream) != CUDA_SUCCESS) error = "kernel fault";
      if (error.empty()) {
        d.MemcpyDtoH(got.data(), out, kN * 4);
        for (int i = 0; i < kN && error.empty(); ++i) {
          if (got[i] != x[i] + y[i]) error = "add result";
        }
        d.MemcpyDtoH(got.data(), out2, kRows * kCols * 4);
        for (int i = 0; i < kRows * kCols && error.empty(); ++i) {
          if (got[i] != x[i] * 2) error = "scratch result";
        }
      }
      for (CUdeviceptr p : {dx, dy, out, out2}) d.MemFree(p);
      d.StreamDestroy(stream);
      d.DevicePrimaryCtxRelease(device);
    });
  }
  for (auto& th : threads) th.join();
  for (size_t t = 0; t < num_threads; ++t) {
    EXPECT_TRUE(errors[t].empty())
        << "thread " << t << " on device " << devices[t % devices.size()] << ": " << errors[t];
  }
  EXPECT_EQ(rt->stats().libraries_loaded, 2u) << "loaded once for all devices, not per device";
  EXPECT_EQ(rt->stats().scratch_arenas, num_threads) << "one arena per (stream, context)";
}

}  // namespace
}  // namespace kpack
