#include "graph/graph_grid.h"

#include <string>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "kpack/graph.h"
#include "launch/args.h"
#include "util/status_macros.h"

namespace kpack::internal {
namespace {

bool Covers(const Grid& big, const Grid& small) {
  return big.x >= small.x && big.y >= small.y && big.z >= small.z;
}

std::string GridText(const Grid& g) { return absl::StrCat("(", g.x, ", ", g.y, ", ", g.z, ")"); }

}  // namespace

std::optional<std::pair<int64_t, int64_t>> PaddingInterval(std::span<const int64_t> edges,
                                                           std::optional<int64_t> grid_max,
                                                           size_t index) {
  int64_t low, high;
  if (index < edges.size()) {
    high = edges[index];
    low = index > 0 ? edges[index - 1] + 1 : 1;
  } else if (index == edges.size() && grid_max.has_value() && !edges.empty()) {
    high = *grid_max;
    low = edges.back() + 1;
  } else {
    return std::nullopt;
  }
  if (high < low) return std::nullopt;
  return std::pair{low, high};
}

std::string GridRuleText(GridRule rule, const KernelSpec& kernel) {
  switch (rule) {
    case GridRule::kPadded:
      return "its grid is padded to its buckets' upper edges";
    case GridRule::kEmptyWork:
      return "its exact grid is empty (no work), so the graph has no node for it, as an "
             "eager launch sends nothing";
    case GridRule::kBelowProven:
      return "a bucket parameter is below 1, where no grid_tolerance is proven (empty work), "
             "so its exact grid is part of the signature";
    case GridRule::kPinned:
      return "its grid is pinned (StepGraph::PinGrid)";
    case GridRule::kNotTolerant:
      return absl::StrCat("kernel '", kernel.name,
                          "' has no grid_tolerance in its pack, so its exact grid is part of the "
                          "signature");
    case GridRule::kExplicitGrid:
      return "the launch has an explicit grid, which is part of the signature (PinGrid fixes "
             "it for a kernel with grid_tolerance)";
    case GridRule::kNoBuckets:
      return absl::StrCat("kernel '", kernel.name,
                          "' has no buckets to pad to, so its exact grid is part of the "
                          "signature");
    case GridRule::kOpenEnded:
      return "its bucket is open-ended and the pack declares no grid_tolerance.max, so its "
             "exact grid is part of the signature";
    case GridRule::kAboveMaximum:
      return "a bucket parameter exceeds the pack's grid_tolerance.max, so its exact grid is "
             "part of the signature";
  }
  return "?";
}

absl::Status GridPlan::Resolve(const BoundState& st, Resolved* out) const {
  const RuntimeImpl& rt = *kernel_->runtime;
  const KernelSpec& k = *kernel_->spec;
  if (st.grid_from_expressions) {
    KPACK_ASSIGN_OR_RETURN(out->exact, rt.EvalGrid(*st.variant, st.args));
  } else {
    out->exact = st.grid;
  }
  out->graph = out->exact;
  if (out->exact.x == 0 || out->exact.y == 0 || out->exact.z == 0) {
    out->rule = GridRule::kEmptyWork;
    return absl::OkStatus();
  }
  if (pinned_.has_value()) {
    out->rule = GridRule::kPinned;
    out->graph = *pinned_;
    if (!Covers(*pinned_, out->exact)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "kernel '", k.name, "': the launch's grid ", GridText(out->exact),
          " exceeds the grid pinned for the graph ", GridText(*pinned_),
          " on some axis: the graph would launch too few programs"));
    }
    return absl::OkStatus();
  }
  if (!k.grid_tolerant) {
    out->rule = GridRule::kNotTolerant;
    return absl::OkStatus();
  }
  if (!st.grid_from_expressions) {
    out->rule = GridRule::kExplicitGrid;
    return absl::OkStatus();
  }
  if (k.buckets.empty()) {
    out->rule = GridRule::kNoBuckets;
    return absl::OkStatus();
  }
  // The arguments with each bucket parameter at the upper edge of its interval.
  absl::InlinedVector<Arg, 16> padded(st.args.begin(), st.args.end());
  bool any = false;
  out->rule = GridRule::kPadded;
  for (const BucketSpec& dim : k.buckets) {
    int64_t value = 0;
    if (!args_detail::ToInt64(st.args[dim.arg], &value)) continue;  // selection refused it
    size_t i = 0;
    while (i < dim.edges.size() && value > dim.edges[i]) ++i;
    const std::optional<std::pair<int64_t, int64_t>> interval =
        PaddingInterval(dim.edges, dim.grid_max, i);
    if (!interval.has_value()) {
      out->rule = i == dim.edges.size() ? GridRule::kOpenEnded : GridRule::kBelowProven;
      continue;
    }
    if (value > interval->second) {
      out->rule = GridRule::kAboveMaximum;
      continue;
    }
    if (value < interval->first) {
      out->rule = GridRule::kBelowProven;
      continue;
    }
    padded[dim.arg] = Arg(interval->second);
    any = true;
  }
  // A dim left exact (open-ended) keeps its rule as the explanation; the others are
  // still padded.
  if (!any) return absl::OkStatus();
  KPACK_ASSIGN_OR_RETURN(out->graph, rt.EvalGrid(*st.variant, padded));
  if (!Covers(out->graph, out->exact)) {
    return absl::InvalidArgumentError(absl::StrCat(
        Describe(*st.variant), ": the grid at the buckets' upper edges ", GridText(out->graph),
        " is smaller than the exact grid ", GridText(out->exact),
        " on some axis: its grid expressions do not grow with the bucket parameters, so its "
        "grid_tolerance cannot be used"));
  }
  return absl::OkStatus();
}

}  // namespace kpack::internal

namespace kpack {

std::optional<std::pair<int64_t, int64_t>> GraphPaddingInterval(std::span<const int64_t> edges,
                                                               std::optional<int64_t> grid_max,
                                                               size_t index) {
  return internal::PaddingInterval(edges, grid_max, index);
}

}  // namespace kpack
