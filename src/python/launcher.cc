// The launch objects of kpack's Python extension; see launcher.h for the contract.

#include "launcher.h"

#include <cuda.h>
#include <structmember.h>  // PyMemberDef (Python.h has it only from 3.12)

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <limits>
#include <new>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/base/attributes.h"
#include "absl/base/optimization.h"
#include "absl/status/statusor.h"
#include "dlpack.h"
#include "meta.h"
#include "tensordesc.h"

namespace kpack::python {
namespace {

// ---------------------------------------------------------------- exceptions

struct ExceptionTypes {
  PyObject* error = nullptr;  // kpack.Error(RuntimeError)
  PyObject* invalid_argument = nullptr;
  PyObject* not_found = nullptr;
  PyObject* failed_precondition = nullptr;
  PyObject* unavailable = nullptr;
  PyObject* unimplemented = nullptr;
  PyObject* resource_exhausted = nullptr;
  PyObject* out_of_range = nullptr;
  PyObject* internal = nullptr;
};
ExceptionTypes g_exc;

PyObject* ExceptionFor(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kInvalidArgument:
      return g_exc.invalid_argument;
    case absl::StatusCode::kNotFound:
      return g_exc.not_found;
    case absl::StatusCode::kFailedPrecondition:
      return g_exc.failed_precondition;
    case absl::StatusCode::kUnavailable:
      return g_exc.unavailable;
    case absl::StatusCode::kUnimplemented:
      return g_exc.unimplemented;
    case absl::StatusCode::kResourceExhausted:
      return g_exc.resource_exhausted;
    case absl::StatusCode::kOutOfRange:
      return g_exc.out_of_range;
    case absl::StatusCode::kInternal:
      return g_exc.internal;
    default:
      return g_exc.error;
  }
}

// Raises `type(message)` with `.code` set to the status code's name. Null.
PyObject* RaiseWithCode(PyObject* type, std::string_view message, absl::StatusCode code) {
  PyObject* text = PyUnicode_FromStringAndSize(message.data(), message.size());
  if (text == nullptr) return nullptr;
  PyObject* exc = PyObject_CallOneArg(type, text);
  Py_DECREF(text);
  if (exc == nullptr) return nullptr;
  const std::string name = absl::StatusCodeToString(code);
  PyObject* code_name = PyUnicode_FromString(name.c_str());
  if (code_name == nullptr || PyObject_SetAttrString(exc, "code", code_name) != 0) {
    Py_XDECREF(code_name);
    Py_DECREF(exc);
    return nullptr;
  }
  Py_DECREF(code_name);
  PyErr_SetObject(type, exc);
  Py_DECREF(exc);
  return nullptr;
}

// Our own argument errors: TypeError (wrong kind or count) is the builtin; value errors
// are kpack.InvalidArgumentError (a ValueError), like the same errors found by the library.
template <typename... A>
PyObject* ValueErrorF(const char* format, A... args) {
  PyObject* text = PyUnicode_FromFormat(format, args...);
  if (text == nullptr) return nullptr;
  Py_ssize_t size = 0;
  const char* utf8 = PyUnicode_AsUTF8AndSize(text, &size);
  PyObject* r = utf8 == nullptr ? nullptr
                                : RaiseWithCode(g_exc.invalid_argument, std::string_view(utf8, size),
                                                absl::StatusCode::kInvalidArgument);
  Py_DECREF(text);
  return r;
}

// ---------------------------------------------------------------- strings

struct Strings {
  PyObject* data_ptr;
  PyObject* dlpack;
  PyObject* dlpack_device;
  PyObject* exchange_api;
  PyObject* stream;
  PyObject* stream_kw;
  PyObject* cuda_stream;
  PyObject* cuda_stream_protocol;
  PyObject* scratch_kw;
  PyObject* grid_kw;
  PyObject* torch;
  PyObject* tensor;
  PyObject* cuda_get_current_raw_stream;
  PyObject* c;
};
Strings g_str;

bool InternStrings() {
  auto intern = [](const char* s) { return PyUnicode_InternFromString(s); };
  g_str.data_ptr = intern("data_ptr");
  g_str.dlpack = intern("__dlpack__");
  g_str.dlpack_device = intern("__dlpack_device__");
  g_str.exchange_api = intern(kExchangeApiAttr);
  g_str.stream = intern("stream");
  g_str.stream_kw = g_str.stream;
  g_str.scratch_kw = intern("scratch");
  g_str.grid_kw = intern("grid");
  g_str.cuda_stream = intern("cuda_stream");
  g_str.cuda_stream_protocol = intern("__cuda_stream__");
  g_str.torch = intern("torch");
  g_str.tensor = intern("Tensor");
  g_str.cuda_get_current_raw_stream = intern("_cuda_getCurrentRawStream");
  g_str.c = intern("_C");
  return g_str.data_ptr && g_str.dlpack && g_str.dlpack_device && g_str.exchange_api &&
         g_str.stream && g_str.scratch_kw && g_str.grid_kw && g_str.cuda_stream && g_str.cuda_stream_protocol && g_str.torch &&
         g_str.tensor && g_str.cuda_get_current_raw_stream && g_str.c;
}

// ---------------------------------------------------------------- the per-kernel plan

enum class ParamKind : uint8_t { kPointer, kInt, kFloat, kBool, kTensorDesc };

struct ParamPlan {
  ParamKind kind = ParamKind::kPointer;
  bool check_dtype = false;  // pointers, descriptors' bases: the element type has a DLPack
  DLDataType dtype{};        // equivalent, which is this
  int desc_index = -1;       // tensordesc: its number among the kernel's descriptors
  int desc_rank = 0;         // tensordesc: the block's rank
  std::string name;
  std::string type;  // Triton type, as in the manifest
  PyObject* py_name = nullptr;  // interned, for keyword matching
};

// DLPack's spelling of a Triton pointer's element type ("*fp32" -> float 32), if any.
// Triton names bool tensors `*u1` (`*i1` is accepted too); `*k` marks a constant pointer.
std::optional<DLDataType> PointeeDType(std::string_view type) {
  std::string_view t = type.substr(1);
  if (t.size() > 1 && t[0] == 'k') t.remove_prefix(1);
  struct Entry {
    std::string_view name;
    uint8_t code, bits;
  };
  static constexpr Entry kTable[] = {
      {"fp16", kDLFloat, 16},   {"bf16", kDLBfloat, 16}, {"fp32", kDLFloat, 32},
      {"fp64", kDLFloat, 64},   {"i8", kDLInt, 8},       {"i16", kDLInt, 16},
      {"i32", kDLInt, 32},      {"i64", kDLInt, 64},     {"u8", kDLUInt, 8},
      {"u16", kDLUInt, 16},     {"u32", kDLUInt, 32},    {"u64", kDLUInt, 64},
      {"u1", kDLBool, 8},       {"i1", kDLBool, 8},      {"fp8e4nv", kDLFloat8_e4m3fn, 8},
      {"fp8e5", kDLFloat8_e5m2, 8}, {"fp8e4b8", kDLFloat8_e4m3fnuz, 8},
      {"fp8e5b16", kDLFloat8_e5m2fnuz, 8},
  };
  for (const Entry& e : kTable) {
    if (e.name == t) return DLDataType{e.code, e.bits, 1};
  }
  return std::nullopt;  // fp8e4b15, void, ...: DLPack has no name for it; not checked
}

const char* DTypeName(DLDataType d) {
  switch (d.code) {
    case kDLInt:
      return d.bits == 8 ? "int8" : d.bits == 16 ? "int16" : d.bits == 32 ? "int32" : d.bits == 64 ? "int64" : "int";
    case kDLUInt:
      return d.bits == 8 ? "uint8" : d.bits == 16 ? "uint16" : d.bits == 32 ? "uint32" : d.bits == 64 ? "uint64" : "uint";
    case kDLFloat:
      return d.bits == 16 ? "float16" : d.bits == 32 ? "float32" : d.bits == 64 ? "float64" : "float";
    case kDLBfloat:
      return "bfloat16";
    case kDLComplex:
      return "complex";
    case kDLBool:
      return "bool";
    case kDLFloat8_e4m3fn:
      return "float8_e4m3fn";
    case kDLFloat8_e4m3fnuz:
      return "float8_e4m3fnuz";
    case kDLFloat8_e5m2:
      return "float8_e5m2";
    case kDLFloat8_e5m2fnuz:
      return "float8_e5m2fnuz";
    default:
      return "another type";
  }
}

struct KernelPlan {
  Kernel kernel;
  std::string name;
  std::vector<ParamPlan> params;  // call parameters, in launch order
  size_t num_descs = 0;           // tensordesc parameters among them
  KernelMeta meta;                // introspection (meta.h)
};

// ---------------------------------------------------------------- object layouts

struct KernelObject {
  PyObject_HEAD
  vectorcallfunc vectorcall;
  PyObject* owner;  // the _kpack.Runtime object: keeps `rt` alive
  RuntimeState* rt;
  KernelPlan* plan;  // owned unless `base` is set
  PyObject* base;     // strong: the kernel object whose plan this one shares (with_scratch)
  PyObject* scratch;  // strong: the default scratch= allocator, or null
};

struct GridObject {  // kernel[grid]
  PyObject_HEAD
  vectorcallfunc vectorcall;
  KernelObject* kernel;  // strong
  Grid grid;
  PyObject* grid_fn;  // strong; a callable grid, else null
};

struct PyScratch;

struct BoundObject {
  PyObject_HEAD
  vectorcallfunc vectorcall;
  KernelObject* kernel;  // strong
  std::optional<BoundLaunch> bound;
  PyScratch* scratch;  // owned, with a strong `fn`; null without a scratch callable
  PyObject* args;  // list: the argument objects, kept alive while the launch may use them
  // How each call finds its stream: explicit (fixed at bind), else the producer's current
  // stream of `device` through `api`, else torch's, else legacy.
  bool stream_explicit;
  const DLPackExchangeAPI* api;
  int32_t device;
  CUstream last_stream;
};

PyTypeObject* g_kernel_type = nullptr;
PyTypeObject* g_grid_type = nullptr;
PyTypeObject* g_bound_type = nullptr;
PyTypeObject* g_variant_stats_type = nullptr;

// ---------------------------------------------------------------- devices and streams

// The ordinal of CUdevice handle `handle` (what DLPack's device_id and torch's device
// index are): the driver's handles need not be ordinals, so it is looked up among
// cuDeviceGet's answers. False with a Python exception set.
bool DeviceOrdinal(const internal::Driver& d, CUdevice handle, int* ordinal) {
  int count = 0;
  if (CUresult r = d.DeviceGetCount(&count); r != CUDA_SUCCESS) {
    RaiseStatus(d.Check(r, "cuDeviceGetCount"));
    return false;
  }
  for (int i = 0; i < count; ++i) {
    CUdevice h = 0;
    if (CUresult r = d.DeviceGet(&h, i); r != CUDA_SUCCESS) {
      RaiseStatus(d.Check(r, "cuDeviceGet"));
      return false;
    }
    if (h == handle) {
      *ordinal = i;
      return true;
    }
  }
  PyErr_Format(g_exc.internal, "kpack: the current context's device (CUdevice %d) is none of "
               "the driver's %d devices", static_cast<int>(handle), count);
  return false;
}

// The device ordinal of the calling thread's current CUDA context. With no context
// current and `hint` >= 0 (a tensor's device), makes that device's primary context current
// first, as the CUDA runtime does on a thread's first call. False with a Python exception
// set.
bool CurrentDevice(const internal::Driver& d, int hint, int* device, bool* have_context) {
  // Context -> device ordinal, which never changes for a context. Keyed by cuCtxGetId, as
  // the runtime keys its per-context state: a context destroyed and replaced by one at the
  // same address (on another device, say) has a new id. A global, not a thread_local
  // (which costs a __tls_get_addr call in a dlopened module): the GIL guards it.
  struct Entry {
    const internal::Driver* driver = nullptr;
    unsigned long long id = 0;  // NOLINT(runtime/int)
    int device = -1;
  };
  static std::array<Entry, 4> cache;
  static size_t next = 0;
  unsigned long long id = 0;  // NOLINT(runtime/int)
  CUresult r = d.CtxGetId(nullptr, &id);  // a thread-local read
  if (r == CUDA_ERROR_INVALID_CONTEXT) {  // no context current
    if (hint < 0) {
      *have_context = false;
      *device = -1;
      return true;
    }
    CUdevice dev = 0;
    CUcontext context = nullptr;
    r = d.DeviceGet(&dev, hint);
    if (r == CUDA_SUCCESS) r = d.DevicePrimaryCtxRetain(&context, dev);
    if (r == CUDA_SUCCESS) r = d.CtxSetCurrent(context);
    if (r == CUDA_SUCCESS) r = d.CtxGetId(nullptr, &id);
  }
  if (r != CUDA_SUCCESS) {
    RaiseStatus(d.Check(r, "cuCtxGetId (or making the tensors' device current)"));
    return false;
  }
  *have_context = true;
  for (const Entry& e : cache) {
    if (e.id == id && e.driver == &d) {
      *device = e.device;
      return true;
    }
  }
  CUdevice handle = 0;
  if (CUresult g = d.CtxGetDevice(&handle); g != CUDA_SUCCESS) {
    RaiseStatus(d.Check(g, "cuCtxGetDevice"));
    return false;
  }
  int ordinal = -1;
  if (!DeviceOrdinal(d, handle, &ordinal)) return false;
  cache[next++ % cache.size()] = {&d, id, ordinal};
  *device = ordinal;
  return true;
}

// torch's exchange API once torch is imported (null before, and with a torch without
// one: then `g_torch_raw_stream` is torch._C._cuda_getCurrentRawStream).
const DLPackExchangeAPI* g_torch_api = nullptr;
PyObject* g_torch_raw_stream = nullptr;
bool g_torch_resolved = false;

const DLPackExchangeAPI* ApiFromCapsule(PyObject* capsule) {
  if (capsule == nullptr || !PyCapsule_IsValid(capsule, kExchangeApiCapsuleName)) return nullptr;
  auto* header = static_cast<DLPackExchangeAPIHeader*>(
      PyCapsule_GetPointer(capsule, kExchangeApiCapsuleName));
  // A newer major version links the older tables it still serves.
  while (header != nullptr && header->version.major != kDLPackMajorVersion) {
    header = header->prev_api;
  }
  if (header == nullptr) return nullptr;
  auto* api = reinterpret_cast<const DLPackExchangeAPI*>(header);
  if (api->dltensor_from_py_object_no_sync == nullptr &&
      api->managed_tensor_from_py_object_no_sync == nullptr) {
    return nullptr;
  }
  return api;
}

// Looks for torch in sys.modules (a dict lookup) until it is there; never imports it.
void ResolveTorch() {
  if (g_torch_resolved) return;
  PyObject* torch = PyDict_GetItemWithError(PyImport_GetModuleDict(), g_str.torch);
  if (torch == nullptr) {
    PyErr_Clear();
    return;
  }
  PyObject* tensor = PyObject_GetAttr(torch, g_str.tensor);
  if (tensor == nullptr) {  // torch is being imported
    PyErr_Clear();
    return;
  }
  PyObject* capsule = PyObject_GetAttr(tensor, g_str.exchange_api);
  Py_DECREF(tensor);
  if (capsule == nullptr) PyErr_Clear();
  g_torch_api = ApiFromCapsule(capsule);
  if (g_torch_api != nullptr) {
    g_torch_resolved = true;  // the capsule's table is static: keep the capsule forever
    return;
  }
  Py_XDECREF(capsule);
  PyObject* c = PyObject_GetAttr(torch, g_str.c);
  if (c != nullptr) {
    g_torch_raw_stream = PyObject_GetAttr(c, g_str.cuda_get_current_raw_stream);
    Py_DECREF(c);
  }
  if (g_torch_raw_stream == nullptr) PyErr_Clear();
  g_torch_resolved = true;
}

bool StreamFromApi(const DLPackExchangeAPI* api, int device, CUstream* stream) {
  if (api->current_work_stream == nullptr) {
    *stream = nullptr;
    return true;
  }
  void* s = nullptr;
  if (api->current_work_stream(kDLCUDA, device, &s) != 0) {
    if (!PyErr_Occurred()) {
      PyErr_SetString(PyExc_RuntimeError, "the tensor library's current_work_stream failed");
    }
    return false;
  }
  *stream = static_cast<CUstream>(s);
  return true;
}

// The stream of a call that named none: see launcher.h.
bool DefaultStream(const RuntimeState& rt, const DLPackExchangeAPI* api, int device,
                   CUstream* stream) {
  if (api != nullptr) return StreamFromApi(api, device, stream);
  *stream = nullptr;  // the legacy default stream
  ResolveTorch();
  if (g_torch_api == nullptr && g_torch_raw_stream == nullptr) return true;
  if (device < 0) {
    bool have_context = false;
    if (!CurrentDevice(*rt.driver, -1, &device, &have_context)) return false;
    if (!have_context) return true;  // the launch will report the missing context
  }
  if (g_torch_api != nullptr) return StreamFromApi(g_torch_api, device, stream);
  PyObject* dev = PyLong_FromLong(device);
  if (dev == nullptr) return false;
  PyObject* s = PyObject_CallOneArg(g_torch_raw_stream, dev);
  Py_DECREF(dev);
  if (s == nullptr) return false;
  *stream = reinterpret_cast<CUstream>(PyLong_AsVoidPtr(s));
  Py_DECREF(s);
  return !PyErr_Occurred();
}

// A `stream=` value: an int CUstream, an object with `.cuda_stream` (torch.cuda.Stream) or
// `__cuda_stream__()` (the CUDA Python stream protocol: (version, handle)).
bool ParseStream(PyObject* o, CUstream* stream) {
  PyObject* handle = nullptr;
  if (PyLong_Check(o) && !PyBool_Check(o)) {
    handle = Py_NewRef(o);
  } else if (PyObject_HasAttr(o, g_str.cuda_stream)) {
    handle = PyObject_GetAttr(o, g_str.cuda_stream);
  } else if (PyObject_HasAttr(o, g_str.cuda_stream_protocol)) {
    PyObject* t = PyObject_CallMethodNoArgs(o, g_str.cuda_stream_protocol);
    if (t == nullptr) return false;
    if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != 2) {
      Py_DECREF(t);
      PyErr_SetString(PyExc_TypeError, "__cuda_stream__() must return (version, handle)");
      return false;
    }
    handle = Py_NewRef(PyTuple_GET_ITEM(t, 1));
    Py_DECREF(t);
  } else {
    PyErr_Format(PyExc_TypeError,
                 "stream= takes an int CUstream, a torch.cuda.Stream or an object with "
                 "__cuda_stream__(); got %.200s",
                 Py_TYPE(o)->tp_name);
    return false;
  }
  if (handle == nullptr) return false;
  if (!PyLong_Check(handle)) {
    PyErr_Format(PyExc_TypeError, "stream handle must be an int, got %.200s",
                 Py_TYPE(handle)->tp_name);
    Py_DECREF(handle);
    return false;
  }
  const unsigned long long v = PyLong_AsUnsignedLongLong(handle);
  Py_DECREF(handle);
  if (v == static_cast<unsigned long long>(-1) && PyErr_Occurred()) {
    PyErr_Clear();
    ValueErrorF("stream handle does not fit an unsigned 64-bit pointer");
    return false;
  }
  *stream = reinterpret_cast<CUstream>(static_cast<uintptr_t>(v));
  return true;
}

