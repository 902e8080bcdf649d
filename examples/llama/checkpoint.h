// llama/checkpoint.h: a Hugging Face Llama checkpoint directory, checked against its
// config before anything is uploaded.
//
// A directory holds `config.json` (llama/config.h) and the weights: `model.safetensors`,
// or, for a sharded checkpoint, `model.safetensors.index.json` (its "weight_map" names
// the shard file of each tensor, files in the same directory) and the shards. Open reads
// the config, maps and checks every file (llama/safetensors.h), then requires each tensor
// the model needs -- model.embed_tokens.weight, per layer input_layernorm,
// self_attn.{q,k,v,o}_proj, post_attention_layernorm, mlp.{gate,up,down}_proj, then
// model.norm.weight and, unless tie_word_embeddings, lm_head.weight -- to be there, BF16,
// and of the shape the config gives. Tensors the engine does not use (lm_head.weight of a
// tied model, rotary_emb.inv_freq of old exports, ...) are fine: they are listed in
// warnings().
//
// Errors name the file and the tensor or field: NOT_FOUND for a missing file or tensor,
// INVALID_ARGUMENT for a malformed one, a wrong dtype or shape; a config the engine
// cannot run is refused by ReadConfig. A real checkpoint loads unchanged.
//
// Thread safety: immutable once open; the weights stay mapped while it lives.

#ifndef KPACK_EXAMPLES_LLAMA_CHECKPOINT_H_
#define KPACK_EXAMPLES_LLAMA_CHECKPOINT_H_

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "config.h"
#include "safetensors.h"

namespace kpack::llama {

// A tensor the model needs: its checkpoint name and the shape the config gives it.
struct ExpectedTensor {
  std::string name;
  std::vector<int64_t> shape;
};

// Every tensor the engine reads for `config`, in upload order.
std::vector<ExpectedTensor> ExpectedTensors(const LlamaConfig& config);

// "model.layers.3.self_attn.q_proj.weight" for (3, "self_attn.q_proj").
std::string LayerTensorName(int64_t layer, absl::string_view part);

class Checkpoint {
 public:
  static absl::StatusOr<Checkpoint> Open(const std::string& dir);

  const std::string& dir() const { return dir_; }
  const LlamaConfig& config() const { return config_; }
  // The bf16 bytes of a tensor ExpectedTensors lists (checked at Open); empty for any
  // other name.
  std::span<const std::byte> Bytes(absl::string_view name) const;
  // Tensors present but unused, one sentence each (at most a few; the rest counted).
  const std::vector<std::string>& warnings() const { return warnings_; }
  // The weight files opened: "model.safetensors", or the shards.
  std::vector<std::string> files() const;

 private:
  std::string dir_;
  LlamaConfig config_;
  std::vector<SafetensorsFile> files_;
  absl::flat_hash_map<std::string, std::span<const std::byte>> expected_;
  std::vector<std::string> warnings_;
};

}  // namespace kpack::llama

#endif  // KPACK_EXAMPLES_LLAMA_CHECKPOINT_H_
