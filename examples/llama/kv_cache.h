// llama/kv_cache.h: the KV cache and which sequence occupies which part of it.
//
// `KvCache` is the device memory docs/llama.md fixes: bf16 K and V, each one allocation of
// L layers × max_seqs sequence slots × NKV heads × `capacity` positions × D, layer l at
// element offset l · max_seqs · NKV · capacity · D. A sequence's token at position p goes
// to slot s, position p.
//
// `SequenceTable` is the host's bookkeeping for it: which slots hold a sequence and the
// position each one's next token takes. The engine consults it before every step, so a
// step that would write past a slot's capacity, or decode a slot holding nothing, is an
// error naming the slot (and nothing is launched), rather than a write outside the cache.
// The device keeps its own copy of the positions (the LM head advances them), so that a
// decode step needs no host write; the two advance together.
//
// Thread safety: neither is thread-safe; the engine's thread owns both.

#ifndef KPACK_EXAMPLES_LLAMA_KV_CACHE_H_
#define KPACK_EXAMPLES_LLAMA_KV_CACHE_H_

#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "config.h"
#include "device.h"

namespace kpack::llama {

class KvCache {
 public:
  // INVALID_ARGUMENT for max_seqs or capacity below 1 or past i32, RESOURCE_EXHAUSTED
  // (naming the bytes) when the device has no room.
  static absl::StatusOr<KvCache> Allocate(const Device& device, const LlamaConfig& config,
                                          int max_seqs, int capacity);

  CUdeviceptr k(int64_t layer) const { return k_.get() + layer * layer_bytes_; }
  CUdeviceptr v(int64_t layer) const { return v_.get() + layer * layer_bytes_; }
  int max_seqs() const { return max_seqs_; }
  int capacity() const { return capacity_; }
  // Bytes of one position of one sequence in one layer, K and V together (2 · NKV · D · 2):
  // what attention reads per position per layer.
  size_t bytes_per_position_per_layer() const { return position_bytes_; }
  size_t total_bytes() const { return k_.size() + v_.size(); }

 private:
  DeviceBuffer k_, v_;
  size_t layer_bytes_ = 0;
  size_t position_bytes_ = 0;
  int max_seqs_ = 0;
  int capacity_ = 0;
};

class SequenceTable {
 public:
  SequenceTable(int slots, int capacity);

  // Slot `slot` starts a sequence whose prompt fills positions 0..prompt_len-1; its
  // next token (the first decoded) takes position prompt_len. INVALID_ARGUMENT for a
  // slot outside the table, an empty prompt, or one longer than the capacity.
  absl::Status Begin(int slot, int prompt_len);
  // The slot holds nothing afterwards.
  void Release(int slot);
  void Clear();
  // OK when slots 0..batch-1 all hold a sequence with room for one more token; else
  // INVALID_ARGUMENT for a batch outside [1, slots], FAILED_PRECONDITION naming the
  // empty slot, OUT_OF_RANGE naming the slot whose position reached the capacity.
  absl::Status CheckDecode(int batch) const;
  // Slots 0..batch-1 took one token each (after a decode step CheckDecode allowed).
  void Advance(int batch);

  bool active(int slot) const { return positions_[static_cast<size_t>(slot)] >= 0; }
  // The position the slot's next token takes; -1 for an empty slot.
  int position(int slot) const { return positions_[static_cast<size_t>(slot)]; }
  int slots() const { return static_cast<int>(positions_.size()); }
  int capacity() const { return capacity_; }

 private:
  std::vector<int> positions_;  // -1: empty
  int capacity_;
};

}  // namespace kpack::llama

#endif  // KPACK_EXAMPLES_LLAMA_KV_CACHE_H_
