// A C view of the fake driver's control API, for tests written in Python (ctypes): the
// Python extension's tests load libkpack_fake_cuda.so as the driver and read what it
// recorded through these functions.

#include <cuda.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string_view>
#include <vector>

#include "fake_driver.h"

extern "C" {

// One recorded launch, flattened (see kpack::fake::LaunchRecord).
struct KpackFakeLaunch {
  char entry[kpack::fake::kMaxRecordedEntryName];
  uint32_t grid[3];
  uint32_t block[3];
  uint32_t shared_bytes;
  uint32_t num_attrs;
  uint64_t stream;
  uint64_t context;
  uint64_t param_size;
  uint8_t params[kpack::fake::kMaxRecordedParamBytes];
  uint32_t captured;      // issued into a capturing stream
  uint32_t graph_replay;  // issued by cuGraphLaunch
};

KPACK_FAKE_EXPORT int64_t kpack_fake_launch_count() { return kpack::fake::LaunchCount(); }

// 0 and the i-th recorded launch; -1 when it is not in the ring (never recorded, or
// overwritten).
KPACK_FAKE_EXPORT int kpack_fake_get_launch(int64_t i, KpackFakeLaunch* out) {
  const int64_t count = kpack::fake::LaunchCount();
  if (i < 0 || i >= count || i < count - kpack::fake::kLaunchRingCapacity) return -1;
  const kpack::fake::LaunchRecord r = kpack::fake::GetLaunch(i);
  std::memcpy(out->entry, r.entry.data(), sizeof(out->entry));
  std::copy(r.grid.begin(), r.grid.end(), out->grid);
  std::copy(r.block.begin(), r.block.end(), out->block);
  out->shared_bytes = r.shared_bytes;
  out->num_attrs = r.num_attrs;
  out->stream = reinterpret_cast<uintptr_t>(r.stream);
  out->context = reinterpret_cast<uintptr_t>(r.context);
  out->param_size = r.param_size;
  std::memcpy(out->params, r.params.data(), sizeof(out->params));
  out->captured = r.captured ? 1 : 0;
  out->graph_replay = r.graph_replay ? 1 : 0;
  return 0;
}

KPACK_FAKE_EXPORT int64_t kpack_fake_call_count(const char* fn) {
  return kpack::fake::CallCount(fn);
}

KPACK_FAKE_EXPORT void kpack_fake_fail_next(const char* fn, int code) {
  kpack::fake::FailNext(fn, static_cast<CUresult>(code));
}

KPACK_FAKE_EXPORT void kpack_fake_fail_next_skip(const char* fn, int code, int skip) {
  kpack::fake::FailNext(fn, static_cast<CUresult>(code), skip);
}

KPACK_FAKE_EXPORT int kpack_fake_cancel_failures() { return kpack::fake::CancelFailures(); }

KPACK_FAKE_EXPORT uint64_t kpack_fake_allocation_id(uint64_t pointer) {
  return kpack::fake::AllocationId(pointer);
}

// kpack::fake::CaptureStatus of a stream handle, as a CUstreamCaptureStatus value.
KPACK_FAKE_EXPORT int kpack_fake_capture_status(uint64_t stream) {
  return static_cast<int>(kpack::fake::CaptureStatus(reinterpret_cast<CUstream>(stream)));
}

KPACK_FAKE_EXPORT int64_t kpack_fake_live_allocations() { return kpack::fake::LiveAllocations(); }
KPACK_FAKE_EXPORT int kpack_fake_live_graphs() { return kpack::fake::LiveGraphs(); }
KPACK_FAKE_EXPORT int kpack_fake_live_user_objects() { return kpack::fake::LiveUserObjects(); }

KPACK_FAKE_EXPORT void kpack_fake_set_launch_noop(int on) { kpack::fake::SetLaunchNoop(on != 0); }

// `count` default devices (kpack::fake::SetDevices); drops every context stack.
KPACK_FAKE_EXPORT void kpack_fake_set_devices(int count) {
  kpack::fake::SetDevices(std::vector<kpack::fake::DeviceConfig>(static_cast<size_t>(count)));
}

KPACK_FAKE_EXPORT void kpack_fake_set_device_handle_offset(int offset) {
  kpack::fake::SetDeviceHandleOffset(offset);
}

KPACK_FAKE_EXPORT void kpack_fake_set_handle_reuse(int on) { kpack::fake::SetHandleReuse(on != 0); }

// ---- tensor maps (cuTensorMapEncodeTiled)

// One recorded encode, flattened (see kpack::fake::TensorMapEncode); arrays innermost
// dimension first, as the driver takes them.
struct KpackFakeTensorMapEncode {
  uint64_t tensor_map;
  uint64_t address;
  uint64_t dims[5];
  uint64_t strides[4];
  uint32_t box[5];
  uint32_t element_strides[5];
  uint32_t data_type, rank, interleave, swizzle, l2_promotion, oob_fill, ok;
};

KPACK_FAKE_EXPORT int64_t kpack_fake_tensor_map_encode_count() {
  return kpack::fake::TensorMapEncodeCount();
}

// 0 and the i-th recorded encode; -1 when it is not among the retained ones.
KPACK_FAKE_EXPORT int kpack_fake_get_tensor_map_encode(int64_t i, KpackFakeTensorMapEncode* out) {
  const int64_t count = kpack::fake::TensorMapEncodeCount();
  if (i < 0 || i >= count || i < count - 256) return -1;
  const kpack::fake::TensorMapEncode e = kpack::fake::GetTensorMapEncode(i);
  out->tensor_map = e.tensor_map;
  out->address = e.address;
  std::copy(e.dims.begin(), e.dims.end(), out->dims);
  std::copy(e.strides.begin(), e.strides.end(), out->strides);
  std::copy(e.box.begin(), e.box.end(), out->box);
  std::copy(e.element_strides.begin(), e.element_strides.end(), out->element_strides);
  out->data_type = e.data_type;
  out->rank = e.rank;
  out->interleave = e.interleave;
  out->swizzle = e.swizzle;
  out->l2_promotion = e.l2_promotion;
  out->oob_fill = e.oob_fill;
  out->ok = e.ok ? 1 : 0;
  return 0;
}

}  // extern "C"