// ---------------------------------------------------------------- argument conversion

// How objects of one Python type give a device pointer. Looked up once per type.
enum class Source : uint8_t { kExchange, kDataPtr, kDLPack, kNone };
struct TypeEntry {
  PyTypeObject* type = nullptr;  // strong
  Source source = Source::kNone;
  bool has_dlpack_device = false;
  const DLPackExchangeAPI* api = nullptr;
  PyObject* capsule = nullptr;  // strong; owns `api`'s table for its producer
};
constexpr size_t kTypeCacheSize = 8;
std::array<TypeEntry, kTypeCacheSize> g_types;
size_t g_types_next = 0;

const TypeEntry* LookupType(PyTypeObject* type) {
  for (const TypeEntry& e : g_types) {
    if (e.type == type) return &e;
  }
  TypeEntry e;
  PyObject* t = reinterpret_cast<PyObject*>(type);
  PyObject* capsule = PyObject_GetAttr(t, g_str.exchange_api);
  if (capsule == nullptr) PyErr_Clear();
  e.api = ApiFromCapsule(capsule);
  if (e.api != nullptr) {
    e.source = Source::kExchange;
    e.capsule = capsule;
  } else {
    Py_XDECREF(capsule);
    if (PyObject_HasAttr(t, g_str.data_ptr)) {
      e.source = Source::kDataPtr;
    } else if (PyObject_HasAttr(t, g_str.dlpack)) {
      e.source = Source::kDLPack;
    }
  }
  e.has_dlpack_device = PyObject_HasAttr(t, g_str.dlpack_device);
  if (e.source == Source::kNone) return nullptr;  // not cached: rare, and an error
  e.type = reinterpret_cast<PyTypeObject*>(Py_NewRef(t));
  TypeEntry& slot = g_types[g_types_next++ % kTypeCacheSize];
  Py_XDECREF(slot.type);
  Py_XDECREF(slot.capsule);
  slot = e;
  return &slot;
}

// What one call accumulates while converting its arguments.
struct CallState {
  const RuntimeState* rt;
  DescStorage* descs = nullptr;  // the call's TensorDescs (tensordesc arguments)
  CUstream explicit_stream = nullptr;
  bool has_explicit_stream = false;
  PyObject* scratch = nullptr;  // borrowed: the call's scratch= (None: the kernel's default)
  PyObject* grid = nullptr;     // borrowed: the call's grid= (None: as if not given)
  const DLPackExchangeAPI* api = nullptr;  // of the first tensor read through one
  int device = -1;                         // the current device, once a tensor needed it
};

// Prefix of every argument message: "kernel 'k': argument 2 ('out', *fp32)".
std::string ArgLabel(const KernelPlan& p, size_t i) {
  return "kernel '" + p.name + "': argument " + std::to_string(i) + " ('" + p.params[i].name +
         "', " + p.params[i].type + ")";
}

