// kpack::StepGraph over StepGraphImpl. The header (kpack/graph.h) has the design.

#include "graph/step_graph.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/launch.h"
#include "util/log.h"
#include "util/status_macros.h"

namespace kpack {
namespace internal {
namespace {

// A launch's error with the step index in front.
absl::Status AtLaunch(size_t i, const absl::Status& s) {
  return absl::Status(s.code(), absl::StrCat("step graph launch ", i, ": ", s.message()));
}

std::string GridText(const Grid& g) { return absl::StrCat("(", g.x, ", ", g.y, ", ", g.z, ")"); }

// At most this many alternatives are listed in an error.
constexpr size_t kListed = 8;

// Replay's status when its stream's capture state (cuStreamIsCapturing: `r`, `status`)
// forbids a graph launch and is not an active capture.
ABSL_ATTRIBUTE_NOINLINE absl::Status CaptureStateError(const Driver& d, CUresult r,
                                                       CUstreamCaptureStatus status) {
  if (r == CUDA_ERROR_STREAM_CAPTURE_IMPLICIT) {
    return absl::FailedPreconditionError(
        "replaying a step graph on the legacy (NULL) stream while a blocking stream of the "
        "context is being captured (cuStreamIsCapturing: CUDA_ERROR_STREAM_CAPTURE_IMPLICIT): "
        "that would invalidate the capture; nothing was launched. Replay on a stream of your "
        "own, or after the capture ends");
  }
  if (r != CUDA_SUCCESS) return d.Error(r, "cuStreamIsCapturing (replaying a step graph)");
  if (status == CU_STREAM_CAPTURE_STATUS_INVALIDATED) {
    return absl::FailedPreconditionError(
        "replaying a step graph: the stream's capture has been invalidated; nothing is "
        "launched into it");
  }
  return absl::InternalError(absl::StrCat("replaying a step graph: unknown capture status ",
                                          static_cast<int>(status)));
}

}  // namespace

absl::StatusOr<std::unique_ptr<StepGraphImpl>> StepGraphImpl::Create(
    std::span<BoundState* const> launches, const StepGraph::Options& options) {
  if (launches.empty()) return absl::InvalidArgumentError("a step graph needs at least one launch");
  std::unique_ptr<StepGraphImpl> g(new StepGraphImpl());
  g->options_ = options;
  absl::flat_hash_set<const BoundState*> seen;
  for (size_t i = 0; i < launches.size(); ++i) {
    if (launches[i] == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("step graph launch ", i, " is null"));
    }
    BoundState& st = *launches[i];
    if (!seen.insert(&st).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          "step graph launch ", i, " (kernel '", st.kernel->spec->name,
          "') is listed twice: a graph node sends each BoundLaunch's bytes once per step"));
    }
    if (g->rt_ == nullptr) g->rt_ = st.kernel->runtime;
    if (st.kernel->runtime != g->rt_) {
      return absl::InvalidArgumentError(absl::StrCat(
          "step graph launch ", i, " (kernel '", st.kernel->spec->name,
          "') belongs to another Runtime than launch 0"));
    }
    g->launches_.push_back(&st);
    g->plans_.emplace_back(*st.kernel);
  }
  const Driver& d = g->rt_->driver();
  unsigned long long context = 0;  // NOLINT(runtime/int)
  if (const CUresult r = d.CtxGetId(nullptr, &context); r != CUDA_SUCCESS) {
    return ContextError(d, r, "creating a step graph");
  }
  g->context_ = context;
  g->shapes_.resize(launches.size());
  g->grids_.resize(launches.size());
  g->resolved_.assign(launches.size(), 0);
  g->prepared_.resize(launches.size());
  return g;
}

absl::Status StepGraphImpl::CheckContext(const char* doing) const {
  const Driver& d = rt_->driver();
  unsigned long long context = 0;  // NOLINT(runtime/int)
  if (const CUresult r = d.CtxGetId(nullptr, &context); ABSL_PREDICT_FALSE(r != CUDA_SUCCESS)) {
    return ContextError(d, r, doing);
  }
  if (ABSL_PREDICT_FALSE(context != context_)) {
    return absl::FailedPreconditionError(absl::StrCat(
        doing, ": the step graph belongs to the CUDA context current at its creation (id ",
        context_, "), but the current one is another (id ", context, ")"));
  }
  return absl::OkStatus();
}

