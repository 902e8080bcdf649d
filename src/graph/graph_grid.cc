#include "graph/graph_grid.h"

#include <algorithm>
#include <limits>
#include <string>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "dispatch/grid_expr.h"
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
  // The bucket's values above the edge before it (none above INT64_MAX), and at least 1.
  int64_t below, high;
  if (index < edges.size()) {
    high = edges[index];
    below = index > 0 ? edges[index - 1] : 0;
  } else if (index == edges.size() && grid_max.has_value() && !edges.empty()) {
    high = *grid_max;
    below = edges.back();
  } else {
    return std::nullopt;
  }
  if (below == std::numeric_limits<int64_t>::max()) return std::nullopt;
  const int64_t low = std::max<int64_t>(below + 1, 1);
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

GridPlan::GridPlan(const KernelData& kernel) : kernel_(&kernel) {
  const KernelSpec& k = *kernel.spec;
  std::vector<bool> in_key(k.args.size(), false);
  // The names every variant's grid expressions resolve to call arguments, by Open's own
  // rule (VariantGridResolver): compiled again here with a resolver that notes them.
  for (const VariantSpec& v : k.variants) {
    const GridExpr::Resolver resolve = VariantGridResolver(k, v);
    const GridExpr::Resolver note = [&](absl::string_view name) -> absl::StatusOr<GridExpr::Name> {
      absl::StatusOr<GridExpr::Name> n = resolve(name);
      if (n.ok() && n->kind == GridExpr::Name::kArg && n->value >= 0 &&
          static_cast<size_t>(n->value) < in_key.size()) {
        in_key[static_cast<size_t>(n->value)] = true;
      }
      return n;
    };
    for (const std::string& text : k.grid) {
      // Open compiled these already; should one fail now, every argument is in the key.
      if (!GridExpr::Compile(text, note).ok()) in_key.assign(in_key.size(), true);
    }
  }
  if (k.grid_tolerant) {
    for (const BucketSpec& dim : k.buckets) {
      if (dim.arg >= 0 && static_cast<size_t>(dim.arg) < in_key.size()) in_key[dim.arg] = true;
    }
  }
  for (size_t i = 0; i < in_key.size(); ++i) {
    if (in_key[i]) key_args_.push_back(static_cast<uint16_t>(i));
  }
  exact_key_.values.resize(key_args_.size());
  padded_key_.values.resize(key_args_.size());
  padded_args_.assign(k.args.size(), Arg(int64_t{0}));
}

bool GridPlan::Matches(const Key& key, const VariantData* variant, bool from_expressions,
                       const Grid& grid, std::span<const Arg> args) const {
  if (key.variant != variant || key.from_expressions != from_expressions) return false;
  if (!from_expressions) {
    return key.grid.x == grid.x && key.grid.y == grid.y && key.grid.z == grid.z;
  }
  for (size_t i = 0; i < key_args_.size(); ++i) {
    const Arg& a = args[key_args_[i]];
    if (a.bits() != key.values[i].first || a.kind() != key.values[i].second) return false;
  }
  return true;
}

void GridPlan::Remember(Key* key, const VariantData* variant, bool from_expressions,
                        const Grid& grid, std::span<const Arg> args) const {
  key->variant = variant;
  key->from_expressions = from_expressions;
  key->grid = grid;
  if (!from_expressions) return;
  for (size_t i = 0; i < key_args_.size(); ++i) {
    const Arg& a = args[key_args_[i]];
    key->values[i] = {a.bits(), a.kind()};
  }
}

absl::Status GridPlan::Resolve(const BoundState& st, Resolved* out) {
  if (Matches(exact_key_, st.variant, st.grid_from_expressions, st.grid, st.args)) {
    *out = exact_;
    return absl::OkStatus();
  }
  exact_key_.variant = nullptr;
  KPACK_RETURN_IF_ERROR(Run(st, out, &padded_key_, &padded_grid_, &padded_args_));
  exact_ = *out;
  Remember(&exact_key_, st.variant, st.grid_from_expressions, st.grid, st.args);
  return absl::OkStatus();
}

absl::Status GridPlan::Run(const BoundState& st, Resolved* out, Key* padded_key,
                           Grid* padded_grid, std::vector<Arg>* padded_args) const {
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
  // The arguments with each bucket parameter at the upper edge of its interval: in
  // Resolve's scratch (no allocation on a replay, however many arguments), else here.
  absl::InlinedVector<Arg, 16> local;
  std::span<Arg> padded;
  if (padded_args != nullptr && padded_args->size() == st.args.size()) {
    std::copy(st.args.begin(), st.args.end(), padded_args->begin());
    padded = *padded_args;
  } else {
    local.assign(st.args.begin(), st.args.end());
    padded = std::span<Arg>(local.data(), local.size());
  }
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
  if (padded_key != nullptr &&
      Matches(*padded_key, st.variant, /*from_expressions=*/true, Grid{}, padded)) {
    out->graph = *padded_grid;
  } else {
    if (padded_key != nullptr) padded_key->variant = nullptr;
    KPACK_ASSIGN_OR_RETURN(out->graph, rt.EvalGrid(*st.variant, padded));
    if (padded_key != nullptr) {
      Remember(padded_key, st.variant, /*from_expressions=*/true, Grid{}, padded);
      *padded_grid = out->graph;
    }
  }
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
