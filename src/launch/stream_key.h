// Which stream a scratch arena belongs to: the identity that the per-stream arenas
// (stream_arenas.h) and the capture reservations (graph_arenas.h) are keyed by.
//
// Streams and contexts are known by the driver's process-unique ids (cuStreamGetId,
// cuCtxGetId), never by handle: a destroyed stream's or context's handle may be handed
// to a new one, which must not inherit the old one's arena. Two streams have no id of
// their own to ask for cheaply: the legacy (NULL) stream is one per context, and
// CU_STREAM_PER_THREAD is one handle for a different stream on every thread, known here
// by a per-thread token that is never reused (a thread that gets an exited thread's
// storage must not inherit its arena).
//
// Inside a stream capture a real stream is known by its handle instead (kHandle): the
// driver refuses cuStreamGetId on a capturing stream, and the failed call would
// invalidate the user's capture (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED on driver 580).
//
// Everything here is inline: KeyOf is on the launch path of every kernel with scratch.
// Thread safety: pure functions; ThreadToken reads (and once per thread sets) a
// thread-local.

#ifndef KPACK_SRC_LAUNCH_STREAM_KEY_H_
#define KPACK_SRC_LAUNCH_STREAM_KEY_H_

#include <cuda.h>

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "absl/status/statusor.h"
#include "driver/driver.h"

namespace kpack::internal {

struct StreamKey {
  // kGraph: not a stream but a graph built node by node (GraphArenas::ForGraph).
  enum Kind : uint64_t { kReal = 1, kLegacy = 2, kPerThread = 3, kHandle = 4, kGraph = 5 };
  uint64_t context = 0;  // cuCtxGetId; 0 only in the empty key
  uint64_t kind = 0;
  // kReal: cuStreamGetId; kHandle: the CUstream's address; kPerThread: the thread's
  // ThreadToken; kGraph: kpack's graph number; else 0
  uint64_t id = 0;
  bool operator==(const StreamKey&) const = default;
};

// The calling thread's token for CU_STREAM_PER_THREAD keys: unique for the process.
inline uint64_t ThreadToken() {
  static std::atomic<uint64_t> next{1};
  thread_local const uint64_t token = next.fetch_add(1, std::memory_order_relaxed);
  return token;
}

inline size_t HashOf(const StreamKey& key) {
  uint64_t h = key.context * 0x9e3779b97f4a7c15ull;
  h ^= (key.kind << 56) ^ key.id * 0xc2b2ae3d27d4eb4full;
  return static_cast<size_t>(h ^ (h >> 29));
}

// The key of `stream` in the current context, whose cuCtxGetId is `context`, outside a
// capture. A real stream's id costs one cuStreamGetId.
inline absl::StatusOr<StreamKey> KeyOf(const Driver& driver, CUstream stream, uint64_t context) {
  if (stream == nullptr || stream == CU_STREAM_LEGACY) {
    return StreamKey{context, StreamKey::kLegacy, 0};
  }
  if (stream == CU_STREAM_PER_THREAD) {
    return StreamKey{context, StreamKey::kPerThread, ThreadToken()};
  }
  unsigned long long id = 0;  // NOLINT(runtime/int)
  if (const CUresult r = driver.StreamGetId(stream, &id); r != CUDA_SUCCESS) {
    return driver.Error(r, "cuStreamGetId for a scratch arena");
  }
  return StreamKey{context, StreamKey::kReal, id};
}

// The key of `stream` as a capture sees it: KeyOf's, but a real stream by its handle (no
// driver call, so it is safe on a capturing stream).
inline StreamKey CaptureKeyOf(CUstream stream, uint64_t context) {
  if (stream == nullptr || stream == CU_STREAM_LEGACY) {
    return StreamKey{context, StreamKey::kLegacy, 0};
  }
  if (stream == CU_STREAM_PER_THREAD) {
    return StreamKey{context, StreamKey::kPerThread, ThreadToken()};
  }
  return StreamKey{context, StreamKey::kHandle, reinterpret_cast<uintptr_t>(stream)};
}

// Whether `key` is the per-thread stream of the thread whose token is `token` (in any
// context).
inline bool IsThreadsStream(const StreamKey& key, uint64_t token) {
  return key.kind == StreamKey::kPerThread && key.id == token;
}

}  // namespace kpack::internal

#endif  // KPACK_SRC_LAUNCH_STREAM_KEY_H_
