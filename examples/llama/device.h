// llama/device.h: the CUDA driver for the engine's memory, streams and events.
//
// The engine allocates, copies and synchronizes through the same driver table kpack
// launches through: loaded at run time (dlopen of the given path, else $KPACK_CUDA_DRIVER,
// else libcuda.so.1, then cuGetProcAddress; never linked), so the CPU tests' recording
// fake driver serves the whole engine. `Device::Open` also retains the device's primary
// context and makes it current on the calling thread, where kpack launches go.
//
// The RAII handles below free what they hold with the device's context current on the
// destroying thread (cuMemFree and friends need one); destroy them before the Device.
// None of them is thread-safe; they are used by the engine's one thread.

#ifndef KPACK_EXAMPLES_LLAMA_DEVICE_H_
#define KPACK_EXAMPLES_LLAMA_DEVICE_H_

#include <cuda.h>

#include <cstddef>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "driver/driver.h"

namespace kpack::llama {

class Device {
 public:
  // UNAVAILABLE when no driver loads or initializes (the message says what was tried),
  // INVALID_ARGUMENT for an ordinal the driver does not have.
  static absl::StatusOr<std::unique_ptr<Device>> Open(const std::string& driver_path, int ordinal);
  ~Device();  // releases the primary context
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  const internal::Driver& driver() const { return *driver_; }
  CUcontext context() const { return context_; }
  const std::string& name() const { return name_; }
  // Makes the context current on the calling thread.
  absl::Status MakeCurrent() const;
  // OK, or a status naming `what` and the driver's error.
  absl::Status Check(CUresult result, absl::string_view what) const {
    return driver_->Check(result, what);
  }

 private:
  Device() = default;
  std::shared_ptr<const internal::Driver> driver_;
  CUdevice device_ = 0;
  CUcontext context_ = nullptr;
  std::string name_;
};

// Offsets of the pieces of one allocation, each 256-byte aligned (as cuMemAlloc aligns,
// so every piece keeps the pointer specializations a kernel variant may assume).
class Carving {
 public:
  static constexpr size_t kAlign = 256;
  // The offset of a new piece of `bytes`.
  size_t Take(size_t bytes) {
    const size_t at = end_;
    end_ = (end_ + bytes + kAlign - 1) / kAlign * kAlign;
    return at;
  }
  size_t size() const { return end_; }

 private:
  size_t end_ = 0;
};

// cuMemAlloc'd device memory, freed on destruction. Move-only.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  // RESOURCE_EXHAUSTED naming `what` and the bytes when the device has no room.
  static absl::StatusOr<DeviceBuffer> Allocate(const Device& device, size_t bytes,
                                               absl::string_view what);
  DeviceBuffer(DeviceBuffer&& other) noexcept { *this = std::move(other); }
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  ~DeviceBuffer();

  CUdeviceptr get() const { return pointer_; }
  size_t size() const { return size_; }

 private:
  const Device* device_ = nullptr;
  CUdeviceptr pointer_ = 0;
  size_t size_ = 0;
};

// Page-locked host memory (cuMemAllocHost): the target of asynchronous read-backs.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  static absl::StatusOr<PinnedBuffer> Allocate(const Device& device, size_t bytes,
                                               absl::string_view what);
  PinnedBuffer(PinnedBuffer&& other) noexcept { *this = std::move(other); }
  PinnedBuffer& operator=(PinnedBuffer&& other) noexcept;
  ~PinnedBuffer();

  template <typename T>
  T* as() const {
    return static_cast<T*>(pointer_);
  }
  size_t size() const { return size_; }

 private:
  const Device* device_ = nullptr;
  void* pointer_ = nullptr;
  size_t size_ = 0;
};

// A blocking stream (ordered with the legacy stream, so synchronous copies on the
// legacy stream are ordered with its work). Move-only.
class Stream {
 public:
  Stream() = default;
  static absl::StatusOr<Stream> Create(const Device& device);
  Stream(Stream&& other) noexcept { *this = std::move(other); }
  Stream& operator=(Stream&& other) noexcept;
  ~Stream();

  CUstream get() const { return stream_; }
  absl::Status Synchronize() const;

 private:
  const Device* device_ = nullptr;
  CUstream stream_ = nullptr;
};

class Event {
 public:
  Event() = default;
  static absl::StatusOr<Event> Create(const Device& device);
  Event(Event&& other) noexcept { *this = std::move(other); }
  Event& operator=(Event&& other) noexcept;
  ~Event();

  CUevent get() const { return event_; }
  absl::Status Record(CUstream stream) const;
  absl::Status Synchronize() const;
  // Milliseconds from `start` to this event, both recorded and complete.
  absl::StatusOr<float> MillisecondsSince(const Event& start) const;

 private:
  const Device* device_ = nullptr;
  CUevent event_ = nullptr;
};

}  // namespace kpack::llama

#endif  // KPACK_EXAMPLES_LLAMA_DEVICE_H_
