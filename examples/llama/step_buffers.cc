#include "step_buffers.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "absl/strings/str_cat.h"
#include "util/status_macros.h"

namespace kpack::llama {

absl::StatusOr<StepBuffers> StepBuffers::Allocate(const Device& device, const LlamaConfig& c,
                                                  const StepBufferSizes& sizes) {
  if (sizes.max_batch < 1 || sizes.max_prompt < 1) {
    return absl::InvalidArgumentError(absl::StrCat("step buffers for a batch of ", sizes.max_batch,
                                                   " and prompts of ", sizes.max_prompt,
                                                   " tokens: both must be at least 1"));
  }
  StepBuffers b;
  b.sizes_ = sizes;
  b.rows_ = std::max(sizes.max_batch, sizes.max_prompt);
  const size_t rows = static_cast<size_t>(b.rows_);
  const size_t batch = static_cast<size_t>(sizes.max_batch);
  const size_t prompt = static_cast<size_t>(sizes.max_prompt);
  const size_t h = static_cast<size_t>(c.hidden_size), v = static_cast<size_t>(c.vocab_size);
  const size_t nh = static_cast<size_t>(c.num_attention_heads);
  const size_t d = static_cast<size_t>(c.head_dim);
  Carving carve;
  b.h_ = carve.Take(rows * h * 4);
  b.xn_ = carve.Take(rows * h * 2);
  b.q_ = carve.Take(rows * nh * d * 2);
  b.attn_ = carve.Take(rows * nh * d * 2);
  b.act_ = carve.Take(rows * static_cast<size_t>(c.intermediate_size) * 2);
  b.logits_ = carve.Take(batch * v * 4);
  b.tokens_ = carve.Take(batch * 4);
  b.pos_ = carve.Take(batch * 4);
  b.seq_ = carve.Take(batch * 4);
  b.prefill_tokens_ = carve.Take(prompt * 4);
  b.prefill_pos_ = carve.Take(prompt * 4);
  b.prefill_seq_ = carve.Take(batch * prompt * 4);
  b.o_part_ = carve.Take(batch * nh * kMaxDecodeSplits * d * 4);
  b.ml_part_ = carve.Take(batch * nh * kMaxDecodeSplits * 2 * 4);
  b.part_max_ = carve.Take(batch * v * 4);
  b.part_idx_ = carve.Take(batch * v * 4);
  b.attn_counters_ = carve.Take(batch * static_cast<size_t>(c.num_key_value_heads) * 4);
  b.lm_counters_ = carve.Take(batch * 4);
  b.proj_part_ = carve.Take(size_t{kMaxProjSplits} * kProjSplitMaxRows * h * 4);
  b.proj_counters_ = carve.Take(size_t{kProjSplitMaxRows / kProjSplitMinTileRows} *
                                ((h + kProjSplitMinTileCols - 1) / kProjSplitMinTileCols) * 4);
  KPACK_ASSIGN_OR_RETURN(b.memory_, DeviceBuffer::Allocate(device, carve.size(),
                                                           "the activations and per-row arrays"));
  const internal::Driver& cu = device.driver();
  KPACK_RETURN_IF_ERROR(
      device.Check(cu.MemsetD8(b.memory_.get(), 0, carve.size()), "zeroing the step buffers"));
  std::vector<int32_t> values(std::max(batch * prompt, prompt));
  for (size_t i = 0; i < batch; ++i) values[i] = static_cast<int32_t>(i);
  KPACK_RETURN_IF_ERROR(
      device.Check(cu.MemcpyHtoD(b.seq(), values.data(), batch * 4), "uploading seq"));
  for (size_t i = 0; i < prompt; ++i) values[i] = static_cast<int32_t>(i);
  KPACK_RETURN_IF_ERROR(device.Check(cu.MemcpyHtoD(b.prefill_pos(), values.data(), prompt * 4),
                                     "uploading the prefill positions"));
  for (size_t i = 0; i < batch * prompt; ++i) values[i] = static_cast<int32_t>(i / prompt);
  KPACK_RETURN_IF_ERROR(
      device.Check(cu.MemcpyHtoD(b.at(b.prefill_seq_), values.data(), batch * prompt * 4),
                   "uploading the prefill sequence slots"));
  return b;
}

}  // namespace kpack::llama
