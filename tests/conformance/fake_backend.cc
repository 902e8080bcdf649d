// The conformance suite on the recording fake driver (CPU tier). The fake runs the test
// packs' kernels as host emulators (emulators.h), reaching device memory only through
// fake::DeviceArray, so an argument or scratch pointer outside the memory a kernel was
// given is a recorded fault, which fails the test. The fake hands out CUdevice handles
// that are not ordinals and reuses destroyed contexts' and streams' handles, so that
// kpack's code can rely on neither.

#include <string>

#include "conformance.h"
#include "emulators.h"
#include "fake_driver.h"
#include "gmock/gmock.h"
#include "unit/fake_runtime.h"

namespace kpack::conformance {
namespace {

class FakeBackend : public Backend {
 public:
  const char* name() const override { return "Fake"; }
  std::string driver_path() const override { return KPACK_FAKE_DRIVER; }
  absl::Status SetUp() override {
    fake::Reset();
    fake::SetDeviceHandleOffset(1000);
    fake::SetHandleReuse(true);
    RegisterKernelEmulators();
    testing::UsePrimaryContext(0);
    return absl::OkStatus();
  }
  void TearDown() override {
    EXPECT_THAT(fake::Faults(), ::testing::IsEmpty()) << "kernels touched memory not theirs";
    fake::Reset();
  }
  const internal::Driver& driver() const override { return testing::FakeDriver(); }
};

}  // namespace

Backend* TheBackend() {
  static FakeBackend backend;
  return &backend;
}

}  // namespace kpack::conformance
