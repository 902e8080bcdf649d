// kpack::Runtime::CurrentDevice and UseDevice (devices.h).

#include "runtime/devices.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kpack/runtime.h"
#include "runtime/runtime_impl.h"
#include "util/status_macros.h"

namespace kpack {
namespace internal {

absl::StatusOr<int> DeviceOrdinal(const Driver& d, CUdevice device) {
  int count = 0;
  KPACK_RETURN_IF_ERROR(d.Check(d.DeviceGetCount(&count), "cuDeviceGetCount"));
  for (int i = 0; i < count; ++i) {
    CUdevice handle = 0;
    KPACK_RETURN_IF_ERROR(
        d.Check(d.DeviceGet(&handle, i), absl::StrCat("cuDeviceGet for device ", i)));
    if (handle == device) return i;
  }
  return absl::InternalError(absl::StrCat("the current CUDA context's device (CUdevice ",
                                          static_cast<int>(device), ") is none of the driver's ",
                                          count, " devices"));
}

absl::StatusOr<int> DeviceOrdinals::Current(const Driver& d) const {
  unsigned long long id = 0;  // NOLINT(runtime/int)
  if (CUresult r = d.CtxGetId(nullptr, &id); ABSL_PREDICT_FALSE(r != CUDA_SUCCESS)) {
    return ContextError(d, r, "finding the current device");
  }
  for (const Node* n = head_.load(std::memory_order_acquire); n != nullptr; n = n->next) {
    if (n->context == id) return n->ordinal;
  }
  CUdevice device = 0;
  KPACK_RETURN_IF_ERROR(d.Check(d.CtxGetDevice(&device), "cuCtxGetDevice"));
  KPACK_ASSIGN_OR_RETURN(const int ordinal, DeviceOrdinal(d, device));
  std::lock_guard<std::mutex> lock(mu_);
  const Node* head = head_.load(std::memory_order_relaxed);
  for (const Node* n = head; n != nullptr; n = n->next) {
    if (n->context == id) return n->ordinal;  // another thread was first
  }
  if (nodes_.size() < kMaxContexts) {
    nodes_.push_back(std::make_unique<Node>(Node{id, ordinal, head}));
    head_.store(nodes_.back().get(), std::memory_order_release);
  }
  return ordinal;
}

absl::Status UseDevice(const Driver& d, int ordinal) {
  int count = 0;
  KPACK_RETURN_IF_ERROR(d.Check(d.DeviceGetCount(&count), "cuDeviceGetCount"));
  if (ordinal < 0 || ordinal >= count) {
    const std::string ordinals = count == 1  ? " (ordinal 0)"
                                 : count > 1 ? absl::StrCat(" (ordinals 0 to ", count - 1, ")")
                                             : std::string();
    return absl::InvalidArgumentError(absl::StrCat("there is no CUDA device ", ordinal,
                                                   ": the driver has ", count,
                                                   count == 1 ? " device" : " devices", ordinals));
  }
  CUdevice device = 0;
  KPACK_RETURN_IF_ERROR(
      d.Check(d.DeviceGet(&device, ordinal), absl::StrCat("cuDeviceGet for device ", ordinal)));
  CUcontext context = nullptr;
  KPACK_RETURN_IF_ERROR(d.Check(d.DevicePrimaryCtxRetain(&context, device),
                                absl::StrCat("cuDevicePrimaryCtxRetain for device ", ordinal)));
  return d.Check(d.CtxSetCurrent(context),
                 absl::StrCat("cuCtxSetCurrent (device ", ordinal, "'s primary context)"));
}

}  // namespace internal

absl::StatusOr<int> Runtime::CurrentDevice() const {
  return impl_->device_ordinals().Current(impl_->driver());
}

absl::Status Runtime::UseDevice(int ordinal) const {
  return internal::UseDevice(impl_->driver(), ordinal);
}

}  // namespace kpack
