// kpack/graph.h: CUDA graphs of a step of kpack launches, built once per bucket signature
// and replayed with new sizes and pointers by patching only the parameters that changed.
//
// A serving step is a fixed sequence of launches whose sizes change every call. Sending
// each launch costs the driver's ~3.5 us of host time; a CUDA graph costs ~0.25 us per
// kernel node whose parameters change plus ~2-4 us per graph launch, with no extra GPU
// time, as long as only arguments change: a node whose grid changes costs ~1 us more on
// the host and ~1 us of GPU time. A StepGraph therefore keys its graphs by the step's
// *bucket signature* -- every launch's chosen variant and the grid the graph launches it
// with -- and patches arguments (sizes, pointers, scalars, all alike) in between:
//
//   kpack::BoundLaunch* step[] = {&*matmul, &*add};  // in launch order
//   absl::StatusOr<kpack::StepGraph> graph = kpack::StepGraph::Create(step);
//   if (!graph.ok()) return graph.status();
//   for (int m : batches) {
//     // This step's sizes and pointers, through BoundLaunch::Set as for eager launches.
//     if (absl::Status s = matmul->Set(3, m); !s.ok()) return s;  // M
//     ...
//     if (absl::Status s = graph->Replay(stream); !s.ok()) return s;
//   }
//
// (examples/step_graph.cc has the whole function, with the BoundLaunches bound; CI
// compiles it.)
//
// Replay(stream) reads each BoundLaunch's current variant, grid and packed parameter bytes
// (BoundLaunch::Set re-selects the variant when a bucket or specialization changes), looks
// up the graph of that signature -- building and instantiating it the first time it is
// seen, or ahead with Build() for a declared list of shapes -- then calls
// cuGraphExecKernelNodeSetParams for exactly the nodes whose bytes differ from what the
// graph last launched, and launches it on `stream`. The outputs are those of the same
// launches sent eagerly, in order, on `stream` (one node after another, like a stream).
//
// Replays. A replay costs per launch only what changed since the StepGraph last saw it:
// every BoundLaunch carries a version that Set (whatever its outcome) and set_grid move
// on, and a launch whose version did not move is neither resolved again (variant, grid)
// nor compared (bytes) -- a step whose inputs live on the device, replayed with nothing
// Set, costs a few instructions per launch. A launch that changed has its grid evaluated
// again only if an argument the grid depends on changed (one its kernel's grid
// expressions read, or a bucket parameter of a grid-tolerant kernel): a pointer or a
// size the grid does not read costs a compare of its bytes, and a patch if they differ.
// stats().last_launches_resolved and last_nodes_patched count what the last replay did.
//
// Inside the caller's stream capture. A graph launch cannot be captured (the driver
// refuses it and invalidates the capture), and building a graph there would allocate. So
// Replay on a stream being captured sends the step's launches into the capture instead,
// exactly as Unseen::kLaunchEagerly does (exact grids; counted in stats().captured_steps):
// each becomes a kernel node of the caller's graph, PDL launches become programmatic edges
// there as the driver captures them, and the rules of any kpack launch in a capture apply
// (kpack/runtime.h, "CUDA graphs"): the variants must be loaded in the context (built
// graphs loaded them; else Preload()), and the scratch of kernels that need it comes from
// the BoundLaunch's ScratchAllocator if it has one, else from the capture's own arena
// (ReserveScratch(stream, bytes) before the capture), which the caller's graph owns. The
// caller's graph therefore uses nothing of the StepGraph's: it
// may outlive it, and runs concurrently with its replays. No graph is built or launched,
// whatever Unseen says; refusals are FAILED_PRECONDITION naming what to call beforehand,
// and leave the capture valid. Replay on the legacy stream while a blocking stream of the
// context is captured, or on a stream whose capture was invalidated, is
// FAILED_PRECONDITION too (a graph launch would invalidate the capture; nothing is sent).
//
// Grids. A launch's grid in the graph is its exact grid (its BoundLaunch's grid, or the
// manifest's grid expressions for its arguments), part of the signature, except for a
// kernel whose pack says its programs tolerate a larger grid (KernelInfo::grid_tolerant,
// the manifest's kpack/2 `grid_tolerance`, docs/pack-format.md) and that takes its grid
// from the grid expressions: that one is launched with the grid evaluated at the upper
// edge of its bucket parameters' buckets (or the pack's `max` for an open-ended last
// bucket), so every size inside a bucket shares one graph and patches arguments only. An
// open-ended last bucket without a maximum, a value above the maximum, a value below 1 (the
// builder's proof of the tolerance starts every bucket at 1), and an explicit grid keep the
// exact grid. Empty work stays empty: a launch whose exact grid is empty has no node, as
// an eager launch sends nothing (also when pinned). PinGrid fixes the graph grid of a
// tolerant launch whose grid the caller gives (e.g. a recorded kernel, which has no grid
// expressions).
//
// A signature never seen: built by default (Unseen::kBuild). Once Build() has covered the
// declared shapes, set_unseen(Unseen::kError) makes any other signature an error that
// names the first launch no built graph has, with its kernel, variant, bucket and grid
// and why its grid is part of the signature; Unseen::kLaunchEagerly sends such a step's
// launches eagerly instead (counted in stats().eager_steps): there is no silent fallback.
// An eager step prepares every launch (the variant loaded, scratch, grid checks) before it
// sends any, so a launch that cannot be prepared sends nothing; only the driver refusing
// cuLaunchKernelEx itself part-way leaves the launches before it sent.
//
// Why graphs built node by node (cuGraphCreate, cuGraphAddKernelNode from each launch's
// prepared function, config and parameter buffer) rather than stream capture: patching
// needs each launch's node handle, which building returns directly (a capture would have
// to recover them from cuStreamGetCaptureInfo after every launch); the padded grid is not
// the launch's own, which a captured launch would need its own path for anyway; building
// touches no stream, so no capture; and adding a node is host-side bookkeeping where a
// captured launch pays much of a launch's host cost. bench/graph_bench reports building
// plus instantiating a bucket graph of 32 and 64 kernels both ways (target: at most 1 ms
// for 32). Launch attributes become node attributes (cluster dimension and scheduling,
// cooperative). A PDL launch (Triton's launch_pdl: programmatic stream serialization) gets
// a programmatic edge from the node before it (CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC from
// its PROGRAMMATIC port, CUDA 12.3), so it may start while that node finishes, as on a
// stream; every other launch a full edge. If the driver refuses programmatic edges when
// instantiating the graph or updating its nodes (CUDA_ERROR_NOT_SUPPORTED, _INVALID_VALUE
// or _GRAPH_EXEC_UPDATE_FAILURE from a graph with such edges), the graph is built again
// with full edges (correct, without the overlap), and that is never silent:
// GraphInfo::pdl_fallback says why, stats().pdl_fallbacks counts it, and the log has a
// warning. Any other failure is returned, and the next Replay builds or patches again.
//
// Other threads' captures. Loading variants, allocating a graph's scratch, instantiating
// and destroying executable graphs are calls a capture in global mode forbids to every
// thread in the default interaction mode. Build, Replay (when it builds) and the
// destruction of graphs make them with the calling thread in RELAXED mode
// (cuThreadExchangeStreamCaptureMode, restored afterwards), which the driver provides for
// work that is not captured: so they neither fail because of another thread's capture nor
// invalidate it, and Build() works while the calling thread captures another stream.
//
// Scratch memory. A graph owns the scratch its nodes use: one buffer per graph, as large
// as the largest node needs (its nodes run one after another), from kpack's idle arena
// pool or cuMemAlloc when the graph is built, handed to the graph through a CUDA user
// object and back to the pool once the graph, its executable and their launches in
// flight are done (the mechanism captured graphs use; docs/runtime.md). So replays never
// share scratch with eager launches on any stream, nor graphs with each other; the
// BoundLaunches' own ScratchAllocators are not used for graph nodes. Two launches of one
// executable graph never overlap (the driver orders them), so replays may go to any
// streams. Pointer arguments are patched like any other bytes: nothing assumes buffers
// stay put.
//
// Contexts: a StepGraph belongs to the CUDA context current at Create; Build and Replay
// need it current (FAILED_PRECONDITION otherwise), and Replay's stream must belong to it.
// Variants are loaded into the context when a graph is first built (no Preload needed).
//
// Thread safety: a StepGraph is used by one thread at a time, and while it builds or
// replays no other thread may use its BoundLaunches. Different StepGraphs (over different
// BoundLaunches) may be used from different threads at once, and their graphs may run
// concurrently on different streams.
//
// Lifetimes: the BoundLaunches (which may be moved, not destroyed) and so their Runtime
// must outlive the StepGraph. Destroying a StepGraph while its graphs run on the GPU is
// safe: the driver finishes them, then the scratch returns to the pool.

