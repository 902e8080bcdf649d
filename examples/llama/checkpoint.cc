#include "checkpoint.h"

#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "util/status_macros.h"

namespace kpack::llama {
namespace {

using Json = nlohmann::json;

constexpr char kSingleFile[] = "model.safetensors";
constexpr char kIndexFile[] = "model.safetensors.index.json";
constexpr size_t kMaxWarnings = 8;

struct Located {
  const SafetensorsFile* file;
  const TensorInfo* tensor;
};

// The shard files a model.safetensors.index.json names, and which holds each tensor.
absl::Status ReadIndex(const std::string& dir, std::vector<std::string>* shards,
                       absl::flat_hash_map<std::string, std::string>* weight_map) {
  const std::string path = (std::filesystem::path(dir) / kIndexFile).string();
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  std::stringstream text;
  text << in.rdbuf();
  Json index;
  try {
    index = Json::parse(text.str());
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not valid JSON (", e.what(), ")"));
  }
  const auto map = index.is_object() ? index.find("weight_map") : index.end();
  if (map == index.end() || !map->is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": no \"weight_map\" object"));
  }
  absl::flat_hash_set<std::string> seen;
  for (auto it = map->begin(); it != map->end(); ++it) {
    if (!it->is_string()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": weight_map entry for tensor '", it.key(), "' is not a file name"));
    }
    const std::string file = it->get<std::string>();
    // Shards live beside the index: a path that leaves the directory is refused.
    if (file.empty() || file.find('/') != std::string::npos || file == "." || file == "..") {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": weight_map puts tensor '", it.key(), "' in '", file,
                       "', which is not a file name in the checkpoint directory"));
    }
    (*weight_map)[it.key()] = file;
    if (seen.insert(file).second) shards->push_back(file);
  }
  return absl::OkStatus();
}

}  // namespace

std::string LayerTensorName(int64_t layer, absl::string_view part) {
  return absl::StrCat("model.layers.", layer, ".", part, ".weight");
}

std::vector<ExpectedTensor> ExpectedTensors(const LlamaConfig& c) {
  const int64_t h = c.hidden_size, i = c.intermediate_size;
  std::vector<ExpectedTensor> t;
  t.push_back({"model.embed_tokens.weight", {c.vocab_size, h}});
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    t.push_back({LayerTensorName(l, "input_layernorm"), {h}});
    t.push_back({LayerTensorName(l, "self_attn.q_proj"), {c.q_rows(), h}});
    t.push_back({LayerTensorName(l, "self_attn.k_proj"), {c.kv_rows(), h}});
    t.push_back({LayerTensorName(l, "self_attn.v_proj"), {c.kv_rows(), h}});
    t.push_back({LayerTensorName(l, "self_attn.o_proj"), {h, c.q_rows()}});
    t.push_back({LayerTensorName(l, "post_attention_layernorm"), {h}});
    t.push_back({LayerTensorName(l, "mlp.gate_proj"), {i, h}});
    t.push_back({LayerTensorName(l, "mlp.up_proj"), {i, h}});
    t.push_back({LayerTensorName(l, "mlp.down_proj"), {h, i}});
  }
  t.push_back({"model.norm.weight", {h}});
  if (!c.tie_word_embeddings) t.push_back({"lm_head.weight", {c.vocab_size, h}});
  return t;
}

