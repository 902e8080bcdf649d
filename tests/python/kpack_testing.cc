// kpack_testing: tensor stand-ins for the Python tests (tests/python) and the no-GPU
// overhead benchmark (bench/python_launch_bench.py --fake-driver), built beside the
// extension (src/python/CMakeLists.txt) and never installed: test-only code stays out of
// the kpack wheel. conftest.py puts its build directory on sys.path.
//
// FakeTensor(ptr, device_type=2, device_id=0, code=2, bits=32, lanes=1, fail=False): its
// type carries a `__dlpack_c_exchange_api__` capsule, as torch.Tensor does, implemented in
// C (so that timing it measures kpack, not a Python callback). `dltensor_from_py_object_
// no_sync` reports the given pointer, device and dtype (or fails with RuntimeError when
// `fail`); `current_work_stream` reports the stream set with set_current_stream(handle,
// device=0). FakeManagedTensor is the same through a table without
// `dltensor_from_py_object_no_sync` (the managed, owning export instead). counters()
// counts the calls of every table function; reset_counters() zeroes them.
//
// native_launch(capsule, handle, args, grid=None, stream=0, device=0, scratch=0) launches
// through kpack._kpack's native entry (src/python/native_api.h) as kpack.torch's C++ ops
// do, without torch: `capsule` is _kpack._native_api(), `handle` a kernel's
// _native_handle(), `args` a list of (kind, value) with kind "p" (pointer), "i", "u"
// (int64, uint64), "f" (double) or "b" (bool); `scratch` a device address a
// ScratchAllocator hands out (0: none given). Returns (status code, message, scratch
// allocator calls).

#include <Python.h>

#include <cstdint>
#include <map>
#include <vector>

#include "kpack/arg.h"
#include "kpack/runtime.h"
#include "native_api.h"

#include "dlpack.h"

namespace kpack::python {
namespace {

struct FakeTensorObject {
  PyObject_HEAD
  uint64_t ptr;
  DLDevice device;
  DLDataType dtype;
  int fail;
  int64_t shape[1];
  int64_t strides[1];
};

struct Counters {
  long long dltensor = 0;
  long long managed = 0;
  long long managed_deleted = 0;
  long long stream = 0;
};
Counters g_counters;
std::map<int32_t, void*> g_streams;  // device -> current stream

void Fill(const FakeTensorObject* t, DLTensor* out) {
  out->data = reinterpret_cast<void*>(static_cast<uintptr_t>(t->ptr));
  out->device = t->device;
  out->ndim = 1;
  out->dtype = t->dtype;
  out->shape = const_cast<int64_t*>(t->shape);
  out->strides = const_cast<int64_t*>(t->strides);
  out->byte_offset = 0;
}

int FromPyObject(void* py_object, DLTensor* out) {
  ++g_counters.dltensor;
  auto* t = static_cast<FakeTensorObject*>(py_object);
  if (t->fail) {
    PyErr_SetString(PyExc_RuntimeError, "FakeTensor: export refused (fail=True)");
    return -1;
  }
  Fill(t, out);
  return 0;
}

void DeleteManaged(DLManagedTensorVersioned* m) {
  ++g_counters.managed_deleted;
  delete m;
}

int ManagedFromPyObject(void* py_object, DLManagedTensorVersioned** out) {
  ++g_counters.managed;
  auto* t = static_cast<FakeTensorObject*>(py_object);
  if (t->fail) {
    PyErr_SetString(PyExc_RuntimeError, "FakeTensor: export refused (fail=True)");
    return -1;
  }
  auto* m = new DLManagedTensorVersioned{};
  m->version = {1, 3};
  m->deleter = DeleteManaged;
  Fill(t, &m->dl_tensor);
  *out = m;
  return 0;
}

int CurrentWorkStream(int32_t device_type, int32_t device_id, void** out) {
  ++g_counters.stream;
  if (device_type != kDLCUDA) {
    *out = nullptr;
    return 0;
  }
  auto it = g_streams.find(device_id);
  *out = it == g_streams.end() ? nullptr : it->second;
  return 0;
}

DLPackExchangeAPI g_api = {{{1, 3}, nullptr},  nullptr, ManagedFromPyObject, nullptr,
                           FromPyObject,       CurrentWorkStream};
DLPackExchangeAPI g_managed_api = {{{1, 3}, nullptr}, nullptr, ManagedFromPyObject, nullptr,
                                   nullptr,           CurrentWorkStream};

PyObject* FakeNew(PyTypeObject* type, PyObject* args, PyObject* kwargs) {
  static const char* kw[] = {"ptr", "device_type", "device_id", "code", "bits", "lanes", "fail",
                             nullptr};
  unsigned long long ptr = 0;
  int device_type = kDLCUDA, device_id = 0, code = kDLFloat, bits = 32, lanes = 1, fail = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "K|iiiiip", const_cast<char**>(kw), &ptr,
                                   &device_type, &device_id, &code, &bits, &lanes, &fail)) {
    return nullptr;
  }
  auto* t = reinterpret_cast<FakeTensorObject*>(type->tp_alloc(type, 0));
  if (t == nullptr) return nullptr;
  t->ptr = ptr;
  t->device = {device_type, device_id};
  t->dtype = {static_cast<uint8_t>(code), static_cast<uint8_t>(bits),
              static_cast<uint16_t>(lanes)};
  t->fail = fail;
  t->shape[0] = 1;
  t->strides[0] = 1;
  return reinterpret_cast<PyObject*>(t);
}

