#include "launch/graph_arenas.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "util/status_macros.h"

namespace kpack::internal {

GraphArenas::~GraphArenas() {
  std::vector<Arena> arenas;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const Reserved& r : reserved_) arenas.push_back(r.arena);
    reserved_.clear();
  }
  pool_.Free(arenas);
}

absl::StatusOr<CUdeviceptr> GraphArenas::ForCapture(const StreamKey& stream, uint64_t capture,
                                                    CUgraph graph, uint64_t bytes) {
  const ArenaPool::LoanTag tag{capture, stream};
  void* loan = nullptr;
  Arena arena;
  {
    // Held across the lookup and the take (no driver call), so that two launches of one
    // capture on one stream never take two arenas.
    std::lock_guard<std::mutex> lock(mu_);
    if (std::optional<Arena> lent = pool_.FindLent(tag)) {
      if (lent->size >= bytes) return lent->aligned;
      return absl::FailedPreconditionError(
          absl::StrCat("needs ", bytes, " bytes of scratch inside a stream capture whose arena has ",
                       lent->size,
                       ", and kpack never allocates during a capture: call "
                       "Runtime::ReserveScratch(stream, ",
                       bytes, ") before beginning the capture"));
    }
    auto reserved = std::find_if(reserved_.begin(), reserved_.end(),
                                 [&](const Reserved& r) { return r.capture_stream == stream; });
    if (reserved != reserved_.end() && reserved->arena.size >= bytes) {
      arena = reserved->arena;
      reserved_.erase(reserved);
    } else if (std::optional<Arena> idle = pool_.TakeIdle(stream.context, bytes)) {
      arena = *idle;
    } else {
      return absl::FailedPreconditionError(
          absl::StrCat("needs ", bytes,
                       " bytes of scratch inside a stream capture, and no arena of that size is "
                       "reserved for this stream (kpack never allocates during a capture, and a "
                       "captured graph must own its scratch): call "
                       "Runtime::ReserveScratch(stream, ",
                       bytes, ") before beginning each capture"));
    }
    loan = pool_.Lend(arena, tag);
  }
  KPACK_RETURN_IF_ERROR(GiveToGraph(graph, loan, "a captured graph's scratch", nullptr));
  return arena.aligned;
}

absl::StatusOr<CUdeviceptr> GraphArenas::ForGraph(CUgraph graph, CUcontext context,
                                                  uint64_t context_id, uint64_t bytes,
                                                  CUuserObject* object) {
  KPACK_ASSIGN_OR_RETURN(const Arena arena, pool_.TakeOrAllocate(context, context_id, bytes));
  // Not a stream's: a key of its own, which no stream or capture has.
  const StreamKey key{context_id, StreamKey::kGraph,
                      next_graph_.fetch_add(1, std::memory_order_relaxed)};
  void* loan = pool_.Lend(arena, {0, key});
  KPACK_RETURN_IF_ERROR(GiveToGraph(graph, loan, "a built graph's scratch", object));
  return arena.aligned;
}

absl::Status GraphArenas::GiveToGraph(CUgraph graph, void* loan, absl::string_view what,
                                      CUuserObject* object) {
  // The graph takes the loan's only reference; the driver runs ArenaPool::Return once the
  // graph, its executables and their work are gone.
  CUuserObject handle = nullptr;
  CUresult r = driver_.UserObjectCreate(&handle, loan, &ArenaPool::Return, 1,
                                        CU_USER_OBJECT_NO_DESTRUCTOR_SYNC);
  if (r != CUDA_SUCCESS) {
    ArenaPool::Return(loan);  // back to the pool, unused
    return driver_.Error(r, absl::StrCat("cuUserObjectCreate for ", what));
  }
  r = driver_.GraphRetainUserObject(graph, handle, 1, CU_GRAPH_USER_OBJECT_MOVE);
  if (r != CUDA_SUCCESS) {
    driver_.UserObjectRelease(handle, 1);  // the driver runs ArenaPool::Return
    return driver_.Error(r, absl::StrCat("cuGraphRetainUserObject for ", what));
  }
  if (object != nullptr) *object = handle;
  return absl::OkStatus();
}

absl::Status GraphArenas::Reserve(CUcontext context, const StreamKey& stream,
                                  const StreamKey& capture_stream, uint64_t bytes) {
  std::vector<Arena> unused;  // never used by any work: straight back to the pool
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto reserved = std::find_if(reserved_.begin(), reserved_.end(),
                                 [&](const Reserved& r) { return r.stream == stream; });
    if (reserved != reserved_.end() && reserved->arena.size >= bytes) return absl::OkStatus();
    // A smaller reservation, and one left by a destroyed stream whose handle this one
    // reuses (a capture on this stream would find it first), give way.
    std::erase_if(reserved_, [&](const Reserved& r) {
      const bool gone = r.stream == stream || r.capture_stream == capture_stream;
      if (gone) unused.push_back(r.arena);
      return gone;
    });
  }
  pool_.PutIdle(unused);
  KPACK_ASSIGN_OR_RETURN(const Arena arena, pool_.TakeOrAllocate(context, stream.context, bytes));
  std::lock_guard<std::mutex> lock(mu_);
  // Another Reserve of this stream may have set one aside meanwhile: keep the larger.
  auto reserved = std::find_if(reserved_.begin(), reserved_.end(),
                               [&](const Reserved& r) { return r.stream == stream; });
  if (reserved == reserved_.end()) {
    reserved_.push_back({stream, capture_stream, arena});
  } else if (reserved->arena.size < arena.size) {
    pool_.PutIdle(std::exchange(reserved->arena, arena));
  } else {
    pool_.PutIdle(arena);
  }
  return absl::OkStatus();
}

void GraphArenas::Release(const StreamKey& stream) {
  std::vector<Arena> arenas;
  {
    std::lock_guard<std::mutex> lock(mu_);
    std::erase_if(reserved_, [&](const Reserved& r) {
      if (r.stream == stream) arenas.push_back(r.arena);
      return r.stream == stream;
    });
  }
  pool_.Free(arenas);
}

void GraphArenas::ReleaseThread(uint64_t token) {
  std::vector<Arena> arenas;
  {
    std::lock_guard<std::mutex> lock(mu_);
    std::erase_if(reserved_, [&](const Reserved& r) {
      const bool mine = IsThreadsStream(r.stream, token);
      if (mine) arenas.push_back(r.arena);
      return mine;
    });
  }
  pool_.Free(arenas);
}

GraphArenas::Stats GraphArenas::stats() const {
  Stats stats;
  std::lock_guard<std::mutex> lock(mu_);
  stats.reserved = reserved_.size();
  for (const Reserved& r : reserved_) stats.bytes += r.arena.size;
  return stats;
}

}  // namespace kpack::internal
