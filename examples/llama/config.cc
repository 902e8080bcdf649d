#include "config.h"

#include <cmath>
#include <cstdint>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "util/status_macros.h"

namespace kpack::llama {
namespace {

using Json = nlohmann::json;

// Reads fields of one JSON object, naming `where` (the file, and the object inside it) in
// every error. Absent and null fields keep their defaults, as Hugging Face's None does.
class Fields {
 public:
  Fields(const Json& object, std::string where) : object_(object), where_(std::move(where)) {}

  const Json* Find(absl::string_view name) const {
    auto it = object_.find(name);
    if (it == object_.end() || it->is_null()) return nullptr;
    return &*it;
  }

  absl::Status Int(absl::string_view name, int64_t* value) const {
    const Json* j = Find(name);
    if (j == nullptr) return absl::OkStatus();
    if (!j->is_number_integer()) return Error(name, "must be an integer", *j);
    if (j->is_number_unsigned() && j->get<uint64_t>() > uint64_t{INT64_MAX}) {
      return Error(name, "is out of range", *j);
    }
    *value = j->get<int64_t>();
    return absl::OkStatus();
  }

  absl::Status Double(absl::string_view name, double* value) const {
    const Json* j = Find(name);
    if (j == nullptr) return absl::OkStatus();
    if (!j->is_number()) return Error(name, "must be a number", *j);
    *value = j->get<double>();
    return absl::OkStatus();
  }

  absl::Status Bool(absl::string_view name, bool* value) const {
    const Json* j = Find(name);
    if (j == nullptr) return absl::OkStatus();
    if (!j->is_boolean()) return Error(name, "must be true or false", *j);
    *value = j->get<bool>();
    return absl::OkStatus();
  }

  // A string field; `*value` unchanged when absent.
  absl::Status String(absl::string_view name, std::string* value) const {
    const Json* j = Find(name);
    if (j == nullptr) return absl::OkStatus();
    if (!j->is_string()) return Error(name, "must be a string", *j);
    *value = j->get<std::string>();
    return absl::OkStatus();
  }

  absl::Status Required(absl::string_view name) const {
    if (Find(name) != nullptr) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(where_, ": field '", name, "' is required"));
  }

  absl::Status Error(absl::string_view name, absl::string_view what, const Json& value) const {
    return absl::InvalidArgumentError(
        absl::StrCat(where_, ": field '", name, "' ", what, " (it is ", value.dump(), ")"));
  }
  absl::Status Error(absl::string_view name, absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat(where_, ": field '", name, "' ", what));
  }

  const std::string& where() const { return where_; }

 private:
  const Json& object_;
  std::string where_;
};

// A size the kernels take as i32: at least 1, below 2^31.
absl::Status CheckSize(const Fields& f, absl::string_view name, int64_t value) {
  if (value < 1 || value > std::numeric_limits<int32_t>::max()) {
    return f.Error(name, absl::StrCat("must be in [1, 2^31), not ", value));
  }
  return absl::OkStatus();
}

absl::Status CheckPositive(const Fields& f, absl::string_view name, double value) {
  if (!std::isfinite(value) || value <= 0) {
    return f.Error(name, absl::StrCat("must be a positive finite number, not ", value));
  }
  return absl::OkStatus();
}

