// The grid a StepGraph launches a BoundLaunch with (kpack/graph.h, "Grids"): its exact
// grid, or for a kernel whose pack says its programs tolerate a larger grid
// (KernelSpec::grid_tolerant), the grid expressions evaluated with each bucket parameter
// at its bucket's upper edge, so that every size inside the bucket gives the same grid.

#ifndef KPACK_SRC_GRAPH_GRAPH_GRID_H_
#define KPACK_SRC_GRAPH_GRAPH_GRID_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "kpack/arg.h"
#include "runtime/runtime_impl.h"

namespace kpack::internal {

// Why a launch's graph grid is what it is (for error messages and tests).
enum class GridRule : uint8_t {
  kPadded,          // at the upper edges of its buckets
  kPinned,          // StepGraph::PinGrid
  kNotTolerant,     // the kernel has no grid_tolerance: exact
  kExplicitGrid,    // the BoundLaunch has an explicit grid: exact
  kNoBuckets,       // tolerant, but no bucket dims to pad: exact
  kOpenEnded,       // a value in an open-ended last bucket without a maximum: exact
  kAboveMaximum,    // a value above the pack's grid_tolerance.max: exact
};

// The rule's reason as a sentence fragment ("its kernel has no grid_tolerance in the
// pack"), for errors explaining why a grid is part of the signature.
std::string GridRuleText(GridRule rule, const KernelSpec& kernel);

class GridPlan {
 public:
  explicit GridPlan(const KernelData& kernel) : kernel_(&kernel) {}

  // Pins the graph grid (the caller checked the kernel is tolerant).
  void Pin(const Grid& grid) { pinned_ = grid; }

  struct Resolved {
    Grid exact;  // what an eager launch would use
    Grid graph;  // what the graph launches
    GridRule rule;
  };
  // For the launch `st` as it is now. Errors: the grid expressions' (naming the kernel
  // and variant), a pinned grid smaller than the exact one, a padded grid smaller than the
  // exact one on some axis (grid expressions that do not grow with the sizes).
  absl::Status Resolve(const BoundState& st, Resolved* out) const;

 private:
  const KernelData* kernel_;
  std::optional<Grid> pinned_;
};

}  // namespace kpack::internal

#endif  // KPACK_SRC_GRAPH_GRAPH_GRID_H_
