// The out-of-line half of argument conversion: tensor types seen for the first time, the
// slow sources (`data_ptr()`, `__dlpack__()`), numbers that are not exact ints or floats,
// keyword arguments, and every error message. See convert.h.

#include "convert.h"

#include <new>
#include <string>

#include "errors.h"
#include "interned.h"

namespace kpack::python {

std::array<TypeEntry, kTypeCacheSize> g_types;

namespace {

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

// Prefix of every argument message: "kernel 'k': argument 2 ('out', *fp32)".
std::string ArgLabel(const KernelPlan& p, size_t i) {
  return "kernel '" + p.name + "': argument " + std::to_string(i) + " ('" + p.params[i].name +
         "', " + p.params[i].type + ")";
}

// `data_ptr()`, plus `__dlpack_device__()` when the type offers it.
bool PointerFromDataPtr(const KernelPlan& p, size_t i, PyObject* o, const TypeEntry& e,
                        CallState* st, uint64_t* ptr) {
  if (e.has_dlpack_device) {
    PyObject* dev = PyObject_CallMethodNoArgs(o, g_str.dlpack_device);
    if (dev == nullptr) return false;
    long type = -1, id = -1;  // NOLINT(runtime/int)
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

// Objects that must not pass as numbers: reading a tensor's value would synchronize.
bool LooksLikeTensor(PyObject* o) {
  PyObject* t = reinterpret_cast<PyObject*>(Py_TYPE(o));
  return PyObject_HasAttr(t, g_str.dlpack) || PyObject_HasAttr(t, g_str.data_ptr);
}

}  // namespace

PyObject* ArgTypeError(const KernelPlan& p, size_t i, const char* expected, PyObject* got) {
  PyErr_Format(PyExc_TypeError, "%s expects %s; got %.200s", ArgLabel(p, i).c_str(), expected,
               Py_TYPE(got)->tp_name);
  return nullptr;
}

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
    if (!CurrentDevice(*st->rt, device_id, &st->device, &have_context)) return false;
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
  const long long s = PyLong_AsLongLongAndOverflow(v, &overflow);  // NOLINT(runtime/int)
  if (overflow == 0) {
    Py_DECREF(v);
    if (s == -1 && PyErr_Occurred()) return false;
    *out = Arg(static_cast<int64_t>(s));
    return true;
  }
  const unsigned long long u = overflow > 0 ? PyLong_AsUnsignedLongLong(v) : 0;  // NOLINT
  if (overflow < 0 || (u == static_cast<unsigned long long>(-1) && PyErr_Occurred())) {  // NOLINT
    PyErr_Clear();
    ValueErrorF("%s: %R does not fit a 64-bit integer", ArgLabel(p, i).c_str(), v);
    Py_DECREF(v);
    return false;
  }
  Py_DECREF(v);
  *out = Arg(static_cast<uint64_t>(u));
  return true;
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
    if (PyUnicode_Compare(key, g_str.stream) == 0) {
      stream_obj = value;
      continue;
    }
    if (PyUnicode_Compare(key, g_str.scratch) == 0) {
      st->scratch = value;
      continue;
    }
    if (PyUnicode_Compare(key, g_str.grid) == 0) {
      st->grid = value;
      continue;
    }
    size_t i = 0;
    while (i < n && PyUnicode_Compare(key, p.params[i].py_name.ptr()) != 0) ++i;
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

}  // namespace kpack::python
