// Reading a Triton TensorDescriptor argument into a kpack::TensorDesc; see tensordesc.h.

#include "tensordesc.h"

#include <cstdint>
#include <string>

namespace kpack::python {
namespace {

struct Names {
  PyObject* base;
  PyObject* shape;
  PyObject* strides;
  PyObject* padding;
};

const Names& AttributeNames() {
  static const Names names = {PyUnicode_InternFromString("base"),
                              PyUnicode_InternFromString("shape"),
                              PyUnicode_InternFromString("strides"),
                              PyUnicode_InternFromString("padding")};
  return names;
}

// `o.<attr>` as `rank` int64s into `out`.
bool ReadDims(PyObject* o, PyObject* attr, int rank, const std::string& label, int64_t* out) {
  PyObject* seq = PyObject_GetAttr(o, attr);
  if (seq == nullptr) return false;
  PyObject* fast = PySequence_Fast(seq, "");
  Py_DECREF(seq);
  if (fast == nullptr) {
    PyErr_Format(PyExc_TypeError, "%s: the descriptor's %U is not a sequence", label.c_str(), attr);
    return false;
  }
  bool ok = PySequence_Fast_GET_SIZE(fast) == rank;
  if (!ok) {
    PyErr_Format(PyExc_ValueError, "%s: the descriptor's %U has %zd dimensions, the parameter's "
                 "block %d", label.c_str(), attr, PySequence_Fast_GET_SIZE(fast), rank);
  }
  for (int i = 0; ok && i < rank; ++i) {
    PyObject* item = PySequence_Fast_GET_ITEM(fast, i);
    int overflow = 0;
    PyObject* index = PyBool_Check(item) ? nullptr : PyNumber_Index(item);
    if (index == nullptr) {
      PyErr_Clear();
      PyErr_Format(PyExc_TypeError, "%s: the descriptor's %U[%d] is %.200s, not an int",
                   label.c_str(), attr, i, Py_TYPE(item)->tp_name);
      ok = false;
      break;
    }
    out[i] = PyLong_AsLongLongAndOverflow(index, &overflow);
    Py_DECREF(index);
    if (overflow != 0) {
      PyErr_Format(PyExc_ValueError, "%s: the descriptor's %U[%d] does not fit 64 bits",
                   label.c_str(), attr, i);
      ok = false;
    }
  }
  Py_DECREF(fast);
  return ok;
}

}  // namespace

PyObject* ReadTensorDescriptor(PyObject* o, int rank, const std::string& label, TensorDesc* desc) {
  const Names& n = AttributeNames();
  PyObject* type = reinterpret_cast<PyObject*>(Py_TYPE(o));
  if (!PyObject_HasAttr(o, n.base) || !PyObject_HasAttr(o, n.shape) ||
      !PyObject_HasAttr(o, n.strides)) {
    PyErr_Format(PyExc_TypeError, "%s expects a tensor descriptor "
                 "(triton.tools.tensor_descriptor.TensorDescriptor: base, shape, strides, "
                 "block_shape, padding); got %.200s", label.c_str(),
                 reinterpret_cast<PyTypeObject*>(type)->tp_name);
    return nullptr;
  }
  desc->rank = rank;
  if (!ReadDims(o, n.shape, rank, label, desc->shape) ||
      !ReadDims(o, n.strides, rank, label, desc->strides)) {
    return nullptr;
  }
  desc->padding = TensorDescPadding::kZero;
  if (PyObject_HasAttr(o, n.padding)) {
    PyObject* padding = PyObject_GetAttr(o, n.padding);
    if (padding == nullptr) return nullptr;
    const char* text = PyUnicode_Check(padding) ? PyUnicode_AsUTF8(padding) : nullptr;
    const std::string value = text != nullptr ? text : "";
    Py_DECREF(padding);
    if (value == "nan") {
      desc->padding = TensorDescPadding::kNan;
    } else if (value != "zero") {
      PyErr_Clear();
      PyErr_Format(PyExc_ValueError, "%s: the descriptor's padding must be \"zero\" or \"nan\"",
                   label.c_str());
      return nullptr;
    }
  }
  return PyObject_GetAttr(o, n.base);
}

}  // namespace kpack::python
