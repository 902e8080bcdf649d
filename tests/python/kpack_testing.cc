#include "testing.h"

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
      PyModule_AddObjectRef(module, name + sizeof("kpack._testing.") - 1, type) != 0) {
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

}  // namespace

bool InitTesting(PyObject* module) {
  PyObject* a = MakeFakeType(module, "kpack._testing.FakeTensor", &g_api);
  PyObject* b = MakeFakeType(module, "kpack._testing.FakeManagedTensor", &g_managed_api);
  Py_XDECREF(a);
  Py_XDECREF(b);
  return a != nullptr && b != nullptr && PyModule_AddFunctions(module, g_methods) == 0;
}

}  // namespace kpack::python