#ifndef KPACK_GRAPH_H_
#define KPACK_GRAPH_H_

#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kpack/arg.h"
#include "kpack/runtime.h"

namespace kpack {

namespace internal {
class StepGraphImpl;
}  // namespace internal

// The rule by which step graphs pad the grid of a kernel with grid_tolerance (see Grids
// above), for one bucket dimension with inclusive upper `edges`: the values of bucket
// `index` that a graph launches with the grid evaluated at the returned upper end, as
// (lowest, highest) of that interval, or nullopt where the exact grid is kept (the
// open-ended last bucket without `grid_max`, or a bucket with no value of at least 1:
// a size below 1 is empty work, which an eager launch does not send and the pack's grid
// proof never runs, so a graph never pads it). The pack builder's grid-tolerance proof
// (tools/kpack_tools/grid_proof.py) proves exactly these intervals, through kpack._kpack.
std::optional<std::pair<int64_t, int64_t>> GraphPaddingInterval(std::span<const int64_t> edges,
                                                               std::optional<int64_t> grid_max,
                                                               size_t index);

class StepGraph {
 public:
  // What Replay does with a signature no graph was built for.
  enum class Unseen : uint8_t {
    kBuild,          // build and instantiate its graph, then replay it (default)
    kError,          // FAILED_PRECONDITION naming the launch and its bucket; nothing launched
    kLaunchEagerly,  // send the step's launches eagerly on the stream (stats().eager_steps)
  };

