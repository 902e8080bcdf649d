// The launch entry that kpack._kpack offers native code in the same process: how
// kpack.torch's C++ op implementations (libkpack_torch_ops.so, torch_ops.cc) launch the
// very kernel a Python kpack.Kernel holds, through the runtime that object belongs to, with
// no Python in between and no second copy of kpack.
//
// `_kpack._native_api()` returns a PyCapsule named KPACK_NATIVE_API_CAPSULE whose pointer
// is a KpackNativeApi that lives as long as the process; `kernel._native_handle()` returns
// (as an int) the handle of a kpack.Kernel, valid while that Python object lives -- the
// caller keeps the object alive for as long as it may launch through the handle.
//
// Both libraries are built from one source tree by one build (src/python/CMakeLists.txt)
// and installed together, so the struct may hold C++ types (kpack::Arg, Grid,
// ScratchAllocator) rather than a C spelling of them; `version` and `size` still refuse a
// table from another build. Entries never touch Python: they may run without the GIL (torch
// releases it around an op called from Python) and on any thread (kpack::Kernel is
// thread-safe).

#ifndef KPACK_SRC_PYTHON_NATIVE_API_H_
#define KPACK_SRC_PYTHON_NATIVE_API_H_

#include <cuda.h>

#include <cstddef>
#include <cstdint>

#include "kpack/arg.h"
#include "kpack/runtime.h"

#define KPACK_NATIVE_API_CAPSULE "kpack._kpack.native_api"

inline constexpr uint32_t kKpackNativeApiVersion = 1;

struct KpackNativeApi {
  uint32_t version;  // kKpackNativeApiVersion
  uint32_t size;     // sizeof(KpackNativeApi)

  // The kernel's name, and its call parameters (constexprs excluded) in launch order: name
  // and Triton type as in the manifest ("*fp32", "i32", "tensordesc<fp16[64, 64]>").
  // The strings live as long as the kernel object.
  const char* (*kernel_name)(const void* kernel);
  size_t (*num_params)(const void* kernel);
  const char* (*param_name)(const void* kernel, size_t i);
  const char* (*param_type)(const void* kernel, size_t i);

  // Launches `kernel` with `args` (one per call parameter) on `stream` in the calling
  // thread's current CUDA context, which is device `device`'s (with none current, the
  // device's primary context is made current, as the Python launch does): with `grid`, or
  // the manifest's grid expressions when null; scratch from `scratch` when not null, else
  // kpack's arenas. Loads every variant first when the pack was opened or registered with
  // preload on first use and this device has not been loaded yet (as the Python launch
  // does). Allocates nothing on success. Returns 0 (absl::StatusCode::kOk) or the failed
  // status's code, with its message copied into `error` (NUL-terminated, truncated to
  // `error_size`).
  int (*launch)(const void* kernel, const kpack::Arg* args, size_t num_args,
                const kpack::Grid* grid, CUstream stream, int device,
                const kpack::ScratchAllocator* scratch, char* error, size_t error_size);
};

#endif  // KPACK_SRC_PYTHON_NATIVE_API_H_
