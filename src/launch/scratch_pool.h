// Scratch device buffers (arenas) that no stream owns: idle ones, ones lent to CUDA
// graphs, and ones the driver would not free yet; and how arenas are allocated and freed.
//
// Owns: the idle arenas, which later streams, reservations and graphs take before
// allocating; the bookkeeping of arenas lent to graphs until they come back (their memory
// is the graph's meanwhile); the arenas whose cuMemFree the driver refused (e.g. while
// another thread captured in global mode), freed at destruction. Arenas in use by a
// stream or reserved for a capture belong to StreamArenas and GraphArenas, which
// allocate and free them through this class.
//
// Stream order: an arena is idle only once no GPU work can use it any more (never used,
// or returned by the driver after its graph's work completed), so it may be reused at
// once. Freeing relies on cuMemFree waiting for the work that used the memory (the CUDA
// programming guide documents cudaFree as synchronizing the device).
//
// Returning a lent arena (Return) is lock-free and makes no CUDA call: it runs in a CUDA
// user object's destructor, on the driver's internal thread, which also runs host
// callbacks that GPU work may wait for, so it must never block. It pushes the loan onto a
// lock-free list that the next call here taking the mutex drains into the idle arenas. It
// may run at any time, also after the pool is gone (the list lives as long as the last
// loan; that arena then leaks, since nothing may free it from the destructor).
//
// Thread safety: every method may be called concurrently, Return from any thread. The
// mutex guards bookkeeping only and is never held across a driver call (a driver call may
// wait for GPU work, and that work for a host callback that waits for a lock a caller
// holds).

#ifndef KPACK_SRC_LAUNCH_SCRATCH_POOL_H_
#define KPACK_SRC_LAUNCH_SCRATCH_POOL_H_

#include <cuda.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "driver/driver.h"
#include "launch/stream_key.h"

namespace kpack::internal {

struct Arena {
  CUcontext context = nullptr;  // handle, for cuMemFree; valid while `context_id` lives
  uint64_t context_id = 0;
  CUdeviceptr base = 0;     // what cuMemAlloc returned
  CUdeviceptr aligned = 0;  // base rounded up to kScratchAlign
  uint64_t size = 0;        // usable bytes from `aligned`
};

inline constexpr uint64_t kScratchAlign = 4096;  // the largest scratch alignment a pack may ask

class ArenaPool {
 public:
  explicit ArenaPool(const Driver& driver);
  // Frees the idle arenas and the leftovers; lent arenas returned later leak.
  ~ArenaPool();
  ArenaPool(const ArenaPool&) = delete;
  ArenaPool& operator=(const ArenaPool&) = delete;

  // The smallest idle arena of context `context_id` with at least `bytes`, if any.
  std::optional<Arena> TakeIdle(uint64_t context_id, uint64_t bytes);
  // TakeIdle, else cuMemAlloc in `context` (pushed for the call), whose id is `context_id`.
  absl::StatusOr<Arena> TakeOrAllocate(CUcontext context, uint64_t context_id, uint64_t bytes);
  // Arenas that no GPU work uses (any more), for later takers.
  void PutIdle(std::span<const Arena> arenas);
  void PutIdle(const Arena& arena) { PutIdle(std::span(&arena, 1)); }
  // cuMemFree of each in its context; those the driver refuses are kept as leftovers.
  void Free(std::span<const Arena> arenas);

  // What a lent arena is known by while its graph holds it: the capture (its
  // cuStreamGetCaptureInfo id, 0 for a graph built node by node) and the stream key.
  struct LoanTag {
    uint64_t capture = 0;
    StreamKey stream;
    bool operator==(const LoanTag&) const = default;
  };
  // Records `arena` as lent under `tag` and returns the loan: the payload of the user
  // object whose destructor is Return. Allocates.
  void* Lend(const Arena& arena, const LoanTag& tag);
  // The arena lent under `tag` and not yet returned, if any.
  std::optional<Arena> FindLent(const LoanTag& tag);
  // A user object's destructor (CUhostFn): `loan`'s arena goes back to the idle arenas.
  // Lock-free, no CUDA call, never blocks; callable on any thread, at any time.
  static void Return(void* loan);

  struct Stats {
    size_t idle = 0;
    size_t lent = 0;     // lent to graphs and not returned yet
    uint64_t bytes = 0;  // idle, lent and leftover arenas
  };
  Stats stats() const;

 private:
  struct Loan;
  struct Returns;  // the lock-free list Return pushes onto; shared with every loan
  struct Lent {
    const Loan* loan;
    LoanTag tag;
    Arena arena;
  };

  // Moves the returned loans' arenas from lent_ to idle_. Needs mu_.
  void DrainLocked() const;
  // cuMemFree in the arena's context. True when freed, or when its context is gone (and
  // the memory with it); false when the driver refused.
  bool FreeOne(const Arena& arena) const;

  const Driver& driver_;
  const std::shared_ptr<Returns> returns_;
  mutable std::mutex mu_;  // guards the three below
  mutable std::vector<Arena> idle_;
  mutable std::vector<Lent> lent_;
  std::vector<Arena> leftovers_;  // cuMemFree refused
};

}  // namespace kpack::internal

#endif  // KPACK_SRC_LAUNCH_SCRATCH_POOL_H_
