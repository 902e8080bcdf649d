// Grids from Python; see grid.h.

#include "grid.h"

#include <array>
#include <cstdint>
#include <limits>

#include "errors.h"

namespace nb = nanobind;

namespace kpack::python {
namespace {

bool Axis(PyObject* v, int axis, uint32_t* out) {
  if (PyBool_Check(v) || !PyIndex_Check(v)) {
    PyErr_Format(PyExc_TypeError, "grid: axis %d is %.200s, not an int", axis,
                 Py_TYPE(v)->tp_name);
    return false;
  }
  PyObject* iv = PyNumber_Index(v);
  if (iv == nullptr) return false;
  int overflow = 0;
  const long long x = PyLong_AsLongLongAndOverflow(iv, &overflow);  // NOLINT(runtime/int)
  Py_DECREF(iv);
  if (x == -1 && overflow == 0 && PyErr_Occurred()) return false;
  if (overflow != 0 || x < 0 || x > std::numeric_limits<uint32_t>::max()) {
    ValueErrorF("grid: axis %d is %R, outside [0, 2**32)", axis, v);
    return false;
  }
  *out = static_cast<uint32_t>(x);
  return true;
}

}  // namespace

bool ParseGrid(PyObject* o, Grid* grid) {
  std::array<uint32_t, 3> dims{1, 1, 1};
  if (PyTuple_Check(o) || PyList_Check(o)) {
    const Py_ssize_t size = PySequence_Fast_GET_SIZE(o);
    if (size < 1 || size > 3) {
      ValueErrorF("grid must have 1 to 3 axes, got %zd", size);
      return false;
    }
    PyObject** items = PySequence_Fast_ITEMS(o);
    for (Py_ssize_t a = 0; a < size; ++a) {
      if (!Axis(items[a], static_cast<int>(a), &dims[a])) return false;
    }
  } else if (!Axis(o, 0, &dims[0])) {
    return false;
  }
  *grid = Grid{dims[0], dims[1], dims[2]};
  return true;
}

Grid GridArg(nb::handle o) {
  Grid g;
  if (!ParseGrid(o.ptr(), &g)) throw nb::python_error();
  return g;
}

}  // namespace kpack::python
