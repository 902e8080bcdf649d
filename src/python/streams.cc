// Devices and streams for Python launches; see streams.h.

#include "streams.h"

#include <cstdint>

#include "absl/base/optimization.h"
#include "errors.h"
#include "interned.h"

namespace nb = nanobind;

namespace kpack::python {
namespace {

// torch's exchange API once torch is imported (null before, and with a torch without
// one: then `g_torch_raw_stream` is torch._C._cuda_getCurrentRawStream).
const DLPackExchangeAPI* g_torch_api = nullptr;
PyObject* g_torch_raw_stream = nullptr;
bool g_torch_resolved = false;
// torch.cuda while torch has not been seen to initialize CUDA; null once it has, and with a
// torch that has no torch.cuda module.
PyObject* g_torch_cuda = nullptr;

// Remembers torch.cuda (a new reference) to ask whether torch initialized CUDA.
void ResolveTorchCuda() {
  g_torch_cuda = PyDict_GetItemWithError(PyImport_GetModuleDict(), g_str.torch_cuda);
  if (g_torch_cuda == nullptr) PyErr_Clear();
  Py_XINCREF(g_torch_cuda);
}

// Whether torch may have a current stream other than the legacy default stream: false
// while torch.cuda._initialized is False. Until torch initializes CUDA it has made no
// stream current (making one current, or creating one, initializes it), so its current
// stream of every device is its default stream, the legacy default stream -- where kpack
// launches without torch. Asking torch for that stream would initialize CUDA in torch as
// a side effect, and raise where torch cannot use the GPU (its CUDA runtime newer than the
// driver, say) though kpack can. Once true it stays true (initialization is not undone)
// and costs nothing more; until then one attribute read per launch on raw pointers.
bool TorchMayHaveStreams() {
  if (g_torch_cuda == nullptr) return true;
  PyObject* v = PyObject_GetAttr(g_torch_cuda, g_str.initialized);
  if (v == nullptr) PyErr_Clear();
  const bool uninitialized = v == Py_False;
  Py_XDECREF(v);
  if (!uninitialized) Py_CLEAR(g_torch_cuda);
  return !uninitialized;
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
  ResolveTorchCuda();
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

}  // namespace

bool CurrentWorkStreamFailed() {
  if (!PyErr_Occurred()) {
    PyErr_SetString(PyExc_RuntimeError, "the tensor library's current_work_stream failed");
  }
  return false;
}

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

bool CurrentDeviceFailed(const RuntimeState& rt, const absl::Status& error, int hint, int* device,
                         bool* have_context) {
  // FAILED_PRECONDITION: no context is current on this thread.
  if (error.code() != absl::StatusCode::kFailedPrecondition) {
    RaiseStatus(error);
    return false;
  }
  if (hint < 0) {
    *have_context = false;
    *device = -1;
    return true;
  }
  if (absl::Status s = rt.runtime.UseDevice(hint); !s.ok()) {
    RaiseStatus(s);
    return false;
  }
  absl::StatusOr<int> current = rt.runtime.CurrentDevice();
  if (!current.ok()) {
    RaiseStatus(current.status());
    return false;
  }
  *have_context = true;
  *device = *current;
  return true;
}

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
  const unsigned long long v = PyLong_AsUnsignedLongLong(handle);  // NOLINT(runtime/int)
  Py_DECREF(handle);
  if (v == static_cast<unsigned long long>(-1) && PyErr_Occurred()) {  // NOLINT(runtime/int)
    PyErr_Clear();
    ValueErrorF("stream handle does not fit an unsigned 64-bit pointer");
    return false;
  }
  *stream = reinterpret_cast<CUstream>(static_cast<uintptr_t>(v));
  return true;
}

bool DefaultStreamWithoutApi(const RuntimeState& rt, int device, CUstream* stream) {
  *stream = nullptr;  // the legacy default stream
  ResolveTorch();
  if (g_torch_api == nullptr && g_torch_raw_stream == nullptr) return true;
  if (!TorchMayHaveStreams()) return true;
  if (device < 0) {
    bool have_context = false;
    if (!CurrentDevice(rt, -1, &device, &have_context)) return false;
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

CUstream StreamOrDefault(const RuntimeState& rt, nb::handle stream) {
  CUstream s = nullptr;
  const bool ok = stream.is_none() ? DefaultStream(rt, nullptr, -1, &s)
                                   : ParseStream(stream.ptr(), &s);
  if (!ok) throw nb::python_error();
  return s;
}

}  // namespace kpack::python
