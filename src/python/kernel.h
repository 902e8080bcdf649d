// kpack.Kernel (`pack["add"]`) and kpack.GridLaunch (`pack["add"][grid]`): a pack kernel
// from Python, and the eager launch.
//
//   k(*args, stream=None, scratch=None, grid=None)   launch (grid: the manifest's grid
//                                                    expressions, or grid= as k[grid])
//   k[grid](*args, stream=None, scratch=None)        launch with `grid`: an int, a 1-3
//                                                    tuple, or a callable of the meta dict
//   k.bind(...), k.select_variant(...), k.stats(), k.restrict(...), k.with_scratch(...)
//
// Arguments: convert.h. Stream: streams.h. Scratch: scratch=, else the kernel's default
// (k.with_scratch(fn)), else kpack's arenas (scratch_callable.h). A callable grid gets
// Triton's meta dict (meta.h). kpack.open(preload="first_use") loads every variant at the
// first launch on a device.
//
// kpack.Kernel is a nanobind class with a hand-written vectorcall (vectorcall.h); the GIL
// is held for the whole launch (a launch is a few microseconds; releasing and retaking the
// GIL would cost more than the time other threads could use).

#ifndef KPACK_SRC_PYTHON_KERNEL_H_
#define KPACK_SRC_PYTHON_KERNEL_H_

#include <Python.h>
#include <nanobind/nanobind.h>

#include <memory>
#include <span>

#include "convert.h"
#include "kpack/kpack.h"
#include "plan.h"
#include "runtime_state.h"

namespace kpack::python {

struct KernelObj {
  vectorcallfunc vectorcall;
  nanobind::object owner;  // the _kpack.Runtime object: keeps `rt` alive
  RuntimeState* rt = nullptr;
  std::shared_ptr<const KernelPlan> plan;  // shared with with_scratch's copies
  nanobind::object scratch;  // the default scratch= allocator (with_scratch), or null
};

// Registers kpack.Kernel, kpack.GridLaunch, kpack.VariantStats, kpack.Param and
// kpack.Variant in `m`.
void InitKernel(nanobind::module_& m);

// A new kernel object for `kernel` of `rt`, keeping `owner` (the Python object owning
// `rt`) alive. Throws nanobind's python_error.
nanobind::object NewKernelObject(nanobind::handle owner, RuntimeState* rt, Kernel kernel);

bool IsKernelObject(PyObject* o);

// Launches kernel object `kernel` with `grid` (None: the manifest's grid expressions; else
// what kernel[grid] takes) on the call parameters `args` (n objects in launch order), as
// `kernel[grid](*args)` does: the drop-in's launch. New reference (None), or null with a
// Python exception set.
PyObject* LaunchObjects(PyObject* kernel, PyObject* grid, PyObject* const* args, size_t n);

// ---- the steps a launch shares with bind (bound.cc)

// kpack.open(preload="first_use"): loads every variant at the first launch on a device.
// False with a Python exception set.
bool MaybePreload(RuntimeState* rt, int device);

// A call's grid= (None: as if not given) merged into the kernel[grid] it may not also have:
// k(*args, grid=g) is k[g](*args). `storage` holds a parsed grid. False with an exception.
bool GridKeyword(const KernelPlan& p, const CallState& st, const Grid** grid,
                 PyObject** grid_fn, Grid* storage);

// A callable grid's value for these arguments: Triton calls `grid(meta)` with the launch's
// named arguments, the chosen variant's constexprs and launch options (meta.h).
bool EvalGridFn(const KernelPlan& p, PyObject* grid_fn, std::span<const Arg> args,
                PyObject* const* objects, Grid* grid);

// The scratch callable of a call: its scratch= (None: none), else the kernel's default.
PyObject* ScratchFn(const KernelObj& k, const CallState& st);

}  // namespace kpack::python

#endif  // KPACK_SRC_PYTHON_KERNEL_H_
