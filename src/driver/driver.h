// The CUDA driver, loaded at run time.
//
// kpack never links libcuda: `Driver::Load` dlopens it (or a stand-in such as the tests'
// recording fake) and resolves every function of driver_symbols.h through
// cuGetProcAddress into a table of typed pointers. The table is passed by reference to
// whatever needs the driver; there is no global.
//
// Thread safety: a loaded Driver is immutable and may be shared by any number of threads.

#ifndef KPACK_SRC_DRIVER_DRIVER_H_
#define KPACK_SRC_DRIVER_DRIVER_H_

#include <cuda.h>
#include <cudaTypedefs.h>

#include <memory>
#include <string>

#include "absl/base/attributes.h"
#include "absl/base/optimization.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kpack::internal {

struct Driver {
#define KPACK_DRIVER_SYMBOL(name, version) PFN_cu##name##_v##version name = nullptr;
#include "driver/driver_symbols.h"
#undef KPACK_DRIVER_SYMBOL

  // The path that was dlopened, for messages.
  std::string path;
  // The dlopen handle. Never closed: unloading libcuda while any thread may still call
  // into it is unsafe, and the process keeps it anyway.
  void* handle = nullptr;

  // Loads `path`; empty means $KPACK_CUDA_DRIVER, else "libcuda.so.1". Then calls cuInit.
  // UNAVAILABLE, with a sentence naming what was tried (and advice that fits where the
  // path came from: explicit, KPACK_CUDA_DRIVER or the default), when the library is missing, has
  // no cuGetProcAddress, lacks one of the functions, or cuInit fails (no device, driver
  // too old...). Never crashes on a machine with no GPU.
  static absl::StatusOr<std::shared_ptr<const Driver>> Load(std::string path);

  // OK for CUDA_SUCCESS; otherwise a status naming `what` (the call and its subject,
  // e.g. "cuLibraryLoadData for kernel 'add' variant 'default'"), the error's name and
  // number and the driver's description. The success test is inline; the message is
  // built out of line.
  absl::Status Check(CUresult result, absl::string_view what) const {
    if (ABSL_PREDICT_TRUE(result == CUDA_SUCCESS)) return absl::OkStatus();
    return Error(result, what);
  }
  ABSL_ATTRIBUTE_NOINLINE absl::Status Error(CUresult result, absl::string_view what) const;
};

// Maps a driver error to the closest status code: out of memory -> RESOURCE_EXHAUSTED,
// invalid value/handle -> INVALID_ARGUMENT, not initialized/no device -> UNAVAILABLE,
// no binary for GPU / unsupported -> FAILED_PRECONDITION, everything else -> INTERNAL.
absl::StatusCode StatusCodeForCuResult(CUresult result);

}  // namespace kpack::internal

#endif  // KPACK_SRC_DRIVER_DRIVER_H_
