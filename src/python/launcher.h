// kpack's Python launch objects: the kernel (`pack["add"]`), the kernel with an explicit
// grid (`pack["add"][grid]`) and the bound launch (`kernel.bind(...)`).
//
// They are plain CPython types with vectorcall, not nanobind classes: a call converts its
// arguments straight from the vectorcall array into kpack::Args on the stack, with no
// argument tuple, no keyword dict and no per-call Python object but the result (None).
// Everything else of the extension (opening a pack, names, introspection) is nanobind
// (module.cc).
//
// Arguments, per call parameter kind (from the manifest's Triton type):
//   pointer  a tensor whose type has `__dlpack_c_exchange_api__` (torch >= 2.11: read
//            through the C function table, no Python call), else an object with
//            `data_ptr()` (and `__dlpack_device__()` when it has one, for the device
//            check), else one with `__dlpack__()`; or a plain int, taken as a raw device
//            pointer. A tensor must be on the calling thread's current CUDA device, and its
//            dtype must be the pointer's element type when DLPack describes it.
//   integer  int (or an object with __index__ that is not a tensor), range-checked by the
//            chosen variant's integer type;
//   float    float or int (or an object with __float__ that is not a tensor);
//   i1/u1    bool;
//   tensordesc  a triton.tools.tensor_descriptor.TensorDescriptor (or an object with base,
//            shape, strides, padding): tensordesc.h.
// A tuple parameter's elements are separate parameters (`t.0`, `t.1`), passed positionally.
// Errors: TypeError for a wrong count or kind, ValueError (kpack.InvalidArgumentError)
// for a wrong device, a value that does not fit, or no variant valid for the values;
// nothing is launched.
//
// Stream: `stream=` (an int CUstream, or an object with `.cuda_stream` or
// `__cuda_stream__()`); else the current stream of the exchange-API producer of the first
// tensor argument (torch: torch.cuda.current_stream() of its device, read in C); else, with
// torch imported, torch's current stream of the current device; else the legacy default
// stream.
//
// Scratch: a kernel with Triton global (or profile) scratch memory takes it from the call's
// `scratch=` callable (nbytes, align, stream) -> int address or object with data_ptr(),
// held until the launch is issued (a kpack::ScratchAllocator; see ScratchFromPython), else
// from the kernel object's default (`k.with_scratch(fn)`), else from kpack's arenas.
//
// Devices: a context's device is cached by its cuCtxGetId and mapped from its CUdevice
// handle to the ordinal (DLPack's device_id) through cuDeviceGet.
//
// The GIL is held for the whole launch (a launch is a few microseconds; releasing and
// retaking the GIL would cost more than the time other threads could use).

#ifndef KPACK_SRC_PYTHON_LAUNCHER_H_
#define KPACK_SRC_PYTHON_LAUNCHER_H_

#include <Python.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "driver/driver.h"
#include "kpack/kpack.h"

namespace kpack::python {

// What a Python `_kpack.Runtime` owns. Kernel objects keep their Runtime object alive.
struct RuntimeState {
  Runtime runtime;
  // The same driver library the runtime loaded (dlopen gives the same handle): the
  // launch objects read the current context's device through it.
  std::shared_ptr<const internal::Driver> driver;
  std::string dir;
  // kpack.open(preload="first_use"): the first launch from Python on a device (ordinal
  // < 64) loads every variant into that device's current context (Runtime::Preload), so
  // that no later launch there loads -- which a CUDA graph capture forbids, and torch
  // captures (torch.cuda.graph, cudagraph trees) on a device the program already used.
  bool preload_on_first_use = false;
  uint64_t preloaded_devices = 0;  // bit per device ordinal
};

// Registers the launch types and the kpack exception classes in `module`. False with a
// Python exception set on failure.
bool InitLaunchTypes(PyObject* module);

// A new kernel object for `kernel` of `state`, keeping `owner` (the Python object owning
// `state`) alive. Null with a Python exception set on failure.
PyObject* NewKernelObject(PyObject* owner, RuntimeState* state, Kernel kernel);

// A new kernel object for `kernel` (a view of the pack kernel of `like`, e.g. from
// Kernel::Restrict) sharing `like`'s owner and runtime. Null with a Python exception set.
PyObject* NewKernelObjectLike(PyObject* like, Kernel kernel);

// Launches kernel object `kernel` (a kpack.Kernel) with `grid` (None: the manifest's grid
// expressions; else what kernel[grid] takes) on the call parameters `args` (n objects in
// launch order), as `kernel[grid](*args)` does. New reference (None), or null with a
// Python exception set.
PyObject* LaunchObjects(PyObject* kernel, PyObject* grid, PyObject* const* args, size_t n);

// Whether `kernel` (a kpack.Kernel) is one, and the DLPack dtype of a tensor argument as
// the kernel's launch would read it (through the exchange API, `__dlpack__` readers
// excluded): false for anything else. Never raises.
bool IsKernelObject(PyObject* o);
bool TensorDType(PyObject* o, uint8_t* code, uint8_t* bits);

// A GC-tracked type with vectorcall at `vectorcall_offset` (also its tp_call), `slots`
// besides, and `flags` added (e.g. Py_TPFLAGS_DISALLOW_INSTANTIATION). Null with a Python
// exception set.
PyTypeObject* MakeType(const char* name, int basicsize, Py_ssize_t vectorcall_offset,
                       std::vector<PyType_Slot> slots, const char* doc, unsigned long flags);

// For kpack.graph (graph.cc): the BoundLaunch of a kpack.BoundLaunch object; null, with no
// exception, for anything else.
BoundLaunch* AsBoundLaunch(PyObject* object);

// A `stream=` argument: an int CUstream, a torch.cuda.Stream or an object with
// __cuda_stream__(); None (or null) for the stream calling `bound` (a kpack.BoundLaunch)
// would launch on now: its stream= if bound with one, else its tensors' producer's
// current stream (torch's), else the legacy stream. False with a Python exception set.
bool StreamArg(PyObject* bound, PyObject* stream, CUstream* out);

// Sets the Python exception that corresponds to `status` (see kpack/__init__.py for the
// classes) and returns null.
PyObject* RaiseStatus(const absl::Status& status);

}  // namespace kpack::python

#endif  // KPACK_SRC_PYTHON_LAUNCHER_H_
