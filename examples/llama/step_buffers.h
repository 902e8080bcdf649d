// llama/step_buffers.h: the device memory a step works in besides the weights and the KV
// cache (docs/llama.md, "Device state"): the residual stream and activations, the per-row
// int32 arrays of decode and of prefill, the logits, and the scratch the kernels share
// (attention, split-K and argmax partials, their counters).
//
// Sizes: `max_batch` decode rows, prompts of up to `max_prompt` tokens; activations have
// max(max_batch, max_prompt) rows; logits, argmax partials and attention partials have
// `max_batch` rows (prefill computes logits for one row per sequence, written to the
// sequence's decode row); the o and down projections' split-K partials hold
// kMaxProjSplits splits of kProjSplitMaxRows rows (the engine refuses a pack whose
// variants split K beyond that: docs/llama.md). Allocate zeroes everything (the counters
// must start at zero; the kernels reset them) and fills the constant arrays: decode row
// b's sequence slot `seq[b] = b`, prefill positions 0..max_prompt-1, and prefill sequence
// slots per row (row r's prefill reads `prefill_seq(r)`, max_prompt copies of r).
//
// One allocation; pointers stay put for the buffers' life, so bound launches and step
// graphs keep them. Not thread-safe.

#ifndef KPACK_EXAMPLES_LLAMA_STEP_BUFFERS_H_
#define KPACK_EXAMPLES_LLAMA_STEP_BUFFERS_H_

#include <cuda.h>

#include <cstddef>

#include "absl/status/statusor.h"
#include "config.h"
#include "device.h"

namespace kpack::llama {

// Attention splits the decode partials are sized for (docs/llama.md S_MAX).
inline constexpr int kMaxDecodeSplits = 32;
// The o and down projections' K splits (llama_proj_residual's SPLIT > 1) the partials are
// sized for: at most this many splits, at M <= kProjSplitMaxRows, in tiles of at least
// kProjSplitMinTileRows rows and kProjSplitMinTileCols columns (one counter per tile).
inline constexpr int kMaxProjSplits = 8;
inline constexpr int kProjSplitMaxRows = 64;
inline constexpr int kProjSplitMinTileRows = 16;
inline constexpr int kProjSplitMinTileCols = 32;

struct StepBufferSizes {
  int max_batch = 1;
  int max_prompt = 1;
};

class StepBuffers {
 public:
  static absl::StatusOr<StepBuffers> Allocate(const Device& device, const LlamaConfig& config,
                                              const StepBufferSizes& sizes);

  int max_batch() const { return sizes_.max_batch; }
  int max_prompt() const { return sizes_.max_prompt; }
  int rows() const { return rows_; }  // activation rows

  CUdeviceptr h() const { return at(h_); }            // fp32 [rows, H]
  CUdeviceptr q() const { return at(q_); }            // bf16 [rows, NH, D]
  CUdeviceptr attn() const { return at(attn_); }      // bf16 [rows, NH·D]
  CUdeviceptr act() const { return at(act_); }        // bf16 [rows, I]
  CUdeviceptr xn() const { return at(xn_); }          // bf16 [rows, H], llama_rmsnorm's
  CUdeviceptr logits() const { return at(logits_); }  // fp32 [max_batch, V]
  CUdeviceptr tokens() const { return at(tokens_); }  // i32 [max_batch], decode rows
  CUdeviceptr pos() const { return at(pos_); }
  CUdeviceptr seq() const { return at(seq_); }
  CUdeviceptr prefill_tokens() const { return at(prefill_tokens_); }  // i32 [max_prompt]
  CUdeviceptr prefill_pos() const { return at(prefill_pos_); }        // 0..max_prompt-1
  // i32 [max_prompt], all `row`.
  CUdeviceptr prefill_seq(int row) const {
    return at(prefill_seq_) + static_cast<size_t>(row) * static_cast<size_t>(sizes_.max_prompt) * 4;
  }
  CUdeviceptr o_part() const { return at(o_part_); }      // fp32 [max_batch, NH, S_MAX, D]
  CUdeviceptr ml_part() const { return at(ml_part_); }    // fp32 [max_batch, NH, S_MAX, 2]
  CUdeviceptr part_max() const { return at(part_max_); }  // fp32 [max_batch, V]
  CUdeviceptr part_idx() const { return at(part_idx_); }  // i32 [max_batch, V]
  CUdeviceptr attn_counters() const { return at(attn_counters_); }  // i32 [max_batch, NKV]
  CUdeviceptr lm_counters() const { return at(lm_counters_); }      // i32 [max_batch]
  // fp32 [kMaxProjSplits, kProjSplitMaxRows, H];
  // i32 [kProjSplitMaxRows / kProjSplitMinTileRows, cdiv(H, kProjSplitMinTileCols)]
  CUdeviceptr proj_part() const { return at(proj_part_); }
  CUdeviceptr proj_counters() const { return at(proj_counters_); }

  size_t device_bytes() const { return memory_.size(); }

 private:
  CUdeviceptr at(size_t offset) const { return memory_.get() + offset; }

  StepBufferSizes sizes_;
  int rows_ = 0;
  DeviceBuffer memory_;
  size_t h_ = 0, xn_ = 0, q_ = 0, attn_ = 0, act_ = 0, logits_ = 0, tokens_ = 0, pos_ = 0, seq_ = 0,
         prefill_tokens_ = 0, prefill_pos_ = 0, prefill_seq_ = 0, o_part_ = 0, ml_part_ = 0,
         part_max_ = 0, part_idx_ = 0, attn_counters_ = 0, lm_counters_ = 0, proj_part_ = 0,
         proj_counters_ = 0;
};

}  // namespace kpack::llama

#endif  // KPACK_EXAMPLES_LLAMA_STEP_BUFFERS_H_
