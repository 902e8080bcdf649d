// llama/config.h: a Llama model's shape, read from a Hugging Face `config.json`.
//
// Every field docs/llama.md lists, with Hugging Face's LlamaConfig defaults where the file
// leaves one out (hidden_size 4096, num_hidden_layers 32, num_attention_heads 32,
// num_key_value_heads = num_attention_heads, head_dim = hidden_size / num_attention_heads,
// intermediate_size 11008, vocab_size 32000, rms_norm_eps 1e-6, rope_theta 10000,
// rope_scaling null, tie_word_embeddings false, max_position_embeddings 2048). Fields the
// engine does not use (architectures, bos_token_id, ...) are ignored; fields that would
// change the math to something the kernels do not compute (hidden_act other than "silu",
// attention_bias or mlp_bias true, a rope_scaling type other than "llama3" or "default",
// a dtype other than bfloat16) are refused, naming the field.
//
//   absl::StatusOr<kpack::llama::LlamaConfig> config =
//       kpack::llama::ReadConfig("/models/Llama-3.2-1B/config.json");
//
// Errors are INVALID_ARGUMENT naming the file and the field (wrong JSON type, a value out
// of range, heads that do not divide), UNIMPLEMENTED for a rope_scaling type the kernels
// lack, NOT_FOUND when the file is missing. Thread-compatible plain data.

#ifndef KPACK_EXAMPLES_LLAMA_CONFIG_H_
#define KPACK_EXAMPLES_LLAMA_CONFIG_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace kpack::llama {

// rope_scaling with rope_type "llama3" (Llama 3.1 and later).
struct Llama3RopeScaling {
  double factor = 0;
  double low_freq_factor = 0;
  double high_freq_factor = 0;
  int64_t original_max_position_embeddings = 0;
};

struct LlamaConfig {
  int64_t hidden_size = 4096;         // H
  int64_t num_hidden_layers = 32;     // L
  int64_t num_attention_heads = 32;   // NH
  int64_t num_key_value_heads = 32;   // NKV
  int64_t head_dim = 128;             // D
  int64_t intermediate_size = 11008;  // I
  int64_t vocab_size = 32000;         // V
  int64_t max_position_embeddings = 2048;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  std::optional<Llama3RopeScaling> rope_scaling;  // null/absent/"default": none
  bool tie_word_embeddings = false;

  int64_t q_rows() const { return num_attention_heads * head_dim; }   // NH·D
  int64_t kv_rows() const { return num_key_value_heads * head_dim; }  // NKV·D
  int64_t qkv_rows() const { return q_rows() + 2 * kv_rows(); }       // (NH + 2 NKV)·D
};

// Parses config.json text; `source` names it in errors (e.g. the path).
absl::StatusOr<LlamaConfig> ParseConfig(absl::string_view json_text, absl::string_view source);
// Reads and parses the file at `path`.
absl::StatusOr<LlamaConfig> ReadConfig(const std::string& path);

// The shape as config.json spells it (the fields above, Hugging Face's names; rope_scaling
// null or a llama3 object); ParseConfig reads it back to the same LlamaConfig.
nlohmann::json ConfigToJson(const LlamaConfig& config);

}  // namespace kpack::llama

#endif  // KPACK_EXAMPLES_LLAMA_CONFIG_H_
