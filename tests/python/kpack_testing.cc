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

#include <Python.h>

#include <cstdint>
#include <map>

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

PyMethodDef g_methods[] = {
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