  struct Options {
    Unseen unseen = Unseen::kBuild;
    // Graphs a StepGraph may hold; building one more is RESOURCE_EXHAUSTED naming the
    // launches whose grids or variants keep changing (each graph costs device memory).
    size_t max_graphs = 256;
    // false: every launch gets a full edge, PDL launches too (they wait for the node
    // before them to finish, as without PDL): for measuring what the overlap buys. The
    // kernels are correct either way; GraphInfo::programmatic_edges is then 0.
    bool programmatic_edges = true;
  };

  // A step of `launches`, in launch order (each at most once; all of one Runtime), in the
  // current CUDA context. Builds nothing yet. INVALID_ARGUMENT for an empty step, a null
  // or repeated launch or launches of different Runtimes; FAILED_PRECONDITION without a
  // current context.
  static absl::StatusOr<StepGraph> Create(std::span<BoundLaunch* const> launches,
                                          const Options& options);
  static absl::StatusOr<StepGraph> Create(std::span<BoundLaunch* const> launches);

  StepGraph(StepGraph&&) noexcept;
  StepGraph& operator=(StepGraph&&) noexcept;
  // Destroys the graphs (see Lifetimes above).
  ~StepGraph();

  // Builds and instantiates the graph of the launches' current signature unless it exists
  // (whatever Unseen says: this is how shapes are declared ahead); launches nothing. Works
  // while any thread captures any stream (see "Other threads' captures").
  absl::Status Build();

  // Patches the nodes whose parameter bytes changed and launches the graph of the
  // launches' current signature on `stream`; on a stream being captured, sends the step's
  // launches into the capture (see the top of this file). Errors name the launch (its
  // index in the step and its kernel); after an error the next Replay starts afresh, and
  // nothing of this replay was launched (but see Unseen::kLaunchEagerly above).
  absl::Status Replay(CUstream stream);

  void set_unseen(Unseen unseen);

  // Fixes launch `launch`'s grid in the graphs to `grid`, for a kernel whose pack says it
  // tolerates a larger grid (KernelInfo::grid_tolerant): every replay then requires the
  // launch's own grid to be at most `grid` on each axis and launches `grid`.
  // INVALID_ARGUMENT for a kernel without the flag (its exact grid is part of the
  // signature), an index past the step or an empty grid.
  absl::Status PinGrid(size_t launch, const Grid& grid);

  // The launches' current signature as text, one `kernel/variant[x,y,z]` per launch
  // joined by "; " (the grid the graph would launch it with); launches nothing. The
  // error Replay would give for launches whose grid does not evaluate.
  absl::StatusOr<std::string> Signature() const;

  // One built graph.
  struct GraphInfo {
    std::string signature;      // as Signature() spells it
    size_t nodes = 0;           // launches with a non-empty grid
    uint64_t scratch_bytes = 0;  // device bytes of its scratch buffer (0: none)
    double build_us = 0;        // cuGraphCreate to instantiated, host microseconds
    uint64_t replays = 0;
    size_t programmatic_edges = 0;  // PDL launches' edges from the node before
    // Non-empty when the driver refused the graph's programmatic edges (at instantiation,
    // or when its nodes were updated) and the graph was built again with full edges: why.
    std::string pdl_fallback;
  };
  std::vector<GraphInfo> graphs() const;

  // Replays are counted here, not in Kernel::variant_stats() (the driver launches the
  // nodes); eager steps (Unseen::kLaunchEagerly) are counted there too.
  struct Stats {
    uint64_t graphs_built = 0;
    uint64_t replays = 0;             // graph launches
    uint64_t nodes_patched = 0;       // cuGraphExecKernelNodeSetParams calls, all replays
    uint64_t last_nodes_patched = 0;  // in the last replay
    // Launches resolved again by the last Replay or Build: those whose BoundLaunch changed
    // since the StepGraph last resolved them (see "Replays" above).
    uint64_t last_launches_resolved = 0;
    uint64_t eager_steps = 0;         // replays sent eagerly (Unseen::kLaunchEagerly)
    uint64_t captured_steps = 0;      // replays on a stream being captured (see above)
    uint64_t scratch_bytes = 0;       // device bytes of all graphs' scratch
    uint64_t pdl_fallbacks = 0;       // graphs built with full edges instead of programmatic
  };
  Stats stats() const;

 private:
  explicit StepGraph(std::unique_ptr<internal::StepGraphImpl> impl);
  std::unique_ptr<internal::StepGraphImpl> impl_;
};

}  // namespace kpack

#endif  // KPACK_GRAPH_H_
