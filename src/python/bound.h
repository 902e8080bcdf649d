// kpack.BoundLaunch (`kernel.bind(...)`): kpack::BoundLaunch for Python, arguments checked,
// dispatched and packed once, then relaunched with b() and changed with b.set(name, value)
// (checked like at bind; a value that changes the bucket or an assumption selects the
// variant again).
//
// b() launches on the stream given at bind (stream=) if any, else follows the current
// stream as an eager call would (streams.h). Its scratch callable (scratch= at bind, or
// the kernel's default) serves every launch (scratch_callable.h). A nanobind class with a
// hand-written vectorcall (vectorcall.h); the GIL is held for the whole launch.

#ifndef KPACK_SRC_PYTHON_BOUND_H_
#define KPACK_SRC_PYTHON_BOUND_H_

#include <Python.h>
#include <cuda.h>
#include <nanobind/nanobind.h>

#include "kpack/kpack.h"

namespace kpack::python {

// Registers kpack.BoundLaunch in `m`.
void InitBound(nanobind::module_& m);

// kernel.bind(*args) (grid and grid_fn null) and kernel[grid].bind(*args): `kernel` is a
// kpack.Kernel object; the arguments are in vectorcall form. New reference, or null with
// a Python exception set.
PyObject* BindCall(PyObject* kernel, const Grid* grid, PyObject* grid_fn, PyObject* const* args,
                   size_t nargs, PyObject* kwnames);

// For kpack.graph (graph.cc): the BoundLaunch of a kpack.BoundLaunch object; null, with no
// exception, for anything else.
BoundLaunch* AsBoundLaunch(PyObject* object);

// The stream a `stream=` argument names, or for None (or null) the stream calling `bound`
// (a kpack.BoundLaunch) would launch on now: its stream= if bound with one, else the
// current stream as for an eager call. False with a Python exception set.
bool BoundStream(PyObject* bound, PyObject* stream, CUstream* out);

// Drops what `bound`'s scratch callable handed out for its last launch (held until that
// launch was issued): for launches kpack::StepGraph sent eagerly (Unseen::kLaunchEagerly),
// which do not pass through b().
void ReleaseBoundScratch(PyObject* bound);

}  // namespace kpack::python

#endif  // KPACK_SRC_PYTHON_BOUND_H_