void FakeDealloc(PyObject* self) {
  PyTypeObject* type = Py_TYPE(self);
  type->tp_free(self);
  Py_DECREF(type);
}

PyObject* MakeFakeType(PyObject* module, const char* name, DLPackExchangeAPI* api) {
  PyType_Slot slots[] = {{Py_tp_new, reinterpret_cast<void*>(FakeNew)},
                         {Py_tp_dealloc, reinterpret_cast<void*>(FakeDealloc)},
                         {0, nullptr}};
  PyType_Spec spec = {name, sizeof(FakeTensorObject), 0, Py_TPFLAGS_DEFAULT, slots};
  PyObject* type = PyType_FromSpec(&spec);
  if (type == nullptr) return nullptr;
  PyObject* capsule = PyCapsule_New(api, kExchangeApiCapsuleName, nullptr);
  if (capsule == nullptr || PyObject_SetAttrString(type, kExchangeApiAttr, capsule) != 0 ||
      PyModule_AddObjectRef(module, name + sizeof("kpack_testing.") - 1, type) != 0) {
    Py_XDECREF(capsule);
    Py_DECREF(type);
    return nullptr;
  }
  Py_DECREF(capsule);
  return type;
}

PyObject* SetCurrentStream(PyObject*, PyObject* args, PyObject* kwargs) {
  static const char* kw[] = {"stream", "device", nullptr};
  unsigned long long stream = 0;
  int device = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "K|i", const_cast<char**>(kw), &stream,
                                   &device)) {
    return nullptr;
  }
  g_streams[device] = reinterpret_cast<void*>(static_cast<uintptr_t>(stream));
  Py_RETURN_NONE;
}

PyObject* GetCounters(PyObject*, PyObject*) {
  return Py_BuildValue("{s:L,s:L,s:L,s:L}", "dltensor_from_py_object", g_counters.dltensor,
                       "managed_tensor_from_py_object", g_counters.managed, "managed_deleted",
                       g_counters.managed_deleted, "current_work_stream", g_counters.stream);
}

PyObject* ResetCounters(PyObject*, PyObject*) {
  g_counters = {};
  Py_RETURN_NONE;
}

struct TestScratch {
  uint64_t address = 0;
  int calls = 0;
  static CUdeviceptr Allocate(size_t, size_t, CUstream, void* self) {
    auto* s = static_cast<TestScratch*>(self);
    ++s->calls;
    return static_cast<CUdeviceptr>(s->address);
  }
};

