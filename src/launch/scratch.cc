#include "launch/scratch.h"

#include <algorithm>
#include <mutex>
#include <utility>

#include "absl/strings/str_cat.h"
#include "util/status_macros.h"

namespace kpack::internal {
namespace {

// A per-thread token for CU_STREAM_PER_THREAD keys: unique for the process, so a thread
// that reuses an exited thread's storage never inherits its arena.
uint64_t ThreadToken() {
  static std::atomic<uint64_t> next{1};
  thread_local const uint64_t token = next.fetch_add(1, std::memory_order_relaxed);
  return token;
}

size_t Hash(const StreamKey& key) {
  uint64_t h = key.context * 0x9e3779b97f4a7c15ull;
  h ^= (key.kind << 56) ^ key.id * 0xc2b2ae3d27d4eb4full;
  return static_cast<size_t>(h ^ (h >> 29));
}

}  // namespace

struct ScratchArenas::Slot {
  // Published under a sequence lock: `seq` is odd while a writer (holding Shared::mu)
  // changes the fields, and each field is stored with release and loaded with acquire,
  // so a reader that sees any new field also sees the odd or newer `seq` afterwards.
  std::atomic<uint32_t> seq{0};
  std::atomic<uint64_t> context{0};  // 0: free
  std::atomic<uint64_t> kind{0};
  std::atomic<uint64_t> id{0};
  std::atomic<uint64_t> aligned{0};
  std::atomic<uint64_t> size{0};
  Slot* next = nullptr;  // immutable once the slot is in its bucket
  // Under Shared::mu only.
  CUstream stream = nullptr;   // the handle, to recognize its reuse by a new stream
  std::vector<Arena> buffers;  // the current arena last; older ones kept for work in flight