PyObject* ArgTypeError(const KernelPlan& p, size_t i, const char* expected, PyObject* got) {
  PyErr_Format(PyExc_TypeError, "%s expects %s; got %.200s", ArgLabel(p, i).c_str(), expected,
               Py_TYPE(got)->tp_name);
  return nullptr;
}

// The failure (or first-tensor) half of CheckTensor: queries the current device once
// per call, and builds the messages.
ABSL_ATTRIBUTE_NOINLINE bool CheckTensorSlow(const KernelPlan& p, size_t i, int32_t device_type,
                                             int32_t device_id, const DLDataType* dtype,
                                             CallState* st) {
  if (device_type != kDLCUDA && device_type != kDLCUDAManaged) {
    const char* where = device_type == kDLCPU        ? "on the CPU"
                        : device_type == kDLCUDAHost ? "in pinned host memory"
                                                     : "not on a CUDA device";
    ValueErrorF("%s: the tensor is %s (DLPack device type %d); kpack launches on CUDA devices",
                ArgLabel(p, i).c_str(), where, static_cast<int>(device_type));
    return false;
  }
  if (st->device < 0) {
    bool have_context = false;
    if (!CurrentDevice(*st->rt->driver, device_id, &st->device, &have_context)) return false;
  }
  if (device_type == kDLCUDA && device_id != st->device) {
    ValueErrorF("%s: the tensor is on cuda:%d but the current device is cuda:%d (use "
                "torch.cuda.set_device or `with torch.cuda.device(...)`)",
                ArgLabel(p, i).c_str(), static_cast<int>(device_id), st->device);
    return false;
  }
  const ParamPlan& param = p.params[i];
  if (dtype != nullptr && param.check_dtype &&
      (dtype->code != param.dtype.code || dtype->bits != param.dtype.bits || dtype->lanes != 1)) {
    PyErr_Format(PyExc_TypeError, "%s: the tensor's dtype is %s (DLPack code %d, %d bits, %d "
                 "lanes) but the kernel was compiled for %s",
                 ArgLabel(p, i).c_str(), DTypeName(*dtype), dtype->code, dtype->bits,
                 dtype->lanes, param.type.c_str());
    return false;
  }
  return true;
}

// A tensor's device and dtype against the parameter and the current device.
ABSL_ATTRIBUTE_ALWAYS_INLINE inline bool CheckTensor(const KernelPlan& p, size_t i,
                                                     int32_t device_type, int32_t device_id,
                                                     const DLDataType* dtype, CallState* st) {
  const ParamPlan& param = p.params[i];
  if (ABSL_PREDICT_TRUE(device_type == kDLCUDA && device_id == st->device &&
                        (dtype == nullptr || !param.check_dtype ||
                         (dtype->code == param.dtype.code && dtype->bits == param.dtype.bits &&
                          dtype->lanes == 1)))) {
    return true;
  }
  return CheckTensorSlow(p, i, device_type, device_id, dtype, st);
}

ABSL_ATTRIBUTE_ALWAYS_INLINE inline bool PointerFromDLTensor(const KernelPlan& p, size_t i,
                                                             const DLTensor& t, CallState* st,
                                                             uint64_t* ptr) {
  if (!CheckTensor(p, i, t.device.device_type, t.device.device_id, &t.dtype, st)) return false;
  *ptr = reinterpret_cast<uintptr_t>(t.data) + t.byte_offset;
  return true;
}

// The slow sources: `data_ptr()` (plus `__dlpack_device__()` when offered) and
// `__dlpack__()`.
bool PointerFromDataPtr(const KernelPlan& p, size_t i, PyObject* o, const TypeEntry& e,
                        CallState* st, uint64_t* ptr) {
  if (e.has_dlpack_device) {
    PyObject* dev = PyObject_CallMethodNoArgs(o, g_str.dlpack_device);
    if (dev == nullptr) return false;
    long type = -1, id = -1;
    if (PyTuple_Check(dev) && PyTuple_GET_SIZE(dev) == 2) {
      type = PyLong_AsLong(PyTuple_GET_ITEM(dev, 0));
      id = PyLong_AsLong(PyTuple_GET_ITEM(dev, 1));
    }
    Py_DECREF(dev);
    if (PyErr_Occurred()) return false;
    if (!CheckTensor(p, i, static_cast<int32_t>(type), static_cast<int32_t>(id), nullptr, st)) {
      return false;
    }
  }
  PyObject* r = PyObject_CallMethodNoArgs(o, g_str.data_ptr);
  if (r == nullptr) return false;
  if (!PyLong_Check(r)) {
    PyErr_Format(PyExc_TypeError, "%s: data_ptr() returned %.200s, not an int",
                 ArgLabel(p, i).c_str(), Py_TYPE(r)->tp_name);
    Py_DECREF(r);
    return false;
  }
  *ptr = PyLong_AsUnsignedLongLong(r);
  Py_DECREF(r);
  if (PyErr_Occurred()) {
    PyErr_Clear();
    ValueErrorF("%s: data_ptr() is not an unsigned 64-bit address", ArgLabel(p, i).c_str());
    return false;
  }
  return true;
}

bool PointerFromDLPack(const KernelPlan& p, size_t i, PyObject* o, CallState* st, uint64_t* ptr) {
  PyObject* capsule;
  if (st->has_explicit_stream) {
    // The protocol's stream argument: the stream the consumer will use (1: legacy default).
    PyObject* s = PyLong_FromVoidPtr(st->explicit_stream != nullptr ? st->explicit_stream
                                                                     : reinterpret_cast<void*>(1));
    if (s == nullptr) return false;
    PyObject* kwnames = PyTuple_Pack(1, g_str.stream);
    PyObject* call_args[] = {o, s};
    capsule = kwnames == nullptr ? nullptr
                                 : PyObject_VectorcallMethod(g_str.dlpack, call_args,
                                                             1 | PY_VECTORCALL_ARGUMENTS_OFFSET,
                                                             kwnames);
    Py_XDECREF(kwnames);
    Py_DECREF(s);
  } else {
    capsule = PyObject_CallMethodNoArgs(o, g_str.dlpack);
  }
  if (capsule == nullptr) return false;
  // Read, not consumed: the capsule's destructor returns the tensor to its producer (the
  // memory stays valid because `o` lives through the launch). The capsule goes before any
  // error is raised: its destructor may run Python code.
  DLTensor t{};
  bool have = false;
  if (PyCapsule_IsValid(capsule, "dltensor")) {
    t = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, "dltensor"))->dl_tensor;
    have = true;
  } else if (PyCapsule_IsValid(capsule, "dltensor_versioned")) {
    t = static_cast<DLManagedTensorVersioned*>(PyCapsule_GetPointer(capsule, "dltensor_versioned"))
            ->dl_tensor;
    have = true;
  }
  Py_DECREF(capsule);
  if (PyErr_Occurred()) return false;
  if (!have) {
    PyErr_Format(PyExc_TypeError, "%s: __dlpack__() returned no DLPack capsule",
                 ArgLabel(p, i).c_str());
    return false;
  }
  return PointerFromDLTensor(p, i, t, st, ptr);
}

ABSL_ATTRIBUTE_NOINLINE bool ConvertPointerSlow(const KernelPlan& p, size_t i, PyObject* o,
                                                CallState* st, Arg* out) {
  uint64_t ptr = 0;
  if (PyLong_Check(o) && !PyBool_Check(o)) {  // a raw device pointer
    ptr = PyLong_AsUnsignedLongLong(o);
    if (ptr == static_cast<uint64_t>(-1) && PyErr_Occurred()) {
      PyErr_Clear();
      ValueErrorF("%s: the int %R is not a device address (0 to 2**64-1)",
                  ArgLabel(p, i).c_str(), o);
      return false;
    }
    *out = Arg(static_cast<CUdeviceptr>(ptr));
    return true;
  }
  const TypeEntry* found = LookupType(Py_TYPE(o));
  if (found == nullptr) {
    if (PyErr_Occurred()) return false;
    ArgTypeError(p, i,
                 "a CUDA tensor (an object with __dlpack_c_exchange_api__, data_ptr() or "
                 "__dlpack__()) or an int device pointer",
                 o);
    return false;
  }
  // A copy: the Python calls below (data_ptr(), __dlpack__()) may launch kernels and so
  // reuse the cache slot. The type and capsule stay alive through `o`.
  const TypeEntry e = *found;
  bool ok;
  switch (e.source) {
    case Source::kExchange: {
      const DLPackExchangeAPI* api = e.api;
      if (api->dltensor_from_py_object_no_sync != nullptr) {
        DLTensor t;
        ok = api->dltensor_from_py_object_no_sync(o, &t) == 0 &&
             PointerFromDLTensor(p, i, t, st, &ptr);
      } else {
        DLManagedTensorVersioned* m = nullptr;
        ok = api->managed_tensor_from_py_object_no_sync(o, &m) == 0;
        if (ok) {
          ok = PointerFromDLTensor(p, i, m->dl_tensor, st, &ptr);
          if (m->deleter != nullptr) m->deleter(m);
        }
      }
      if (ok && st->api == nullptr) st->api = api;
      break;
    }
    case Source::kDataPtr:
      ok = PointerFromDataPtr(p, i, o, e, st, &ptr);
      break;
    case Source::kDLPack:
      ok = PointerFromDLPack(p, i, o, st, &ptr);
      break;
    default:
      ok = false;
  }
  if (!ok) {
    if (!PyErr_Occurred()) {
      PyErr_Format(PyExc_RuntimeError, "%s: the tensor could not be read", ArgLabel(p, i).c_str());
    }
    return false;
  }
  *out = Arg(static_cast<CUdeviceptr>(ptr));
  return true;
}

// The common case inline: a tensor whose type is the first one in the cache (in practice
// torch.Tensor) and has `dltensor_from_py_object_no_sync`.
ABSL_ATTRIBUTE_ALWAYS_INLINE inline bool ConvertPointer(const KernelPlan& p, size_t i, PyObject* o,
                                                        CallState* st, Arg* out) {
  const TypeEntry& first = g_types[0];
  if (ABSL_PREDICT_TRUE(Py_TYPE(o) == first.type && first.source == Source::kExchange &&
                        first.api->dltensor_from_py_object_no_sync != nullptr)) {
    DLTensor t;
    uint64_t ptr;
    if (ABSL_PREDICT_FALSE(first.api->dltensor_from_py_object_no_sync(o, &t) != 0)) return false;
    if (ABSL_PREDICT_FALSE(!PointerFromDLTensor(p, i, t, st, &ptr))) return false;
    if (st->api == nullptr) st->api = first.api;
    *out = Arg(static_cast<CUdeviceptr>(ptr));
    return true;
  }
  return ConvertPointerSlow(p, i, o, st, out);
}

// Objects that must not pass as numbers: reading a tensor's value would synchronize.
bool LooksLikeTensor(PyObject* o) {
  PyObject* t = reinterpret_cast<PyObject*>(Py_TYPE(o));
  return PyObject_HasAttr(t, g_str.dlpack) || PyObject_HasAttr(t, g_str.data_ptr);
}