absl::Status ParseRopeScaling(const Fields& top, LlamaConfig& config) {
  const Json* j = top.Find("rope_scaling");
  if (j == nullptr) return absl::OkStatus();
  if (!j->is_object()) return top.Error("rope_scaling", "must be an object or null", *j);
  const Fields f(*j, absl::StrCat(top.where(), ": rope_scaling"));
  // Transformers reads "rope_type", and "type" from older configs.
  std::string type;
  KPACK_RETURN_IF_ERROR(f.String("type", &type));
  KPACK_RETURN_IF_ERROR(f.String("rope_type", &type));
  if (type == "default") return absl::OkStatus();
  if (type != "llama3") {
    return absl::UnimplementedError(
        absl::StrCat(top.where(), ": field 'rope_scaling.rope_type' is '", type,
                     "'; the kernels implement \"llama3\" scaling (or none: null or \"default\")"));
  }
  Llama3RopeScaling s;
  for (absl::string_view name :
       {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}) {
    KPACK_RETURN_IF_ERROR(f.Required(name));
  }
  KPACK_RETURN_IF_ERROR(f.Double("factor", &s.factor));
  KPACK_RETURN_IF_ERROR(f.Double("low_freq_factor", &s.low_freq_factor));
  KPACK_RETURN_IF_ERROR(f.Double("high_freq_factor", &s.high_freq_factor));
  KPACK_RETURN_IF_ERROR(
      f.Int("original_max_position_embeddings", &s.original_max_position_embeddings));
  KPACK_RETURN_IF_ERROR(CheckPositive(f, "factor", s.factor));
  KPACK_RETURN_IF_ERROR(CheckPositive(f, "low_freq_factor", s.low_freq_factor));
  KPACK_RETURN_IF_ERROR(CheckPositive(f, "high_freq_factor", s.high_freq_factor));
  if (!(s.high_freq_factor > s.low_freq_factor)) {
    return f.Error("high_freq_factor",
                   absl::StrCat("must be greater than low_freq_factor (", s.high_freq_factor,
                                " <= ", s.low_freq_factor, ")"));
  }
  if (s.original_max_position_embeddings < 1) {
    return f.Error("original_max_position_embeddings", "must be at least 1");
  }
  config.rope_scaling = s;
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<LlamaConfig> ParseConfig(absl::string_view json_text, absl::string_view source) {
  Json json;
  try {
    json = Json::parse(json_text);
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": not valid JSON (", e.what(), ")"));
  }
  if (!json.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": not a JSON object"));
  }
  const Fields f(json, std::string(source));
  LlamaConfig c;

  std::string text;
  KPACK_RETURN_IF_ERROR(f.String("model_type", &text));
  if (!text.empty() && text != "llama") {
    return f.Error("model_type", absl::StrCat("is '", text, "'; the engine runs \"llama\""));
  }
  text.clear();
  KPACK_RETURN_IF_ERROR(f.String("hidden_act", &text));
  if (!text.empty() && text != "silu") {
    return f.Error("hidden_act", absl::StrCat("is '", text, "'; the kernels compute \"silu\""));
  }
  // Transformers 4.56 renamed torch_dtype to dtype; either names the weights' type.
  for (absl::string_view name : {"torch_dtype", "dtype"}) {
    text.clear();
    KPACK_RETURN_IF_ERROR(f.String(name, &text));
    if (!text.empty() && text != "bfloat16") {
      return f.Error(name, absl::StrCat("is '", text, "'; the engine runs bfloat16 weights"));
    }
  }
  for (absl::string_view name : {"attention_bias", "mlp_bias"}) {
    bool bias = false;
    KPACK_RETURN_IF_ERROR(f.Bool(name, &bias));
    if (bias) return f.Error(name, "is true; the kernels have no bias terms");
  }

  KPACK_RETURN_IF_ERROR(f.Int("hidden_size", &c.hidden_size));
  KPACK_RETURN_IF_ERROR(f.Int("num_hidden_layers", &c.num_hidden_layers));
  KPACK_RETURN_IF_ERROR(f.Int("num_attention_heads", &c.num_attention_heads));
  c.num_key_value_heads = c.num_attention_heads;
  KPACK_RETURN_IF_ERROR(f.Int("num_key_value_heads", &c.num_key_value_heads));
  KPACK_RETURN_IF_ERROR(f.Int("intermediate_size", &c.intermediate_size));
  KPACK_RETURN_IF_ERROR(f.Int("vocab_size", &c.vocab_size));
  KPACK_RETURN_IF_ERROR(f.Int("max_position_embeddings", &c.max_position_embeddings));
  KPACK_RETURN_IF_ERROR(f.Double("rms_norm_eps", &c.rms_norm_eps));
  KPACK_RETURN_IF_ERROR(f.Double("rope_theta", &c.rope_theta));
  KPACK_RETURN_IF_ERROR(f.Bool("tie_word_embeddings", &c.tie_word_embeddings));

  KPACK_RETURN_IF_ERROR(CheckSize(f, "hidden_size", c.hidden_size));
  KPACK_RETURN_IF_ERROR(CheckSize(f, "num_hidden_layers", c.num_hidden_layers));
  KPACK_RETURN_IF_ERROR(CheckSize(f, "num_attention_heads", c.num_attention_heads));
  KPACK_RETURN_IF_ERROR(CheckSize(f, "num_key_value_heads", c.num_key_value_heads));
  KPACK_RETURN_IF_ERROR(CheckSize(f, "intermediate_size", c.intermediate_size));
  KPACK_RETURN_IF_ERROR(CheckSize(f, "vocab_size", c.vocab_size));
  KPACK_RETURN_IF_ERROR(CheckSize(f, "max_position_embeddings", c.max_position_embeddings));
  KPACK_RETURN_IF_ERROR(CheckPositive(f, "rms_norm_eps", c.rms_norm_eps));
  KPACK_RETURN_IF_ERROR(CheckPositive(f, "rope_theta", c.rope_theta));

  // head_dim defaults to hidden_size / num_attention_heads (Transformers).
  c.head_dim = c.hidden_size / c.num_attention_heads;
  KPACK_RETURN_IF_ERROR(f.Int("head_dim", &c.head_dim));
  if (f.Find("head_dim") == nullptr && c.hidden_size % c.num_attention_heads != 0) {
    return f.Error("hidden_size",
                   absl::StrCat("(", c.hidden_size, ") is not a multiple of num_attention_heads (",
                                c.num_attention_heads, ") and head_dim is not given"));
  }
  KPACK_RETURN_IF_ERROR(CheckSize(f, "head_dim", c.head_dim));
  if (c.head_dim % 2 != 0) {
    return f.Error("head_dim",
                   absl::StrCat("must be even for the rotary embedding, not ", c.head_dim));
  }
  if (c.num_attention_heads % c.num_key_value_heads != 0) {
    return f.Error("num_key_value_heads",
                   absl::StrCat("(", c.num_key_value_heads, ") must divide num_attention_heads (",
                                c.num_attention_heads, ")"));
  }
  if (c.num_attention_heads / c.num_key_value_heads > 16) {
    return f.Error("num_key_value_heads",
                   absl::StrCat("(", c.num_key_value_heads, ") leaves ",
                                c.num_attention_heads / c.num_key_value_heads,
                                " query heads per KV head; the attention kernels take at most 16"));
  }
  // The widest matrix rows the kernels index in i32: (NH + 2 NKV)·D and NH·D.
  if (c.qkv_rows() > std::numeric_limits<int32_t>::max()) {
    return f.Error("head_dim", "times the heads exceeds 2^31 rows");
  }
  KPACK_RETURN_IF_ERROR(ParseRopeScaling(f, c));
  return c;
}

