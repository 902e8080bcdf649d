// Scratch memory from a Python callable; see scratch_callable.h.

#include "scratch_callable.h"

#include <cstdint>

#include "absl/base/optimization.h"
#include "errors.h"
#include "interned.h"

namespace kpack::python {

void PyScratch::Release() {
  if (kept[0] == nullptr && kept[1] == nullptr) return;
  PyObject *type, *value, *tb;
  PyErr_Fetch(&type, &value, &tb);
  Py_CLEAR(kept[0]);
  Py_CLEAR(kept[1]);
  PyErr_Restore(type, value, tb);
}

CUdeviceptr PyScratch::Allocate(size_t bytes, size_t align, CUstream stream, void* self) {
  auto* s = static_cast<PyScratch*>(self);
  // An exception already set: the launch's first scratch kind failed (kpack would not ask
  // for the second then) or Python code before it raised; either way it fails.
  if (PyErr_Occurred()) return 0;
  PyObject* r = PyObject_CallFunction(s->fn, "nnK", static_cast<Py_ssize_t>(bytes),
                                      static_cast<Py_ssize_t>(align),
                                      static_cast<unsigned long long>(  // NOLINT(runtime/int)
                                          reinterpret_cast<uintptr_t>(stream)));
  if (r == nullptr) return 0;
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
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "scratch allocator returned %.200s; expected an int device "
                     "address or an object with data_ptr()", Py_TYPE(r)->tp_name);
      }
      Py_DECREF(r);
      return 0;
    }
    ptr = PyLong_AsUnsignedLongLong(address);
    Py_DECREF(address);
    // Held until the launch is issued (at most one object per scratch kind).
    PyObject*& slot = s->kept[0] == nullptr ? s->kept[0] : s->kept[1];
    Py_XSETREF(slot, r);
  }
  if (PyErr_Occurred()) return 0;
  return static_cast<CUdeviceptr>(ptr);
}

PyObject* LaunchResult(const absl::Status& status, PyScratch* scratch) {
  if (scratch != nullptr) scratch->Release();
  if (ABSL_PREDICT_TRUE(status.ok())) Py_RETURN_NONE;
  return RaiseStatus(status);
}

}  // namespace kpack::python