ABSL_ATTRIBUTE_NOINLINE bool ConvertIntSlow(const KernelPlan& p, size_t i, PyObject* o,
                                            Arg* out) {
  PyObject* v = nullptr;
  if (PyLong_Check(o) && !PyBool_Check(o)) {
    v = Py_NewRef(o);
  } else if (!PyBool_Check(o) && Py_TYPE(o)->tp_as_number != nullptr &&
             Py_TYPE(o)->tp_as_number->nb_index != nullptr && !LooksLikeTensor(o)) {
    v = PyNumber_Index(o);  // numpy integers
    if (v == nullptr) return false;
  } else {
    ArgTypeError(p, i, "an int", o);
    return false;
  }
  int overflow = 0;
  const long long s = PyLong_AsLongLongAndOverflow(v, &overflow);
  if (overflow == 0) {
    Py_DECREF(v);
    if (s == -1 && PyErr_Occurred()) return false;
    *out = Arg(static_cast<int64_t>(s));
    return true;
  }
  const unsigned long long u = overflow > 0 ? PyLong_AsUnsignedLongLong(v) : 0;
  if (overflow < 0 || (u == static_cast<unsigned long long>(-1) && PyErr_Occurred())) {
    PyErr_Clear();
    ValueErrorF("%s: %R does not fit a 64-bit integer", ArgLabel(p, i).c_str(), v);
    Py_DECREF(v);
    return false;
  }
  Py_DECREF(v);
  *out = Arg(static_cast<uint64_t>(u));
  return true;
}

ABSL_ATTRIBUTE_ALWAYS_INLINE inline bool ConvertInt(const KernelPlan& p, size_t i, PyObject* o,
                                                    Arg* out) {
#if PY_VERSION_HEX >= 0x030C0000
  // An int that fits a machine word (the common case) without a call into CPython.
  if (ABSL_PREDICT_TRUE(PyLong_CheckExact(o) &&
                        PyUnstable_Long_IsCompact(reinterpret_cast<PyLongObject*>(o)))) {
    *out = Arg(static_cast<int64_t>(
        PyUnstable_Long_CompactValue(reinterpret_cast<PyLongObject*>(o))));
    return true;
  }
#endif
  return ConvertIntSlow(p, i, o, out);
}

ABSL_ATTRIBUTE_NOINLINE bool ConvertFloatSlow(const KernelPlan& p, size_t i, PyObject* o,
                                              Arg* out) {
  double d;
  if (PyFloat_Check(o)) {
    d = PyFloat_AS_DOUBLE(o);
  } else if (PyLong_Check(o) && !PyBool_Check(o)) {
    d = PyLong_AsDouble(o);
    if (d == -1.0 && PyErr_Occurred()) {
      PyErr_Clear();
      ValueErrorF("%s: %R is too large for a float", ArgLabel(p, i).c_str(), o);
      return false;
    }
  } else if (!PyBool_Check(o) && Py_TYPE(o)->tp_as_number != nullptr &&
             Py_TYPE(o)->tp_as_number->nb_float != nullptr && !LooksLikeTensor(o)) {
    d = PyFloat_AsDouble(o);  // numpy floats
    if (d == -1.0 && PyErr_Occurred()) return false;
  } else {
    ArgTypeError(p, i, "a float", o);
    return false;
  }
  *out = Arg(d);
  return true;
}

ABSL_ATTRIBUTE_ALWAYS_INLINE inline bool ConvertFloat(const KernelPlan& p, size_t i,
                                                      PyObject* o, Arg* out) {
  if (ABSL_PREDICT_TRUE(PyFloat_CheckExact(o))) {
    *out = Arg(PyFloat_AS_DOUBLE(o));
    return true;
  }
  return ConvertFloatSlow(p, i, o, out);
}

// A tensordesc argument: a TensorDescriptor read into the call's storage (tensordesc.h),
// its base converted like a pointer argument (device and element type checked).
ABSL_ATTRIBUTE_NOINLINE bool ConvertDesc(const KernelPlan& p, size_t i, PyObject* o,
                                         CallState* st, Arg* out) {
  const ParamPlan& param = p.params[i];
  auto* desc = new (st->descs->slot(param.desc_index)) TensorDesc();
  PyObject* base = ReadTensorDescriptor(o, param.desc_rank, ArgLabel(p, i), desc);
  if (base == nullptr) return false;
  Arg pointer(0);
  const bool ok = ConvertPointer(p, i, base, st, &pointer);
  Py_DECREF(base);
  if (!ok) return false;
  desc->base = pointer.bits();
  *out = Arg(*desc);
  return true;
}

ABSL_ATTRIBUTE_ALWAYS_INLINE inline bool ConvertArg(const KernelPlan& p, size_t i, PyObject* o,
                                                    CallState* st, Arg* out) {
  switch (p.params[i].kind) {
    case ParamKind::kTensorDesc:
      return ConvertDesc(p, i, o, st, out);
    case ParamKind::kPointer:
      return ConvertPointer(p, i, o, st, out);
    case ParamKind::kInt:
      return ConvertInt(p, i, o, out);
    case ParamKind::kFloat:
      return ConvertFloat(p, i, o, out);
    case ParamKind::kBool:
      if (!PyBool_Check(o)) {
        ArgTypeError(p, i, "a bool", o);
        return false;
      }
      *out = Arg(o == Py_True);
      return true;
  }
  return false;
}

// ---------------------------------------------------------------- calls

PyObject* BoundVectorcall(PyObject* self, PyObject* const* args, size_t nargsf, PyObject* kwnames);

// A call's arguments: the objects in parameter order (borrowed) and their conversions.
// Inline storage covers every realistic kernel; more arguments than kInlineArgs take the
// heap (such calls are then not allocation-free).
constexpr size_t kInlineArgs = 40;
class CallArgs {
 public:
  CallArgs(size_t n, size_t descs) : n_(n), descs_(descs) {
    if (ABSL_PREDICT_FALSE(n > kInlineArgs)) {
      heap_.reset(new Slot[n]);
      args_ = reinterpret_cast<Arg*>(heap_.get());
      objects_ = reinterpret_cast<PyObject**>(heap_.get() + n);
    }
  }
  CallArgs(const CallArgs&) = delete;
  CallArgs& operator=(const CallArgs&) = delete;

  Arg* args() { return args_; }
  PyObject** objects() { return objects_; }
  DescStorage* descs() { return &descs_; }
  std::span<const Arg> span() { return std::span<const Arg>(args_, n_); }

 private:
  // Arg has no default constructor; it is trivially copyable, so raw storage will do.
  struct alignas(Arg) Slot {
    unsigned char bytes[sizeof(Arg)];
  };
  static_assert(sizeof(Slot) >= sizeof(PyObject*));
  size_t n_;
  Slot inline_args_[kInlineArgs];
  PyObject* inline_objects_[kInlineArgs];
  Arg* args_ = reinterpret_cast<Arg*>(inline_args_);
  PyObject** objects_ = inline_objects_;
  std::unique_ptr<Slot[]> heap_;  // 2n slots: n Args, then n object pointers
  DescStorage descs_;             // what descriptor Args point at
};

// Orders positional and keyword arguments by parameter into `a.objects()`; `stream=`
// goes to `st`. False with a TypeError set.
ABSL_ATTRIBUTE_NOINLINE bool CollectArgs(const KernelPlan& p, PyObject* const* args, size_t nargs,
                                         PyObject* kwnames, CallState* st, CallArgs* a) {
  const size_t n = p.params.size();
  PyObject** objects = a->objects();
  if (nargs > n || (kwnames == nullptr && nargs < n)) {
    PyErr_Format(PyExc_TypeError, "kernel '%s' takes %zu arguments (%s), got %zu", p.name.c_str(),
                 n, p.meta.signature.c_str(), nargs);
    return false;
  }
  for (size_t i = 0; i < n; ++i) objects[i] = i < nargs ? args[i] : nullptr;
  PyObject* stream_obj = nullptr;
  const Py_ssize_t nkw = kwnames == nullptr ? 0 : PyTuple_GET_SIZE(kwnames);
  for (Py_ssize_t k = 0; k < nkw; ++k) {
    PyObject* key = PyTuple_GET_ITEM(kwnames, k);
    PyObject* value = args[nargs + k];
    if (PyUnicode_Compare(key, g_str.stream_kw) == 0) {
      stream_obj = value;
      continue;
    }
    if (PyUnicode_Compare(key, g_str.scratch_kw) == 0) {
      st->scratch = value;
      continue;
    }
    if (PyUnicode_Compare(key, g_str.grid_kw) == 0) {
      st->grid = value;
      continue;
    }
    size_t i = 0;
    while (i < n && PyUnicode_Compare(key, p.params[i].py_name) != 0) ++i;
    if (i == n) {
      std::string hint = p.meta.KeywordHint(PyUnicode_AsUTF8(key));
      PyErr_Format(PyExc_TypeError, "kernel '%s' got an unexpected keyword argument %R%s",
                   p.name.c_str(), key, hint.c_str());
      return false;
    }
    if (objects[i] != nullptr) {
      PyErr_Format(PyExc_TypeError, "kernel '%s' got multiple values for argument '%s'",
                   p.name.c_str(), p.params[i].name.c_str());
      return false;
    }
    objects[i] = value;
  }
  for (size_t i = 0; i < n; ++i) {
    if (objects[i] == nullptr) {
      PyErr_Format(PyExc_TypeError, "kernel '%s' takes %zu arguments (%s): missing '%s'",
                   p.name.c_str(), n, p.meta.signature.c_str(), p.params[i].name.c_str());
      return false;
    }
  }
  if (stream_obj != nullptr && stream_obj != Py_None) {
    if (!ParseStream(stream_obj, &st->explicit_stream)) return false;
    st->has_explicit_stream = true;
  }
  return true;
}

// Converts a call's arguments into `a` (and the stream into `st`). The common call --
// positional arguments only, the right count -- reads the vectorcall array directly, and
// copies the objects into `a` only when `keep_objects` (a callable grid, bind).
ABSL_ATTRIBUTE_ALWAYS_INLINE inline bool PrepareCall(const KernelPlan& p, PyObject* const* args,
                                                     size_t nargs, PyObject* kwnames,
                                                     bool keep_objects, CallState* st,
                                                     CallArgs* a) {
  const size_t n = p.params.size();
  PyObject* const* objects = args;
  st->descs = a->descs();
  if (ABSL_PREDICT_FALSE(kwnames != nullptr || nargs != n)) {
    if (!CollectArgs(p, args, nargs, kwnames, st, a)) return false;
    objects = a->objects();
  } else if (keep_objects) {
    std::copy_n(args, n, a->objects());
  }
  Arg* out = a->args();
  for (size_t i = 0; i < n; ++i) {
    if (ABSL_PREDICT_FALSE(!ConvertArg(p, i, objects[i], st, &out[i]))) return false;
  }
  return true;
}

bool ResolveStream(const RuntimeState& rt, CallState* st, CUstream* stream) {
  if (st->has_explicit_stream) {
    *stream = st->explicit_stream;
    return true;
  }
  return DefaultStream(rt, st->api, st->device, stream);
}

// ---------------------------------------------------------------- scratch from Python

