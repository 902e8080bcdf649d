// Devices and streams for Python launches: which device is current, which stream a launch
// goes to, and the one parser of `stream=` values (launches, bind, set_stream, graph
// replays, reserve_scratch and release_scratch all take the same forms).
//
// A stream value is an int CUstream, an object with `.cuda_stream` (torch.cuda.Stream) or
// one with `__cuda_stream__()` (the CUDA Python stream protocol: (version, handle)). A
// call that names none launches on the current stream of the exchange-API producer of its
// first tensor argument (torch: torch.cuda.current_stream() of its device, read in C);
// else, with torch imported and its CUDA initialized, on torch's current stream of the
// current device; else on the legacy default stream (torch's current stream too until it
// initializes CUDA, which kpack then never makes it do). torch is looked up in
// sys.modules, never imported.
//
// The current device comes from the library (Runtime::CurrentDevice: one cuCtxGetId and a
// lookup); a thread with no current context gets the primary context of its tensors'
// device made current (Runtime::UseDevice), as the CUDA runtime would on a thread's first
// call.
//
// Everything here needs the GIL, which also guards the module's state (torch's table).

#ifndef KPACK_SRC_PYTHON_STREAMS_H_
#define KPACK_SRC_PYTHON_STREAMS_H_

#include <Python.h>
#include <cuda.h>
#include <nanobind/nanobind.h>

#include "absl/base/optimization.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "dlpack.h"
#include "runtime_state.h"

namespace kpack::python {

// CurrentDevice when Runtime::CurrentDevice failed with `error`.
bool CurrentDeviceFailed(const RuntimeState& rt, const absl::Status& error, int hint, int* device,
                         bool* have_context);

// The device ordinal of the calling thread's current CUDA context into `device`. With no
// context current: `hint` >= 0 (a tensor's device) makes that device's primary context
// current first; else `*have_context` is false and `*device` -1. False with a Python
// exception set. Inline: every launch with tensor arguments asks once.
inline bool CurrentDevice(const RuntimeState& rt, int hint, int* device, bool* have_context) {
  absl::StatusOr<int> current = rt.runtime.CurrentDevice();
  if (ABSL_PREDICT_FALSE(!current.ok())) {
    return CurrentDeviceFailed(rt, current.status(), hint, device, have_context);
  }
  *have_context = true;
  *device = *current;
  return true;
}

// A `stream=` value (see above) into `stream`. False with a TypeError or ValueError set.
bool ParseStream(PyObject* o, CUstream* stream);

// A producer's current_work_stream failing: sets a RuntimeError unless it raised. False.
bool CurrentWorkStreamFailed();

// The current stream of `device` of the producer whose exchange API is `api` (null when
// the API has no current_work_stream). False with a Python exception set.
inline bool StreamFromApi(const DLPackExchangeAPI* api, int device, CUstream* stream) {
  if (api->current_work_stream == nullptr) {
    *stream = nullptr;
    return true;
  }
  void* s = nullptr;
  if (ABSL_PREDICT_FALSE(api->current_work_stream(kDLCUDA, device, &s) != 0)) {
    return CurrentWorkStreamFailed();
  }
  *stream = static_cast<CUstream>(s);
  return true;
}

// DefaultStream when no tensor was read through an exchange API.
bool DefaultStreamWithoutApi(const RuntimeState& rt, int device, CUstream* stream);

// The stream of a call that named none (see above), given the exchange API of its first
// tensor (null: none read through one) and its device (-1: not known yet). False with a
// Python exception set. Inline: every launch without stream= asks.
inline bool DefaultStream(const RuntimeState& rt, const DLPackExchangeAPI* api, int device,
                          CUstream* stream) {
  if (api == nullptr) return DefaultStreamWithoutApi(rt, device, stream);
  return StreamFromApi(api, device, stream);
}

// For nanobind code: `stream` parsed, or for None the stream a launch without stream= and
// without tensor arguments would use. Throws nanobind's python_error.
CUstream StreamOrDefault(const RuntimeState& rt, nanobind::handle stream);

// The exchange API table a `__dlpack_c_exchange_api__` capsule points at (the newest one
// of DLPack's major version), or null for anything else. Never raises.
const DLPackExchangeAPI* ApiFromCapsule(PyObject* capsule);

}  // namespace kpack::python

#endif  // KPACK_SRC_PYTHON_STREAMS_H_
