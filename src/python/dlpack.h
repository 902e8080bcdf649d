// The parts of the DLPack ABI (dlpack.h, v1.3) that kpack's Python extension consumes,
// declared here so that the build needs no DLPack package. Layouts and values are the
// ABI: they must match dlpack.h exactly (tests/python checks them against a producer
// written independently with ctypes).
//
// `__dlpack_c_exchange_api__` (DLPack 1.2+; torch 2.11's Tensor has it): a PyCapsule named
// "dlpack_exchange_api", set on the tensor *type*, pointing at a static DLPackExchangeAPI
// table. Its `dltensor_from_py_object_no_sync` fills a caller-owned DLTensor from a
// PyObject* with no Python-level call, and `current_work_stream` gives the producer's
// current stream for a device (torch: the current CUDA stream), so a consumer launches
// where the producer's next kernel would, with no synchronization.

#ifndef KPACK_SRC_PYTHON_DLPACK_H_
#define KPACK_SRC_PYTHON_DLPACK_H_

#include <cstdint>

namespace kpack::python {

inline constexpr uint32_t kDLPackMajorVersion = 1;
inline constexpr const char* kExchangeApiCapsuleName = "dlpack_exchange_api";
inline constexpr const char* kExchangeApiAttr = "__dlpack_c_exchange_api__";

// DLDeviceType values kpack cares about.
enum DLDeviceTypeValue : int32_t {
  kDLCPU = 1,
  kDLCUDA = 2,
  kDLCUDAHost = 3,
  kDLROCM = 10,
  kDLCUDAManaged = 13,
};

// DLDataTypeCode values.
enum DLDataTypeCodeValue : uint8_t {
  kDLInt = 0,
  kDLUInt = 1,
  kDLFloat = 2,
  kDLBfloat = 4,
  kDLComplex = 5,
  kDLBool = 6,
  kDLFloat8_e4m3fn = 10,
  kDLFloat8_e4m3fnuz = 11,
  kDLFloat8_e5m2 = 12,
  kDLFloat8_e5m2fnuz = 13,
};

struct DLPackVersion {
  uint32_t major;
  uint32_t minor;
};

struct DLDevice {
  int32_t device_type;  // DLDeviceType (an int32_t enum)
  int32_t device_id;
};

struct DLDataType {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
};

struct DLTensor {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;
  uint64_t byte_offset;
};

struct DLManagedTensor {  // legacy capsule "dltensor"
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor* self);
};

struct DLManagedTensorVersioned {  // capsule "dltensor_versioned"
  DLPackVersion version;
  void* manager_ctx;
  void (*deleter)(DLManagedTensorVersioned* self);
  uint64_t flags;
  DLTensor dl_tensor;
};

struct DLPackExchangeAPIHeader {
  DLPackVersion version;
  DLPackExchangeAPIHeader* prev_api;
};

// Every function returns 0 on success, -1 with a Python exception set on failure, and is
// called with the GIL held.
struct DLPackExchangeAPI {
  DLPackExchangeAPIHeader header;
  void* managed_tensor_allocator;  // not used by kpack
  int (*managed_tensor_from_py_object_no_sync)(void* py_object, DLManagedTensorVersioned** out);
  void* managed_tensor_to_py_object_no_sync;  // not used by kpack
  // May be null (then kpack uses managed_tensor_from_py_object_no_sync).
  int (*dltensor_from_py_object_no_sync)(void* py_object, DLTensor* out);
  int (*current_work_stream)(int32_t device_type, int32_t device_id, void** out_stream);
};

static_assert(sizeof(DLTensor) == 48);
static_assert(sizeof(DLManagedTensorVersioned) == 80);
static_assert(sizeof(DLPackExchangeAPI) == 56);

}  // namespace kpack::python

#endif  // KPACK_SRC_PYTHON_DLPACK_H_
