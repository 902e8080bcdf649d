// The scratch arena of each stream, for launches outside a capture: one per real stream,
// one per context for the legacy (NULL) stream, one per thread and context for
// CU_STREAM_PER_THREAD (StreamKey, stream_key.h).
//
// Owns: each stream's buffers. An arena grows (to at least twice its size) when a launch
// needs more; the old buffer is kept, since work already enqueued on the stream may use
// it, until the stream's arena is released: by Release (ReleaseScratch), by ReleaseThread
// when a thread exits (its per-thread stream's), when a new stream turns up with a
// destroyed one's handle, or at destruction. Releasing frees with cuMemFree, which waits
// for the work that used the memory, so a buffer is never reused while work in flight may
// use it.
//
// Lookups are lock-free (Find, on the launch path): a fixed array of buckets, each a list
// of slots that are never freed while the table lives; a slot's key and arena are
// published under a sequence lock, so a released slot can be reused for another stream
// while launches on other threads read.
//
// Thread safety: all methods may be called concurrently, except that Release and
// ReleaseThread must not race with launches on the stream they release (as ReleaseScratch
// documents). The mutex guards the slots' bookkeeping and is never held across a driver
// call: growth allocates, and releases free, with it released.

#ifndef KPACK_SRC_LAUNCH_STREAM_ARENAS_H_
#define KPACK_SRC_LAUNCH_STREAM_ARENAS_H_

#include <cuda.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "launch/scratch_pool.h"
#include "launch/stream_key.h"

namespace kpack::internal {

class StreamArenas {
 public:
  explicit StreamArenas(ArenaPool& pool) : pool_(pool) {}
  ~StreamArenas();  // Frees every stream's buffers.
  StreamArenas(const StreamArenas&) = delete;
  StreamArenas& operator=(const StreamArenas&) = delete;

  // The lock-free lookup: `key`'s arena (aligned base, usable size), or {0, 0}.
  std::pair<CUdeviceptr, uint64_t> Find(const StreamKey& key) const;

  // Grows (or makes) the arena of `stream`, whose key is `key`, to at least `bytes`,
  // allocating in `context` (the handle of the context whose id is key.context), and
  // returns its aligned base.
  absl::StatusOr<CUdeviceptr> Grow(CUstream stream, CUcontext context, const StreamKey& key,
                                   uint64_t bytes);
  // Frees `key`'s arena (all its buffers).
  void Release(const StreamKey& key);
  // Frees the arenas of the per-thread stream of the thread whose token is `token`, in
  // every context.
  void ReleaseThread(uint64_t token);

  struct Stats {
    size_t arenas = 0;   // streams with an arena
    uint64_t bytes = 0;  // all their buffers, retired ones too
  };
  Stats stats() const;

 private:
  struct Slot {
    // Published under a sequence lock: `seq` is odd while a writer (holding mu_) changes
    // the fields, and each field is stored with release and loaded with acquire, so a
    // reader that sees any new field also sees the odd or newer `seq` afterwards.
    std::atomic<uint32_t> seq{0};
    std::atomic<uint64_t> context{0};  // 0: free
    std::atomic<uint64_t> kind{0};
    std::atomic<uint64_t> id{0};
    std::atomic<uint64_t> aligned{0};
    std::atomic<uint64_t> size{0};
    Slot* next = nullptr;  // immutable once the slot is in its bucket
    // Under mu_ only.
    CUstream stream = nullptr;   // the handle, to recognize its reuse by a new stream
    std::vector<Arena> buffers;  // the current arena last; older ones kept for work in flight

    StreamKey key() const {
      return {context.load(std::memory_order_relaxed), kind.load(std::memory_order_relaxed),
              id.load(std::memory_order_relaxed)};
    }
    void Publish(const StreamKey& k, uint64_t new_aligned, uint64_t new_size);
    // Unpublishes the slot (free for reuse) and moves its buffers to `out`. Needs mu_.
    void Clear(std::vector<Arena>* out);
  };
  static constexpr size_t kBuckets = 64;

  ArenaPool& pool_;
  std::array<std::atomic<Slot*>, kBuckets> buckets_{};
  mutable std::mutex mu_;                     // guards the slots' bookkeeping
  std::vector<std::unique_ptr<Slot>> slots_;  // owns the buckets' slots; guarded by mu_
};

inline std::pair<CUdeviceptr, uint64_t> StreamArenas::Find(const StreamKey& key) const {
  for (const Slot* s = buckets_[HashOf(key) % kBuckets].load(std::memory_order_acquire);
       s != nullptr; s = s->next) {
    // A slot being rewritten is skipped: a key is only ever in one slot, so if it is
    // `key`'s (growing, or being made for it), no later slot has it, and the locked path
    // decides; if it is another stream's (e.g. an exiting thread's, being freed), `key`'s
    // may come later.
    const uint32_t before = s->seq.load(std::memory_order_acquire);
    if (before & 1u) continue;
    const StreamKey found{s->context.load(std::memory_order_acquire),
                          s->kind.load(std::memory_order_acquire),
                          s->id.load(std::memory_order_acquire)};
    const uint64_t aligned = s->aligned.load(std::memory_order_acquire);
    const uint64_t size = s->size.load(std::memory_order_acquire);
    if (s->seq.load(std::memory_order_relaxed) != before) continue;
    if (found == key) return {aligned, size};
  }
  return {0, 0};
}

}  // namespace kpack::internal

#endif  // KPACK_SRC_LAUNCH_STREAM_ARENAS_H_
