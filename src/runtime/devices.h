// Devices and contexts for kpack::Runtime::CurrentDevice and UseDevice: which device the
// calling thread's current CUDA context is on, and making a device's primary context
// current, through the runtime's driver. They serve callers with no CUDA runtime of their
// own to ask (kpack's Python extension reads the current device on every launch that has
// tensor arguments, to check their device and to find the tensor library's stream).

#ifndef KPACK_SRC_RUNTIME_DEVICES_H_
#define KPACK_SRC_RUNTIME_DEVICES_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "driver/driver.h"

namespace kpack::internal {

// The device ordinal of each CUDA context seen, keyed by cuCtxGetId (never reused, unlike
// a context's handle). A list of immutable nodes, newest first, read without a lock and
// grown under `mu_`; contexts are few, and past kMaxContexts distinct ones a new context's
// device is asked of the driver on every call instead of being remembered (so that a
// program that creates and destroys contexts forever does not grow the list forever).
//
// Thread safety: Current may be called from any number of threads at once.
class DeviceOrdinals {
 public:
  static constexpr size_t kMaxContexts = 64;

  // The ordinal of the current context's device: one cuCtxGetId and a list walk once
  // the context is known. FAILED_PRECONDITION when no context is current (see
  // ContextError); the driver's error otherwise.
  absl::StatusOr<int> Current(const Driver& d) const;

 private:
  struct Node {
    uint64_t context = 0;
    int ordinal = -1;
    const Node* next = nullptr;
  };
  mutable std::atomic<const Node*> head_{nullptr};
  mutable std::mutex mu_;
  mutable std::vector<std::unique_ptr<Node>> nodes_;  // guarded by mu_; owns the list
};

// The ordinal of CUdevice handle `device`: the driver's handles need not be ordinals, so
// it is looked up among cuDeviceGet's answers.
absl::StatusOr<int> DeviceOrdinal(const Driver& d, CUdevice device);

// Makes device `ordinal`'s primary context current on the calling thread (see
// Runtime::UseDevice).
absl::Status UseDevice(const Driver& d, int ordinal);

}  // namespace kpack::internal

#endif  // KPACK_SRC_RUNTIME_DEVICES_H_
