#include "test_files.h"

#include "checkpoint.h"

namespace kpack::llama::testing {

std::map<std::string, TensorSpec> CheckpointTensors(const LlamaConfig& config) {
  std::map<std::string, TensorSpec> out;
  for (const ExpectedTensor& e : ExpectedTensors(config)) out[e.name] = {"BF16", e.shape, ""};
  return out;
}

std::string ConfigJson(const LlamaConfig& c) {
  nlohmann::json j = ConfigToJson(c);
  j["architectures"] = {"LlamaForCausalLM"};
  j["model_type"] = "llama";
  j["torch_dtype"] = "bfloat16";
  j["hidden_act"] = "silu";
  return j.dump(2);
}

LlamaConfig MicroConfig() {
  LlamaConfig c;
  c.hidden_size = 8;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 1;
  c.head_dim = 4;
  c.intermediate_size = 16;
  c.vocab_size = 10;
  c.max_position_embeddings = 128;
  c.rms_norm_eps = 1e-5;
  c.rope_theta = 500000;
  c.rope_scaling = Llama3RopeScaling{32, 1, 4, 8192};
  c.tie_word_embeddings = true;
  return c;
}

}  // namespace kpack::llama::testing
