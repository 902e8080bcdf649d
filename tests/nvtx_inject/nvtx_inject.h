// Read side of kpack_nvtx_inject, an NVTX injection library that records the
// NVTX domain ranges a process emits, so tests can check kpack's annotations
// without a profiler.
//
// How a test uses it:
//   1. Before the process makes its first NVTX call, set
//      NVTX_INJECTION64_PATH to the library's path (CMake:
//      $<TARGET_FILE:kpack_nvtx_inject>). NVTX reads the variable once, at
//      that first call, dlopens the path and calls InitializeInjectionNvtx2;
//      setting it later has no effect for the rest of the process.
//   2. Read the recorder through the functions below, either by linking
//      kpack_nvtx_inject or by dlopen/dlsym of the same path. Both reach the
//      one copy NVTX loaded: glibc identifies an already loaded object by its
//      file, so a dlopen of the path returns the linked copy.
//
// The recorder hooks the domain API only (nvtxDomainCreateA,
// nvtxDomainRegisterStringA, nvtxDomainRangePushEx, nvtxDomainRangePop,
// nvtxDomainDestroy), which is what kpack uses; every other NVTX call is a
// no-op while it is injected.
//
// Every function is thread-safe. Indices count from 0 since the last reset.
// Returned strings stay valid until the next kpack_nvtx_inject_reset().
//
// This is a C API so a test can look the functions up with dlsym by name.

#ifndef KPACK_TESTS_NVTX_INJECT_NVTX_INJECT_H_
#define KPACK_TESTS_NVTX_INJECT_NVTX_INJECT_H_

#include <stddef.h>
#include <stdint.h>

#define KPACK_NVTX_INJECT_API __attribute__((visibility("default")))

#ifdef __cplusplus
extern "C" {
#endif

// 1 once NVTX has called InitializeInjectionNvtx2 and the callbacks are
// installed, else 0. 0 means NVTX_INJECTION64_PATH was not set (or not set
// early enough) and nothing will be recorded.
KPACK_NVTX_INJECT_API int kpack_nvtx_inject_initialized(void);

// Clears the range log, the pop count and the depth statistics. Domains and
// registered strings survive: a library registers those once, at load, and
// later tests still push with them.
KPACK_NVTX_INJECT_API void kpack_nvtx_inject_reset(void);

// Number of nvtxDomainRangePushEx / nvtxDomainRangePop calls, all threads.
KPACK_NVTX_INJECT_API size_t kpack_nvtx_inject_push_count(void);
KPACK_NVTX_INJECT_API size_t kpack_nvtx_inject_pop_count(void);

// Text of push `i`: the string registered with nvtxDomainRegisterStringA whose
// handle the push passed as its registered message. NULL when the push used
// another message type (e.g. ASCII), passed a handle nobody registered, or
// passed a handle registered in a different domain, so a test expecting a
// text also checks that the message was registered properly. NULL when `i` is
// out of range.
KPACK_NVTX_INJECT_API const char* kpack_nvtx_inject_push_text(size_t i);

// Name of the domain push `i` was made in. NULL for the default (null) domain,
// a destroyed or unknown handle, or `i` out of range.
KPACK_NVTX_INJECT_API const char* kpack_nvtx_inject_push_domain(size_t i);

// Deepest nesting of ranges open at once on any single thread (depth counts
// every domain's ranges on that thread together).
KPACK_NVTX_INJECT_API int kpack_nvtx_inject_max_depth(void);

// The log of pushes and pops in the order they were recorded, all threads.
// kpack_nvtx_inject_event_is_push returns 1 for a push, 0 for a pop and -1
// when `i` is out of range. kpack_nvtx_inject_event_thread returns the Linux
// thread id (gettid) that made event `i`, 0 when out of range.
KPACK_NVTX_INJECT_API size_t kpack_nvtx_inject_event_count(void);
KPACK_NVTX_INJECT_API int kpack_nvtx_inject_event_is_push(size_t i);
KPACK_NVTX_INJECT_API uint64_t kpack_nvtx_inject_event_thread(size_t i);

#ifdef __cplusplus
}  // extern "C"
#endif

#endif  // KPACK_TESTS_NVTX_INJECT_NVTX_INJECT_H_
