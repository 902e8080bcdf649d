// kpack's Python exceptions (kpack.Error and its subclasses, one per absl::StatusCode the
// library returns) and the one mapping from absl::Status to them, used by every part of
// the extension: hand-written CPython code calls RaiseStatus and returns null; nanobind
// code calls Throw (or ThrowIfError), which raises the same exception through nanobind.
//
// The mapping also respells the library's messages for Python users: they are written for
// C++ callers ("set Options::driver_path", "call Runtime::ReserveScratch(stream, 4096)")
// and become the Python API's names ("kpack.open(..., driver=...)",
// "pack.reserve_scratch(4096, stream)"); PythonSpelling has the table.

#ifndef KPACK_SRC_PYTHON_ERRORS_H_
#define KPACK_SRC_PYTHON_ERRORS_H_

#include <Python.h>
#include <nanobind/nanobind.h>

#include <string>
#include <string_view>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace kpack::python {

// Creates kpack.Error and its subclasses in `module`. False with a Python exception set.
bool InitErrors(PyObject* module);

// Sets the Python exception for a failed `status` (its class chosen by the status code,
// with `.code` the code's name and the message in Python spelling) and returns null.
// When a Python exception is already set, Python code kpack called during the operation
// raised it (a scratch= callable, a callable grid): that is why the operation failed, so
// it stays set, unchanged, and `status` is dropped.
PyObject* RaiseStatus(const absl::Status& status);

// RaiseStatus, then throws nanobind's python_error so that nanobind code propagates it.
[[noreturn]] void Throw(const absl::Status& status);
inline void ThrowIfError(const absl::Status& status) {
  if (!status.ok()) Throw(status);
}
template <typename T>
T ValueOrThrow(absl::StatusOr<T> value) {
  if (!value.ok()) Throw(value.status());
  return *std::move(value);
}

// The extension's own argument errors: kpack.InvalidArgumentError (a ValueError) with a
// PyUnicode_FromFormat message, like the same kind of error found by the library; wrong
// kinds and counts are the builtin TypeError. Returns null.
PyObject* ValueErrorF(const char* format, ...);

// `message` with the C++ API's names replaced by the Python API's.
std::string PythonSpelling(std::string_view message);

}  // namespace kpack::python

#endif  // KPACK_SRC_PYTHON_ERRORS_H_