absl::StatusOr<Checkpoint> Checkpoint::Open(const std::string& dir) {
  namespace fs = std::filesystem;
  Checkpoint ck;
  ck.dir_ = dir;
  KPACK_ASSIGN_OR_RETURN(ck.config_, ReadConfig((fs::path(dir) / "config.json").string()));

  // Which file holds each tensor.
  absl::flat_hash_map<std::string, Located> located;
  std::error_code ec;
  if (fs::exists(fs::path(dir) / kSingleFile, ec)) {
    KPACK_ASSIGN_OR_RETURN(SafetensorsFile f,
                           SafetensorsFile::Open((fs::path(dir) / kSingleFile).string()));
    ck.files_.push_back(std::move(f));
    for (const TensorInfo& t : ck.files_[0].tensors()) located[t.name] = {&ck.files_[0], &t};
  } else if (fs::exists(fs::path(dir) / kIndexFile, ec)) {
    std::vector<std::string> shards;
    absl::flat_hash_map<std::string, std::string> weight_map;
    KPACK_RETURN_IF_ERROR(ReadIndex(dir, &shards, &weight_map));
    ck.files_.reserve(shards.size());  // `located` points into it
    absl::flat_hash_map<std::string, const SafetensorsFile*> by_name;
    for (const std::string& shard : shards) {
      KPACK_ASSIGN_OR_RETURN(SafetensorsFile f,
                             SafetensorsFile::Open((fs::path(dir) / shard).string()));
      ck.files_.push_back(std::move(f));
      by_name[shard] = &ck.files_.back();
    }
    for (const auto& [name, shard] : weight_map) {
      const SafetensorsFile* f = by_name[shard];
      const TensorInfo* t = f->Find(name);
      if (t == nullptr) {
        return absl::NotFoundError(absl::StrCat((fs::path(dir) / kIndexFile).string(),
                                                ": weight_map puts tensor '", name, "' in ", shard,
                                                ", which has no such tensor"));
      }
      located[name] = {f, t};
    }
  } else {
    return absl::NotFoundError(absl::StrCat(dir, ": no ", kSingleFile, " and no ", kIndexFile,
                                            " (a Hugging Face checkpoint directory has one)"));
  }

  absl::flat_hash_set<std::string> used;
  for (const ExpectedTensor& e : ExpectedTensors(ck.config_)) {
    auto it = located.find(e.name);
    if (it == located.end()) {
      return absl::NotFoundError(
          absl::StrCat(dir, ": tensor '", e.name, "' is missing (config.json: num_hidden_layers ",
                       ck.config_.num_hidden_layers, ", tie_word_embeddings ",
                       ck.config_.tie_word_embeddings ? "true" : "false", ")"));
    }
    const auto& [file, tensor] = it->second;
    if (tensor->dtype != "BF16") {
      return absl::InvalidArgumentError(absl::StrCat(file->path(), ": tensor '", e.name, "' is ",
                                                     tensor->dtype,
                                                     "; the engine needs BF16 weights"));
    }
    if (tensor->shape != e.shape) {
      return absl::InvalidArgumentError(absl::StrCat(
          file->path(), ": tensor '", e.name, "' has shape ", ShapeString(tensor->shape),
          ", but config.json gives ", ShapeString(e.shape)));
    }
    ck.expected_[e.name] = file->Data(*tensor);
    used.insert(e.name);
  }

  std::vector<std::string> unused;
  for (const SafetensorsFile& f : ck.files_) {
    for (const TensorInfo& t : f.tensors()) {
      if (!used.contains(t.name))
        unused.push_back(absl::StrCat(f.path(), ": tensor '", t.name, "'"));
    }
  }
  std::sort(unused.begin(), unused.end());
  for (size_t i = 0; i < unused.size() && i < kMaxWarnings; ++i) {
    const bool tied_head =
        ck.config_.tie_word_embeddings && unused[i].ends_with("'lm_head.weight'");
    ck.warnings_.push_back(
        absl::StrCat(unused[i], " is not used", tied_head ? " (tie_word_embeddings is true)" : ""));
  }
  if (unused.size() > kMaxWarnings) {
    ck.warnings_.push_back(
        absl::StrCat("and ", unused.size() - kMaxWarnings, " more unused tensors"));
  }
  return ck;
}

std::span<const std::byte> Checkpoint::Bytes(absl::string_view name) const {
  auto it = expected_.find(name);
  return it == expected_.end() ? std::span<const std::byte>() : it->second;
}

std::vector<std::string> Checkpoint::files() const {
  std::vector<std::string> names;
  for (const SafetensorsFile& f : files_) names.push_back(f.path());
  return names;
}

}  // namespace kpack::llama
