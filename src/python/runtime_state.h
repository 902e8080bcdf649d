// What a Python `_kpack.Runtime` (kpack.open's object) owns: the kpack::Runtime and what
// the Python launch path adds to it. Kernel objects keep their Runtime object alive.

#ifndef KPACK_SRC_PYTHON_RUNTIME_STATE_H_
#define KPACK_SRC_PYTHON_RUNTIME_STATE_H_

#include <atomic>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "kpack/kpack.h"

namespace kpack::python {

struct RuntimeState {
  Runtime runtime;
  std::string dir;
  // kpack.open(preload="first_use"): the first launch from Python on a device (ordinal
  // < 64) loads every variant into that device's current context (Runtime::Preload), so
  // that no later launch there loads -- which a CUDA graph capture forbids, and torch
  // captures (torch.cuda.graph, cudagraph trees) on a device the program already used.
  // Set before launches that rely on it (kpack.open, kpack.torch.register).
  bool preload_on_first_use = false;
  // Bit per device ordinal. Atomic: kpack.torch's native ops launch without the GIL.
  std::atomic<uint64_t> preloaded_devices{0};
};

// kpack.open(preload="first_use"): loads every variant into `device`'s current context at
// the first launch there (a device >= 64 is never preloaded). Two threads may both load at
// once, which Runtime::Preload allows; every later launch reads one relaxed atomic. Needs
// no GIL.
absl::Status PreloadOnFirstUse(RuntimeState* rt, int device);

}  // namespace kpack::python

#endif  // KPACK_SRC_PYTHON_RUNTIME_STATE_H_
