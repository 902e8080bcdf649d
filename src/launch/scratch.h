// Device memory for Triton's hidden scratch parameters: where a launch's scratch comes
// from when the caller gives no ScratchAllocator, and the Runtime's scratch calls
// (ReserveScratch, ReleaseScratch, the scratch stats).
//
// A Triton 3.6 kernel with global_scratch_size (or profile_scratch_size) > 0 needs a
// device buffer of gridX*gridY*gridZ*num_ctas*size bytes per launch, and crashes when
// given null. kpack gets it from one of three places, in this order:
//
//  1. A caller's ScratchAllocator (per launch, per BoundLaunch, or Options-wide): asked
//     for each launch, like Triton's set_allocator. Nothing here is involved.
//  2. Inside a stream capture, and for a graph kpack builds node by node (ForGraph): an
//     arena the graph owns (graph_arenas.h), reserved ahead, never allocated during a
//     capture, returned to the pool by the driver when the graph is gone.
//  3. Outside a capture: the arena of the launch's stream in its context (stream_arenas.h),
//     found lock-free, grown on demand.
//
// The pieces, one job each: stream_key.h (which stream), scratch_pool.h (allocation,
// freeing, idle and lent arenas), stream_arenas.h (per-stream arenas), graph_arenas.h
// (graph arenas and capture reservations), thread_exit.h (a thread's per-thread-stream
// arenas freed when it exits). This class routes between them.
//
// A thread's CU_STREAM_PER_THREAD arenas (and reservation) are freed when the thread
// exits, on that thread (cuMemFree waits for its launches still in flight), in relaxed
// capture interaction mode (so as not to invalidate another thread's global capture);
// after the Runtime is destroyed a thread's exit does nothing (the destruction freed them).
//
// Thread safety: all methods may be called concurrently (Release must not race with
// launches on the stream it releases). No lock is held across a driver call, and nothing
// the driver calls back (a graph arena's return, on the driver's internal thread) takes a
// lock or makes a CUDA call.

#ifndef KPACK_SRC_LAUNCH_SCRATCH_H_
#define KPACK_SRC_LAUNCH_SCRATCH_H_

#include <cuda.h>

#include <cstdint>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "driver/driver.h"
#include "launch/graph_arenas.h"
#include "launch/scratch_pool.h"
#include "launch/stream_arenas.h"
#include "launch/stream_key.h"
#include "launch/thread_exit.h"

namespace kpack::internal {

class ScratchArenas {
 public:
  explicit ScratchArenas(const Driver& driver);
  // Stops freeing exiting threads' arenas (waiting for those under way), then frees every
  // arena it holds, each in its own context.
  ~ScratchArenas();
  ScratchArenas(const ScratchArenas&) = delete;
  ScratchArenas& operator=(const ScratchArenas&) = delete;

  // A device buffer of at least `bytes` (> 0) bytes, aligned to 4096, for one launch on
  // `stream` in the current context, whose cuCtxGetId is `context`. Inside a capture: the
  // capture's arena on this stream, or FAILED_PRECONDITION naming ReserveScratch if none
  // was reserved. Outside: lock-free unless the stream's arena must grow.
  absl::StatusOr<CUdeviceptr> Get(CUstream stream, uint64_t context, uint64_t bytes);

  // A device buffer of at least `bytes` (> 0) bytes, aligned to 4096, owned by `graph`, a
  // graph built node by node (not captured) in the current context, whose cuCtxGetId is
  // `context`: see GraphArenas::ForGraph (`object` receives the user object that holds
  // it, to retain on another graph that must keep it too).
  absl::StatusOr<CUdeviceptr> ForGraph(CUgraph graph, uint64_t context, uint64_t bytes,
                                       CUuserObject* object = nullptr);

  // Sizes `stream`'s arena to at least `bytes`, and sets aside an arena of at least
  // `bytes` for the next capture on `stream`. FAILED_PRECONDITION while `stream` captures.
  absl::Status Reserve(CUstream stream, uint64_t bytes);
  // Frees `stream`'s arena (all its buffers) and its capture reservation.
  absl::Status Release(CUstream stream);

  struct Stats {
    size_t stream_arenas = 0;  // streams with an arena
    size_t reserved = 0;       // set aside for a capture
    size_t in_graphs = 0;      // owned by graphs
    size_t idle = 0;           // returned by graphs (or set aside), not yet reused
    uint64_t bytes = 0;        // device bytes in all of the above, retired buffers too
  };
  Stats stats() const;

 private:
  // For Reserve and Release: `stream`'s context and key, or FAILED_PRECONDITION naming
  // `call` while `stream` is being captured.
  absl::StatusOr<std::pair<CUcontext, StreamKey>> OutsideCapture(CUstream stream,
                                                                 absl::string_view call) const;
  // Get's slow path: `stream`'s arena grows.
  absl::StatusOr<CUdeviceptr> Grow(CUstream stream, const StreamKey& key, uint64_t bytes);
  // Has the calling thread's arenas freed when it exits, if `key` is its per-thread stream.
  void WatchThread(const StreamKey& key);
  static void OnThreadExit(void* self, uint64_t token);

  const Driver& driver_;
  // Destroyed in reverse: the exit hook closes first, the pool goes last.
  ArenaPool pool_;
  StreamArenas streams_;
  GraphArenas graphs_;
  ThreadExitHook thread_exits_;
};

}  // namespace kpack::internal

#endif  // KPACK_SRC_LAUNCH_SCRATCH_H_
