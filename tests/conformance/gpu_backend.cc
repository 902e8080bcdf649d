// The conformance suite on the real CUDA driver and a GPU (GPU tier): the same test
// bodies as the fake driver's, with the kernels really running. Skipped without a driver,
// failed instead under KPACK_REQUIRE_GPU=1.

#include <memory>

#include "conformance.h"

namespace kpack::conformance {
namespace {

class GpuBackend : public Backend {
 public:
  const char* name() const override { return "Gpu"; }
  std::string driver_path() const override { return ""; }
  absl::Status SetUp() override {
    if (driver_ == nullptr) {
      auto loaded = internal::Driver::Load("");
      if (!loaded.ok()) return loaded.status();
      driver_ = *loaded;
      CUdevice device = 0;
      if (CUresult r = driver_->DeviceGet(&device, 0); r != CUDA_SUCCESS) {
        return driver_->Error(r, "cuDeviceGet(0)");
      }
      if (CUresult r = driver_->DevicePrimaryCtxRetain(&primary_, device); r != CUDA_SUCCESS) {
        return driver_->Error(r, "cuDevicePrimaryCtxRetain");
      }
    }
    return driver_->Check(driver_->CtxSetCurrent(primary_), "cuCtxSetCurrent");
  }
  void TearDown() override {}
  const internal::Driver& driver() const override { return *driver_; }

 private:
  std::shared_ptr<const internal::Driver> driver_;
  CUcontext primary_ = nullptr;
};

}  // namespace

Backend* TheBackend() {
  static GpuBackend backend;
  return &backend;
}

}  // namespace kpack::conformance