absl::Status StepGraphImpl::ResolveChanged() {
  stats_.last_launches_resolved = 0;
  // Locals, so that the loop over unchanged launches reloads nothing the calls below
  // might have changed.
  const size_t n = launches_.size();
  BoundState* const* const launches = launches_.data();
  uint64_t* const resolved = resolved_.data();
  for (size_t i = 0; i < n; ++i) {
    const BoundState& st = *launches[i];
    if (st.version == resolved[i]) continue;
    resolved[i] = 0;
    ++stats_.last_launches_resolved;
    absl::Status s = plans_[i].Resolve(st, &grids_[i]);
    if (ABSL_PREDICT_FALSE(!s.ok())) return AtLaunch(i, s);
    const LaunchShape shape{st.variant, grids_[i].graph};
    if (!(shape == shapes_[i])) {
      shapes_[i] = shape;
      signature_moved_ = true;
    }
    resolved[i] = st.version;
  }
  return absl::OkStatus();
}

absl::StatusOr<BucketGraph*> StepGraphImpl::BuildGraph(const internal::Signature& shapes,
                                                       CUstream stream) {
  if (graphs_.size() >= options_.max_graphs) {
    std::string changing;
    if (current_ != nullptr) {
      for (size_t i = 0; i < shapes.size(); ++i) {
        if (shapes[i] == current_->signature()[i]) continue;
        changing = absl::StrCat(": launch ", i, " is now ", ShapeText(shapes[i]), ", was ",
                                ShapeText(current_->signature()[i]), " (",
                                GridRuleText(grids_[i].rule, *shapes[i].variant->kernel->spec),
                                ")");
        break;
      }
    }
    return absl::ResourceExhaustedError(absl::StrCat(
        "step graph: already holds ", graphs_.size(),
        " graphs (StepGraph::Options::max_graphs); another signature", changing));
  }
  KPACK_ASSIGN_OR_RETURN(std::unique_ptr<BucketGraph> graph,
                         NewGraph(shapes, stream, absl::OkStatus()));
  BucketGraph* raw = graph.get();
  graphs_.emplace(shapes, std::move(graph));
  built_.push_back(raw);
  ++stats_.graphs_built;
  stats_.scratch_bytes += raw->scratch_bytes();
  return raw;
}

absl::StatusOr<std::unique_ptr<BucketGraph>> StepGraphImpl::NewGraph(
    const internal::Signature& shapes, CUstream stream, const absl::Status& refused) {
  RelaxedCaptureMode relaxed(rt_->driver());
  KPACK_RETURN_IF_ERROR(relaxed.status());
  bool pdl_refused = false;
  absl::StatusOr<std::unique_ptr<BucketGraph>> graph = BucketGraph::Build(
      *rt_, launches_, shapes, context_, stream,
      /*programmatic_edges=*/options_.programmatic_edges && refused.ok(), &pdl_refused);
  const absl::Status first = graph.status();
  if (pdl_refused) {
    graph = BucketGraph::Build(*rt_, launches_, shapes, context_, stream,
                               /*programmatic_edges=*/false, nullptr);
    if (!graph.ok()) {
      return absl::Status(graph.status().code(),
                          absl::StrCat(graph.status().message(), " (with full edges, after the "
                                       "driver refused programmatic ones: ", first.message(), ")"));
    }
  }
  KPACK_RETURN_IF_ERROR(graph.status());
  KPACK_RETURN_IF_ERROR(relaxed.Restore());
  if (pdl_refused) {
    FellBack(**graph, first, "instantiating it");
  } else if (!refused.ok()) {
    FellBack(**graph, refused, "updating its nodes");
  }
  return graph;
}

void StepGraphImpl::FellBack(BucketGraph& graph, const absl::Status& refused,
                             absl::string_view when) {
  std::string why = absl::StrCat(
      "the driver refused the programmatic (PDL) edges of this signature's graph when ", when,
      " (", refused.message(), "); its PDL launches now wait for the node before them to "
      "finish, without the overlap");
  Log().warn("step graph {}: {}", SignatureText(graph.signature()), why);
  graph.set_pdl_fallback(std::move(why));
  ++stats_.pdl_fallbacks;
}

absl::Status StepGraphImpl::Build() {
  KPACK_RETURN_IF_ERROR(CheckContext("building a step graph"));
  KPACK_RETURN_IF_ERROR(ResolveChanged());
  if (graphs_.contains(shapes_)) return absl::OkStatus();
  return BuildGraph(shapes_, nullptr).status();
}

