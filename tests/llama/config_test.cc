// config.json: Hugging Face's defaults, the real Llama-3.2-1B file, and one test per
// refusal, each naming the field.

#include "config.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "rope.h"

namespace kpack::llama {
namespace {

using ::testing::HasSubstr;

// meta-llama/Llama-3.2-1B's config.json as published.
constexpr char kLlama32_1B[] = R"({
  "architectures": ["LlamaForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 128000,
  "eos_token_id": 128001,
  "head_dim": 64,
  "hidden_act": "silu",
  "hidden_size": 2048,
  "initializer_range": 0.02,
  "intermediate_size": 8192,
  "max_position_embeddings": 131072,
  "mlp_bias": false,
  "model_type": "llama",
  "num_attention_heads": 32,
  "num_hidden_layers": 16,
  "num_key_value_heads": 8,
  "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_scaling": {
    "factor": 32.0,
    "high_freq_factor": 4.0,
    "low_freq_factor": 1.0,
    "original_max_position_embeddings": 8192,
    "rope_type": "llama3"
  },
  "rope_theta": 500000.0,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.45.0.dev0",
  "use_cache": true,
  "vocab_size": 128256
})";

absl::Status ParseError(const std::string& text) {
  absl::StatusOr<LlamaConfig> c = ParseConfig(text, "config.json");
  return c.ok() ? absl::OkStatus() : c.status();
}

TEST(LlamaConfigTest, ReadsLlama32_1B) {
  absl::StatusOr<LlamaConfig> c = ParseConfig(kLlama32_1B, "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->hidden_size, 2048);
  EXPECT_EQ(c->num_hidden_layers, 16);
  EXPECT_EQ(c->num_attention_heads, 32);
  EXPECT_EQ(c->num_key_value_heads, 8);
  EXPECT_EQ(c->head_dim, 64);
  EXPECT_EQ(c->intermediate_size, 8192);
  EXPECT_EQ(c->vocab_size, 128256);
  EXPECT_EQ(c->max_position_embeddings, 131072);
  EXPECT_EQ(c->rms_norm_eps, 1e-5);
  EXPECT_EQ(c->rope_theta, 500000.0);
  EXPECT_TRUE(c->tie_word_embeddings);
  ASSERT_TRUE(c->rope_scaling.has_value());
  EXPECT_EQ(c->rope_scaling->factor, 32.0);
  EXPECT_EQ(c->rope_scaling->low_freq_factor, 1.0);
  EXPECT_EQ(c->rope_scaling->high_freq_factor, 4.0);
  EXPECT_EQ(c->rope_scaling->original_max_position_embeddings, 8192);
  EXPECT_EQ(c->qkv_rows(), (32 + 2 * 8) * 64);
}

TEST(LlamaConfigTest, ConfigToJsonReadsBack) {
  absl::StatusOr<LlamaConfig> c = ParseConfig(kLlama32_1B, "config.json");
  ASSERT_TRUE(c.ok());
  absl::StatusOr<LlamaConfig> back = ParseConfig(ConfigToJson(*c).dump(), "back");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(ConfigToJson(*back), ConfigToJson(*c));
  EXPECT_EQ(back->rope_scaling->original_max_position_embeddings, 8192);
  c->rope_scaling.reset();
  EXPECT_TRUE(ConfigToJson(*c)["rope_scaling"].is_null());
}

TEST(LlamaConfigTest, HuggingFaceDefaults) {
  absl::StatusOr<LlamaConfig> c = ParseConfig("{}", "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->hidden_size, 4096);
  EXPECT_EQ(c->num_hidden_layers, 32);
  EXPECT_EQ(c->num_attention_heads, 32);
  EXPECT_EQ(c->num_key_value_heads, 32);  // = num_attention_heads
  EXPECT_EQ(c->head_dim, 128);            // = hidden_size / num_attention_heads
  EXPECT_EQ(c->intermediate_size, 11008);
  EXPECT_EQ(c->vocab_size, 32000);
  EXPECT_EQ(c->max_position_embeddings, 2048);
  EXPECT_EQ(c->rms_norm_eps, 1e-6);
  EXPECT_EQ(c->rope_theta, 10000.0);
  EXPECT_FALSE(c->rope_scaling.has_value());
  EXPECT_FALSE(c->tie_word_embeddings);

  // Derived defaults follow the fields given; null is absent.
  c = ParseConfig(R"({"hidden_size": 256, "num_attention_heads": 4, "num_key_value_heads": null,
                      "head_dim": null, "rope_scaling": null})",
                  "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->num_key_value_heads, 4);
  EXPECT_EQ(c->head_dim, 64);
  // rope_type "default" (and the older key "type") mean no scaling.
  c = ParseConfig(R"({"rope_scaling": {"type": "default"}})", "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->rope_scaling.has_value());
}

TEST(LlamaConfigTest, MalformedJsonNamesTheFile) {
  const absl::Status s = ParseError("{\"hidden_size\": 2048,");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("config.json: not valid JSON"));
  EXPECT_THAT(ParseError("[1, 2]").message(), HasSubstr("not a JSON object"));
}

TEST(LlamaConfigTest, WrongTypesNameTheField) {
  EXPECT_THAT(ParseError(R"({"hidden_size": "2048"})").message(),
              HasSubstr("field 'hidden_size' must be an integer"));
  EXPECT_THAT(ParseError(R"({"num_hidden_layers": 16.5})").message(),
              HasSubstr("field 'num_hidden_layers' must be an integer"));
  EXPECT_THAT(ParseError(R"({"rms_norm_eps": "small"})").message(),
              HasSubstr("field 'rms_norm_eps' must be a number"));
  EXPECT_THAT(ParseError(R"({"tie_word_embeddings": 1})").message(),
              HasSubstr("field 'tie_word_embeddings' must be true or false"));
  EXPECT_THAT(ParseError(R"({"rope_scaling": 32})").message(),
              HasSubstr("field 'rope_scaling' must be an object or null"));
  EXPECT_THAT(ParseError(R"({"model_type": 7})").message(),
              HasSubstr("field 'model_type' must be a string"));
}

TEST(LlamaConfigTest, SizesOutOfRangeNameTheField) {
  EXPECT_THAT(ParseError(R"({"hidden_size": 0})").message(),
              HasSubstr("field 'hidden_size' must be in [1, 2^31)"));
  EXPECT_THAT(ParseError(R"({"vocab_size": -3})").message(),
              HasSubstr("field 'vocab_size' must be in [1, 2^31)"));
  EXPECT_THAT(ParseError(R"({"intermediate_size": 4294967296})").message(),
              HasSubstr("field 'intermediate_size' must be in [1, 2^31)"));
  EXPECT_THAT(ParseError(R"({"num_hidden_layers": 18446744073709551615})").message(),
              HasSubstr("field 'num_hidden_layers' is out of range"));
  EXPECT_THAT(ParseError(R"({"rms_norm_eps": 0})").message(),
              HasSubstr("field 'rms_norm_eps' must be a positive finite number"));
  EXPECT_THAT(ParseError(R"({"rope_theta": -1.0})").message(),
              HasSubstr("field 'rope_theta' must be a positive finite number"));
}

TEST(LlamaConfigTest, HeadsMustFitTheKernels) {
  EXPECT_THAT(ParseError(R"({"num_attention_heads": 32, "num_key_value_heads": 6})").message(),
              HasSubstr("field 'num_key_value_heads' (6) must divide num_attention_heads (32)"));
  EXPECT_THAT(
      ParseError(R"({"num_attention_heads": 64, "num_key_value_heads": 2})").message(),
      HasSubstr("leaves 32 query heads per KV head; the attention kernels take at most 16"));
  EXPECT_THAT(ParseError(R"({"head_dim": 63})").message(),
              HasSubstr("field 'head_dim' must be even"));
  EXPECT_THAT(ParseError(R"({"hidden_size": 100, "num_attention_heads": 3,
                             "num_key_value_heads": 1})")
                  .message(),
              HasSubstr("field 'hidden_size' (100) is not a multiple of num_attention_heads (3)"));
}

TEST(LlamaConfigTest, RefusesOtherMath) {
  EXPECT_THAT(ParseError(R"({"model_type": "mistral"})").message(),
              HasSubstr("field 'model_type' is 'mistral'"));
  EXPECT_THAT(ParseError(R"({"hidden_act": "gelu"})").message(),
              HasSubstr("field 'hidden_act' is 'gelu'"));
  EXPECT_THAT(ParseError(R"({"attention_bias": true})").message(),
              HasSubstr("field 'attention_bias' is true"));
  EXPECT_THAT(ParseError(R"({"mlp_bias": true})").message(), HasSubstr("field 'mlp_bias' is true"));
  EXPECT_THAT(ParseError(R"({"torch_dtype": "float16"})").message(),
              HasSubstr("field 'torch_dtype' is 'float16'"));
  EXPECT_THAT(ParseError(R"({"dtype": "float32"})").message(),
              HasSubstr("field 'dtype' is 'float32'"));
}

TEST(LlamaConfigTest, RopeScalingChecks) {
  const absl::Status yarn = ParseError(R"({"rope_scaling": {"rope_type": "yarn", "factor": 4}})");
  EXPECT_EQ(yarn.code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(yarn.message(), HasSubstr("'rope_scaling.rope_type' is 'yarn'"));
  EXPECT_THAT(ParseError(R"({"rope_scaling": {"rope_type": "llama3", "factor": 32,
                             "low_freq_factor": 1, "high_freq_factor": 4}})")
                  .message(),
              HasSubstr("rope_scaling: field 'original_max_position_embeddings' is required"));
  EXPECT_THAT(ParseError(R"({"rope_scaling": {"rope_type": "llama3", "factor": 0,
                             "low_freq_factor": 1, "high_freq_factor": 4,
                             "original_max_position_embeddings": 8192}})")
                  .message(),
              HasSubstr("rope_scaling: field 'factor' must be a positive finite number"));
  EXPECT_THAT(ParseError(R"({"rope_scaling": {"rope_type": "llama3", "factor": 8,
                             "low_freq_factor": 4, "high_freq_factor": 4,
                             "original_max_position_embeddings": 8192}})")
                  .message(),
              HasSubstr("field 'high_freq_factor' must be greater than low_freq_factor"));
  EXPECT_THAT(ParseError(R"({"rope_scaling": {"rope_type": "llama3", "factor": 8,
                             "low_freq_factor": "1", "high_freq_factor": 4,
                             "original_max_position_embeddings": 8192}})")
                  .message(),
              HasSubstr("rope_scaling: field 'low_freq_factor' must be a number"));
}

