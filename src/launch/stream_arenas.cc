#include "launch/stream_arenas.h"

#include <algorithm>
#include <utility>

#include "util/status_macros.h"

namespace kpack::internal {

void StreamArenas::Slot::Publish(const StreamKey& k, uint64_t new_aligned, uint64_t new_size) {
  const uint32_t s = seq.load(std::memory_order_relaxed);
  seq.store(s + 1, std::memory_order_relaxed);
  context.store(k.context, std::memory_order_release);
  kind.store(k.kind, std::memory_order_release);
  id.store(k.id, std::memory_order_release);
  aligned.store(new_aligned, std::memory_order_release);
  size.store(new_size, std::memory_order_release);
  seq.store(s + 2, std::memory_order_release);
}

void StreamArenas::Slot::Clear(std::vector<Arena>* out) {
  out->insert(out->end(), buffers.begin(), buffers.end());
  buffers.clear();
  stream = nullptr;
  Publish({}, 0, 0);
}

StreamArenas::~StreamArenas() {
  std::vector<Arena> arenas;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& slot : slots_) {
      arenas.insert(arenas.end(), slot->buffers.begin(), slot->buffers.end());
    }
  }
  pool_.Free(arenas);
}

absl::StatusOr<CUdeviceptr> StreamArenas::Grow(CUstream stream, CUcontext context,
                                               const StreamKey& key, uint64_t bytes) {
  std::atomic<Slot*>& bucket = buckets_[HashOf(key) % kBuckets];
  // The slot of `key` in its bucket, and the bucket's first free slot. Needs mu_.
  auto find = [&](Slot** free_slot) {
    Slot* slot = nullptr;
    *free_slot = nullptr;
    for (Slot* s = bucket.load(std::memory_order_relaxed); s != nullptr; s = s->next) {
      const StreamKey k = s->key();
      if (k == key) slot = s;
      if (k.context == 0 && *free_slot == nullptr) *free_slot = s;
    }
    return slot;
  };
  std::vector<Arena> stale;
  uint64_t current = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    Slot* free_slot;
    if (Slot* slot = find(&free_slot); slot != nullptr) {
      current = slot->size.load(std::memory_order_relaxed);
      if (current >= bytes) {  // grown meanwhile
        return slot->aligned.load(std::memory_order_relaxed);
      }
    } else if (key.kind == StreamKey::kReal) {
      // A new stream with the handle of one destroyed without ReleaseScratch: that one's
      // arena goes (cuMemFree waits for the work that used it).
      for (const auto& s : slots_) {
        const StreamKey k = s->key();
        if (s->stream == stream && k.kind == StreamKey::kReal && k.context == key.context) {
          s->Clear(&stale);
        }
      }
    }
  }
  pool_.Free(stale);
  KPACK_ASSIGN_OR_RETURN(const Arena arena,
                         pool_.TakeOrAllocate(context, key.context, std::max(bytes, 2 * current)));
  std::lock_guard<std::mutex> lock(mu_);
  Slot* free_slot;
  Slot* slot = find(&free_slot);
  if (slot != nullptr && slot->size.load(std::memory_order_relaxed) >= bytes) {
    pool_.PutIdle(arena);  // another thread grew it while this one allocated: never used
    return slot->aligned.load(std::memory_order_relaxed);
  }
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

void StreamArenas::Release(const StreamKey& key) {
  std::vector<Arena> arenas;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (Slot* s = buckets_[HashOf(key) % kBuckets].load(std::memory_order_relaxed); s != nullptr;
         s = s->next) {
      if (s->key() == key) s->Clear(&arenas);
    }
  }
  pool_.Free(arenas);
}

void StreamArenas::ReleaseThread(uint64_t token) {
  std::vector<Arena> arenas;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& s : slots_) {
      if (IsThreadsStream(s->key(), token)) s->Clear(&arenas);
    }
  }
  pool_.Free(arenas);
}

StreamArenas::Stats StreamArenas::stats() const {
  Stats stats;
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& slot : slots_) {
    if (slot->key().context != 0) ++stats.arenas;
    for (const Arena& a : slot->buffers) stats.bytes += a.size;
  }
  return stats;
}

}  // namespace kpack::internal
