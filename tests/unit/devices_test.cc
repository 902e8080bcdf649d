// Runtime::CurrentDevice and Runtime::UseDevice against the fake driver: the device of the
// current context (by ordinal, though the driver's CUdevice handles are not ordinals
// here), making a primary context current on a thread that has none, and contexts told
// apart by id when a handle is reused.

#include <atomic>
#include <optional>
#include <thread>
#include <vector>

#include "fake_driver.h"
#include "fake_runtime.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kpack/kpack.h"
#include "runtime/devices.h"

namespace kpack {
namespace {

using ::kpack::testing::FakeDriver;
using ::kpack::testing::OpenFake;
using ::testing::HasSubstr;

const CUdeviceptr kX = 0x7f0000001000, kOut = 0x7f0000003000;

class DevicesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    testing::ResetFake();
    fake::SetDevices({fake::DeviceConfig{}, fake::DeviceConfig{}, fake::DeviceConfig{}});
    fake::SetDeviceHandleOffset(100);
    testing::UsePrimaryContext(0);
    absl::StatusOr<Runtime> rt = OpenFake();
    ASSERT_TRUE(rt.ok()) << rt.status();
    rt_.emplace(*std::move(rt));
  }
  void TearDown() override {
    rt_.reset();
    fake::Reset();
  }
  // `fn` on a new thread, which starts with no current context.
  template <typename F>
  static void OnNewThread(F fn) {
    std::thread t(fn);
    t.join();
  }

  std::optional<Runtime> rt_;
};

TEST_F(DevicesTest, NoCurrentContextIsFailedPreconditionNamingUseDevice) {
  OnNewThread([&] {
    absl::StatusOr<int> device = rt_->CurrentDevice();
    ASSERT_FALSE(device.ok());
    EXPECT_EQ(device.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(std::string(device.status().message()),
                HasSubstr("no CUDA context is current on this thread"));
    EXPECT_THAT(std::string(device.status().message()), HasSubstr("Runtime::UseDevice"));
  });
}

TEST_F(DevicesTest, UseDeviceMakesThatDevicesPrimaryContextCurrent) {
  OnNewThread([&] {
    ASSERT_TRUE(rt_->UseDevice(2).ok());
    absl::StatusOr<int> device = rt_->CurrentDevice();
    ASSERT_TRUE(device.ok()) << device.status();
    EXPECT_EQ(*device, 2);
    const internal::Driver& d = FakeDriver();
    CUdevice handle = 0;
    CUcontext primary = nullptr, current = nullptr;
    ASSERT_EQ(d.DeviceGet(&handle, 2), CUDA_SUCCESS);
    ASSERT_EQ(handle, 102);
    ASSERT_EQ(d.DevicePrimaryCtxRetain(&primary, handle), CUDA_SUCCESS);
    ASSERT_EQ(d.CtxGetCurrent(&current), CUDA_SUCCESS);
    EXPECT_EQ(current, primary);
    // And a launch there works, which it would not without a context.
    EXPECT_TRUE(rt_->Launch("add", Grid{1}, nullptr, kX, kX, kOut, 1).ok());
  });
  EXPECT_EQ(*rt_->CurrentDevice(), 0) << "the other thread's context is its own";
}

TEST_F(DevicesTest, UseDeviceRefusesAnOrdinalThatIsNotADevice) {
  for (int ordinal : {3, -1}) {
    absl::Status s = rt_->UseDevice(ordinal);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(s.message()),
                HasSubstr("the driver has 3 devices (ordinals 0 to 2)"));
  }
  EXPECT_EQ(*rt_->CurrentDevice(), 0) << "the current context is unchanged";
}

TEST_F(DevicesTest, AKnownContextCostsNoDriverCallButCuCtxGetId) {
  ASSERT_EQ(*rt_->CurrentDevice(), 0);
  const int64_t get_device = fake::CallCount("CtxGetDevice");
  const int64_t get_count = fake::CallCount("DeviceGetCount");
  const int64_t get_id = fake::CallCount("CtxGetId");
  for (int i = 0; i < 10; ++i) ASSERT_EQ(*rt_->CurrentDevice(), 0);
  EXPECT_EQ(fake::CallCount("CtxGetDevice"), get_device);
  EXPECT_EQ(fake::CallCount("DeviceGetCount"), get_count);
  EXPECT_EQ(fake::CallCount("CtxGetId"), get_id + 10);
}

// A context destroyed and replaced by one at the same address on another device: the id
// is new, so the answer is the new context's device, not the remembered one.
TEST_F(DevicesTest, AReusedContextHandleIsANewContext) {
  fake::SetHandleReuse(true);
  const internal::Driver& d = FakeDriver();
  CUdevice dev1 = 0, dev2 = 0;
  ASSERT_EQ(d.DeviceGet(&dev1, 1), CUDA_SUCCESS);
  ASSERT_EQ(d.DeviceGet(&dev2, 2), CUDA_SUCCESS);
  CUcontext first = nullptr, second = nullptr;
  ASSERT_EQ(d.CtxCreate(&first, nullptr, 0, dev1), CUDA_SUCCESS);
  ASSERT_EQ(*rt_->CurrentDevice(), 1);
  ASSERT_EQ(d.CtxDestroy(first), CUDA_SUCCESS);
  ASSERT_EQ(d.CtxCreate(&second, nullptr, 0, dev2), CUDA_SUCCESS);
  ASSERT_EQ(second, first) << "the fake reuses the handle";
  EXPECT_EQ(*rt_->CurrentDevice(), 2);
  ASSERT_EQ(d.CtxDestroy(second), CUDA_SUCCESS);
}

// More contexts than are remembered: each is still answered right.
TEST_F(DevicesTest, ContextsBeyondTheRememberedOnesAreStillAnswered) {
  const internal::Driver& d = FakeDriver();
  for (int i = 0; i < static_cast<int>(internal::DeviceOrdinals::kMaxContexts) + 8; ++i) {
    CUdevice dev = 0;
    CUcontext context = nullptr;
    ASSERT_EQ(d.DeviceGet(&dev, i % 3), CUDA_SUCCESS);
    ASSERT_EQ(d.CtxCreate(&context, nullptr, 0, dev), CUDA_SUCCESS);
    ASSERT_EQ(*rt_->CurrentDevice(), i % 3) << "context " << i;
    ASSERT_EQ(*rt_->CurrentDevice(), i % 3) << "context " << i << ", again";
    ASSERT_EQ(d.CtxDestroy(context), CUDA_SUCCESS);
  }
}

// Threads on different devices asking at once (TSan checks the lock-free lookup).
TEST_F(DevicesTest, ThreadsOnDifferentDevicesAskAtOnce) {
  std::vector<std::thread> threads;
  std::atomic<int> wrong{0};
  for (int t = 0; t < 6; ++t) {
    threads.emplace_back([&, t] {
      if (!rt_->UseDevice(t % 3).ok()) ++wrong;
      for (int i = 0; i < 200; ++i) {
        absl::StatusOr<int> device = rt_->CurrentDevice();
        if (!device.ok() || *device != t % 3) ++wrong;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(wrong.load(), 0);
}

}  // namespace
}  // namespace kpack