// scratch=: a callable `scratch(nbytes, align, stream)` that kpack asks, through a
// kpack::ScratchAllocator, for each launch's Triton scratch memory (once per scratch kind
// the chosen variant has; `stream` is the launch's CUstream as an int). It returns an int
// device address, which stays the caller's (kpack never frees it), or an object with
// data_ptr() (a tensor, say), which kpack holds until the launch has been issued and then
// releases: with a stream-ordered allocator -- torch's caching allocator, allocating on
// `stream` -- that is safe, as the memory is reused only by work ordered after the launch.
// An exception from the callable propagates out of the launch (nothing launched).
struct PyScratch {
  PyObject* fn = nullptr;  // borrowed from the call, or held by the bound launch
  PyObject* kept[2] = {nullptr, nullptr};
  bool failed = false;

  // Drops what the last launch kept (with any pending exception preserved: releasing may
  // run Python code, e.g. a caching allocator's free).
  void Release() {
    if (kept[0] == nullptr && kept[1] == nullptr) return;
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    Py_CLEAR(kept[0]);
    Py_CLEAR(kept[1]);
    PyErr_Restore(type, value, tb);
  }
};

CUdeviceptr ScratchFromPython(size_t bytes, size_t align, CUstream stream, void* user_data) {
  auto* s = static_cast<PyScratch*>(user_data);
  if (s->failed) return 0;
  PyObject* r = PyObject_CallFunction(s->fn, "nnK", static_cast<Py_ssize_t>(bytes),
                                      static_cast<Py_ssize_t>(align),
                                      static_cast<unsigned long long>(  // NOLINT(runtime/int)
                                          reinterpret_cast<uintptr_t>(stream)));
  if (r == nullptr) {
    s->failed = true;
    return 0;
  }
  unsigned long long ptr = 0;  // NOLINT(runtime/int)
  if (PyLong_Check(r) && !PyBool_Check(r)) {
    ptr = PyLong_AsUnsignedLongLong(r);
    Py_DECREF(r);
  } else {
    PyObject* address = PyObject_CallMethodNoArgs(r, g_str.data_ptr);
    if (address == nullptr || !PyLong_Check(address)) {
      if (address != nullptr) {
        PyErr_Format(PyExc_TypeError, "scratch allocator: data_ptr() returned %.200s, not an int",
                     Py_TYPE(address)->tp_name);
        Py_DECREF(address);
      } else if (PyErr_ExceptionMatches(PyExc_AttributeError)) {
        PyErr_Format(PyExc_TypeError, "scratch allocator returned %.200s; expected an int device "
                     "address or an object with data_ptr()", Py_TYPE(r)->tp_name);
      }
      Py_DECREF(r);
      s->failed = true;
      return 0;
    }
    ptr = PyLong_AsUnsignedLongLong(address);
    Py_DECREF(address);
    // Held until the launch is issued (at most one object per scratch kind).
    PyObject*& slot = s->kept[0] == nullptr ? s->kept[0] : s->kept[1];
    Py_XSETREF(slot, r);
  }
  if (PyErr_Occurred()) {
    s->failed = true;
    return 0;
  }
  return static_cast<CUdeviceptr>(ptr);
}

// The launch's result: None, or the exception -- the scratch callable's own, when it is
// why the launch failed.
PyObject* LaunchResult(const absl::Status& status, PyScratch* scratch) {
  if (scratch != nullptr) scratch->Release();
  if (ABSL_PREDICT_TRUE(status.ok())) Py_RETURN_NONE;
  if (scratch != nullptr && scratch->failed && PyErr_Occurred()) return nullptr;
  return RaiseStatus(status);
}

// kpack.open(preload="first_use"): loads every variant at the first launch on a device.
bool MaybePreload(RuntimeState* rt, int device) {
  if (ABSL_PREDICT_TRUE(!rt->preload_on_first_use) || device < 0 || device >= 64 ||
      (rt->preloaded_devices >> device & 1) != 0) {
    return true;
  }
  if (absl::Status s = rt->runtime.Preload(); !s.ok()) {
    RaiseStatus(s);
    return false;
  }
  rt->preloaded_devices |= uint64_t{1} << device;
  return true;
}

// A grid value: an int, or a tuple/list of 1-3 ints. False with an exception set.
bool ParseGrid(PyObject* o, Grid* grid) {
  std::array<uint32_t, 3> dims{1, 1, 1};
  auto dim = [&](PyObject* v, int axis) {
    if (PyBool_Check(v) || !PyIndex_Check(v)) {
      PyErr_Format(PyExc_TypeError, "grid: axis %d is %.200s, not an int", axis,
                   Py_TYPE(v)->tp_name);
      return false;
    }
    PyObject* iv = PyNumber_Index(v);
    if (iv == nullptr) return false;
    int overflow = 0;
    const long long x = PyLong_AsLongLongAndOverflow(iv, &overflow);
    Py_DECREF(iv);
    if (overflow != 0 || x < 0 || x > std::numeric_limits<uint32_t>::max()) {
      ValueErrorF("grid: axis %d is %R, outside [0, 2**32)", axis, v);
      return false;
    }
    if (x == -1 && PyErr_Occurred()) return false;
    dims[axis] = static_cast<uint32_t>(x);
    return true;
  };
  if (PyTuple_Check(o) || PyList_Check(o)) {
    const Py_ssize_t size = PySequence_Fast_GET_SIZE(o);
    if (size < 1 || size > 3) {
      ValueErrorF("grid must have 1 to 3 axes, got %zd", size);
      return false;
    }
    PyObject** items = PySequence_Fast_ITEMS(o);
    for (Py_ssize_t a = 0; a < size; ++a) {
      if (!dim(items[a], static_cast<int>(a))) return false;
    }
  } else if (!dim(o, 0)) {
    return false;
  }
  *grid = Grid{dims[0], dims[1], dims[2]};
  return true;
}

// A callable grid's value for these arguments: Triton calls `grid(meta)` with the launch's
// named arguments, the chosen variant's constexprs and launch options (meta.h).
bool EvalGridFn(const KernelObject* k, PyObject* grid_fn, std::span<const Arg> args,
                PyObject* const* objects, Grid* grid) {
  PyObject* meta = k->plan->meta.GridMeta(k->plan->kernel, args, objects);
  if (meta == nullptr) return false;
  PyObject* r = PyObject_CallOneArg(grid_fn, meta);
  Py_DECREF(meta);
  if (r == nullptr) return false;
  const bool ok = ParseGrid(r, grid);
  Py_DECREF(r);
  return ok;
}

// A call's grid= (None: as if not given), merged into the kernel[grid] it may not also
// have: k(*args, grid=g) is k[g](*args). `storage` holds a parsed grid. False with an
// exception set.
bool GridKeyword(const KernelPlan& p, const CallState& st, const Grid** grid, PyObject** grid_fn,
                 Grid* storage) {
  if (st.grid == nullptr || st.grid == Py_None) return true;
  if (*grid != nullptr || *grid_fn != nullptr) {
    PyErr_Format(PyExc_TypeError, "kernel '%s': grid given twice (kernel[grid] and grid=)",
                 p.name.c_str());
    return false;
  }
  if (PyCallable_Check(st.grid)) {
    *grid_fn = st.grid;
    return true;
  }
  if (!ParseGrid(st.grid, storage)) return false;
  *grid = storage;
  return true;
}

// The scratch callable of a call: its scratch= (None: none), else the kernel's default.
PyObject* ScratchFn(const KernelObject* k, const CallState& st) {
  if (st.scratch != nullptr) return st.scratch == Py_None ? nullptr : st.scratch;
  return k->scratch;
}

PyObject* LaunchCall(KernelObject* k, const Grid* grid, PyObject* grid_fn, PyObject* const* args,
                     size_t nargs, PyObject* kwnames) {
  const KernelPlan& p = *k->plan;
  CallArgs a(p.params.size(), p.num_descs);
  CallState st{k->rt};
  if (!PrepareCall(p, args, nargs, kwnames, grid_fn != nullptr, &st, &a)) return nullptr;
  CUstream stream;
  if (!ResolveStream(*k->rt, &st, &stream)) return nullptr;
  if (!MaybePreload(k->rt, st.device)) return nullptr;
  Grid g;
  if (!GridKeyword(p, st, &grid, &grid_fn, &g)) return nullptr;
  if (grid_fn != nullptr) {
    if (!EvalGridFn(k, grid_fn, a.span(), a.objects(), &g)) return nullptr;
    grid = &g;
  }
  PyObject* scratch_fn = ScratchFn(k, st);
  if (ABSL_PREDICT_TRUE(scratch_fn == nullptr)) {
    const absl::Status s = grid != nullptr ? p.kernel.LaunchArgs(*grid, stream, a.span())
                                           : p.kernel.LaunchArgs(stream, a.span());
    if (ABSL_PREDICT_FALSE(!s.ok())) return RaiseStatus(s);
    Py_RETURN_NONE;
  }
  PyScratch scratch;
  scratch.fn = scratch_fn;
  const ScratchAllocator allocator{ScratchFromPython, &scratch};
  const absl::Status s = grid != nullptr ? p.kernel.LaunchArgs(*grid, stream, a.span(), allocator)
                                         : p.kernel.LaunchArgs(stream, a.span(), allocator);
  return LaunchResult(s, &scratch);
}

PyObject* KernelVectorcall(PyObject* self, PyObject* const* args, size_t nargsf,
                           PyObject* kwnames) {
  return LaunchCall(reinterpret_cast<KernelObject*>(self), nullptr, nullptr, args,
                    PyVectorcall_NARGS(nargsf), kwnames);
}

PyObject* GridVectorcall(PyObject* self, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
  auto* g = reinterpret_cast<GridObject*>(self);
  return LaunchCall(g->kernel, &g->grid, g->grid_fn, args, PyVectorcall_NARGS(nargsf), kwnames);
}

// ---------------------------------------------------------------- bind

PyObject* BindCall(KernelObject* k, const Grid* grid, PyObject* grid_fn, PyObject* const* args,
                   size_t nargs, PyObject* kwnames) {
  const KernelPlan& p = *k->plan;
  const size_t n = p.params.size();
  CallArgs a(n, p.num_descs);
  CallState st{k->rt};
  if (!PrepareCall(p, args, nargs, kwnames, true, &st, &a)) return nullptr;
  CUstream stream;
  if (!ResolveStream(*k->rt, &st, &stream)) return nullptr;
  if (!MaybePreload(k->rt, st.device)) return nullptr;
  const std::span<const Arg> span = a.span();
  PyObject** objects = a.objects();
  Grid g;
  if (!GridKeyword(p, st, &grid, &grid_fn, &g)) return nullptr;
  if (grid_fn != nullptr) {
    if (!EvalGridFn(k, grid_fn, span, objects, &g)) return nullptr;
    grid = &g;
  }
  absl::StatusOr<BoundLaunch> bound =
      grid != nullptr ? p.kernel.Bind(*grid, stream, span) : p.kernel.Bind(stream, span);
  if (!bound.ok()) return RaiseStatus(bound.status());
  PyObject* kept = PyList_New(static_cast<Py_ssize_t>(n));
  if (kept == nullptr) return nullptr;
  for (size_t i = 0; i < n; ++i) PyList_SET_ITEM(kept, i, Py_NewRef(objects[i]));
  BoundObject* b = PyObject_GC_New(BoundObject, g_bound_type);
  if (b == nullptr) {
    Py_DECREF(kept);
    return nullptr;
  }
  b->vectorcall = nullptr;  // set below, after the members
  b->kernel = reinterpret_cast<KernelObject*>(Py_NewRef(reinterpret_cast<PyObject*>(k)));
  new (&b->bound) std::optional<BoundLaunch>(std::move(*bound));
  b->scratch = nullptr;
  if (PyObject* fn = ScratchFn(k, st); fn != nullptr) {
    b->scratch = new PyScratch;
    b->scratch->fn = Py_NewRef(fn);
    b->bound->set_scratch_allocator({ScratchFromPython, b->scratch});
  }
  b->args = kept;
  b->stream_explicit = st.has_explicit_stream;
  b->api = st.api;
  b->device = st.device;
  b->last_stream = stream;
  b->vectorcall = BoundVectorcall;
  PyObject_GC_Track(reinterpret_cast<PyObject*>(b));
  return reinterpret_cast<PyObject*>(b);
}