nlohmann::json ConfigToJson(const LlamaConfig& c) {
  Json j = {
      {"hidden_size", c.hidden_size},
      {"num_hidden_layers", c.num_hidden_layers},
      {"num_attention_heads", c.num_attention_heads},
      {"num_key_value_heads", c.num_key_value_heads},
      {"head_dim", c.head_dim},
      {"intermediate_size", c.intermediate_size},
      {"vocab_size", c.vocab_size},
      {"max_position_embeddings", c.max_position_embeddings},
      {"rms_norm_eps", c.rms_norm_eps},
      {"rope_theta", c.rope_theta},
      {"tie_word_embeddings", c.tie_word_embeddings},
      {"rope_scaling", nullptr},
  };
  if (c.rope_scaling.has_value()) {
    j["rope_scaling"] = {
        {"rope_type", "llama3"},
        {"factor", c.rope_scaling->factor},
        {"low_freq_factor", c.rope_scaling->low_freq_factor},
        {"high_freq_factor", c.rope_scaling->high_freq_factor},
        {"original_max_position_embeddings", c.rope_scaling->original_max_position_embeddings},
    };
  }
  return j;
}

absl::StatusOr<LlamaConfig> ReadConfig(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open the model's config"));
  std::stringstream text;
  text << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat(path, ": read failed"));
  return ParseConfig(text.str(), path);
}

}  // namespace kpack::llama
