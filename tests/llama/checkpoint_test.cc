// Checkpoint directories: complete ones (single file and sharded) load; each missing,
// mistyped or misshapen tensor is an error naming it; unused tensors are warnings.

#include "checkpoint.h"

#include <cstring>
#include <map>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "test_files.h"

namespace kpack::llama {
namespace {

using ::kpack::llama::testing::CheckpointTensors;
using ::kpack::llama::testing::ConfigJson;
using ::kpack::llama::testing::MicroConfig;
using ::kpack::llama::testing::SafetensorsOf;
using ::kpack::llama::testing::TempDir;
using ::kpack::llama::testing::TensorSpec;
using ::kpack::llama::testing::WriteFile;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

class LlamaCheckpointTest : public ::testing::Test {
 protected:
  void Write(const LlamaConfig& config, const std::map<std::string, TensorSpec>& tensors) {
    WriteFile(dir_.file("config.json"), ConfigJson(config));
    WriteFile(dir_.file("model.safetensors"), SafetensorsOf(tensors));
  }
  absl::Status OpenError() {
    absl::StatusOr<Checkpoint> ck = Checkpoint::Open(dir_.path().string());
    return ck.ok() ? absl::OkStatus() : ck.status();
  }

  TempDir dir_;
  LlamaConfig config_ = MicroConfig();
};

TEST_F(LlamaCheckpointTest, LoadsEveryTensorTheModelNeeds) {
  std::map<std::string, TensorSpec> tensors = CheckpointTensors(config_);
  tensors["model.layers.1.mlp.up_proj.weight"].bytes = std::string(16 * 8 * 2, '\x42');
  Write(config_, tensors);
  absl::StatusOr<Checkpoint> ck = Checkpoint::Open(dir_.path().string());
  ASSERT_TRUE(ck.ok()) << ck.status();
  EXPECT_EQ(ck->config().hidden_size, 8);
  EXPECT_TRUE(ck->warnings().empty());
  const std::vector<ExpectedTensor> expected = ExpectedTensors(config_);
  EXPECT_EQ(expected.size(), 1u + 9u * 2 + 1u);  // tied: no lm_head.weight
  for (const ExpectedTensor& e : expected) {
    EXPECT_EQ(ck->Bytes(e.name).size(),
              2u * static_cast<size_t>(e.shape[0]) *
                  (e.shape.size() > 1 ? static_cast<size_t>(e.shape[1]) : 1))
        << e.name;
  }
  const std::span<const std::byte> up = ck->Bytes("model.layers.1.mlp.up_proj.weight");
  EXPECT_EQ(static_cast<char>(up[0]), '\x42');
  EXPECT_EQ(static_cast<char>(up[up.size() - 1]), '\x42');
  EXPECT_TRUE(ck->Bytes("not.a.tensor").empty());
  EXPECT_THAT(ck->files(), ElementsAre(dir_.file("model.safetensors")));
}

TEST_F(LlamaCheckpointTest, ExpectedShapesFollowTheConfig) {
  config_.tie_word_embeddings = false;
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const ExpectedTensor& e : ExpectedTensors(config_)) shapes[e.name] = e.shape;
  EXPECT_EQ(shapes["model.embed_tokens.weight"], (std::vector<int64_t>{10, 8}));
  EXPECT_EQ(shapes["model.layers.0.self_attn.q_proj.weight"], (std::vector<int64_t>{8, 8}));
  EXPECT_EQ(shapes["model.layers.0.self_attn.k_proj.weight"], (std::vector<int64_t>{4, 8}));
  EXPECT_EQ(shapes["model.layers.1.self_attn.o_proj.weight"], (std::vector<int64_t>{8, 8}));
  EXPECT_EQ(shapes["model.layers.1.mlp.gate_proj.weight"], (std::vector<int64_t>{16, 8}));
  EXPECT_EQ(shapes["model.layers.1.mlp.down_proj.weight"], (std::vector<int64_t>{8, 16}));
  EXPECT_EQ(shapes["model.layers.0.input_layernorm.weight"], (std::vector<int64_t>{8}));
  EXPECT_EQ(shapes["lm_head.weight"], (std::vector<int64_t>{10, 8}));
}

TEST_F(LlamaCheckpointTest, MissingConfig) {
  WriteFile(dir_.file("model.safetensors"), SafetensorsOf(CheckpointTensors(config_)));
  const absl::Status s = OpenError();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr("config.json"));
}