  StreamKey key() const {
    return {context.load(std::memory_order_relaxed), kind.load(std::memory_order_relaxed),
            id.load(std::memory_order_relaxed)};
  }
  void Publish(const StreamKey& k, uint64_t new_aligned, uint64_t new_size) {
    const uint32_t s = seq.load(std::memory_order_relaxed);
    seq.store(s + 1, std::memory_order_relaxed);
    context.store(k.context, std::memory_order_release);
    kind.store(k.kind, std::memory_order_release);
    id.store(k.id, std::memory_order_release);
    aligned.store(new_aligned, std::memory_order_release);
    size.store(new_size, std::memory_order_release);
    seq.store(s + 2, std::memory_order_release);
  }
};

struct ScratchArenas::Shared {
  std::mutex mu;
  bool closed = false;  // ~ScratchArenas ran: graphs' arenas returning now leak
  struct Reserved {
    StreamKey stream;          // KeyOf: what Reserve and Release match on
    StreamKey capture_stream;  // CaptureKeyOf: what a launch inside a capture matches on
    Arena arena;
  };
  std::vector<Reserved> reserved;  // set aside for the next capture on a stream
  struct Captured {
    uint64_t capture;  // cuStreamGetCaptureInfo's id
    StreamKey stream;  // CaptureKeyOf
    Arena arena;
  };
  std::vector<Captured> in_graphs;  // owned by graphs, until their destructor returns them
  std::vector<Arena> idle;          // returned by graphs; reused before allocating
  std::vector<Arena> leftovers;     // released while the driver refused cuMemFree
};

// The payload of a graph's user object.
struct ScratchArenas::GraphArena {
  std::shared_ptr<Shared> shared;
  uint64_t capture;
  StreamKey stream;
};

ScratchArenas::ScratchArenas(const Driver& driver)
    : driver_(driver), shared_(std::make_shared<Shared>()) {}

ScratchArenas::~ScratchArenas() {
  std::vector<Arena> arenas;
  {
    std::lock_guard<std::mutex> lock(shared_->mu);
    shared_->closed = true;
    for (const auto& slot : slots_) {
      arenas.insert(arenas.end(), slot->buffers.begin(), slot->buffers.end());
    }
    for (const Shared::Reserved& r : shared_->reserved) arenas.push_back(r.arena);
    arenas.insert(arenas.end(), shared_->idle.begin(), shared_->idle.end());
    arenas.insert(arenas.end(), shared_->leftovers.begin(), shared_->leftovers.end());
    shared_->reserved.clear();
    shared_->idle.clear();
    shared_->leftovers.clear();
  }
  for (const Arena& arena : arenas) Free(arena);
}

absl::StatusOr<StreamKey> ScratchArenas::KeyOf(CUstream stream, uint64_t context) const {
  if (stream == nullptr || stream == CU_STREAM_LEGACY) return StreamKey{context, StreamKey::kLegacy, 0};
  if (stream == CU_STREAM_PER_THREAD) {
    return StreamKey{context, StreamKey::kPerThread, ThreadToken()};
  }
  unsigned long long id = 0;  // NOLINT(runtime/int)
  KPACK_RETURN_IF_ERROR(
      driver_.Check(driver_.StreamGetId(stream, &id), "cuStreamGetId for a scratch arena"));
  return StreamKey{context, StreamKey::kReal, id};
}

StreamKey ScratchArenas::CaptureKeyOf(CUstream stream, uint64_t context) {
  if (stream == nullptr || stream == CU_STREAM_LEGACY) return StreamKey{context, StreamKey::kLegacy, 0};
  if (stream == CU_STREAM_PER_THREAD) {
    return StreamKey{context, StreamKey::kPerThread, ThreadToken()};
  }
  return StreamKey{context, StreamKey::kHandle, reinterpret_cast<uintptr_t>(stream)};
}

std::pair<CUdeviceptr, uint64_t> ScratchArenas::Find(const StreamKey& key) const {
  for (const Slot* s = buckets_[Hash(key) % kBuckets].load(std::memory_order_acquire);
       s != nullptr; s = s->next) {
    const uint32_t before = s->seq.load(std::memory_order_acquire);
    if (before & 1u) return {0, 0};  // being rewritten: the locked path decides
    const StreamKey found{s->context.load(std::memory_order_acquire),
                          s->kind.load(std::memory_order_acquire),
                          s->id.load(std::memory_order_acquire)};
    const uint64_t aligned = s->aligned.load(std::memory_order_acquire);
    const uint64_t size = s->size.load(std::memory_order_acquire);
    if (s->seq.load(std::memory_order_relaxed) != before) return {0, 0};
    if (found == key) return {aligned, size};
  }
  return {0, 0};
}

absl::StatusOr<CUdeviceptr> ScratchArenas::Get(CUstream stream, uint64_t context, uint64_t bytes) {
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  cuuint64_t capture = 0;
  CUgraph graph = nullptr;
  CUresult r = driver_.StreamGetCaptureInfo(stream, &status, &capture, &graph, nullptr, nullptr,
                                            nullptr);
  if (r != CUDA_SUCCESS) return driver_.Error(r, "cuStreamGetCaptureInfo for scratch memory");
  if (status == CU_STREAM_CAPTURE_STATUS_ACTIVE) {
    return ForCapture(stream, context, capture, graph, bytes);
  }
  if (status != CU_STREAM_CAPTURE_STATUS_NONE) {
    return absl::FailedPreconditionError(
        "the stream's capture has been invalidated; nothing is launched into it");
  }
  KPACK_ASSIGN_OR_RETURN(StreamKey key, KeyOf(stream, context));
  auto [aligned, size] = Find(key);
  if (aligned != 0 && size >= bytes) return aligned;
  CUcontext current = nullptr;
  KPACK_RETURN_IF_ERROR(driver_.Check(driver_.CtxGetCurrent(&current), "cuCtxGetCurrent"));
  std::lock_guard<std::mutex> lock(shared_->mu);
  return GrowLocked(stream, current, key, bytes);
}

absl::StatusOr<ScratchArenas::Arena> ScratchArenas::TakeOrAllocate(CUcontext context,
                                                                   uint64_t context_id,
                                                                   uint64_t bytes) {
  // The smallest idle arena that fits.
  auto best = shared_->idle.end();
  for (auto it = shared_->idle.begin(); it != shared_->idle.end(); ++it) {
    if (it->context_id == context_id && it->size >= bytes &&
        (best == shared_->idle.end() || it->size < best->size)) {
      best = it;
    }
  }
  if (best != shared_->idle.end()) {
    Arena arena = *best;
    shared_->idle.erase(best);
    return arena;
  }
  Arena arena;
  arena.context = context;
  arena.context_id = context_id;
  arena.size = (bytes + kAlign - 1) / kAlign * kAlign;
  KPACK_RETURN_IF_ERROR(driver_.Check(driver_.CtxPushCurrent(context), "cuCtxPushCurrent"));
  const CUresult alloc = driver_.MemAlloc(&arena.base, arena.size + kAlign - 1);
  if (alloc == CUDA_SUCCESS) {
    CUcontext popped = nullptr;
    if (const CUresult pop = driver_.CtxPopCurrent(&popped); pop != CUDA_SUCCESS) {
      driver_.MemFree(arena.base);
      return driver_.Error(pop, "cuCtxPopCurrent after allocating a scratch arena");
    }
  } else {
    CUcontext popped = nullptr;
    driver_.CtxPopCurrent(&popped);
  }
  KPACK_RETURN_IF_ERROR(driver_.Check(
      alloc, absl::StrCat("cuMemAlloc of a ", arena.size + kAlign - 1, "-byte scratch arena")));
  arena.aligned = (arena.base + kAlign - 1) / kAlign * kAlign;
  return arena;
}

bool ScratchArenas::Free(const Arena& arena) const {
  unsigned long long id = 0;  // NOLINT(runtime/int)
  // A context destroyed since (its handle perhaps reused by a new one) took the memory
  // with it: nothing to free, and nothing of the new context's may be freed.
  const CUresult r = driver_.CtxGetId(arena.context, &id);
  if (r == CUDA_ERROR_CONTEXT_IS_DESTROYED || r == CUDA_ERROR_INVALID_CONTEXT ||
      (r == CUDA_SUCCESS && id != arena.context_id)) {
    return true;
  }
  if (r != CUDA_SUCCESS) return false;
  if (driver_.CtxPushCurrent(arena.context) != CUDA_SUCCESS) return false;
  const bool freed = driver_.MemFree(arena.base) == CUDA_SUCCESS;
  CUcontext popped = nullptr;
  driver_.CtxPopCurrent(&popped);
  return freed;
}

void ScratchArenas::ReleaseSlot(Slot* slot) {
  for (const Arena& arena : slot->buffers) {
    if (!Free(arena)) shared_->leftovers.push_back(arena);
  }
  slot->buffers.clear();
  slot->stream = nullptr;
  slot->Publish({}, 0, 0);
}

absl::StatusOr<CUdeviceptr> ScratchArenas::GrowLocked(CUstream stream, CUcontext context,
                                                      const StreamKey& key, uint64_t bytes) {
  std::atomic<Slot*>& bucket = buckets_[Hash(key) % kBuckets];
  Slot* slot = nullptr;
  Slot* free_slot = nullptr;
  for (Slot* s = bucket.load(std::memory_order_relaxed); s != nullptr; s = s->next) {
    const StreamKey k = s->key();
    if (k == key) slot = s;
    if (k.context == 0 && free_slot == nullptr) free_slot = s;
  }
  if (slot != nullptr && slot->size.load(std::memory_order_relaxed) >= bytes) {
    return slot->aligned.load(std::memory_order_relaxed);  // another thread grew it
  }
  if (slot == nullptr && key.kind == StreamKey::kReal) {
    // A new stream with the handle of one destroyed without ReleaseScratch: free that
    // one's arena (cuMemFree waits for the work that used it).
    for (const auto& s : slots_) {
      const StreamKey k = s->key();
      if (s->stream == stream && k.kind == StreamKey::kReal && k.context == key.context) {
        ReleaseSlot(s.get());
      }
    }
  }
  const uint64_t current = slot != nullptr ? slot->size.load(std::memory_order_relaxed) : 0;
  KPACK_ASSIGN_OR_RETURN(Arena arena,
                         TakeOrAllocate(context, key.context, std::max(bytes, 2 * current)));
  if (slot == nullptr) {
    slot = free_slot;
    if (slot == nullptr) {
      slots_.push_back(std::make_unique<Slot>());
      slot = slots_.back().get();
      slot->next = bucket.load(std::memory_order_relaxed);
      bucket.store(slot, std::memory_order_release);
    }
    slot->stream = stream;
  }
  slot->buffers.push_back(arena);
  slot->Publish(key, arena.aligned, arena.size);
  return arena.aligned;
}

absl::StatusOr<CUdeviceptr> ScratchArenas::ForCapture(CUstream stream, uint64_t context,
                                                      uint64_t capture, CUgraph graph,
                                                      uint64_t bytes) {
  const StreamKey key = CaptureKeyOf(stream, context);
  Arena arena;
  {
    std::lock_guard<std::mutex> lock(shared_->mu);
    for (const Shared::Captured& c : shared_->in_graphs) {
      if (c.capture != capture || !(c.stream == key)) continue;
      if (c.arena.size >= bytes) return c.arena.aligned;
      return absl::FailedPreconditionError(absl::StrCat(
          "needs ", bytes, " bytes of scratch inside a stream capture whose arena has ",
          c.arena.size, ", and kpack never allocates during a capture: call "
          "Runtime::ReserveScratch(stream, ", bytes, ") before beginning the capture"));
    }
    auto reserved =
        std::find_if(shared_->reserved.begin(), shared_->reserved.end(),
                     [&](const Shared::Reserved& r) { return r.capture_stream == key; });
    if (reserved != shared_->reserved.end() && reserved->arena.size >= bytes) {
      arena = reserved->arena;
      shared_->reserved.erase(reserved);
    } else {
      auto best = shared_->idle.end();
      for (auto it = shared_->idle.begin(); it != shared_->idle.end(); ++it) {
        if (it->context_id == context && it->size >= bytes &&
            (best == shared_->idle.end() || it->size < best->size)) {
          best = it;
        }
      }
      if (best == shared_->idle.end()) {
        return absl::FailedPreconditionError(absl::StrCat(
            "needs ", bytes, " bytes of scratch inside a stream capture, and no arena of that "
            "size is reserved for this stream (kpack never allocates during a capture, and a "
            "captured graph must own its scratch): call Runtime::ReserveScratch(stream, ",
            bytes, ") before beginning each capture"));
      }
      arena = *best;
      shared_->idle.erase(best);
    }
    shared_->in_graphs.push_back({capture, key, arena});
  }
  KPACK_RETURN_IF_ERROR(GiveToGraph(graph, capture, key, "a captured graph's scratch"));
  return arena.aligned;
}

absl::StatusOr<CUdeviceptr> ScratchArenas::ForGraph(CUgraph graph, uint64_t context,
                                                    uint64_t bytes) {
  CUcontext current = nullptr;
  KPACK_RETURN_IF_ERROR(driver_.Check(driver_.CtxGetCurrent(&current), "cuCtxGetCurrent"));
  // Not a stream's: a key of its own, which no stream or capture has.
  const StreamKey key{context, StreamKey::kGraph,
                      next_graph_.fetch_add(1, std::memory_order_relaxed)};
  Arena arena;
  {
    std::lock_guard<std::mutex> lock(shared_->mu);
    KPACK_ASSIGN_OR_RETURN(arena, TakeOrAllocate(current, context, bytes));
    shared_->in_graphs.push_back({0, key, arena});
  }
  KPACK_RETURN_IF_ERROR(GiveToGraph(graph, 0, key, "a built graph's scratch"));
  return arena.aligned;
}

absl::Status ScratchArenas::GiveToGraph(CUgraph graph, uint64_t capture, const StreamKey& key,
                                        absl::string_view what) {
  // The graph takes the arena's only reference; its destructor returns the arena. Made
  // without the lock: a destructor the driver runs at once must be able to take it.
  auto* payload = new GraphArena{shared_, capture, key};
  CUuserObject object = nullptr;
  CUresult r = driver_.UserObjectCreate(&object, payload, &ScratchArenas::ReturnFromGraph, 1,
                                        CU_USER_OBJECT_NO_DESTRUCTOR_SYNC);
  if (r != CUDA_SUCCESS) {
    ReturnFromGraph(payload);  // back to the pool, unused
    return driver_.Error(r, absl::StrCat("cuUserObjectCreate for ", what));
  }
  r = driver_.GraphRetainUserObject(graph, object, 1, CU_GRAPH_USER_OBJECT_MOVE);
  if (r != CUDA_SUCCESS) {
    driver_.UserObjectRelease(object, 1);  // runs ReturnFromGraph
    return driver_.Error(r, absl::StrCat("cuGraphRetainUserObject for ", what));
  }
  return absl::OkStatus();
}

void ScratchArenas::ReturnFromGraph(void* graph_arena) {
  auto* g = static_cast<GraphArena*>(graph_arena);
  {
    std::lock_guard<std::mutex> lock(g->shared->mu);
    auto& in_graphs = g->shared->in_graphs;
    auto it = std::find_if(in_graphs.begin(), in_graphs.end(), [&](const Shared::Captured& c) {
      return c.capture == g->capture && c.stream == g->stream;
    });
    if (it != in_graphs.end()) {
      // After ~ScratchArenas nothing may free it (no CUDA call from here): it leaks.
      if (!g->shared->closed) g->shared->idle.push_back(it->arena);
      in_graphs.erase(it);
    }
  }
  delete g;
}

absl::StatusOr<std::pair<CUcontext, StreamKey>> ScratchArenas::OutsideCapture(
    CUstream stream, absl::string_view call) const {
  CUcontext context = nullptr;
  KPACK_RETURN_IF_ERROR(driver_.Check(driver_.StreamGetCtx(stream, &context), "cuStreamGetCtx"));
  unsigned long long context_id = 0;  // NOLINT(runtime/int)
  KPACK_RETURN_IF_ERROR(driver_.Check(driver_.CtxGetId(context, &context_id), "cuCtxGetId"));
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  KPACK_RETURN_IF_ERROR(driver_.Check(
      driver_.StreamGetCaptureInfo(stream, &status, nullptr, nullptr, nullptr, nullptr, nullptr),
      "cuStreamGetCaptureInfo"));
  if (status != CU_STREAM_CAPTURE_STATUS_NONE) {
    return absl::FailedPreconditionError(absl::StrCat(
        call, " on a stream that is being captured: call it before cuStreamBeginCapture or "
        "after cuStreamEndCapture (kpack never allocates or frees during a capture)"));
  }
  KPACK_ASSIGN_OR_RETURN(StreamKey key, KeyOf(stream, context_id));
  return std::pair{context, key};
}

absl::Status ScratchArenas::Reserve(CUstream stream, uint64_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  KPACK_ASSIGN_OR_RETURN(auto context_and_key, OutsideCapture(stream, "ReserveScratch"));
  const CUcontext context = context_and_key.first;  // (no structured binding: clang 14
  const StreamKey key = context_and_key.second;      // cannot capture one in a lambda)
  const uint64_t context_id = key.context;
  std::lock_guard<std::mutex> lock(shared_->mu);
  // The stream's own arena...
  auto [aligned, size] = Find(key);
  if (aligned == 0 || size < bytes) {
    KPACK_RETURN_IF_ERROR(GrowLocked(stream, context, key, bytes).status());
  }
  // ...and one for the next capture on it.
  auto reserved = std::find_if(shared_->reserved.begin(), shared_->reserved.end(),
                               [&](const Shared::Reserved& r) { return r.stream == key; });
  if (reserved != shared_->reserved.end() && reserved->arena.size >= bytes) {
    return absl::OkStatus();
  }
  if (reserved != shared_->reserved.end()) {
    shared_->idle.push_back(reserved->arena);  // too small: back to the pool
    shared_->reserved.erase(reserved);
  }
  // A reservation left by a destroyed stream whose handle this one reuses would be found
  // first by a capture on this stream: back to the pool with it.
  const StreamKey capture_key = CaptureKeyOf(stream, context_id);
  for (auto it = shared_->reserved.begin(); it != shared_->reserved.end();) {
    if (it->capture_stream == capture_key) {
      shared_->idle.push_back(it->arena);
      it = shared_->reserved.erase(it);
    } else {
      ++it;
    }
  }
  KPACK_ASSIGN_OR_RETURN(Arena arena, TakeOrAllocate(context, context_id, bytes));
  shared_->reserved.push_back({key, capture_key, arena});
  return absl::OkStatus();
}

absl::Status ScratchArenas::Release(CUstream stream) {
  KPACK_ASSIGN_OR_RETURN(auto context_and_key, OutsideCapture(stream, "ReleaseScratch"));
  const StreamKey key = context_and_key.second;
  std::lock_guard<std::mutex> lock(shared_->mu);
  for (Slot* s = buckets_[Hash(key) % kBuckets].load(std::memory_order_relaxed); s != nullptr;
       s = s->next) {
    if (s->key() == key) ReleaseSlot(s);
  }
  auto reserved = std::find_if(shared_->reserved.begin(), shared_->reserved.end(),
                               [&](const Shared::Reserved& r) { return r.stream == key; });
  if (reserved != shared_->reserved.end()) {
    if (!Free(reserved->arena)) shared_->leftovers.push_back(reserved->arena);
    shared_->reserved.erase(reserved);
  }
  return absl::OkStatus();
}

ScratchArenas::Stats ScratchArenas::stats() const {
  Stats stats;
  std::lock_guard<std::mutex> lock(shared_->mu);
  for (const auto& slot : slots_) {
    if (slot->key().context != 0) ++stats.stream_arenas;
    for (const Arena& a : slot->buffers) stats.bytes += a.size;
  }
  stats.reserved = shared_->reserved.size();
  for (const Shared::Reserved& r : shared_->reserved) stats.bytes += r.arena.size;
  stats.in_graphs = shared_->in_graphs.size();
  for (const Shared::Captured& c : shared_->in_graphs) stats.bytes += c.arena.size;
  stats.idle = shared_->idle.size();
  for (const Arena& a : shared_->idle) stats.bytes += a.size;
  for (const Arena& a : shared_->leftovers) stats.bytes += a.size;
  return stats;
}

}  // namespace kpack::internal
