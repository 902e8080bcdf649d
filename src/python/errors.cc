// kpack's Python exceptions and the status mapping; see errors.h.

#include "errors.h"

#include <cstdarg>
#include <string>
#include <string_view>

namespace nb = nanobind;

namespace kpack::python {
namespace {

struct ExceptionTypes {
  PyObject* error = nullptr;  // kpack.Error(RuntimeError)
  PyObject* invalid_argument = nullptr;
  PyObject* not_found = nullptr;
  PyObject* failed_precondition = nullptr;
  PyObject* unavailable = nullptr;
  PyObject* unimplemented = nullptr;
  PyObject* resource_exhausted = nullptr;
  PyObject* out_of_range = nullptr;
  PyObject* internal = nullptr;
};
ExceptionTypes g_exc;  // created once, kept for the process's life

PyObject* ExceptionFor(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kInvalidArgument:
      return g_exc.invalid_argument;
    case absl::StatusCode::kNotFound:
      return g_exc.not_found;
    case absl::StatusCode::kFailedPrecondition:
      return g_exc.failed_precondition;
    case absl::StatusCode::kUnavailable:
      return g_exc.unavailable;
    case absl::StatusCode::kUnimplemented:
      return g_exc.unimplemented;
    case absl::StatusCode::kResourceExhausted:
      return g_exc.resource_exhausted;
    case absl::StatusCode::kOutOfRange:
      return g_exc.out_of_range;
    case absl::StatusCode::kInternal:
      return g_exc.internal;
    default:
      return g_exc.error;
  }
}

// Raises `type(message)` with `.code` set to the status code's name. Null.
PyObject* RaiseWithCode(PyObject* type, std::string_view message, absl::StatusCode code) {
  PyObject* text = PyUnicode_FromStringAndSize(message.data(),
                                               static_cast<Py_ssize_t>(message.size()));
  if (text == nullptr) return nullptr;
  PyObject* exc = PyObject_CallOneArg(type, text);
  Py_DECREF(text);
  if (exc == nullptr) return nullptr;
  const std::string name = absl::StatusCodeToString(code);
  PyObject* code_name = PyUnicode_FromString(name.c_str());
  if (code_name == nullptr || PyObject_SetAttrString(exc, "code", code_name) != 0) {
    Py_XDECREF(code_name);
    Py_DECREF(exc);
    return nullptr;
  }
  Py_DECREF(code_name);
  PyErr_SetObject(type, exc);
  Py_DECREF(exc);
  return nullptr;
}

// The C++ API's names in the library's messages and what a Python user calls instead, the
// more specific first (each is replaced wherever it occurs).
struct Respelling {
  std::string_view cpp, python;
};
constexpr Respelling kRespellings[] = {
    {"Options::driver_path or --driver", "kpack.open(..., driver=...)"},
    {"Options::driver_path", "kpack.open(..., driver=...)"},
    {"Runtime::Preload() or Kernel::Preload()", "pack.preload() or kernel.preload()"},
    {"Runtime::Preload()", "pack.preload()"},
    {"Runtime::UseDevice", "pack.use_device(ordinal)"},
    {"StepGraph::Unseen::kError", "unseen='error'"},
    {"StepGraph::Unseen::kBuild", "unseen='build'"},
    {"StepGraph::Unseen::kLaunchEagerly", "unseen='launch_eagerly'"},
    {"StepGraph::Options::max_graphs", "kpack.graph(..., max_graphs=...)"},
    {"StepGraph::PinGrid", "StepGraph.pin_grid"},
    {"PinGrid", "pin_grid"},
    {"with Build() first", "with build() first"},
    {"kpack::Kernel::Restrict", "kpack.Kernel.restrict"},
    {"kpack::Kernel", "kpack.Kernel"},
    {"kpack::TensorDesc", "tensor descriptor"},
    {"ReserveScratch on a stream", "reserve_scratch on a stream"},
    {"ReleaseScratch on a stream", "release_scratch on a stream"},
};

// "Runtime::ReserveScratch(stream, N)" -> "pack.reserve_scratch(N, stream)": the Python
// method takes the size first.
constexpr std::string_view kReserveCpp = "Runtime::ReserveScratch(stream, ";

}  // namespace

