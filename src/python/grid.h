// Grids from Python, for every call that takes one (kernel[grid], grid=, set_grid,
// StepGraph.pin_grid): an int, or a tuple or list of 1 to 3 ints, each in [0, 2**32).
// TypeError for something else, kpack.InvalidArgumentError for a value out of range.

#ifndef KPACK_SRC_PYTHON_GRID_H_
#define KPACK_SRC_PYTHON_GRID_H_

#include <Python.h>
#include <nanobind/nanobind.h>

#include "kpack/kpack.h"

namespace kpack::python {

// False with a Python exception set.
bool ParseGrid(PyObject* o, Grid* grid);

// For nanobind code: throws nanobind's python_error.
Grid GridArg(nanobind::handle o);

}  // namespace kpack::python

#endif  // KPACK_SRC_PYTHON_GRID_H_
