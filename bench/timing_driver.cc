// A pass-through CUDA driver for bench/launch_split.cc: loaded in place of libcuda.so.1
// (KPACK_CUDA_DRIVER), it dlopens the real driver ($KPACK_TIMING_REAL_DRIVER, else
// libcuda.so.1) and hands out the real driver's functions through cuGetProcAddress_v2,
// but for cuLaunchKernelEx, where it hands out a wrapper that stamps Ticks() (ticks.h) on
// entry and on return. So a launch's host time splits, where it happens, into the caller's
// part before the driver (kpack's Select, PackArgs and Prepare, or a raw caller's params),
// the driver's own part and what follows it, with the driver's real work evicting
// the caller's data as it does in an application.
//
// kpack resolves every driver function through cuGetProcAddress_v2 (src/driver/driver.cc),
// so that is the only entry point this library needs besides cuInit, which some loaders
// call by name. Not for production: a benchmark instrument.

#include <cuda.h>
#include <cudaTypedefs.h>
#include <dlfcn.h>

#include <cstdlib>
#include <cstring>

#include "ticks.h"

#define KPACK_TIMING_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

using GetProcAddressFn = CUresult (*)(const char*, void**, int, cuuint64_t,
                                      CUdriverProcAddressQueryResult*);

KpackTimingStamps stamps = {};
GetProcAddressFn real_get_proc = nullptr;
PFN_cuLaunchKernelEx_v11060 real_launch = nullptr;

CUresult TimedLaunch(const CUlaunchConfig* config, CUfunction f, void** params, void** extra) {
  stamps.entry = kpack::bench::Ticks();
  const CUresult r = real_launch(config, f, params, extra);
  stamps.exit = kpack::bench::Ticks();
  ++stamps.launches;
  return r;
}

// The real driver's cuGetProcAddress_v2; null when it cannot be loaded (the caller then
// reports the driver as missing, as it would without this library).
GetProcAddressFn RealGetProc() {
  if (real_get_proc == nullptr) {
    const char* path = std::getenv("KPACK_TIMING_REAL_DRIVER");
    void* handle =
        dlopen(path != nullptr && path[0] != '\0' ? path : "libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) return nullptr;
    real_get_proc = reinterpret_cast<GetProcAddressFn>(dlsym(handle, "cuGetProcAddress_v2"));
  }
  return real_get_proc;
}

}  // namespace

KPACK_TIMING_EXPORT KpackTimingStamps* kpack_timing_stamps() { return &stamps; }

#undef cuGetProcAddress
KPACK_TIMING_EXPORT CUresult cuGetProcAddress_v2(const char* symbol, void** function, int version,
                                                 cuuint64_t flags,
                                                 CUdriverProcAddressQueryResult* status) {
  GetProcAddressFn get_proc = RealGetProc();
  if (get_proc == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  const CUresult r = get_proc(symbol, function, version, flags, status);
  if (r == CUDA_SUCCESS && *function != nullptr && std::strcmp(symbol, "cuLaunchKernelEx") == 0) {
    real_launch = reinterpret_cast<PFN_cuLaunchKernelEx_v11060>(*function);
    *function = reinterpret_cast<void*>(&TimedLaunch);
  }
  return r;
}

#undef cuInit
KPACK_TIMING_EXPORT CUresult cuInit(unsigned int flags) {
  GetProcAddressFn get_proc = RealGetProc();
  if (get_proc == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  void* init = nullptr;
  CUdriverProcAddressQueryResult found;
  if (get_proc("cuInit", &init, 2000, CU_GET_PROC_ADDRESS_DEFAULT, &found) != CUDA_SUCCESS ||
      init == nullptr) {
    return CUDA_ERROR_NOT_INITIALIZED;
  }
  return reinterpret_cast<CUresult (*)(unsigned int)>(init)(flags);
}