std::string PythonSpelling(std::string_view message) {
  std::string out(message);
  for (const Respelling& r : kRespellings) {
    for (size_t at = out.find(r.cpp); at != std::string::npos;
         at = out.find(r.cpp, at + r.python.size())) {
      out.replace(at, r.cpp.size(), r.python);
    }
  }
  for (size_t at = out.find(kReserveCpp); at != std::string::npos; at = out.find(kReserveCpp)) {
    const size_t bytes = at + kReserveCpp.size();
    const size_t close = out.find(')', bytes);
    if (close == std::string::npos) break;
    out.replace(at, close - at + 1,
                "pack.reserve_scratch(" + out.substr(bytes, close - bytes) + ", stream)");
  }
  return out;
}

PyObject* RaiseStatus(const absl::Status& status) {
  if (PyErr_Occurred()) return nullptr;  // raised by Python code kpack called: see errors.h
  const std::string message = PythonSpelling(
      std::string_view(status.message().data(), status.message().size()));
  return RaiseWithCode(ExceptionFor(status.code()), message, status.code());
}

void Throw(const absl::Status& status) {
  RaiseStatus(status);
  throw nb::python_error();
}

PyObject* ValueErrorF(const char* format, ...) {
  va_list args;
  va_start(args, format);
  PyObject* text = PyUnicode_FromFormatV(format, args);
  va_end(args);
  if (text == nullptr) return nullptr;
  Py_ssize_t size = 0;
  const char* utf8 = PyUnicode_AsUTF8AndSize(text, &size);
  if (utf8 != nullptr) {
    RaiseWithCode(g_exc.invalid_argument, std::string_view(utf8, static_cast<size_t>(size)),
                  absl::StatusCode::kInvalidArgument);
  }
  Py_DECREF(text);
  return nullptr;
}

namespace {

PyObject* MakeException(PyObject* module, const char* name, PyObject* bases, const char* doc) {
  std::string full = std::string("kpack.") + name;
  PyObject* type = PyErr_NewExceptionWithDoc(full.c_str(), doc, bases, nullptr);
  if (type == nullptr) return nullptr;
  if (PyModule_AddObjectRef(module, name, type) != 0) {
    Py_DECREF(type);
    return nullptr;
  }
  return type;  // kept for the process's life
}

}  // namespace

bool InitErrors(PyObject* m) {
  g_exc.error = MakeException(
      m, "Error", PyExc_RuntimeError,
      "An error from kpack; `code` is the absl::Status code name (e.g. 'INVALID_ARGUMENT').");
  if (g_exc.error == nullptr) return false;
  struct Sub {
    PyObject** slot;
    const char* name;
    PyObject* builtin;
    const char* doc;
  };
  const Sub subs[] = {
      {&g_exc.invalid_argument, "InvalidArgumentError", PyExc_ValueError,
       "INVALID_ARGUMENT: a value the kernel cannot take (no variant valid for it, an "
       "integer that does not fit, a tensor on the wrong device), or a malformed pack."},
      {&g_exc.not_found, "NotFoundError", PyExc_LookupError,
       "NOT_FOUND: no such kernel, pack directory or file."},
      {&g_exc.failed_precondition, "FailedPreconditionError", nullptr,
       "FAILED_PRECONDITION: the system is not in a state to do this (e.g. no CUDA context "
       "current, a kernel with no grid expressions launched without a grid, a cubin for "
       "another GPU)."},
      {&g_exc.unavailable, "UnavailableError", nullptr,
       "UNAVAILABLE: no CUDA driver could be loaded or initialized."},
      {&g_exc.unimplemented, "UnimplementedError", PyExc_NotImplementedError,
       "UNIMPLEMENTED: a pack feature this kpack version does not support."},
      {&g_exc.resource_exhausted, "ResourceExhaustedError", nullptr,
       "RESOURCE_EXHAUSTED: out of device memory (scratch arenas), or a scratch= callable "
       "that returned 0."},
      {&g_exc.out_of_range, "OutOfRangeError", PyExc_IndexError, "OUT_OF_RANGE."},
      {&g_exc.internal, "InternalError", nullptr, "INTERNAL: a driver error."},
  };
  for (const Sub& s : subs) {
    PyObject* bases = s.builtin != nullptr ? PyTuple_Pack(2, g_exc.error, s.builtin)
                                           : PyTuple_Pack(1, g_exc.error);
    if (bases == nullptr) return false;
    *s.slot = MakeException(m, s.name, bases, s.doc);
    Py_DECREF(bases);
    if (*s.slot == nullptr) return false;
  }
  return true;
}

}  // namespace kpack::python
