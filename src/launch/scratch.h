// Device memory for Triton's hidden scratch parameters.
//
// A Triton 3.6 kernel with global_scratch_size (or profile_scratch_size) > 0 needs a
// device buffer of gridX*gridY*gridZ*num_ctas*size bytes per launch, and crashes when
// given null. kpack gets it from one of three places, in this order:
//
//  1. A caller's ScratchAllocator (per launch, per BoundLaunch, or Options-wide): asked
//     for each launch, like Triton's set_allocator. Nothing below is involved.
//  2. Inside a stream capture: an arena that the captured graph owns (and, the same way,
//     for a graph kpack builds node by node: ForGraph). Launches on one
//     stream run in order and may share memory; a graph does not run in the capturing
//     stream's order (it is replayed on any stream, while the capturing stream goes on
//     eagerly), so it must not use that stream's arena. kpack takes an arena reserved
//     ahead (ReserveScratch), never allocates during a capture (cuMemAlloc would
//     invalidate it), and hands the arena to the graph: a CUDA user object retained by
//     the capture graph, whose destructor (run by the driver when the graph and every
//     executable instantiated from it are destroyed, after their work) returns the arena
//     to an idle pool that later reservations and streams draw from. All launches of one
//     capture on one stream share that stream's graph arena (they are ordered in the
//     graph too); a capture that forks into several streams takes one per stream.
//  3. Outside a capture: the arena of the launch's stream in its context: one per real
//     stream, one per context for the legacy (NULL) stream, one per thread and context for
//     CU_STREAM_PER_THREAD (one handle, but a different stream on every thread). It grows
//     (to at least twice its size) when a launch needs more; the old buffer is kept, since
//     work already enqueued may use it, until ReleaseScratch or destruction.
//
// Lookups of (3) are lock-free: a fixed array of buckets, each a list of slots that are
// never freed while the table lives; a slot's key and arena are published under a
// sequence lock, so a released slot can be reused for another stream while launches on
// other threads read. Everything else (growth, captures, release) takes the mutex.
//
// Identity: contexts by cuCtxGetId and real streams by cuStreamGetId (unique for the
// process), never by handle, so that a destroyed stream's or context's handle reused by
// a new one never inherits its arena. When a stream handle shows up with a new id, the
// arena of the destroyed stream is freed (cuMemFree waits for the GPU to finish with it:
// the CUDA programming guide documents cudaMalloc/cudaFree as synchronizing the device).
//
// Thread safety: all methods may be called concurrently. A graph arena's destructor may
// run on a driver thread at any time, also after ~ScratchArenas (its arena then leaks:
// no CUDA call may be made from that callback).

#ifndef KPACK_SRC_LAUNCH_SCRATCH_H_
#define KPACK_SRC_LAUNCH_SCRATCH_H_

#include <cuda.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "driver/driver.h"

namespace kpack::internal {

// Which stream a launch's eager arena belongs to, within a context.
// Inside a stream capture a real stream is known by its handle (kHandle): the driver
// refuses cuStreamGetId on a capturing stream, and a failed call would invalidate the
// user's capture (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED on driver 580).
struct StreamKey {
  // kGraph: not a stream but a graph built node by node (ForGraph), numbered by kpack.
  enum Kind : uint64_t { kReal = 1, kLegacy = 2, kPerThread = 3, kHandle = 4, kGraph = 5 };
  uint64_t context = 0;  // cuCtxGetId
  uint64_t kind = 0;
  // kReal: cuStreamGetId; kHandle: the CUstream's address; kPerThread: the thread's
  // kpack token; kGraph: kpack's graph number; else 0
  uint64_t id = 0;
  bool operator==(const StreamKey&) const = default;
};

class ScratchArenas {
 public:
  explicit ScratchArenas(const Driver& driver);
  ~ScratchArenas();  // Frees every arena it holds, each in its own context.
  ScratchArenas(const ScratchArenas&) = delete;
  ScratchArenas& operator=(const ScratchArenas&) = delete;

  // A device buffer of at least `bytes` (> 0) bytes, aligned to 4096, for one launch on
  // `stream` in the current context, whose cuCtxGetId is `context`. Inside a capture: the
  // capture's arena on this stream, or FAILED_PRECONDITION naming ReserveScratch if none
  // was reserved. Outside: lock-free unless the stream's arena must grow.
  absl::StatusOr<CUdeviceptr> Get(CUstream stream, uint64_t context, uint64_t bytes);