TEST_F(LlamaCheckpointTest, NoWeightFile) {
  WriteFile(dir_.file("config.json"), ConfigJson(config_));
  const absl::Status s = OpenError();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr("no model.safetensors and no model.safetensors.index.json"));
}

TEST_F(LlamaCheckpointTest, MissingTensor) {
  std::map<std::string, TensorSpec> tensors = CheckpointTensors(config_);
  tensors.erase("model.layers.1.self_attn.v_proj.weight");
  Write(config_, tensors);
  const absl::Status s = OpenError();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr("tensor 'model.layers.1.self_attn.v_proj.weight' is missing"));
}

TEST_F(LlamaCheckpointTest, UntiedModelNeedsItsLmHead) {
  config_.tie_word_embeddings = false;
  std::map<std::string, TensorSpec> tensors = CheckpointTensors(config_);
  tensors.erase("lm_head.weight");
  Write(config_, tensors);
  EXPECT_THAT(OpenError().message(),
              HasSubstr("tensor 'lm_head.weight' is missing (config.json: num_hidden_layers 2, "
                        "tie_word_embeddings false)"));
}

TEST_F(LlamaCheckpointTest, WrongDtype) {
  std::map<std::string, TensorSpec> tensors = CheckpointTensors(config_);
  tensors["model.norm.weight"].dtype = "F32";
  Write(config_, tensors);
  const absl::Status s = OpenError();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(),
              HasSubstr("tensor 'model.norm.weight' is F32; the engine needs BF16 weights"));
}

TEST_F(LlamaCheckpointTest, ShapeDisagreesWithTheConfig) {
  std::map<std::string, TensorSpec> tensors = CheckpointTensors(config_);
  tensors["model.layers.0.mlp.gate_proj.weight"].shape = {8, 16};  // transposed
  Write(config_, tensors);
  EXPECT_THAT(OpenError().message(),
              HasSubstr("tensor 'model.layers.0.mlp.gate_proj.weight' has shape [8, 16], but "
                        "config.json gives [16, 8]"));
  // A config that says more layers than the file has.
  config_.num_hidden_layers = 3;
  Write(config_, CheckpointTensors(MicroConfig()));
  EXPECT_THAT(OpenError().message(),
              HasSubstr("tensor 'model.layers.2.input_layernorm.weight' is missing"));
}

TEST_F(LlamaCheckpointTest, BrokenFileNamesTheFile) {
  WriteFile(dir_.file("config.json"), ConfigJson(config_));
  std::string bytes = SafetensorsOf(CheckpointTensors(config_));
  bytes.resize(bytes.size() - 3);  // truncated: the last tensor's data runs past the end
  WriteFile(dir_.file("model.safetensors"), bytes);
  const absl::Status s = OpenError();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("model.safetensors: tensor '"));
  EXPECT_THAT(s.message(), HasSubstr("past the data region"));
}

TEST_F(LlamaCheckpointTest, UnusedTensorsAreWarnings) {
  std::map<std::string, TensorSpec> tensors = CheckpointTensors(config_);
  tensors["lm_head.weight"] = {"BF16", {10, 8}, ""};  // tied: the embedding serves
  tensors["model.layers.0.self_attn.rotary_emb.inv_freq"] = {"F32", {2}, ""};
  Write(config_, tensors);
  absl::StatusOr<Checkpoint> ck = Checkpoint::Open(dir_.path().string());
  ASSERT_TRUE(ck.ok()) << ck.status();
  ASSERT_EQ(ck->warnings().size(), 2u);
  EXPECT_THAT(ck->warnings()[0],
              HasSubstr("tensor 'lm_head.weight' is not used (tie_word_embeddings is true)"));
  EXPECT_THAT(ck->warnings()[1],
              HasSubstr("tensor 'model.layers.0.self_attn.rotary_emb.inv_freq' is not used"));
}

