// Loading the CUDA driver (driver.h): dlopen, cuGetProcAddress for every symbol of
// driver_symbols.h, cuInit, and the one CUresult-to-Status conversion with its advice.

#include "driver/driver.h"

#include <dlfcn.h>

#include <cstdlib>
#include <utility>

#include "absl/strings/str_cat.h"

namespace kpack::internal {
namespace {

using GetProcAddressFn = CUresult(CUDAAPI*)(const char*, void**, int, cuuint64_t,
                                            CUdriverProcAddressQueryResult*);

// Where the driver path came from decides the advice when it cannot be loaded: only a
// user who chose nothing is told about KPACK_CUDA_DRIVER.
enum class PathOrigin { kExplicit, kEnvironment, kDefault };

PathOrigin ResolvePath(std::string& path) {
  if (!path.empty()) return PathOrigin::kExplicit;
  const char* env = std::getenv("KPACK_CUDA_DRIVER");
  if (env != nullptr && env[0] != '\0') {
    path = env;
    return PathOrigin::kEnvironment;
  }
  path = "libcuda.so.1";
  return PathOrigin::kDefault;
}

std::string Advice(PathOrigin origin) {
  switch (origin) {
    case PathOrigin::kExplicit:
      return "the path was given explicitly (Options::driver_path or --driver): point it at "
             "the CUDA driver library, or leave it empty for KPACK_CUDA_DRIVER or the "
             "system's libcuda.so.1";
    case PathOrigin::kEnvironment:
      return "the path came from KPACK_CUDA_DRIVER: point it at the CUDA driver library, or "
             "unset it for the system's libcuda.so.1";
    case PathOrigin::kDefault:
      break;
  }
  return "install the NVIDIA driver, or set KPACK_CUDA_DRIVER or Options::driver_path to the "
         "driver library";
}

}  // namespace

absl::StatusCode StatusCodeForCuResult(CUresult result) {
  switch (result) {
    case CUDA_ERROR_OUT_OF_MEMORY:
      return absl::StatusCode::kResourceExhausted;
    case CUDA_ERROR_INVALID_VALUE:
    case CUDA_ERROR_INVALID_HANDLE:
    case CUDA_ERROR_INVALID_IMAGE:
    case CUDA_ERROR_NOT_FOUND:
      return absl::StatusCode::kInvalidArgument;
    case CUDA_ERROR_NOT_INITIALIZED:
    case CUDA_ERROR_DEINITIALIZED:
    case CUDA_ERROR_NO_DEVICE:
      return absl::StatusCode::kUnavailable;
    case CUDA_ERROR_NO_BINARY_FOR_GPU:
    case CUDA_ERROR_NOT_SUPPORTED:
    case CUDA_ERROR_INVALID_CONTEXT:
    case CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED:
    case CUDA_ERROR_STREAM_CAPTURE_INVALIDATED:
      return absl::StatusCode::kFailedPrecondition;
    default:
      return absl::StatusCode::kInternal;
  }
}

absl::Status Driver::Error(CUresult result, absl::string_view what) const {
  const char* name = nullptr;
  const char* text = nullptr;
  if (GetErrorName == nullptr || GetErrorName(result, &name) != CUDA_SUCCESS) name = nullptr;
  if (GetErrorString == nullptr || GetErrorString(result, &text) != CUDA_SUCCESS) {
    text = nullptr;
  }
  return absl::Status(StatusCodeForCuResult(result),
                      absl::StrCat(what, " failed: ", name != nullptr ? name : "CUDA error", " (",
                                   static_cast<int>(result), ")",
                                   text != nullptr ? absl::StrCat(": ", text) : std::string()));
}

absl::StatusOr<std::shared_ptr<const Driver>> Driver::Load(std::string path) {
  const PathOrigin origin = ResolvePath(path);
  auto driver = std::make_shared<Driver>();
  driver->path = path;

  driver->handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (driver->handle == nullptr) {
    const char* why = dlerror();
    return absl::UnavailableError(absl::StrCat(
        "no CUDA driver: dlopen(\"", path, "\") failed (", why != nullptr ? why : "unknown",
        "); ", Advice(origin)));
  }
  auto get_proc = reinterpret_cast<GetProcAddressFn>(dlsym(driver->handle, "cuGetProcAddress_v2"));
  if (get_proc == nullptr) {
    return absl::UnavailableError(
        absl::StrCat("CUDA driver '", path,
                     "' has no cuGetProcAddress_v2: kpack needs a CUDA 12.4 or newer driver",
                     origin == PathOrigin::kDefault ? "" : absl::StrCat("; ", Advice(origin))));
  }

#define KPACK_DRIVER_SYMBOL(name, version)                                                      \
  {                                                                                             \
    void* fn = nullptr;                                                                         \
    CUdriverProcAddressQueryResult found = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;                \
    CUresult r = get_proc("cu" #name, &fn, version, CU_GET_PROC_ADDRESS_DEFAULT, &found);       \
    if (r != CUDA_SUCCESS || found != CU_GET_PROC_ADDRESS_SUCCESS || fn == nullptr) {           \
      return absl::UnavailableError(                                                            \
          absl::StrCat("CUDA driver '", path, "' does not provide cu" #name " (ABI version ",   \
                       version, "): the driver is too old for kpack, which needs CUDA 12.4+")); \
    }                                                                                           \
    driver->name = reinterpret_cast<PFN_cu##name##_v##version>(fn);                             \
  }
#include "driver/driver_symbols.h"
#undef KPACK_DRIVER_SYMBOL

  CUresult init = driver->Init(0);
  if (init != CUDA_SUCCESS) {
    absl::Status s = driver->Error(init, absl::StrCat("cuInit in '", path, "'"));
    return absl::UnavailableError(
        absl::StrCat(s.message(), "; the driver library loaded but no usable GPU was found"));
  }
  return std::shared_ptr<const Driver>(std::move(driver));
}

}  // namespace kpack::internal
