// kpack: launch precompiled GPU kernels (Triton cubins) from C++ at the driver's own cost.
//
// The one header a user includes. See kpack/runtime.h for the API and its contracts,
// kpack/arg.h for how C++ values map to kernel parameters, kpack/pack.h for reading and
// describing a pack without a driver, kpack/graph.h for CUDA graphs of a step of launches
// replayed with new sizes, and docs/pack-format.md for the pack directory a Runtime opens.

#ifndef KPACK_KPACK_H_
#define KPACK_KPACK_H_

#include "kpack/arg.h"      // IWYU pragma: export
#include "kpack/graph.h"    // IWYU pragma: export
#include "kpack/pack.h"     // IWYU pragma: export
#include "kpack/runtime.h"  // IWYU pragma: export

#endif  // KPACK_KPACK_H_
