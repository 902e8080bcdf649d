// A cheap clock for splitting one launch's host time into parts (bench/launch_split.cc and
// the pass-through driver of bench/timing_driver.cc read the same one): the x86 time-stamp
// counter (constant rate on every CPU kpack benchmarks on), steady_clock's nanoseconds
// elsewhere. Not serializing: a stamp may move by a few cycles against the instructions
// around it, which averages out over thousands of launches.

#ifndef KPACK_BENCH_TICKS_H_
#define KPACK_BENCH_TICKS_H_

#include <chrono>
#include <cstdint>

#if defined(__x86_64__) || defined(__i386__)
#include <x86intrin.h>
#endif

namespace kpack::bench {

inline uint64_t Ticks() {
#if defined(__x86_64__) || defined(__i386__)
  return __rdtsc();
#else
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
#endif
}

}  // namespace kpack::bench

// What the pass-through driver records of the last cuLaunchKernelEx: Ticks() on entry and
// on return, and a count of the launches it passed on (so a benchmark can tell that its
// launches went through it). Written by the launching thread only; the driver hands it out
// through its exported `KpackTimingStamps* kpack_timing_stamps()`.
struct KpackTimingStamps {
  uint64_t entry;
  uint64_t exit;
  uint64_t launches;
};

#endif  // KPACK_BENCH_TICKS_H_
