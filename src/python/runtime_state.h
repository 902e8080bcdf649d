// What a Python `_kpack.Runtime` (kpack.open's object) owns: the kpack::Runtime and what
// the Python launch path adds to it. Kernel objects keep their Runtime object alive.

#ifndef KPACK_SRC_PYTHON_RUNTIME_STATE_H_
#define KPACK_SRC_PYTHON_RUNTIME_STATE_H_

#include <cstdint>
#include <string>

#include "kpack/kpack.h"

namespace kpack::python {

struct RuntimeState {
  Runtime runtime;
  std::string dir;
  // kpack.open(preload="first_use"): the first launch from Python on a device (ordinal
  // < 64) loads every variant into that device's current context (Runtime::Preload), so
  // that no later launch there loads -- which a CUDA graph capture forbids, and torch
  // captures (torch.cuda.graph, cudagraph trees) on a device the program already used.
  bool preload_on_first_use = false;
  uint64_t preloaded_devices = 0;  // bit per device ordinal
};

}  // namespace kpack::python

#endif  // KPACK_SRC_PYTHON_RUNTIME_STATE_H_
