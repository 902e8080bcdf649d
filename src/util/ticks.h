// A cheap clock for splitting one launch's host time into parts: the x86 time-stamp
// counter (constant rate on the CPUs kpack benchmarks on), steady_clock's nanoseconds
// elsewhere. Not serializing: a stamp may move by a few cycles against the instructions
// around it, which averages out over thousands of launches. Used by profiling builds
// (KPACK_LAUNCH_STAMPS, runtime/launch.h) and kpack's benchmarks, never by the launch
// path of a normal build.

#ifndef KPACK_SRC_UTIL_TICKS_H_
#define KPACK_SRC_UTIL_TICKS_H_

#include <chrono>
#include <cstdint>

#if defined(__x86_64__) || defined(__i386__)
#include <x86intrin.h>
#endif

namespace kpack::internal {

inline uint64_t Ticks() {
#if defined(__x86_64__) || defined(__i386__)
  return __rdtsc();
#else
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
#endif
}

}  // namespace kpack::internal

#endif  // KPACK_SRC_UTIL_TICKS_H_