PyObject* KernelBind(PyObject* self, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  return BindCall(reinterpret_cast<KernelObject*>(self), nullptr, nullptr, args,
                  static_cast<size_t>(nargs), kwnames);
}

PyObject* GridBind(PyObject* self, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  auto* g = reinterpret_cast<GridObject*>(self);
  return BindCall(g->kernel, &g->grid, g->grid_fn, args, static_cast<size_t>(nargs), kwnames);
}

// b(): relaunches. Unless the stream was given at bind, it follows the current stream
// (torch's, for torch tensors) like an eager call: one C call per launch.
PyObject* BoundVectorcall(PyObject* self, PyObject* const* args, size_t nargsf,
                          PyObject* kwnames) {
  auto* b = reinterpret_cast<BoundObject*>(self);
  if (PyVectorcall_NARGS(nargsf) != 0 || kwnames != nullptr) {
    PyErr_SetString(PyExc_TypeError,
                    "a bound launch takes no arguments; change them with .set(name, value)");
    return nullptr;
  }
  if (!MaybePreload(b->kernel->rt, b->device)) return nullptr;
  if (!b->stream_explicit) {
    CUstream stream;
    if (!DefaultStream(*b->kernel->rt, b->api, b->device, &stream)) return nullptr;
    if (stream != b->last_stream) {
      b->bound->set_stream(stream);
      b->last_stream = stream;
    }
  }
  if (b->scratch != nullptr) b->scratch->failed = false;
  return LaunchResult(b->bound->Launch(), b->scratch);
}

// b.set(name_or_index, value)
PyObject* BoundSet(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  auto* b = reinterpret_cast<BoundObject*>(self);
  const KernelPlan& p = *b->kernel->plan;
  if (nargs != 2) {
    PyErr_SetString(PyExc_TypeError, "set(name_or_index, value) takes 2 arguments");
    return nullptr;
  }
  size_t index = p.params.size();
  if (PyUnicode_Check(args[0])) {
    for (size_t i = 0; i < p.params.size(); ++i) {
      if (PyUnicode_Compare(args[0], p.params[i].py_name) == 0) index = i;
    }
    if (index == p.params.size()) {
      PyErr_Format(PyExc_KeyError, "kernel '%s' has no call parameter %R (%s)", p.name.c_str(),
                   args[0], p.meta.signature.c_str());
      return nullptr;
    }
  } else if (PyLong_Check(args[0]) && !PyBool_Check(args[0])) {
    const Py_ssize_t i = PyLong_AsSsize_t(args[0]);
    if (i == -1 && PyErr_Occurred()) return nullptr;
    if (i < 0 || static_cast<size_t>(i) >= p.params.size()) {
      PyErr_Format(PyExc_IndexError, "kernel '%s' has %zu call parameters; no index %zd",
                   p.name.c_str(), p.params.size(), i);
      return nullptr;
    }
    index = static_cast<size_t>(i);
  } else {
    PyErr_Format(PyExc_TypeError, "set() takes a parameter name or index, got %.200s",
                 Py_TYPE(args[0])->tp_name);
    return nullptr;
  }
  CallState st{b->kernel->rt};
  st.device = b->device;
  DescStorage descs(p.num_descs);  // a descriptor lives until Set has copied it
  st.descs = &descs;
  Arg a(0);
  if (!ConvertArg(p, index, args[1], &st, &a)) return nullptr;
  absl::Status s = b->bound->Set(index, a);
  if (!s.ok()) return RaiseStatus(s);
  PyList_SetItem(b->args, static_cast<Py_ssize_t>(index), Py_NewRef(args[1]));
  if (b->api == nullptr && st.api != nullptr) b->api = st.api;
  if (b->device < 0) b->device = st.device;
  Py_RETURN_NONE;
}

PyObject* BoundSetGrid(PyObject* self, PyObject* grid_obj) {
  auto* b = reinterpret_cast<BoundObject*>(self);
  Grid g;
  if (!ParseGrid(grid_obj, &g)) return nullptr;
  b->bound->set_grid(g);
  Py_RETURN_NONE;
}

PyObject* BoundSetStream(PyObject* self, PyObject* stream_obj) {
  auto* b = reinterpret_cast<BoundObject*>(self);
  if (stream_obj == Py_None) {
    b->stream_explicit = false;  // follow the current stream again
    Py_RETURN_NONE;
  }
  CUstream s;
  if (!ParseStream(stream_obj, &s)) return nullptr;
  b->bound->set_stream(s);
  b->stream_explicit = true;
  b->last_stream = s;
  Py_RETURN_NONE;
}

PyObject* BoundGetArgs(PyObject* self, void*) {
  return PyList_AsTuple(reinterpret_cast<BoundObject*>(self)->args);
}

PyObject* BoundGetKernel(PyObject* self, void*) {
  return Py_NewRef(reinterpret_cast<PyObject*>(reinterpret_cast<BoundObject*>(self)->kernel));
}

int BoundTraverse(PyObject* self, visitproc visit, void* arg) {
  auto* b = reinterpret_cast<BoundObject*>(self);
  Py_VISIT(Py_TYPE(self));
  Py_VISIT(reinterpret_cast<PyObject*>(b->kernel));
  Py_VISIT(b->args);
  if (b->scratch != nullptr) Py_VISIT(b->scratch->fn);
  return 0;
}

int BoundClear(PyObject* self) {
  auto* b = reinterpret_cast<BoundObject*>(self);
  Py_CLEAR(b->args);
  return 0;
}

void BoundDealloc(PyObject* self) {
  auto* b = reinterpret_cast<BoundObject*>(self);
  PyTypeObject* type = Py_TYPE(self);
  PyObject_GC_UnTrack(self);
  b->bound.~optional();  // before the kernel (and so the Runtime) may go
  if (b->scratch != nullptr) {
    b->scratch->Release();
    Py_CLEAR(b->scratch->fn);
    delete b->scratch;
    b->scratch = nullptr;
  }
  Py_CLEAR(b->args);
  Py_CLEAR(b->kernel);
  PyObject_GC_Del(self);
  Py_DECREF(type);
}

PyObject* BoundRepr(PyObject* self) {
  auto* b = reinterpret_cast<BoundObject*>(self);
  return PyUnicode_FromFormat("<kpack bound launch of kernel '%s'>", b->kernel->plan->name.c_str());
}

// ---------------------------------------------------------------- kernel[grid]

PyObject* KernelGetItem(PyObject* self, PyObject* grid_obj) {
  Grid grid;
  PyObject* fn = nullptr;
  if (PyCallable_Check(grid_obj)) {
    fn = grid_obj;
  } else if (!ParseGrid(grid_obj, &grid)) {
    return nullptr;
  }
  GridObject* g = PyObject_GC_New(GridObject, g_grid_type);
  if (g == nullptr) return nullptr;
  g->vectorcall = GridVectorcall;
  g->kernel = reinterpret_cast<KernelObject*>(Py_NewRef(self));
  g->grid = grid;
  g->grid_fn = Py_XNewRef(fn);
  PyObject_GC_Track(reinterpret_cast<PyObject*>(g));
  return reinterpret_cast<PyObject*>(g);
}

int GridTraverse(PyObject* self, visitproc visit, void* arg) {
  auto* g = reinterpret_cast<GridObject*>(self);
  Py_VISIT(Py_TYPE(self));
  Py_VISIT(reinterpret_cast<PyObject*>(g->kernel));
  Py_VISIT(g->grid_fn);
  return 0;
}

int GridClear(PyObject* self) {
  Py_CLEAR(reinterpret_cast<GridObject*>(self)->grid_fn);
  return 0;
}

void GridDealloc(PyObject* self) {
  auto* g = reinterpret_cast<GridObject*>(self);
  PyTypeObject* type = Py_TYPE(self);
  PyObject_GC_UnTrack(self);
  Py_CLEAR(g->grid_fn);
  Py_CLEAR(g->kernel);
  PyObject_GC_Del(self);
  Py_DECREF(type);
}

PyObject* GridRepr(PyObject* self) {
  auto* g = reinterpret_cast<GridObject*>(self);
  if (g->grid_fn != nullptr) {
    return PyUnicode_FromFormat("<kpack kernel '%s' with grid %R>", g->kernel->plan->name.c_str(),
                                g->grid_fn);
  }
  return PyUnicode_FromFormat("<kpack kernel '%s' with grid (%u, %u, %u)>",
                              g->kernel->plan->name.c_str(), g->grid.x, g->grid.y, g->grid.z);
}

// ---------------------------------------------------------------- kernel attributes

PyObject* KernelGetName(PyObject* self, void*) {
  const std::string& name = reinterpret_cast<KernelObject*>(self)->plan->name;
  return PyUnicode_FromStringAndSize(name.data(), static_cast<Py_ssize_t>(name.size()));
}

PyObject* KernelGetParams(PyObject* self, void*) {
  return reinterpret_cast<KernelObject*>(self)->plan->meta.Params();
}

PyObject* KernelGetVariants(PyObject* self, void*) {
  return reinterpret_cast<KernelObject*>(self)->plan->meta.Variants();
}

PyObject* KernelGetGrid(PyObject* self, void*) {
  return reinterpret_cast<KernelObject*>(self)->plan->meta.GridExpressions();
}

PyObject* KernelStats(PyObject* self, PyObject*) {
  const Kernel& kernel = reinterpret_cast<KernelObject*>(self)->plan->kernel;
  PyObject* d = PyDict_New();
  if (d == nullptr) return nullptr;
  for (const Kernel::VariantStats& v : kernel.variant_stats()) {
    PyObject* s = PyStructSequence_New(g_variant_stats_type);
    if (s == nullptr) {
      Py_DECREF(d);
      return nullptr;
    }
    PyStructSequence_SetItem(s, 0, PyLong_FromUnsignedLongLong(v.launches));
    PyStructSequence_SetItem(s, 1, PyLong_FromUnsignedLongLong(v.fallback_launches));
    PyObject* key = PyUnicode_FromStringAndSize(v.variant.data(),
                                                static_cast<Py_ssize_t>(v.variant.size()));
    if (key == nullptr || PyErr_Occurred() || PyDict_SetItem(d, key, s) != 0) {
      Py_XDECREF(key);
      Py_DECREF(s);
      Py_DECREF(d);
      return nullptr;
    }
    Py_DECREF(key);
    Py_DECREF(s);
  }
  return d;
}