  // A device buffer of at least `bytes` (> 0) bytes, aligned to 4096, owned by `graph`, a
  // graph built node by node (not captured) in the current context, whose cuCtxGetId is
  // `context`: from the idle pool or cuMemAlloc (so never during a capture), handed to
  // the graph through a user object like a capture's arena, and returned to the pool when
  // the graph and its executables are destroyed and their work is done. Every node of
  // the graph may use it when the graph runs them one after another.
  absl::StatusOr<CUdeviceptr> ForGraph(CUgraph graph, uint64_t context, uint64_t bytes);

  // Sizes `stream`'s arena to at least `bytes`, and sets aside an arena of at least
  // `bytes` for the next capture on `stream`. FAILED_PRECONDITION while `stream` captures.
  absl::Status Reserve(CUstream stream, uint64_t bytes);
  // Frees `stream`'s arena (all its buffers) and its capture reservation.
  absl::Status Release(CUstream stream);

  struct Stats {
    size_t stream_arenas = 0;    // streams with an arena
    size_t reserved = 0;         // set aside for a capture
    size_t in_graphs = 0;        // owned by captured graphs
    size_t idle = 0;             // returned by graphs, not yet reused
    uint64_t bytes = 0;          // device bytes in all of the above, retired buffers too
  };
  Stats stats() const;

 private:
  struct Arena {
    CUcontext context = nullptr;  // handle, for cuMemFree; valid while `context_id` lives
    uint64_t context_id = 0;
    CUdeviceptr base = 0;     // what cuMemAlloc returned
    CUdeviceptr aligned = 0;  // base rounded up to kAlign
    uint64_t size = 0;        // usable bytes from `aligned`
  };
  struct Slot;
  struct Shared;   // the state a graph arena's destructor reaches; outlives this object
  struct GraphArena;
  static constexpr uint64_t kAlign = 4096;  // the largest scratch alignment a pack may ask
  static constexpr size_t kBuckets = 64;

  // For Reserve and Release: `stream`'s context and key, or FAILED_PRECONDITION naming
  // `call` while `stream` is being captured.
  absl::StatusOr<std::pair<CUcontext, StreamKey>> OutsideCapture(CUstream stream,
                                                                 absl::string_view call) const;
  // The key of `stream` in the current context `context`; a real stream's id costs one
  // cuStreamGetId.
  absl::StatusOr<StreamKey> KeyOf(CUstream stream, uint64_t context) const;
  // The key of `stream` as a capture sees it: KeyOf's, but a real stream by its handle
  // (no driver call, so it is safe on a capturing stream).
  static StreamKey CaptureKeyOf(CUstream stream, uint64_t context);
  // The lock-free lookup: the arena (aligned, size) of `key`, or {0, 0}.
  std::pair<CUdeviceptr, uint64_t> Find(const StreamKey& key) const;
  // Grows (or makes) `stream`'s arena to at least `bytes`, allocating in `context` (the
  // handle of the context whose id is key.context). Needs Shared::mu held.
  absl::StatusOr<CUdeviceptr> GrowLocked(CUstream stream, CUcontext context, const StreamKey& key,
                                         uint64_t bytes);
  absl::StatusOr<CUdeviceptr> ForCapture(CUstream stream, uint64_t context, uint64_t capture,
                                         CUgraph graph, uint64_t bytes);
  // Hands the arena in_graphs holds under (capture, key) to `graph` (a user object whose
  // destructor returns it); on failure the arena is back in the idle pool.
  absl::Status GiveToGraph(CUgraph graph, uint64_t capture, const StreamKey& key,
                           absl::string_view what);
  // An arena of at least `bytes` in context `context` (cuCtxGetId `context_id`): from the
  // idle pool when one fits, else cuMemAlloc. Needs Shared::mu held.
  absl::StatusOr<Arena> TakeOrAllocate(CUcontext context, uint64_t context_id, uint64_t bytes);
  // cuMemFree in the arena's context. True when freed, or when its context is gone (and
  // the memory with it); false when the driver refused (e.g. another thread captures).
  bool Free(const Arena& arena) const;
  // Frees `slot`'s buffers (those the driver refuses now wait for ~ScratchArenas) and
  // marks it free. Needs Shared::mu held.
  void ReleaseSlot(Slot* slot);
  static void ReturnFromGraph(void* graph_arena);  // the user object's destructor

  const Driver& driver_;
  std::shared_ptr<Shared> shared_;
  std::array<std::atomic<Slot*>, kBuckets> buckets_{};
  std::vector<std::unique_ptr<Slot>> slots_;  // guarded by Shared::mu; owns the buckets' slots
  std::atomic<uint64_t> next_graph_{1};       // StreamKey ids of ForGraph's graphs
};

}  // namespace kpack::internal

#endif  // KPACK_SRC_LAUNCH_SCRATCH_H_
