#include "kv_cache.h"

#include <limits>

#include "absl/strings/str_cat.h"
#include "util/status_macros.h"

namespace kpack::llama {

absl::StatusOr<KvCache> KvCache::Allocate(const Device& device, const LlamaConfig& config,
                                          int max_seqs, int capacity) {
  if (max_seqs < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV cache: ", max_seqs, " sequence slots; at least 1 is needed"));
  }
  if (capacity < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV cache: capacity ", capacity, " positions; at least 1 is needed"));
  }
  KvCache kv;
  kv.max_seqs_ = max_seqs;
  kv.capacity_ = capacity;
  const size_t per_position = static_cast<size_t>(config.num_key_value_heads) *
                              static_cast<size_t>(config.head_dim) * 2;  // bf16
  kv.position_bytes_ = 2 * per_position;
  // Sizes in 64 bits; a product past what the device could hold fails the allocation.
  const size_t layer = per_position * static_cast<size_t>(capacity) * static_cast<size_t>(max_seqs);
  kv.layer_bytes_ = layer;
  const size_t bytes = layer * static_cast<size_t>(config.num_hidden_layers);
  const std::string what =
      absl::StrCat("the KV cache (", config.num_hidden_layers, " layers x ", max_seqs,
                   " sequences x ", config.num_key_value_heads, " KV heads x ", capacity,
                   " positions x ", config.head_dim, ", bf16)");
  KPACK_ASSIGN_OR_RETURN(kv.k_, DeviceBuffer::Allocate(device, bytes, absl::StrCat("K of ", what)));
  KPACK_ASSIGN_OR_RETURN(kv.v_, DeviceBuffer::Allocate(device, bytes, absl::StrCat("V of ", what)));
  return kv;
}

SequenceTable::SequenceTable(int slots, int capacity)
    : positions_(static_cast<size_t>(slots), -1), capacity_(capacity) {}

absl::Status SequenceTable::Begin(int slot, int prompt_len) {
  if (slot < 0 || slot >= slots()) {
    return absl::InvalidArgumentError(
        absl::StrCat("sequence slot ", slot, " does not exist (the KV cache has ", slots(), ")"));
  }
  if (prompt_len < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("slot ", slot, ": a prompt of ", prompt_len, " tokens; at least 1 is needed"));
  }
  if (prompt_len > capacity_) {
    return absl::InvalidArgumentError(absl::StrCat("slot ", slot, ": a prompt of ", prompt_len,
                                                   " tokens does not fit the KV cache capacity of ",
                                                   capacity_, " positions"));
  }
  positions_[static_cast<size_t>(slot)] = prompt_len;
  return absl::OkStatus();
}

void SequenceTable::Release(int slot) { positions_[static_cast<size_t>(slot)] = -1; }

void SequenceTable::Clear() { std::fill(positions_.begin(), positions_.end(), -1); }

absl::Status SequenceTable::CheckDecode(int batch) const {
  if (batch < 1 || batch > slots()) {
    return absl::InvalidArgumentError(
        absl::StrCat("a decode step of ", batch, " rows; the engine has ", slots(), " slots"));
  }
  for (int s = 0; s < batch; ++s) {
    const int p = positions_[static_cast<size_t>(s)];
    if (p < 0) {
      return absl::FailedPreconditionError(absl::StrCat("decode row ", s, ": sequence slot ", s,
                                                        " holds no sequence (prefill it first)"));
    }
    if (p >= capacity_) {
      return absl::OutOfRangeError(
          absl::StrCat("decode row ", s, ": sequence slot ", s, " is at position ", p,
                       ", and the KV cache holds ", capacity_,
                       " positions per sequence: one more token would not fit (raise --capacity)"));
    }
  }
  return absl::OkStatus();
}

void SequenceTable::Advance(int batch) {
  for (int s = 0; s < batch; ++s) ++positions_[static_cast<size_t>(s)];
}

}  // namespace kpack::llama