PyObject* NativeLaunch(PyObject*, PyObject* args, PyObject* kwargs) {
  static const char* kw[] = {"capsule", "handle", "args", "grid", "stream", "device", "scratch",
                             nullptr};
  PyObject *capsule, *list, *grid_obj = Py_None;
  unsigned long long handle = 0, stream = 0, scratch_address = 0;
  int device = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OKO|OKiK", const_cast<char**>(kw), &capsule,
                                   &handle, &list, &grid_obj, &stream, &device,
                                   &scratch_address)) {
    return nullptr;
  }
  const auto* api = static_cast<const KpackNativeApi*>(
      PyCapsule_GetPointer(capsule, KPACK_NATIVE_API_CAPSULE));
  if (api == nullptr) return nullptr;
  std::vector<kpack::Arg> packed;
  const Py_ssize_t n = PySequence_Size(list);
  if (n < 0) return nullptr;
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* item = PySequence_GetItem(list, i);
    if (item == nullptr) return nullptr;
    const char* kind;
    PyObject* value;
    const bool ok = PyArg_ParseTuple(item, "sO", &kind, &value);
    Py_DECREF(item);
    if (!ok) return nullptr;
    switch (kind[0]) {
      case 'p':
        packed.emplace_back(static_cast<CUdeviceptr>(PyLong_AsUnsignedLongLong(value)));
        break;
      case 'i':
        packed.emplace_back(static_cast<int64_t>(PyLong_AsLongLong(value)));
        break;
      case 'u':
        packed.emplace_back(static_cast<uint64_t>(PyLong_AsUnsignedLongLong(value)));
        break;
      case 'f':
        packed.emplace_back(PyFloat_AsDouble(value));
        break;
      case 'b':
        packed.emplace_back(PyObject_IsTrue(value) == 1);
        break;
      default:
        PyErr_Format(PyExc_ValueError, "native_launch: unknown kind %s", kind);
        return nullptr;
    }
    if (PyErr_Occurred()) return nullptr;
  }
  kpack::Grid grid;
  const kpack::Grid* grid_ptr = nullptr;
  if (grid_obj != Py_None) {
    if (!PyArg_ParseTuple(grid_obj, "I|II", &grid.x, &grid.y, &grid.z)) return nullptr;
    grid_ptr = &grid;
  }
  TestScratch scratch{scratch_address};
  const kpack::ScratchAllocator allocator{&TestScratch::Allocate, &scratch};
  char error[256];
  error[0] = '\0';
  const int code = api->launch(reinterpret_cast<const void*>(static_cast<uintptr_t>(handle)),
                               packed.data(), packed.size(), grid_ptr,
                               reinterpret_cast<CUstream>(static_cast<uintptr_t>(stream)),
                               device, scratch_address != 0 ? &allocator : nullptr, error,
                               sizeof(error));
  return Py_BuildValue("isi", code, error, scratch.calls);
}

// The native entry's descriptive half: (version, size == sizeof(KpackNativeApi), kernel
// name, [(param name, param type)]) for `handle`.
PyObject* NativeDescribe(PyObject*, PyObject* args) {
  PyObject* capsule;
  unsigned long long handle;
  if (!PyArg_ParseTuple(args, "OK", &capsule, &handle)) return nullptr;
  const auto* api = static_cast<const KpackNativeApi*>(
      PyCapsule_GetPointer(capsule, KPACK_NATIVE_API_CAPSULE));
  if (api == nullptr) return nullptr;
  const void* k = reinterpret_cast<const void*>(static_cast<uintptr_t>(handle));
  PyObject* params = PyList_New(0);
  if (params == nullptr) return nullptr;
  for (size_t i = 0; i < api->num_params(k); ++i) {
    PyObject* p = Py_BuildValue("(ss)", api->param_name(k, i), api->param_type(k, i));
    if (p == nullptr || PyList_Append(params, p) != 0) {
      Py_XDECREF(p);
      Py_DECREF(params);
      return nullptr;
    }
    Py_DECREF(p);
  }
  const bool out_of_range_is_null = api->param_name(k, api->num_params(k)) == nullptr &&
                                    api->param_type(k, api->num_params(k)) == nullptr;
  return Py_BuildValue("(IOsNO)", api->version,
                       api->size == sizeof(KpackNativeApi) ? Py_True : Py_False,
                       api->kernel_name(k), params,
                       out_of_range_is_null ? Py_True : Py_False);
}

PyMethodDef g_methods[] = {
    {"native_launch", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(NativeLaunch)),
     METH_VARARGS | METH_KEYWORDS,
     "native_launch(capsule, handle, args, grid=None, stream=0, device=0, scratch=0)"},
    {"native_describe", NativeDescribe, METH_VARARGS, "native_describe(capsule, handle)"},
    {"set_current_stream", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(SetCurrentStream)),
     METH_VARARGS | METH_KEYWORDS, "set_current_stream(handle, device=0)"},
    {"counters", GetCounters, METH_NOARGS, "calls of each exchange-API function"},
    {"reset_counters", ResetCounters, METH_NOARGS, "zero the counters"},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef g_module = {PyModuleDef_HEAD_INIT, "kpack_testing",
                        "Tensor stand-ins for kpack's tests; not part of kpack.", -1, g_methods};

}  // namespace
}  // namespace kpack::python

PyMODINIT_FUNC PyInit_kpack_testing() {
  using namespace kpack::python;  // NOLINT(build/namespaces)
  PyObject* module = PyModule_Create(&g_module);
  if (module == nullptr) return nullptr;
  PyObject* a = MakeFakeType(module, "kpack_testing.FakeTensor", &g_api);
  PyObject* b = MakeFakeType(module, "kpack_testing.FakeManagedTensor", &g_managed_api);
  Py_XDECREF(a);
  Py_XDECREF(b);
  if (a == nullptr || b == nullptr) {
    Py_DECREF(module);
    return nullptr;
  }
  return module;
}
