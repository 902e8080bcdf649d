// The GPU tier for dispatch: the committed dispatch pack's axpy (3 buckets, each with its
// own config, x {generic, div16, div16 + stride_x == 1}; tools/README.md) launched with
// shapes crossing every bucket, unit and non-unit strides and misaligned pointers. Every
// result is checked bit-exactly against a host reference, and the variant chosen is
// asserted each time, both through SelectVariant and through the launch counters.

#include <cstdint>
#include <cstdlib>
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

class GpuDispatchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto d = Driver::Load("");
    KPACK_SKIP_WITHOUT_GPU(d.status());
    driver_ = *d;
    CUdevice dev;
    ASSERT_EQ(driver_->DeviceGet(&dev, 0), CUDA_SUCCESS);
    ASSERT_EQ(driver_->DevicePrimaryCtxRetain(&ctx_, dev), CUDA_SUCCESS);
    ASSERT_EQ(driver_->CtxSetCurrent(ctx_), CUDA_SUCCESS);
    // A blocking stream: it orders after the synchronous copies and memsets of the
    // legacy default stream that fill its inputs.
    ASSERT_EQ(driver_->StreamCreate(&stream_, CU_STREAM_DEFAULT), CUDA_SUCCESS);
    auto rt = Runtime::Open(KPACK_DISPATCH_PACK_DIR);
    ASSERT_TRUE(rt.ok()) << rt.status();
    rt_ = std::make_unique<Runtime>(std::move(*rt));
    axpy_ = *rt_->Find("axpy");
  }
  void TearDown() override {
    if (!driver_) return;
    for (CUdeviceptr p : buffers_) driver_->MemFree(p);
    driver_->StreamDestroy(stream_);
    rt_.reset();
  }
  CUdeviceptr Alloc(size_t bytes) {
    CUdeviceptr p = 0;
    EXPECT_EQ(driver_->MemAlloc(&p, bytes), CUDA_SUCCESS);
    EXPECT_EQ(driver_->MemsetD8(p, 0xff, bytes), CUDA_SUCCESS);  // NaN poison
    buffers_.push_back(p);
    return p;
  }
  uint64_t Launches(std::string_view variant) const {
    for (const auto& s : axpy_.variant_stats()) {
      if (s.variant == variant) return s.launches;
    }
    return 0;
  }

  std::shared_ptr<const Driver> driver_;
  CUcontext ctx_ = nullptr;
  CUstream stream_ = nullptr;
  std::unique_ptr<Runtime> rt_;
  Kernel axpy_;
  std::vector<CUdeviceptr> buffers_;
};

TEST_F(GpuDispatchTest, EveryBucketAlignmentAndStrideMatchesTheReference) {
  struct Case {
    int64_t n;
    int stride;
    int misalign;  // floats to offset x, y and out by
    const char* variant;
  } cases[] = {
      {1000, 1, 0, "b0_generic"},                                 // n % 16 != 0
      {4096, 1, 0, "b0_div16_unit"},                              // last value of bucket 0
      {4096, 3, 0, "b0_div16"},      {4096, 1, 1, "b0_generic"},  // misaligned pointers
      {4112, 1, 0, "b1_div16_unit"},  // first multiple of 16 in bucket 1
      {100000, 2, 0, "b1_div16"},    {99999, 1, 0, "b1_generic"},
      {262144, 1, 3, "b1_generic"},  {262160, 1, 0, "b2_div16_unit"},  // bucket 2
      {1 << 22, 5, 0, "b2_div16"},   {(1 << 22) + 1, 1, 0, "b2_generic"},
      {1 << 22, 1, 2, "b2_generic"},
  };
  std::mt19937 gen(123);
  std::uniform_real_distribution<float> dist(-8.0f, 8.0f);
  const float alpha = 1.7f;
  for (const Case& c : cases) {
    const size_t xs = static_cast<size_t>(c.n) * c.stride + 4;
    std::vector<float> x(xs), y(c.n + 4);
    for (float& v : x) v = dist(gen);
    for (float& v : y) v = dist(gen);
    CUdeviceptr dx = Alloc(xs * 4), dy = Alloc((c.n + 4) * 4), dout = Alloc((c.n + 4) * 4);
    ASSERT_EQ(driver_->MemcpyHtoD(dx, x.data(), xs * 4), CUDA_SUCCESS);
    ASSERT_EQ(driver_->MemcpyHtoD(dy, y.data(), (c.n + 4) * 4), CUDA_SUCCESS);
    const CUdeviceptr px = dx + 4 * c.misalign, py = dy + 4 * c.misalign,
                      pout = dout + 4 * c.misalign;
    const Arg args[] = {Arg(px), Arg(py), Arg(pout), Arg(c.n), Arg(c.stride), Arg(alpha)};
    auto chosen = axpy_.SelectVariant(args);
    ASSERT_TRUE(chosen.ok()) << chosen.status();
    EXPECT_EQ(*chosen, c.variant) << "n=" << c.n << " stride=" << c.stride;
    const uint64_t before = Launches(c.variant);
    ASSERT_TRUE(axpy_.LaunchArgs(stream_, args).ok());
    EXPECT_EQ(Launches(c.variant), before + 1) << c.variant;

    std::vector<float> out(c.n);
    ASSERT_EQ(driver_->StreamSynchronize(stream_), CUDA_SUCCESS);
    ASSERT_EQ(driver_->MemcpyDtoH(out.data(), pout, c.n * 4), CUDA_SUCCESS);
    size_t bad = 0;
    for (int64_t i = 0; i < c.n; ++i) {
      volatile float prod = alpha * x[c.misalign + i * c.stride];
      float ref = prod + y[c.misalign + i];
      bad += out[i] != ref;
    }
    EXPECT_EQ(bad, 0u) << c.variant << " n=" << c.n;
  }
  size_t fallbacks = 0;
  for (const auto& s : axpy_.variant_stats()) fallbacks += s.fallback_launches;
  // Six generic launches plus three strided div16 ones: each had a more specialized
  // variant in its bucket whose assumptions failed.
  EXPECT_EQ(fallbacks, 9u);
}

}  // namespace
}  // namespace kpack
