// One instantiated CUDA graph of a StepGraph: the graph of one bucket signature, built node
// by node from the step's launches, and the parameter bytes each node launches now, so
// that a replay patches exactly the nodes whose bytes changed.

#ifndef KPACK_SRC_GRAPH_BUCKET_GRAPH_H_
#define KPACK_SRC_GRAPH_BUCKET_GRAPH_H_

#include <cuda.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "driver/capture_mode.h"
#include "graph/signature.h"
#include "runtime/runtime_impl.h"

namespace kpack::internal {

// Whether the driver's code for a failed instantiation or node update of a graph with
// programmatic edges may mean it refuses those edges (an unsupported or invalid update),
// so that rebuilding with full edges is the remedy; any other failure (out of memory, a
// lost context, an earlier fault) is reported as it is.
bool MayRefusePdl(CUresult r);

class BucketGraph {
 public:
  // Builds and instantiates the graph of `signature` for `launches` (one shape each, in
  // order) with their current parameter bytes, in the current context, whose cuCtxGetId
  // is `context`: one kernel node per launch with a non-empty grid, each depending on the
  // one before -- a programmatic (PDL) edge when the launch's variant is a PDL launch and
  // `programmatic_edges`, else a full one; one scratch buffer from `rt`'s pool owned by the
  // graph, if any node needs scratch. Loads variants not yet loaded in the context first
  // (the caller makes sure no stream of its is captured, and makes the thread RELAXED:
  // see RelaxedCaptureMode); prepares the launches for `stream`. Errors name the launch (its
  // index) and the driver call; nothing is left behind. `pdl_refused`: set when the error
  // may be the driver refusing to instantiate a graph with programmatic edges (the graph
  // has some, and the driver's code is one MayRefusePdl names).
  static absl::StatusOr<std::unique_ptr<BucketGraph>> Build(const RuntimeImpl& rt,
                                                            std::span<BoundState* const> launches,
                                                            const Signature& signature,
                                                            uint64_t context, CUstream stream,
                                                            bool programmatic_edges,
                                                            bool* pdl_refused);
  // Destroys the executable and the graph in RELAXED mode; work in flight finishes, and
  // the scratch returns to the pool after it (a failure here has no one to report to and
  // is ignored).
  ~BucketGraph();
  BucketGraph(const BucketGraph&) = delete;
  BucketGraph& operator=(const BucketGraph&) = delete;

  const Signature& signature() const { return signature_; }

  // cuGraphExecKernelNodeSetParams for each node whose launch's current bytes differ from
  // what the node launches now; `patched` counts the calls. A node whose launch's
  // BoundState::version is the one the node's bytes were last compared at is skipped
  // without comparing: nothing that writes the launch's bytes leaves the version alone.
  // Allocates nothing. A failed call is an error naming the launch; the nodes patched
  // before it stay patched. `pdl_refused` (if not null): set when the failure may be the
  // driver refusing to update a graph with programmatic edges (as for Build).
  absl::Status Patch(std::span<BoundState* const> launches, uint64_t* patched,
                     bool* pdl_refused = nullptr);
  // cuGraphLaunch on `stream`.
  absl::Status Launch(CUstream stream);

  size_t nodes() const { return nodes_.size(); }
  size_t programmatic_edges() const { return programmatic_edges_; }
  // Why PDL launches got full edges in this graph though they are PDL launches (the
  // driver refused programmatic edges); empty if they did not.
  const std::string& pdl_fallback() const { return pdl_fallback_; }
  void set_pdl_fallback(std::string why) { pdl_fallback_ = std::move(why); }
  uint64_t scratch_bytes() const { return scratch_bytes_; }
  double build_us() const { return build_us_; }
  uint64_t replays() const { return replays_; }

 private:
  struct Node {
    size_t launch = 0;  // index in the step
    CUgraphNode handle = nullptr;
    CUDA_KERNEL_NODE_PARAMS_v2 params{};  // all but `extra`, which each call sets
    size_t param_bytes = 0;
    // The scratch pointers the graph gives the node: (offset in the buffer, value).
    std::array<std::pair<uint32_t, CUdeviceptr>, 2> scratch{};
    int num_scratch = 0;
    std::vector<std::byte> bytes;  // the parameter buffer the executable launches now
    // The launch's BoundState::version when `bytes` were last found equal to its bytes.
    uint64_t version = 0;
  };

  explicit BucketGraph(const Driver& driver) : driver_(driver) {}

  const Driver& driver_;
  CUgraph graph_ = nullptr;
  CUgraphExec exec_ = nullptr;
  Signature signature_;
  std::vector<Node> nodes_;
  uint64_t scratch_bytes_ = 0;
  size_t programmatic_edges_ = 0;
  std::string pdl_fallback_;
  double build_us_ = 0;
  uint64_t replays_ = 0;
  alignas(16) std::byte staging_[kMaxParamBytes];  // a node's bytes with the graph's scratch
};

}  // namespace kpack::internal

#endif  // KPACK_SRC_GRAPH_BUCKET_GRAPH_H_
