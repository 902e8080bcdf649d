// Scratch arenas owned by CUDA graphs: those of stream captures, those of graphs kpack
// builds node by node (StepGraph), and the reservations set aside for the next capture
// on a stream.
//
// A graph does not run in its capturing stream's order (it is replayed on any stream
// while the capturing stream goes on eagerly), so it must not use that stream's arena:
// it gets one of its own. kpack never allocates during a capture (cuMemAlloc would
// invalidate it), so a capture takes an arena reserved ahead (Reserve) or an idle one.
// The arena is handed to the graph through a CUDA user object retained by the graph
// (moving kpack's only reference), whose destructor the driver runs once the graph and
// every executable instantiated from it are destroyed and their work is done: the arena
// then goes back to the idle pool. All launches of one capture on one stream share that
// stream's graph arena (they are ordered in the graph too); a capture that forks into
// several streams takes one per stream.
//
// Owns: the reservations (freed by Release, ReleaseThread, or destruction). Lent arenas
// are the pool's bookkeeping (scratch_pool.h: ArenaPool::Lend/Return), and their return
// never blocks: the destructor runs on the driver's internal thread.
//
// Thread safety: all methods may be called concurrently. The mutex guards the
// reservations and makes a capture's lookup-or-take atomic; it is never held across a
// driver call.

#ifndef KPACK_SRC_LAUNCH_GRAPH_ARENAS_H_
#define KPACK_SRC_LAUNCH_GRAPH_ARENAS_H_

#include <cuda.h>

#include <atomic>
#include <cstdint>
#include <mutex>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "driver/driver.h"
#include "launch/scratch_pool.h"
#include "launch/stream_key.h"

namespace kpack::internal {

class GraphArenas {
 public:
  GraphArenas(const Driver& driver, ArenaPool& pool) : driver_(driver), pool_(pool) {}
  ~GraphArenas();  // Frees the reservations.
  GraphArenas(const GraphArenas&) = delete;
  GraphArenas& operator=(const GraphArenas&) = delete;

  // For a launch on a stream being captured: the capture's arena on that stream (key
  // `stream`, CaptureKeyOf), of at least `bytes`, or FAILED_PRECONDITION naming
  // ReserveScratch. `capture` and `graph`: cuStreamGetCaptureInfo's id and graph. The
  // first launch of a capture on a stream takes the stream's reservation (or an idle
  // arena) and gives it to `graph`; no allocation.
  absl::StatusOr<CUdeviceptr> ForCapture(const StreamKey& stream, uint64_t capture, CUgraph graph,
                                         uint64_t bytes);

  // An arena of at least `bytes`, from the idle pool or cuMemAlloc (in `context`, whose
  // cuCtxGetId is `context_id`; so never during a capture), given to `graph`, a graph
  // built node by node, through a user object like a capture's arena. Every node of the
  // graph may use it when the graph runs them one after another. `object`, if not null,
  // receives the user object: it lives while `graph` or an executable of it holds it, and
  // retaining it on another graph (cuGraphRetainUserObject without MOVE, while `graph`
  // lives) keeps the arena for that graph too, e.g. a caller's capture that `graph`'s
  // executable was launched into.
  absl::StatusOr<CUdeviceptr> ForGraph(CUgraph graph, CUcontext context, uint64_t context_id,
                                       uint64_t bytes, CUuserObject* object = nullptr);

  // Sets aside an arena of at least `bytes` for the next capture on the stream whose key
  // is `stream` (KeyOf) and whose capture key is `capture_stream` (CaptureKeyOf), in
  // `context`. Not during a capture on that stream (the caller checks).
  absl::Status Reserve(CUcontext context, const StreamKey& stream, const StreamKey& capture_stream,
                       uint64_t bytes);
  // Frees the reservation of the stream whose key is `stream`, if any.
  void Release(const StreamKey& stream);
  // Frees the reservations of the per-thread stream of the thread whose token is `token`.
  void ReleaseThread(uint64_t token);

  struct Stats {
    size_t reserved = 0;  // set aside for a capture
    uint64_t bytes = 0;
  };
  Stats stats() const;

 private:
  struct Reserved {
    StreamKey stream;          // KeyOf: what Reserve and Release match on
    StreamKey capture_stream;  // CaptureKeyOf: what a launch inside a capture matches on
    Arena arena;
  };

  // Hands the arena lent as `loan` to `graph` through a user object (`object`, if not
  // null, receives it); on failure the loan is returned (the arena goes back to the pool).
  absl::Status GiveToGraph(CUgraph graph, void* loan, absl::string_view what, CUuserObject* object);

  const Driver& driver_;
  ArenaPool& pool_;
  std::atomic<uint64_t> next_graph_{1};  // the ids of ForGraph's kGraph keys
  mutable std::mutex mu_;                // guards reserved_
  std::vector<Reserved> reserved_;
};

}  // namespace kpack::internal

#endif  // KPACK_SRC_LAUNCH_GRAPH_ARENAS_H_