absl::Status StepGraphImpl::Replay(CUstream stream) {
  KPACK_RETURN_IF_ERROR(CheckContext("replaying a step graph"));
  KPACK_RETURN_IF_ERROR(ResolveChanged());
  // An executable graph cannot be launched into a capture (the driver refuses, and the
  // capture is invalidated), and a graph must not be built during one: a replay on a
  // stream being captured sends the step's launches into the capture instead.
  const Driver& d = rt_->driver();
  CUstreamCaptureStatus capture = CU_STREAM_CAPTURE_STATUS_NONE;
  if (const CUresult r = d.StreamIsCapturing(stream, &capture);
      ABSL_PREDICT_FALSE(r != CUDA_SUCCESS || capture != CU_STREAM_CAPTURE_STATUS_NONE)) {
    if (r != CUDA_SUCCESS || capture != CU_STREAM_CAPTURE_STATUS_ACTIVE) {
      return CaptureStateError(d, r, capture);
    }
    KPACK_RETURN_IF_ERROR(LaunchEagerly(stream));
    ++stats_.captured_steps;
    return absl::OkStatus();
  }
  if (current_ == nullptr || (signature_moved_ && current_->signature() != shapes_)) {
    auto it = graphs_.find(shapes_);
    if (it != graphs_.end()) {
      current_ = it->second.get();
    } else {
      switch (options_.unseen) {
        case StepGraph::Unseen::kError:
          return UnseenError(shapes_);
        case StepGraph::Unseen::kLaunchEagerly:
          KPACK_RETURN_IF_ERROR(LaunchEagerly(stream));
          ++stats_.eager_steps;
          return absl::OkStatus();
        case StepGraph::Unseen::kBuild:
          break;
      }
      KPACK_ASSIGN_OR_RETURN(current_, BuildGraph(shapes_, stream));
    }
  }
  signature_moved_ = false;  // current_'s signature is shapes_
  uint64_t patched = 0;
  bool pdl_refused = false;
  absl::Status s = current_->Patch(launches_, &patched, &pdl_refused);
  stats_.nodes_patched += patched;
  stats_.last_nodes_patched = patched;
  if (ABSL_PREDICT_FALSE(!s.ok())) {
    // Any other failure is the caller's, and the next replay patches again.
    if (!pdl_refused) return s;
    // The driver refused to update a graph with programmatic edges: this signature's
    // graph again, with full edges (and its launches' current bytes).
    absl::StatusOr<std::unique_ptr<BucketGraph>> full = NewGraph(shapes_, stream, s);
    if (!full.ok()) return s;
    stats_.scratch_bytes += (*full)->scratch_bytes() - current_->scratch_bytes();
    *std::find(built_.begin(), built_.end(), current_) = full->get();
    std::unique_ptr<BucketGraph>& slot = graphs_[shapes_];
    slot = *std::move(full);
    current_ = slot.get();
  }
  KPACK_RETURN_IF_ERROR(current_->Launch(stream));
  ++stats_.replays;
  return absl::OkStatus();
}

absl::Status StepGraphImpl::UnseenError(const internal::Signature& shapes) const {
  const std::string head =
      "step graph: this step's signature has no graph, and new signatures are errors "
      "(StepGraph::Unseen::kError)";
  if (built_.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        head, ": none was built (declare the shapes with Build() first); launch 0 is ",
        DescribeShape(shapes[0]), " with grid ", GridText(shapes[0].grid)));
  }
  for (size_t i = 0; i < shapes.size(); ++i) {
    std::vector<const LaunchShape*> known;
    bool found = false;
    for (const BucketGraph* g : built_) {
      const LaunchShape& other = g->signature()[i];
      found |= other == shapes[i];
      if (std::find_if(known.begin(), known.end(), [&](const LaunchShape* k) {
            return *k == other;
          }) == known.end()) {
        known.push_back(&other);
      }
    }
    if (found) continue;
    const bool same_variant = std::any_of(known.begin(), known.end(), [&](const LaunchShape* k) {
      return k->variant == shapes[i].variant;
    });
    std::vector<std::string> listed;
    for (size_t k = 0; k < known.size() && k < kListed; ++k) {
      listed.push_back(absl::StrCat("variant '", known[k]->variant->spec->name, "' grid ",
                                    GridText(known[k]->grid)));
    }
    if (known.size() > kListed) listed.push_back("...");
    const std::string why =
        same_variant ? absl::StrCat("; its variant was declared with other grids: ",
                                    GridRuleText(grids_[i].rule, *shapes[i].variant->kernel->spec))
                     : "; its variant changed (a bucket or specialization no declared shape has)";
    return absl::FailedPreconditionError(absl::StrCat(
        head, ": launch ", i, " is ", DescribeShape(shapes[i]), " with grid ",
        GridText(shapes[i].grid), ", which no built graph has (they have ",
        absl::StrJoin(listed, ", "), ")", why));
  }
  return absl::FailedPreconditionError(absl::StrCat(
      head, ": every launch's variant and grid was built, but not in this combination: ",
      SignatureText(shapes)));
}

