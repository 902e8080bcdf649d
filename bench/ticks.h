// What bench/launch_split.cc and the pass-through driver of bench/timing_driver.cc share:
// the clock (src/util/ticks.h) and the driver's stamps.

#ifndef KPACK_BENCH_TICKS_H_
#define KPACK_BENCH_TICKS_H_

#include <cstdint>

#include "util/ticks.h"

namespace kpack::bench {
using internal::Ticks;
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
