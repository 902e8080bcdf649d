// llama/model.h: the model's weights on the device, in docs/llama.md's layout.
//
// One device allocation holds everything, each piece 256-byte aligned: per layer the two
// norm weights, `wqkv` (q_proj, k_proj, v_proj rows concatenated: [(NH + 2 NKV)·D, H]),
// `wo`, `wgu` (gate_proj then up_proj rows: [2 I, H]) and `wd`; the final norm; the
// embedding (also the LM head when tie_word_embeddings, else lm_head.weight); and
// `inv_freq` (llama/rope.h). The concatenations happen in the upload: each checkpoint
// tensor is copied from the mapped file straight to its place (no staging copy on the
// device, no host copy beyond the driver's own).
//
// Thread safety: immutable after Upload. The Model must not outlive its Device.

#ifndef KPACK_EXAMPLES_LLAMA_MODEL_H_
#define KPACK_EXAMPLES_LLAMA_MODEL_H_

#include <cuda.h>

#include <cstddef>
#include <vector>

#include "absl/status/statusor.h"
#include "checkpoint.h"
#include "config.h"
#include "device.h"

namespace kpack::llama {

struct LayerWeights {
  CUdeviceptr ln1 = 0;   // input_layernorm [H]
  CUdeviceptr wqkv = 0;  // [(NH + 2 NKV)·D, H]
  CUdeviceptr wo = 0;    // [H, NH·D]
  CUdeviceptr ln2 = 0;   // post_attention_layernorm [H]
  CUdeviceptr wgu = 0;   // [2 I, H]
  CUdeviceptr wd = 0;    // [H, I]
};

class Model {
 public:
  static absl::StatusOr<Model> Upload(const Device& device, const Checkpoint& checkpoint);

  const LlamaConfig& config() const { return config_; }
  const LayerWeights& layer(int64_t l) const { return layers_[static_cast<size_t>(l)]; }
  CUdeviceptr embed() const { return embed_; }
  CUdeviceptr lm_head() const { return lm_head_; }
  CUdeviceptr norm_f() const { return norm_f_; }
  CUdeviceptr inv_freq() const { return inv_freq_; }
  // Bytes of weights a decode step reads (embedding rows aside): the layers, the final
  // norm and the LM head; for the memory-floor figures.
  size_t step_weight_bytes() const { return step_weight_bytes_; }
  size_t device_bytes() const { return memory_.size(); }

 private:
  LlamaConfig config_;
  DeviceBuffer memory_;
  std::vector<LayerWeights> layers_;
  CUdeviceptr embed_ = 0, lm_head_ = 0, norm_f_ = 0, inv_freq_ = 0;
  size_t step_weight_bytes_ = 0;
};

}  // namespace kpack::llama

#endif  // KPACK_EXAMPLES_LLAMA_MODEL_H_