absl::Status StepGraphImpl::LaunchEagerly(CUstream stream) {
  for (size_t i = 0; i < launches_.size(); ++i) {
    BoundState& st = *launches_[i];
    const ScratchAllocator* scratch = st.scratch.allocate != nullptr ? &st.scratch : nullptr;
    absl::Status s =
        rt_->Prepare(*st.variant, grids_[i].exact, stream, scratch, st.buf, &prepared_[i]);
    if (!s.ok()) return AtLaunch(i, s);
  }
  for (size_t i = 0; i < launches_.size(); ++i) {
    const BoundState& st = *launches_[i];
    absl::Status s = rt_->Send(*st.variant, prepared_[i], st.fallback);
    if (!s.ok()) return AtLaunch(i, s);
  }
  return absl::OkStatus();
}

absl::Status StepGraphImpl::PinGrid(size_t launch, const Grid& grid) {
  if (launch >= launches_.size()) {
    return absl::InvalidArgumentError(absl::StrCat("PinGrid: the step has ", launches_.size(),
                                                   " launches; no launch ", launch));
  }
  const KernelSpec& k = *launches_[launch]->kernel->spec;
  if (!k.grid_tolerant) {
    return absl::InvalidArgumentError(absl::StrCat(
        "PinGrid: step graph launch ", launch, ": kernel '", k.name,
        "' has no grid_tolerance in its pack, so the graph launches its exact grid: a larger "
        "grid would run programs that may not mask themselves out"));
  }
  if (grid.x == 0 || grid.y == 0 || grid.z == 0) {
    return absl::InvalidArgumentError(absl::StrCat("PinGrid: step graph launch ", launch,
                                                   ": the grid ", GridText(grid), " is empty"));
  }
  plans_[launch].Pin(grid);
  resolved_[launch] = 0;
  return absl::OkStatus();
}

absl::StatusOr<std::string> StepGraphImpl::Signature() const {
  internal::Signature shapes(launches_.size());
  for (size_t i = 0; i < launches_.size(); ++i) {
    const BoundState& st = *launches_[i];
    GridPlan::Resolved grid;
    absl::Status s = plans_[i].Compute(st, &grid);
    if (!s.ok()) return AtLaunch(i, s);
    shapes[i] = LaunchShape{st.variant, grid.graph};
  }
  return SignatureText(shapes);
}

std::vector<StepGraph::GraphInfo> StepGraphImpl::graphs() const {
  std::vector<StepGraph::GraphInfo> out;
  for (const BucketGraph* g : built_) {
    out.push_back({SignatureText(g->signature()), g->nodes(), g->scratch_bytes(), g->build_us(),
                   g->replays(), g->programmatic_edges(), g->pdl_fallback()});
  }
  return out;
}

StepGraph::Stats StepGraphImpl::stats() const { return stats_; }

}  // namespace internal

// ---- StepGraph ----

StepGraph::StepGraph(std::unique_ptr<internal::StepGraphImpl> impl) : impl_(std::move(impl)) {}
StepGraph::StepGraph(StepGraph&&) noexcept = default;
StepGraph& StepGraph::operator=(StepGraph&&) noexcept = default;
StepGraph::~StepGraph() = default;

absl::StatusOr<StepGraph> StepGraph::Create(std::span<BoundLaunch* const> launches,
                                            const Options& options) {
  std::vector<internal::BoundState*> states;  // null for a null launch, which Create refuses
  for (BoundLaunch* b : launches) states.push_back(b != nullptr ? b->state_.get() : nullptr);
  KPACK_ASSIGN_OR_RETURN(std::unique_ptr<internal::StepGraphImpl> impl,
                         internal::StepGraphImpl::Create(states, options));
  return StepGraph(std::move(impl));
}

absl::StatusOr<StepGraph> StepGraph::Create(std::span<BoundLaunch* const> launches) {
  return Create(launches, Options());
}

absl::Status StepGraph::Build() { return impl_->Build(); }
absl::Status StepGraph::Replay(CUstream stream) { return impl_->Replay(stream); }
void StepGraph::set_unseen(Unseen unseen) { impl_->set_unseen(unseen); }
absl::Status StepGraph::PinGrid(size_t launch, const Grid& grid) {
  return impl_->PinGrid(launch, grid);
}
absl::StatusOr<std::string> StepGraph::Signature() const { return impl_->Signature(); }
std::vector<StepGraph::GraphInfo> StepGraph::graphs() const { return impl_->graphs(); }
StepGraph::Stats StepGraph::stats() const { return impl_->stats(); }

}  // namespace kpack
