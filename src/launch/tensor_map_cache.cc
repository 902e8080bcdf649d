// The seqlock behind TensorMapCache (tensor_map_cache.h), after Boehm, "Can seqlocks get
// along with programming language memory models?" (2012), in its form without fences
// (which ThreadSanitizer does not model): every word of an entry is an atomic, a writer
// stores the words with release order after making the sequence odd and publishes the
// next even value with release order; a reader loads the sequence and the words with
// acquire order and accepts its copy only if the sequence is still the same even value.
// A reader that loaded any word of a write in progress synchronizes with that store, so
// its second load of the sequence sees the odd value (or a later one) and it retries no
// further: it reports a miss. On x86 every one of these loads and stores is a plain move.

#include "launch/tensor_map_cache.h"

#include <cstring>

namespace kpack::internal {

bool TensorMapCache::Find(const TensorMapEncodeArgs& key, std::byte* map) const {
  uint64_t want[kKeyWords];
  std::memcpy(want, &key, sizeof(want));
  for (const Entry& e : entries_) {
    // An entry never written (sequence 0) holds an all-zero key, which no encode has
    // (its rank is at least 1), so it fails the comparison like any other.
    const uint64_t seq = e.seq.load(std::memory_order_acquire);
    // Word 0 is the address: it tells most entries apart at once.
    if ((seq & 1) != 0 || e.key[0].load(std::memory_order_acquire) != want[0]) continue;
    uint64_t diff = 0;
#pragma GCC unroll 32
    for (int i = 1; i < kKeyWords; ++i) {
      diff |= e.key[i].load(std::memory_order_acquire) ^ want[i];
    }
    if (diff != 0) continue;
    // Straight into `map`: if the copy turns out torn, the caller encodes over it.
#pragma GCC unroll 16
    for (int i = 0; i < kMapWords; ++i) {
      const uint64_t word = e.map[i].load(std::memory_order_acquire);
      std::memcpy(map + 8 * i, &word, 8);
    }
    if (e.seq.load(std::memory_order_relaxed) != seq) continue;  // overwritten meanwhile
    return true;
  }
  return false;
}

void TensorMapCache::Insert(const TensorMapEncodeArgs& key, const std::byte* map) {
  Entry& e = entries_[next_.fetch_add(1, std::memory_order_relaxed) % kWays];
  uint64_t seq = e.seq.load(std::memory_order_relaxed);
  // Another writer holds the entry (odd), or took it since the load: leave it to them.
  if ((seq & 1) != 0 ||
      !e.seq.compare_exchange_strong(seq, seq + 1, std::memory_order_relaxed)) {
    return;
  }
  uint64_t words[kKeyWords];
  std::memcpy(words, &key, sizeof(words));
  for (int i = 0; i < kKeyWords; ++i) e.key[i].store(words[i], std::memory_order_release);
  for (int i = 0; i < kMapWords; ++i) {
    uint64_t word;
    std::memcpy(&word, map + 8 * i, 8);
    e.map[i].store(word, std::memory_order_release);
  }
  e.seq.store(seq + 2, std::memory_order_release);
}

}  // namespace kpack::internal
