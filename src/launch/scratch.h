// Per-stream device arenas for Triton's hidden scratch parameters.
//
// A Triton 3.6 kernel with global_scratch_size (or profile_scratch_size) > 0 needs a
// device buffer of gridX*gridY*gridZ*num_ctas*size bytes per launch, and crashes when
// given null. Launches on one stream run in order, so they can share one buffer; launches
// on different streams may run at once, so each (stream, context) owns its own arena.
//
// The lookup is lock-free: a fixed open-addressing table whose slots are written once,
// under a mutex, and then only read. An arena that is too small grows (under the mutex,
// with cuMemAlloc in the stream's context) to at least twice its size; the old buffer is
// kept until the table is destroyed, because kernels already enqueued may still use it.
// So the steady state neither locks nor allocates, and `Reserve` can size an arena ahead
// (needed before CUDA graph capture, during which cuMemAlloc is not allowed).
//
// Thread safety: all methods may be called concurrently.

#ifndef KPACK_SRC_LAUNCH_SCRATCH_H_
#define KPACK_SRC_LAUNCH_SCRATCH_H_

#include <cuda.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "driver/driver.h"

namespace kpack::internal {

class ScratchArenas {
 public:
  // Streams with an arena, at most. Beyond it, Get fails with RESOURCE_EXHAUSTED.
  static constexpr size_t kCapacity = 1024;

  explicit ScratchArenas(const Driver& driver) : driver_(driver) {}
  ~ScratchArenas();  // Frees every buffer, in its own context.
  ScratchArenas(const ScratchArenas&) = delete;
  ScratchArenas& operator=(const ScratchArenas&) = delete;

  // A device buffer of at least `bytes` bytes (bytes > 0) for work on `stream`, aligned
  // to 4096 bytes, valid until the next call for the same stream that needs more.
  absl::StatusOr<CUdeviceptr> Get(CUstream stream, uint64_t bytes) {
    CUcontext ctx = nullptr;
    CUresult r = driver_.StreamGetCtx(stream, &ctx);
    if (r != CUDA_SUCCESS) return driver_.Error(r, "cuStreamGetCtx for a scratch arena");
    const Buffer* b = Find(stream, ctx);
    if (b != nullptr && b->size >= bytes) return b->aligned;
    return Grow(stream, ctx, bytes);
  }

  absl::Status Reserve(CUstream stream, uint64_t bytes);

  size_t arenas() const { return arenas_.load(std::memory_order_relaxed); }
  uint64_t bytes() const { return bytes_.load(std::memory_order_relaxed); }

 private:
  struct Buffer {
    CUdeviceptr base = 0;     // what cuMemAlloc returned
    CUdeviceptr aligned = 0;  // base rounded up to kAlign
    uint64_t size = 0;        // usable bytes from `aligned`
    CUcontext ctx = nullptr;
  };
  struct Slot {
    std::atomic<CUstream> stream{nullptr};
    std::atomic<CUcontext> ctx{nullptr};
    std::atomic<bool> used{false};
    std::atomic<const Buffer*> buffer{nullptr};
  };
  static constexpr uint64_t kAlign = 4096;  // the largest scratch alignment a pack may ask

  static size_t Hash(CUstream stream, CUcontext ctx) {
    auto h = reinterpret_cast<uintptr_t>(stream) * 0x9e3779b97f4a7c15ull ^
             reinterpret_cast<uintptr_t>(ctx);
    return static_cast<size_t>(h >> 7) % kCapacity;
  }
  const Buffer* Find(CUstream stream, CUcontext ctx) const;
  absl::StatusOr<CUdeviceptr> Grow(CUstream stream, CUcontext ctx, uint64_t bytes);

  const Driver& driver_;
  std::array<Slot, kCapacity> slots_;
  std::atomic<size_t> arenas_{0};
  std::atomic<uint64_t> bytes_{0};
  std::mutex grow_mu_;
  std::vector<std::unique_ptr<Buffer>> buffers_ ABSL_GUARDED_BY(grow_mu_);
};

}  // namespace kpack::internal

#endif  // KPACK_SRC_LAUNCH_SCRATCH_H_
