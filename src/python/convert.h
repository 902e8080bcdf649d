// Python call arguments into kpack::Args: the launch path's conversion, shared by every
// call form (kernel(...), kernel[grid](...), bind, set, select_variant).
//
// Per call parameter kind (plan.h):
//   pointer  a tensor whose type has `__dlpack_c_exchange_api__` (torch >= 2.11: read
//            through the C function table, no Python call), else an object with
//            `data_ptr()` (and `__dlpack_device__()` when it has one, for the device
//            check), else one with `__dlpack__()`; or a plain int, taken as a raw device
//            pointer. A tensor must be on the calling thread's current CUDA device, and its
//            dtype must be the pointer's element type when DLPack describes it.
//   integer  int (or an object with __index__ that is not a tensor), range-checked by the
//            chosen variant's integer type;
//   float    float or int (or an object with __float__ that is not a tensor);
//   i1/u1    bool;
//   tensordesc  a triton.tools.tensor_descriptor.TensorDescriptor (or an object with base,
//            shape, strides, padding): tensordesc.h.
// A tuple parameter's elements are separate parameters (`t.0`, `t.1`), passed positionally.
// Errors: TypeError for a wrong count or kind, ValueError (kpack.InvalidArgumentError)
// for a wrong device or a value that does not fit; nothing is launched.
//
// The common cases are inline here (a call converts its arguments straight from the
// vectorcall array into Args on the stack, with no argument tuple or keyword dict); what
// they fall back to, and every message, is out of line in convert.cc.
//
// Devices: the first tensor of a call reads the current device (streams.h), once per call.

#ifndef KPACK_SRC_PYTHON_CONVERT_H_
#define KPACK_SRC_PYTHON_CONVERT_H_

#include <Python.h>
#include <cuda.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "absl/base/attributes.h"
#include "absl/base/optimization.h"
#include "dlpack.h"
#include "kpack/kpack.h"
#include "plan.h"
#include "runtime_state.h"
#include "streams.h"
#include "tensordesc.h"

namespace kpack::python {

// How objects of one Python type give a device pointer. Looked up once per type.
enum class Source : uint8_t { kExchange, kDataPtr, kDLPack, kNone };
struct TypeEntry {
  PyTypeObject* type = nullptr;  // strong
  Source source = Source::kNone;
  bool has_dlpack_device = false;
  const DLPackExchangeAPI* api = nullptr;
  PyObject* capsule = nullptr;  // strong; owns `api`'s table for its producer
};
inline constexpr size_t kTypeCacheSize = 8;
// The tensor types seen, in the order first seen (in practice torch.Tensor first).
// Hidden: the launch path reads it directly, not through the GOT.
extern std::array<TypeEntry, kTypeCacheSize> g_types __attribute__((visibility("hidden")));

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

// ---- out of line (convert.cc)

// A tensor's device (and dtype, when known) against the parameter and the current device,
// when the inline check did not pass: reads the current device (once per call) and builds
// the messages.
bool CheckTensorSlow(const KernelPlan& p, size_t i, int32_t device_type, int32_t device_id,
                     const DLDataType* dtype, CallState* st);
bool ConvertPointerSlow(const KernelPlan& p, size_t i, PyObject* o, CallState* st, Arg* out);
bool ConvertIntSlow(const KernelPlan& p, size_t i, PyObject* o, Arg* out);
bool ConvertFloatSlow(const KernelPlan& p, size_t i, PyObject* o, Arg* out);
bool ConvertDesc(const KernelPlan& p, size_t i, PyObject* o, CallState* st, Arg* out);
PyObject* ArgTypeError(const KernelPlan& p, size_t i, const char* expected, PyObject* got);

// The DLPack dtype of a tensor argument as a launch would read it (through an exchange
// API; `__dlpack__` readers excluded): false for anything else. Never raises.
bool TensorDType(PyObject* o, uint8_t* code, uint8_t* bits);

// ---- inline: the launch path

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

ABSL_ATTRIBUTE_ALWAYS_INLINE inline bool ConvertFloat(const KernelPlan& p, size_t i,
                                                      PyObject* o, Arg* out) {
  if (ABSL_PREDICT_TRUE(PyFloat_CheckExact(o))) {
    *out = Arg(PyFloat_AS_DOUBLE(o));
    return true;
  }
  return ConvertFloatSlow(p, i, o, out);
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

// A call's arguments: the objects in parameter order (borrowed) and their conversions.
// Inline storage covers every realistic kernel; more arguments than kInlineArgs take the
// heap (such calls are then not allocation-free).
inline constexpr size_t kInlineArgs = 40;
class CallArgs {
 public:
  CallArgs(size_t n, size_t descs) : n_(n), descs_(descs) {
    if (ABSL_PREDICT_FALSE(n > kInlineArgs)) {
      heap_.reset(new Slot[2 * n]);
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

// Orders positional and keyword arguments by parameter into `a.objects()`; `stream=`,
// `scratch=` and `grid=` go to `st`. False with a TypeError set.
bool CollectArgs(const KernelPlan& p, PyObject* const* args, size_t nargs, PyObject* kwnames,
                 CallState* st, CallArgs* a);

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

// The call's stream: its stream=, else the default (streams.h).
inline bool ResolveStream(const RuntimeState& rt, CallState* st, CUstream* stream) {
  if (st->has_explicit_stream) {
    *stream = st->explicit_stream;
    return true;
  }
  return DefaultStream(rt, st->api, st->device, stream);
}

}  // namespace kpack::python

#endif  // KPACK_SRC_PYTHON_CONVERT_H_
