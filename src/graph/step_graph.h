// The state behind kpack::StepGraph (kpack/graph.h): the step's launches, their grid
// plans, and one BucketGraph per signature seen (or declared with Build).

#ifndef KPACK_SRC_GRAPH_STEP_GRAPH_H_
#define KPACK_SRC_GRAPH_STEP_GRAPH_H_

#include <cuda.h>

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "graph/bucket_graph.h"
#include "graph/graph_grid.h"
#include "graph/signature.h"
#include "kpack/graph.h"
#include "runtime/runtime_impl.h"

namespace kpack::internal {

class StepGraphImpl {
 public:
  // `launches`: the BoundLaunches' states (StepGraph::Create takes them out of the
  // BoundLaunches, whose friend it is), in launch order.
  static absl::StatusOr<std::unique_ptr<StepGraphImpl>> Create(
      std::span<BoundState* const> launches, const StepGraph::Options& options);

  absl::Status Build();
  absl::Status Replay(CUstream stream);
  void set_unseen(StepGraph::Unseen unseen) { options_.unseen = unseen; }
  absl::Status PinGrid(size_t launch, const Grid& grid);
  absl::StatusOr<std::string> Signature() const;
  std::vector<StepGraph::GraphInfo> graphs() const;
  StepGraph::Stats stats() const;

 private:
  StepGraphImpl() = default;
  // FAILED_PRECONDITION unless the StepGraph's context is current (`doing`: for messages).
  absl::Status CheckContext(const char* doing) const;
  // shapes_ and grids_ brought up to date: each launch whose BoundState::version moved
  // since it was last resolved is resolved again (its GridPlan evaluates grids only if
  // their key changed), and signature_moved_ is set when a launch's shape changed. After
  // an error the failing launch is resolved again next time.
  absl::Status ResolveChanged();
  // The graph of `shapes`, built now (RESOURCE_EXHAUSTED past Options::max_graphs), its
  // launches prepared for `stream` (null for Build()), which is not being captured.
  absl::StatusOr<BucketGraph*> BuildGraph(const internal::Signature& shapes, CUstream stream);
  // A new graph of `shapes` in RELAXED capture mode: with programmatic edges for PDL
  // launches, or, if the driver refuses those at instantiation, with full edges and the
  // reason recorded (BucketGraph::pdl_fallback, stats, a warning in the log). `refused`:
  // non-empty when the graph replaces one whose programmatic edges the driver refused
  // later (a patch); the new graph then has full edges and says why.
  absl::StatusOr<std::unique_ptr<BucketGraph>> NewGraph(const internal::Signature& shapes,
                                                        CUstream stream,
                                                        const absl::Status& refused);
  // Records that `graph` has full edges for PDL launches because of `refused`.
  void FellBack(BucketGraph& graph, const absl::Status& refused, absl::string_view when);
  // Unseen::kError's status for `shapes`: the first launch no built graph has, and why.
  absl::Status UnseenError(const internal::Signature& shapes) const;
  // Every launch as BoundLaunch::Launch would send it, on `stream`, with its exact grid:
  // all prepared (loaded, scratch, config) before any is sent, so that a failure to
  // prepare one sends nothing. For Unseen::kLaunchEagerly and for a stream being captured.
  absl::Status LaunchEagerly(CUstream stream);

  const RuntimeImpl* rt_ = nullptr;
  uint64_t context_ = 0;  // cuCtxGetId at Create
  StepGraph::Options options_;
  std::vector<BoundState*> launches_;  // BoundLaunch states: they stay put when it moves
  std::vector<GridPlan> plans_;  // Resolve remembers its last key and result
  absl::flat_hash_map<internal::Signature, std::unique_ptr<BucketGraph>> graphs_;
  std::vector<const BucketGraph*> built_;  // graphs_ in the order they were built
  BucketGraph* current_ = nullptr;         // the last replayed
  // Per replay, sized once at Create so that a replay allocates nothing. shapes_[i] and
  // grids_[i] are launch i's at its BoundState::version resolved_[i] (0: never resolved).
  internal::Signature shapes_;
  std::vector<GridPlan::Resolved> grids_;
  std::vector<uint64_t> resolved_;
  // Whether shapes_ may differ from current_'s signature (a launch's shape changed since
  // current_ was last found for shapes_).
  bool signature_moved_ = true;
  std::vector<RuntimeImpl::DriverLaunch> prepared_;  // LaunchEagerly's
  StepGraph::Stats stats_;
};

}  // namespace kpack::internal

#endif  // KPACK_SRC_GRAPH_STEP_GRAPH_H_
