// scratch=: Triton scratch memory from a Python callable, as a kpack::ScratchAllocator.
//
// The callable `scratch(nbytes, align, stream)` is asked for each launch's memory (once
// per scratch kind the chosen variant has; `stream` is the launch's CUstream as an int).
// It returns an int device address, which stays the caller's (kpack never frees it), or
// an object with data_ptr() (a tensor, say), which kpack holds until the launch has been
// issued and then releases: with a stream-ordered allocator -- torch's caching allocator,
// allocating on `stream` -- that is safe, as the memory is reused only by work ordered
// after the launch. An exception from the callable fails the launch (nothing launched)
// and propagates as itself (errors.h: RaiseStatus keeps it); nothing of it outlives the
// launch, so the next launch asks the callable again.
//
// Needs the GIL, which every launch from Python holds.

#ifndef KPACK_SRC_PYTHON_SCRATCH_CALLABLE_H_
#define KPACK_SRC_PYTHON_SCRATCH_CALLABLE_H_

#include <Python.h>
#include <cuda.h>

#include "absl/status/status.h"
#include "kpack/kpack.h"

namespace kpack::python {

struct PyScratch {
  PyObject* fn = nullptr;  // borrowed: the call's scratch=, or held by the bound launch
  PyObject* kept[2] = {nullptr, nullptr};  // what the launch's scratch came from

  PyScratch() = default;
  PyScratch(const PyScratch&) = delete;
  PyScratch& operator=(const PyScratch&) = delete;
  ~PyScratch() { Release(); }

  // Drops what the last launch kept (with any pending exception preserved: releasing may
  // run Python code, e.g. a caching allocator's free).
  void Release();
  ScratchAllocator allocator() { return ScratchAllocator{&Allocate, this}; }

 private:
  static CUdeviceptr Allocate(size_t bytes, size_t align, CUstream stream, void* self);
};

// A launch's result: None, or the exception (the scratch callable's own when it is why
// the launch failed). Releases what `scratch` (null: none) kept.
PyObject* LaunchResult(const absl::Status& status, PyScratch* scratch);

}  // namespace kpack::python

#endif  // KPACK_SRC_PYTHON_SCRATCH_CALLABLE_H_