TEST_F(LlamaCheckpointTest, ManyUnusedTensorsAreCounted) {
  std::map<std::string, TensorSpec> tensors = CheckpointTensors(config_);
  for (int i = 0; i < 20; ++i) tensors["extra." + std::to_string(i)] = {"BF16", {1}, ""};
  Write(config_, tensors);
  absl::StatusOr<Checkpoint> ck = Checkpoint::Open(dir_.path().string());
  ASSERT_TRUE(ck.ok()) << ck.status();
  ASSERT_EQ(ck->warnings().size(), 9u);
  EXPECT_EQ(ck->warnings().back(), "and 12 more unused tensors");
}

class LlamaShardedCheckpointTest : public LlamaCheckpointTest {
 protected:
  // Layer tensors in shard 2, the rest in shard 1, and the index naming them.
  void WriteShards(const std::map<std::string, TensorSpec>& tensors,
                   std::map<std::string, std::string> remap = {}) {
    std::map<std::string, TensorSpec> one, two;
    nlohmann::json map = nlohmann::json::object();
    for (const auto& [name, t] : tensors) {
      const bool layer = name.starts_with("model.layers.");
      (layer ? two : one)[name] = t;
      map[name] = layer ? "model-00002-of-00002.safetensors" : "model-00001-of-00002.safetensors";
    }
    for (const auto& [name, file] : remap) map[name] = file;
    WriteFile(dir_.file("config.json"), ConfigJson(config_));
    WriteFile(dir_.file("model-00001-of-00002.safetensors"), SafetensorsOf(one));
    WriteFile(dir_.file("model-00002-of-00002.safetensors"), SafetensorsOf(two));
    WriteFile(dir_.file("model.safetensors.index.json"),
              nlohmann::json({{"metadata", {{"total_size", 0}}}, {"weight_map", map}}).dump());
  }
};

TEST_F(LlamaShardedCheckpointTest, LoadsAcrossShards) {
  std::map<std::string, TensorSpec> tensors = CheckpointTensors(config_);
  tensors["model.layers.1.mlp.down_proj.weight"].bytes = std::string(8 * 16 * 2, '\x17');
  WriteShards(tensors);
  absl::StatusOr<Checkpoint> ck = Checkpoint::Open(dir_.path().string());
  ASSERT_TRUE(ck.ok()) << ck.status();
  EXPECT_EQ(ck->files().size(), 2u);
  const std::span<const std::byte> down = ck->Bytes("model.layers.1.mlp.down_proj.weight");
  ASSERT_EQ(down.size(), 256u);
  EXPECT_EQ(static_cast<char>(down[100]), '\x17');
  EXPECT_EQ(ck->Bytes("model.norm.weight").size(), 16u);
}

TEST_F(LlamaShardedCheckpointTest, IndexNamesAShardWithoutTheTensor) {
  WriteShards(CheckpointTensors(config_),
              {{"model.norm.weight", "model-00002-of-00002.safetensors"}});
  const absl::Status s = OpenError();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr("weight_map puts tensor 'model.norm.weight' in "
                                     "model-00002-of-00002.safetensors, which has no such tensor"));
}

TEST_F(LlamaShardedCheckpointTest, ShardOutsideTheDirectoryIsRefused) {
  WriteShards(CheckpointTensors(config_), {{"model.norm.weight", "../elsewhere.safetensors"}});
  EXPECT_THAT(OpenError().message(),
              HasSubstr("weight_map puts tensor 'model.norm.weight' in '../elsewhere.safetensors', "
                        "which is not a file name in the checkpoint directory"));
}

TEST_F(LlamaShardedCheckpointTest, MissingShardAndMalformedIndex) {
  WriteShards(CheckpointTensors(config_),
              {{"model.norm.weight", "model-00003-of-00002.safetensors"}});
  const absl::Status missing = OpenError();
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.message(), HasSubstr("model-00003-of-00002.safetensors: cannot open"));
  WriteFile(dir_.file("model.safetensors.index.json"), R"({"weight_map": [1]})");
  EXPECT_THAT(OpenError().message(), HasSubstr("no \"weight_map\" object"));
  WriteFile(dir_.file("model.safetensors.index.json"), R"({"weight_map": )");
  EXPECT_THAT(OpenError().message(), HasSubstr("model.safetensors.index.json: not valid JSON"));
}

}  // namespace
}  // namespace kpack::llama