// k.select_variant(*args): the variant these arguments would launch (launches nothing).
PyObject* KernelSelectVariant(PyObject* self, PyObject* const* args, Py_ssize_t nargs,
                              PyObject* kwnames) {
  auto* k = reinterpret_cast<KernelObject*>(self);
  CallArgs a(k->plan->params.size(), k->plan->num_descs);
  CallState st{k->rt};
  if (!PrepareCall(*k->plan, args, static_cast<size_t>(nargs), kwnames, false, &st, &a)) {
    return nullptr;
  }
  absl::StatusOr<std::string_view> v = k->plan->kernel.SelectVariant(a.span());
  if (!v.ok()) return RaiseStatus(v.status());
  return PyUnicode_FromStringAndSize(v->data(), static_cast<Py_ssize_t>(v->size()));
}

// k.restrict(variants, ignore_buckets=False): Kernel::Restrict, as a new kernel object.
PyObject* KernelRestrict(PyObject* self, PyObject* args, PyObject* kwargs) {
  static const char* kwlist[] = {"variants", "ignore_buckets", nullptr};
  PyObject* names = nullptr;
  int ignore_buckets = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|p:restrict", const_cast<char**>(kwlist),
                                   &names, &ignore_buckets)) {
    return nullptr;
  }
  if (PyUnicode_Check(names)) {
    PyErr_SetString(PyExc_TypeError, "restrict() takes a list of variant names, not a str");
    return nullptr;
  }
  PyObject* seq = PySequence_Fast(names, "restrict() takes a list of variant names");
  if (seq == nullptr) return nullptr;
  std::vector<std::string> list;
  for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq); ++i) {
    const char* name = PyUnicode_AsUTF8(PySequence_Fast_GET_ITEM(seq, i));
    if (name == nullptr) {
      Py_DECREF(seq);
      return nullptr;
    }
    list.emplace_back(name);
  }
  Py_DECREF(seq);
  auto* k = reinterpret_cast<KernelObject*>(self);
  absl::StatusOr<Kernel> view = k->plan->kernel.Restrict(list, ignore_buckets != 0);
  if (!view.ok()) return RaiseStatus(view.status());
  PyObject* o = NewKernelObjectLike(self, *view);
  if (o != nullptr && k->scratch != nullptr) {
    reinterpret_cast<KernelObject*>(o)->scratch = Py_NewRef(k->scratch);
  }
  return o;
}

// k.with_scratch(allocator): the same kernel with a default scratch= (None: none).
PyObject* KernelWithScratch(PyObject* self, PyObject* allocator) {
  auto* k = reinterpret_cast<KernelObject*>(self);
  if (allocator != Py_None && !PyCallable_Check(allocator)) {
    PyErr_Format(PyExc_TypeError, "with_scratch() takes a callable (nbytes, align, stream) or "
                 "None, got %.200s", Py_TYPE(allocator)->tp_name);
    return nullptr;
  }
  KernelObject* c = PyObject_GC_New(KernelObject, g_kernel_type);
  if (c == nullptr) return nullptr;
  c->vectorcall = KernelVectorcall;
  c->owner = Py_NewRef(k->owner);
  c->rt = k->rt;
  c->plan = k->plan;
  c->base = Py_NewRef(k->base != nullptr ? k->base : self);  // the plan's owner
  c->scratch = allocator == Py_None ? nullptr : Py_NewRef(allocator);
  PyObject_GC_Track(reinterpret_cast<PyObject*>(c));
  return reinterpret_cast<PyObject*>(c);
}

PyObject* KernelGetSource(PyObject* self, void*) {
  return reinterpret_cast<KernelObject*>(self)->plan->meta.Source();
}

PyObject* KernelGetAutotuneKey(PyObject* self, void*) {
  return reinterpret_cast<KernelObject*>(self)->plan->meta.AutotuneKey();
}

PyObject* KernelGetHasScratch(PyObject* self, void*) {
  return PyBool_FromLong(reinterpret_cast<KernelObject*>(self)->plan->meta.has_scratch());
}

PyObject* KernelGetScratch(PyObject* self, void*) {
  PyObject* s = reinterpret_cast<KernelObject*>(self)->scratch;
  return Py_NewRef(s != nullptr ? s : Py_None);
}

PyObject* KernelPreload(PyObject* self, PyObject*) {
  absl::Status s = reinterpret_cast<KernelObject*>(self)->plan->kernel.Preload();
  if (!s.ok()) return RaiseStatus(s);
  Py_RETURN_NONE;
}

PyObject* KernelRepr(PyObject* self) {
  const KernelPlan& p = *reinterpret_cast<KernelObject*>(self)->plan;
  return PyUnicode_FromFormat("<kpack kernel '%s'(%s)>", p.name.c_str(), p.meta.signature.c_str());
}

int KernelTraverse(PyObject* self, visitproc visit, void* arg) {
  auto* k = reinterpret_cast<KernelObject*>(self);
  Py_VISIT(Py_TYPE(self));
  Py_VISIT(k->owner);
  Py_VISIT(k->base);
  Py_VISIT(k->scratch);
  return 0;
}

void KernelDealloc(PyObject* self) {
  auto* k = reinterpret_cast<KernelObject*>(self);
  PyTypeObject* type = Py_TYPE(self);
  PyObject_GC_UnTrack(self);
  if (k->plan != nullptr && k->base == nullptr) {
    for (ParamPlan& p : k->plan->params) Py_XDECREF(p.py_name);
    delete k->plan;
  }
  Py_CLEAR(k->base);
  Py_CLEAR(k->scratch);
  Py_CLEAR(k->owner);
  PyObject_GC_Del(self);
  Py_DECREF(type);
}

// ---------------------------------------------------------------- type objects

PyMethodDef g_kernel_methods[] = {
    {"bind", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(KernelBind)),
     METH_FASTCALL | METH_KEYWORDS,
     "bind(*args, stream=None) -> BoundLaunch: check, dispatch and pack the arguments once; "
     "b() relaunches them, b.set(name_or_index, value) changes one."},
    {"stats", KernelStats, METH_NOARGS,
     "stats() -> {variant: VariantStats(launches, fallback_launches)}: launches since the "
     "pack was opened; fallbacks are launches that a more specialized variant of the same "
     "bucket could not take (e.g. a misaligned pointer)."},
    {"select_variant",
     reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(KernelSelectVariant)),
     METH_FASTCALL | METH_KEYWORDS,
     "select_variant(*args) -> str: the variant these arguments would launch; launches "
     "nothing."},
    {"preload", KernelPreload, METH_NOARGS,
     "preload(): load every variant of this kernel now (needs a current CUDA context)."},
    {"restrict", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(KernelRestrict)),
     METH_VARARGS | METH_KEYWORDS,
     "restrict(variants, ignore_buckets=False) -> Kernel launching only the named variants "
     "(kpack::Kernel::Restrict): chosen among them by bucket and specialization, or with "
     "ignore_buckets by specialization alone (a fixed configuration for every shape)."},
    {"with_scratch", KernelWithScratch, METH_O,
     "with_scratch(allocator) -> Kernel: this kernel with `allocator` as every launch's "
     "default scratch= (see the call's scratch=); None: kpack's own arenas."},
    {nullptr, nullptr, 0, nullptr},
};

PyGetSetDef g_kernel_getset[] = {
    {"name", KernelGetName, nullptr, "the kernel's name", nullptr},
    {"params", KernelGetParams, nullptr,
     "every parameter in declaration order: Param(name, type, constexpr); the call takes "
     "the non-constexpr ones",
     nullptr},
    {"variants", KernelGetVariants, nullptr,
     "the compiled variants: Variant(name, bucket, assumptions, num_warps, num_ctas, "
     "num_stages, shared, constexprs, arch, arg_types)",
     nullptr},
    {"grid", KernelGetGrid, nullptr,
     "the manifest's grid expressions (x, y, z), empty if the kernel has none", nullptr},
    {"source", KernelGetSource, nullptr,
     "(qualname, sha256) of the @triton.jit function the pack was built or recorded from "
     "(kpack/2 `source`), or None",
     nullptr},
    {"autotune_key", KernelGetAutotuneKey, nullptr,
     "the triton.autotune key's parameter names a recorded autotuned function was tuned on "
     "(kpack/2 `autotune_key`), empty if none",
     nullptr},
    {"has_scratch", KernelGetHasScratch, nullptr,
     "whether a variant needs Triton global or profile scratch memory (see scratch=)",
     nullptr},
    {"scratch", KernelGetScratch, nullptr,
     "the default scratch= allocator (with_scratch), or None", nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr},
};


PyMethodDef g_grid_methods[] = {
    {"bind", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(GridBind)),
     METH_FASTCALL | METH_KEYWORDS,
     "bind(*args, stream=None) -> BoundLaunch with this grid (a callable grid is evaluated "
     "once, now)."},
    {nullptr, nullptr, 0, nullptr},
};

PyMethodDef g_bound_methods[] = {
    {"set", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(BoundSet)), METH_FASTCALL,
     "set(name_or_index, value): replace one argument (checked like at bind; a value that "
     "changes the bucket or an assumption selects the variant again)."},
    {"set_grid", BoundSetGrid, METH_O, "set_grid(grid): an int or a 1-3 tuple."},
    {"set_stream", BoundSetStream, METH_O,
     "set_stream(stream): launch on this stream from now on; None: follow the current "
     "stream again."},
    {nullptr, nullptr, 0, nullptr},
};

PyGetSetDef g_bound_getset[] = {
    {"args", BoundGetArgs, nullptr, "the bound argument objects", nullptr},
    {"kernel", BoundGetKernel, nullptr, "the kernel", nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr},
};

PyObject* MakeException(PyObject* module, const char* name, PyObject* bases, const char* doc) {
  std::string full = std::string("kpack.") + name;
  PyObject* type = PyErr_NewExceptionWithDoc(full.c_str(), doc, bases, nullptr);
  if (type == nullptr) return nullptr;
  if (PyModule_AddObjectRef(module, name, type) != 0) {
    Py_DECREF(type);
    return nullptr;
  }
  return type;  // kept for the process's life
}

