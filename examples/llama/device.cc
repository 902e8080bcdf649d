#include "device.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "util/status_macros.h"

namespace kpack::llama {

absl::StatusOr<std::unique_ptr<Device>> Device::Open(const std::string& driver_path, int ordinal) {
  std::unique_ptr<Device> d(new Device());
  KPACK_ASSIGN_OR_RETURN(d->driver_, internal::Driver::Load(driver_path));
  const internal::Driver& cu = *d->driver_;
  int count = 0;
  KPACK_RETURN_IF_ERROR(cu.Check(cu.DeviceGetCount(&count), "cuDeviceGetCount"));
  if (ordinal < 0 || ordinal >= count) {
    return absl::InvalidArgumentError(
        absl::StrCat("device ", ordinal, " does not exist (the driver has ", count, ")"));
  }
  KPACK_RETURN_IF_ERROR(cu.Check(cu.DeviceGet(&d->device_, ordinal), "cuDeviceGet"));
  KPACK_RETURN_IF_ERROR(
      cu.Check(cu.DevicePrimaryCtxRetain(&d->context_, d->device_), "cuDevicePrimaryCtxRetain"));
  KPACK_RETURN_IF_ERROR(d->MakeCurrent());
  char name[256] = {};
  KPACK_RETURN_IF_ERROR(
      cu.Check(cu.DeviceGetName(name, sizeof(name) - 1, d->device_), "cuDeviceGetName"));
  d->name_ = name;
  return d;
}

Device::~Device() {
  if (context_ != nullptr) driver_->DevicePrimaryCtxRelease(device_);
}

absl::Status Device::MakeCurrent() const {
  return Check(driver_->CtxSetCurrent(context_), "cuCtxSetCurrent");
}

absl::StatusOr<DeviceBuffer> DeviceBuffer::Allocate(const Device& device, size_t bytes,
                                                    absl::string_view what) {
  DeviceBuffer b;
  const CUresult r = device.driver().MemAlloc(&b.pointer_, bytes);
  if (r != CUDA_SUCCESS) {
    return device.Check(r, absl::StrCat("cuMemAlloc of ", bytes, " bytes for ", what));
  }
  b.device_ = &device;
  b.size_ = bytes;
  return b;
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    this->~DeviceBuffer();
    device_ = std::exchange(other.device_, nullptr);
    pointer_ = std::exchange(other.pointer_, 0);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

DeviceBuffer::~DeviceBuffer() {
  if (pointer_ != 0) device_->driver().MemFree(pointer_);
  pointer_ = 0;
}

absl::StatusOr<PinnedBuffer> PinnedBuffer::Allocate(const Device& device, size_t bytes,
                                                    absl::string_view what) {
  PinnedBuffer b;
  const CUresult r = device.driver().MemAllocHost(&b.pointer_, bytes);
  if (r != CUDA_SUCCESS) {
    return device.Check(r, absl::StrCat("cuMemAllocHost of ", bytes, " bytes for ", what));
  }
  b.device_ = &device;
  b.size_ = bytes;
  return b;
}

PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& other) noexcept {
  if (this != &other) {
    this->~PinnedBuffer();
    device_ = std::exchange(other.device_, nullptr);
    pointer_ = std::exchange(other.pointer_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

PinnedBuffer::~PinnedBuffer() {
  if (pointer_ != nullptr) device_->driver().MemFreeHost(pointer_);
  pointer_ = nullptr;
}

absl::StatusOr<Stream> Stream::Create(const Device& device) {
  Stream s;
  KPACK_RETURN_IF_ERROR(
      device.Check(device.driver().StreamCreate(&s.stream_, 0), "cuStreamCreate"));
  s.device_ = &device;
  return s;
}

Stream& Stream::operator=(Stream&& other) noexcept {
  if (this != &other) {
    this->~Stream();
    device_ = std::exchange(other.device_, nullptr);
    stream_ = std::exchange(other.stream_, nullptr);
  }
  return *this;
}

Stream::~Stream() {
  if (stream_ != nullptr) device_->driver().StreamDestroy(stream_);
  stream_ = nullptr;
}

absl::Status Stream::Synchronize() const {
  return device_->Check(device_->driver().StreamSynchronize(stream_), "cuStreamSynchronize");
}

absl::StatusOr<Event> Event::Create(const Device& device) {
  Event e;
  KPACK_RETURN_IF_ERROR(device.Check(device.driver().EventCreate(&e.event_, 0), "cuEventCreate"));
  e.device_ = &device;
  return e;
}

Event& Event::operator=(Event&& other) noexcept {
  if (this != &other) {
    this->~Event();
    device_ = std::exchange(other.device_, nullptr);
    event_ = std::exchange(other.event_, nullptr);
  }
  return *this;
}

Event::~Event() {
  if (event_ != nullptr) device_->driver().EventDestroy(event_);
  event_ = nullptr;
}

absl::Status Event::Record(CUstream stream) const {
  return device_->Check(device_->driver().EventRecord(event_, stream), "cuEventRecord");
}

absl::Status Event::Synchronize() const {
  return device_->Check(device_->driver().EventSynchronize(event_), "cuEventSynchronize");
}

absl::StatusOr<float> Event::MillisecondsSince(const Event& start) const {
  float ms = 0;
  KPACK_RETURN_IF_ERROR(device_->Check(
      device_->driver().EventElapsedTime(&ms, start.event_, event_), "cuEventElapsedTime"));
  return ms;
}

}  // namespace kpack::llama