TEST(LlamaConfigTest, MissingFileIsNotFound) {
  const absl::StatusOr<LlamaConfig> c = ReadConfig("/nonexistent/config.json");
  EXPECT_EQ(c.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(c.status().message(), HasSubstr("/nonexistent/config.json"));
}

// docs/llama.md: base^(-2j/D) in float64, Hugging Face's llama3 rule, rounded once.
TEST(LlamaRopeTest, InvFreqWithoutScalingIsThePowerRoundedOnce) {
  LlamaConfig c;
  c.head_dim = 64;
  c.rope_theta = 500000;
  const std::vector<float> f = RopeInvFreq(c);
  ASSERT_EQ(f.size(), 32u);
  for (int j = 0; j < 32; ++j) {
    EXPECT_EQ(f[static_cast<size_t>(j)], static_cast<float>(std::pow(500000.0, -(2.0 * j) / 64)))
        << j;
  }
  EXPECT_EQ(f[0], 1.0f);
}

TEST(LlamaRopeTest, Llama3ScalingKeepsHighDividesLowSmoothsBetween) {
  absl::StatusOr<LlamaConfig> c = ParseConfig(kLlama32_1B, "config.json");
  ASSERT_TRUE(c.ok());
  const std::vector<float> f = RopeInvFreq(*c);
  ASSERT_EQ(f.size(), 32u);
  int high = 0, low = 0, medium = 0;
  for (int j = 0; j < 32; ++j) {
    const double base = std::pow(500000.0, -(2.0 * j) / 64);
    const double wavelen = 2 * M_PI / base;
    if (wavelen < 8192.0 / 4) {
      EXPECT_EQ(f[static_cast<size_t>(j)], static_cast<float>(base)) << j;
      ++high;
    } else if (wavelen > 8192.0 / 1) {
      EXPECT_EQ(f[static_cast<size_t>(j)], static_cast<float>(base / 32)) << j;
      ++low;
    } else {
      // Between the two: strictly between the kept and the divided frequency.
      EXPECT_LT(f[static_cast<size_t>(j)], static_cast<float>(base)) << j;
      EXPECT_GT(f[static_cast<size_t>(j)], static_cast<float>(base / 32)) << j;
      ++medium;
    }
  }
  // Llama 3's 64-dim heads have frequencies in all three bands.
  EXPECT_GT(high, 0);
  EXPECT_GT(low, 0);
  EXPECT_GT(medium, 0);
}

}  // namespace
}  // namespace kpack::llama