bool InitExceptions(PyObject* m) {
  g_exc.error = MakeException(
      m, "Error", PyExc_RuntimeError,
      "An error from kpack; `code` is the absl::Status code name (e.g. 'INVALID_ARGUMENT').");
  if (g_exc.error == nullptr) return false;
  struct Sub {
    PyObject** slot;
    const char* name;
    PyObject* builtin;
    const char* doc;
  };
  const Sub subs[] = {
      {&g_exc.invalid_argument, "InvalidArgumentError", PyExc_ValueError,
       "INVALID_ARGUMENT: a value the kernel cannot take (no variant valid for it, an "
       "integer that does not fit, a tensor on the wrong device), or a malformed pack."},
      {&g_exc.not_found, "NotFoundError", PyExc_LookupError,
       "NOT_FOUND: no such kernel, pack directory or file."},
      {&g_exc.failed_precondition, "FailedPreconditionError", nullptr,
       "FAILED_PRECONDITION: the system is not in a state to do this (e.g. a kernel with no "
       "grid expressions launched without a grid, a cubin for another GPU)."},
      {&g_exc.unavailable, "UnavailableError", nullptr,
       "UNAVAILABLE: no CUDA driver could be loaded or initialized."},
      {&g_exc.unimplemented, "UnimplementedError", PyExc_NotImplementedError,
       "UNIMPLEMENTED: a pack feature this kpack version does not support."},
      {&g_exc.resource_exhausted, "ResourceExhaustedError", nullptr,
       "RESOURCE_EXHAUSTED: out of device memory (scratch arenas)."},
      {&g_exc.out_of_range, "OutOfRangeError", PyExc_IndexError, "OUT_OF_RANGE."},
      {&g_exc.internal, "InternalError", nullptr, "INTERNAL: a driver error."},
  };
  for (const Sub& s : subs) {
    PyObject* bases =
        s.builtin != nullptr ? PyTuple_Pack(2, g_exc.error, s.builtin) : PyTuple_Pack(1, g_exc.error);
    if (bases == nullptr) return false;
    *s.slot = MakeException(m, s.name, bases, s.doc);
    Py_DECREF(bases);
    if (*s.slot == nullptr) return false;
  }
  return true;
}

PyStructSequence_Field g_variant_stats_fields[] = {
    {"launches", "launches of this variant since the pack was opened"},
    {"fallback_launches",
     "of which a more specialized variant of the same bucket could not take the arguments"},
    {nullptr, nullptr},
};
PyStructSequence_Desc g_variant_stats_desc = {"kpack.VariantStats", "Launch counters.",
                                              g_variant_stats_fields, 2};

}  // namespace

PyTypeObject* MakeType(const char* name, int basicsize, Py_ssize_t vectorcall_offset,
                       std::vector<PyType_Slot> slots, const char* doc, unsigned long flags) {
  static std::vector<std::unique_ptr<PyMemberDef[]>> members_keep;
  auto members = std::make_unique<PyMemberDef[]>(2);
  members[0] = {"__vectorcalloffset__", T_PYSSIZET, vectorcall_offset, READONLY, nullptr};
  members[1] = {nullptr, 0, 0, 0, nullptr};
  slots.push_back({Py_tp_members, members.get()});
  slots.push_back({Py_tp_call, reinterpret_cast<void*>(PyVectorcall_Call)});
  slots.push_back({Py_tp_doc, const_cast<char*>(doc)});
  slots.push_back({0, nullptr});
  members_keep.push_back(std::move(members));
  PyType_Spec spec = {name, basicsize, 0,
                      static_cast<unsigned int>(Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC |
                                                Py_TPFLAGS_HAVE_VECTORCALL | flags),
                      slots.data()};
  return reinterpret_cast<PyTypeObject*>(PyType_FromSpec(&spec));
}

PyObject* RaiseStatus(const absl::Status& status) {
  return RaiseWithCode(ExceptionFor(status.code()),
                       std::string_view(status.message().data(), status.message().size()),
                       status.code());
}

bool InitLaunchTypes(PyObject* m) {
  if (!InternStrings() || !InitExceptions(m)) return false;
  g_kernel_type = MakeType(
      "kpack.Kernel", sizeof(KernelObject), offsetof(KernelObject, vectorcall),
      {{Py_tp_dealloc, reinterpret_cast<void*>(KernelDealloc)},
       {Py_tp_traverse, reinterpret_cast<void*>(KernelTraverse)},
       {Py_tp_repr, reinterpret_cast<void*>(KernelRepr)},
       {Py_mp_subscript, reinterpret_cast<void*>(KernelGetItem)},
       {Py_tp_methods, g_kernel_methods},
       {Py_tp_getset, g_kernel_getset}},
      "A pack kernel. k(*args, stream=None, scratch=None, grid=None) launches with the "
      "manifest's grid expressions, or grid= (as k[grid](*args) does: an int, a 1-3 tuple, "
      "or a callable of the launch's meta dict); k.bind(*args) packs once for repeated "
      "launches.",
      Py_TPFLAGS_DISALLOW_INSTANTIATION);
  g_grid_type = MakeType(
      "kpack.GridLaunch", sizeof(GridObject), offsetof(GridObject, vectorcall),
      {{Py_tp_dealloc, reinterpret_cast<void*>(GridDealloc)},
       {Py_tp_traverse, reinterpret_cast<void*>(GridTraverse)},
       {Py_tp_clear, reinterpret_cast<void*>(GridClear)},
       {Py_tp_repr, reinterpret_cast<void*>(GridRepr)},
       {Py_tp_methods, g_grid_methods}},
      "kernel[grid]: call it with the kernel's arguments to launch with that grid.",
      Py_TPFLAGS_DISALLOW_INSTANTIATION);
  g_bound_type = MakeType(
      "kpack.BoundLaunch", sizeof(BoundObject), offsetof(BoundObject, vectorcall),
      {{Py_tp_dealloc, reinterpret_cast<void*>(BoundDealloc)},
       {Py_tp_traverse, reinterpret_cast<void*>(BoundTraverse)},
       {Py_tp_clear, reinterpret_cast<void*>(BoundClear)},
       {Py_tp_repr, reinterpret_cast<void*>(BoundRepr)},
       {Py_tp_methods, g_bound_methods},
       {Py_tp_getset, g_bound_getset}},
      "A launch whose arguments are checked, dispatched and packed: b() launches it.",
      Py_TPFLAGS_DISALLOW_INSTANTIATION);
  if (g_kernel_type == nullptr || g_grid_type == nullptr || g_bound_type == nullptr) return false;
  g_variant_stats_type = PyStructSequence_NewType(&g_variant_stats_desc);
  if (g_variant_stats_type == nullptr) return false;
  if (!InitMetaTypes(m)) return false;
  for (auto [name, type] : {std::pair{"Kernel", g_kernel_type}, std::pair{"GridLaunch", g_grid_type},
                            std::pair{"BoundLaunch", g_bound_type},
                            std::pair{"VariantStats", g_variant_stats_type}}) {
    if (PyModule_AddObjectRef(m, name, reinterpret_cast<PyObject*>(type)) != 0) return false;
  }
  return true;
}

PyObject* NewKernelObject(PyObject* owner, RuntimeState* state, Kernel kernel) {
  auto plan = std::make_unique<KernelPlan>();
  plan->kernel = kernel;
  plan->name = std::string(kernel.name());
  for (size_t i = 0; i < kernel.num_args(); ++i) {
    ParamPlan p;
    p.name = std::string(kernel.arg_name(i));
    p.type = std::string(kernel.arg_type(i));
    const std::string_view t = p.type;
    if (!t.empty() && t[0] == '*') {
      p.kind = ParamKind::kPointer;
      if (std::optional<DLDataType> d = PointeeDType(t)) {
        p.check_dtype = true;
        p.dtype = *d;
      }
    } else if (t == "i1" || t == "u1") {
      p.kind = ParamKind::kBool;
    } else if (t == "fp16" || t == "bf16" || t == "fp32" || t == "fp64") {
      p.kind = ParamKind::kFloat;
    } else if (t.starts_with("tensordesc<")) {
      // tensordesc<fp16[64, 128]>: its base tensor is checked like a `*fp16`'s.
      p.kind = ParamKind::kTensorDesc;
      const size_t open = t.find('[');
      if (std::optional<DLDataType> d = PointeeDType(std::string("*").append(t.substr(11, open - 11)))) {
        p.check_dtype = true;
        p.dtype = *d;
      }
      p.desc_rank = static_cast<int>(std::count(t.begin(), t.end(), ',')) + 1;
      p.desc_index = static_cast<int>(plan->num_descs++);
    } else {
      p.kind = ParamKind::kInt;
    }
    p.py_name = PyUnicode_InternFromString(p.name.c_str());
    if (p.py_name == nullptr) {
      for (ParamPlan& q : plan->params) Py_XDECREF(q.py_name);
      return nullptr;
    }
    plan->params.push_back(std::move(p));
  }
  plan->meta.Init(kernel);
  KernelObject* k = PyObject_GC_New(KernelObject, g_kernel_type);
  if (k == nullptr) {
    for (ParamPlan& q : plan->params) Py_XDECREF(q.py_name);
    return nullptr;
  }
  k->vectorcall = KernelVectorcall;
  k->owner = Py_NewRef(owner);
  k->rt = state;
  k->plan = plan.release();
  k->base = nullptr;
  k->scratch = nullptr;
  PyObject_GC_Track(reinterpret_cast<PyObject*>(k));
  return reinterpret_cast<PyObject*>(k);
}

PyObject* NewKernelObjectLike(PyObject* like, Kernel kernel) {
  auto* k = reinterpret_cast<KernelObject*>(like);
  return NewKernelObject(k->owner, k->rt, kernel);
}

bool IsKernelObject(PyObject* o) { return Py_TYPE(o) == g_kernel_type; }

PyObject* LaunchObjects(PyObject* kernel, PyObject* grid_obj, PyObject* const* args, size_t n) {
  auto* k = reinterpret_cast<KernelObject*>(kernel);
  if (grid_obj == Py_None) return LaunchCall(k, nullptr, nullptr, args, n, nullptr);
  if (PyCallable_Check(grid_obj)) return LaunchCall(k, nullptr, grid_obj, args, n, nullptr);
  Grid grid;
  if (!ParseGrid(grid_obj, &grid)) return nullptr;
  return LaunchCall(k, &grid, nullptr, args, n, nullptr);
}

bool TensorDType(PyObject* o, uint8_t* code, uint8_t* bits) {
  const TypeEntry* e = nullptr;
  for (const TypeEntry& t : g_types) {
    if (t.type == Py_TYPE(o)) e = &t;
  }
  if (e == nullptr) {
    if (PyLong_Check(o)) return false;
    e = LookupType(Py_TYPE(o));
    if (e == nullptr) {
      PyErr_Clear();
      return false;
    }
  }
  if (e->source != Source::kExchange || e->api->dltensor_from_py_object_no_sync == nullptr) {
    return false;
  }
  DLTensor t;
  if (e->api->dltensor_from_py_object_no_sync(o, &t) != 0) {
    PyErr_Clear();
    return false;
  }
  *code = t.dtype.code;
  *bits = t.dtype.bits;
  return true;
}

// ---------------------------------------------------------------- for kpack.graph (graph.cc)

BoundLaunch* AsBoundLaunch(PyObject* object) {
  if (g_bound_type == nullptr || !PyObject_TypeCheck(object, g_bound_type)) return nullptr;
  auto* b = reinterpret_cast<BoundObject*>(object);
  return b->bound.has_value() ? &*b->bound : nullptr;
}

bool StreamArg(PyObject* bound, PyObject* stream, CUstream* out) {
  if (stream != nullptr && stream != Py_None) return ParseStream(stream, out);
  auto* b = reinterpret_cast<BoundObject*>(bound);  // as BoundVectorcall picks it
  if (b->stream_explicit) {
    *out = b->last_stream;
    return true;
  }
  return DefaultStream(*b->kernel->rt, b->api, b->device, out);
}

}  // namespace kpack::python
