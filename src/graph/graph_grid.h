// The grid a StepGraph launches a BoundLaunch with (kpack/graph.h, "Grids"): its exact
// grid, or for a kernel whose pack says its programs tolerate a larger grid
// (KernelSpec::grid_tolerant), the grid expressions evaluated with each bucket parameter
// at its bucket's upper edge, so that every size inside the bucket gives the same grid.

#ifndef KPACK_SRC_GRAPH_GRAPH_GRID_H_
#define KPACK_SRC_GRAPH_GRAPH_GRID_H_

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "kpack/arg.h"
#include "runtime/runtime_impl.h"

namespace kpack::internal {

// The values of bucket `index` (0 for values <= edges[0], ..., edges.size() for the
// open-ended last bucket) that a graph pads to one value, as [low, high]: high is the
// bucket's upper edge, or `grid_max` for the open-ended last bucket; low its lowest value,
// but 1 in the first bucket. Nullopt when the bucket keeps exact grids: the open-ended last
// one without a grid_max, or a first bucket whose edge is below 1. A size below 1 is
// empty work, for which an eager launch sends nothing (the grid expressions give an empty
// grid) and which the pack's grid-tolerance proof therefore never runs: a graph must not
// launch a padded grid there. The one statement of this rule: the builder's proof
// (tools/kpack_tools/grid_proof.py) calls it through the extension (kpack._kpack).
std::optional<std::pair<int64_t, int64_t>> PaddingInterval(std::span<const int64_t> edges,
                                                           std::optional<int64_t> grid_max,
                                                           size_t index);

// Why a launch's graph grid is what it is (for error messages and tests).
enum class GridRule : uint8_t {
  kPadded,          // at the upper edges of its buckets
  kEmptyWork,       // its exact grid is empty: no node, as an eager launch sends nothing
  kBelowProven,     // a bucket value below the proven interval (a size < 1): exact
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

// One launch's graph grid. Its grids are functions of the launch's variant, its explicit
// grid or the values of the call arguments the kernel's grid expressions read, and (for a
// tolerant kernel) the values of its bucket parameters -- its *key* -- so Resolve keeps
// the key and result of its last success and evaluates nothing while the key stays. Not
// thread-safe (one StepGraph's, used as it is: by one thread at a time).
class GridPlan {
 public:
  // Finds the arguments the key holds (allocates; Resolve then allocates nothing).
  explicit GridPlan(const KernelData& kernel);

  // Pins the graph grid (the caller checked the kernel is tolerant).
  void Pin(const Grid& grid) {
    pinned_ = grid;
    exact_key_.variant = nullptr;
  }

  struct Resolved {
    Grid exact;  // what an eager launch would use
    Grid graph;  // what the graph launches
    GridRule rule;
  };
  // For the launch `st` as it is now: the last result again if its key did not change,
  // else Compute's (and the key remembered when it succeeds).
  absl::Status Resolve(const BoundState& st, Resolved* out);
  // For the launch `st` as it is now, remembering nothing. An empty exact grid stays empty
  // (whatever the pin). Errors: the grid expressions' (naming the kernel and variant), a
  // pinned grid smaller than the exact one, a padded grid smaller than the exact one on
  // some axis (grid expressions that do not grow with the sizes).
  absl::Status Compute(const BoundState& st, Resolved* out) const {
    return Run(st, out, nullptr, nullptr, nullptr);
  }

 private:
  // A key: `variant` null when none is remembered; `grid` the explicit grid (when not
  // from_expressions); `values` those of key_args_, in order (sized at construction).
  struct Key {
    const VariantData* variant = nullptr;
    bool from_expressions = false;
    Grid grid;
    std::vector<std::pair<uint64_t, Arg::Kind>> values;
  };
  bool Matches(const Key& key, const VariantData* variant, bool from_expressions,
               const Grid& grid, std::span<const Arg> args) const;
  void Remember(Key* key, const VariantData* variant, bool from_expressions, const Grid& grid,
                std::span<const Arg> args) const;
  // Compute's body. `padded_key`, `padded_grid`, `padded_args`: non-null from Resolve,
  // whose last padded grid (keyed by the padded arguments) it reuses rather than evaluate
  // it again, and whose scratch for the padded arguments (sized at construction: the
  // kernel's argument count) it fills instead of allocating, whatever that count.
  absl::Status Run(const BoundState& st, Resolved* out, Key* padded_key, Grid* padded_grid,
                   std::vector<Arg>* padded_args) const;

  const KernelData* kernel_;
  std::optional<Grid> pinned_;
  // The call arguments the key holds: those any variant's grid expressions read, and a
  // tolerant kernel's bucket parameters (they decide the padding and its rule).
  std::vector<uint16_t> key_args_;
  Key exact_key_;       // the last successful Resolve's
  Resolved exact_{};    // its result
  Key padded_key_;      // the padded arguments of the last padded grid evaluated
  Grid padded_grid_{};  // that grid
  std::vector<Arg> padded_args_;  // Resolve's scratch for Run, one slot per argument
};

}  // namespace kpack::internal

#endif  // KPACK_SRC_GRAPH_GRAPH_GRID_H_
