#include "model.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "rope.h"
#include "util/status_macros.h"

namespace kpack::llama {
namespace {

constexpr size_t kBf16 = 2;

struct Offsets {
  struct Layer {
    size_t ln1, wqkv, wo, ln2, wgu, wd;
  };
  std::vector<Layer> layers;
  size_t embed = 0, lm_head = 0, norm_f = 0, inv_freq = 0;
};

Offsets Place(const LlamaConfig& c, Carving& layout) {
  const size_t h = static_cast<size_t>(c.hidden_size), i = static_cast<size_t>(c.intermediate_size);
  const size_t v = static_cast<size_t>(c.vocab_size);
  Offsets o;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    Offsets::Layer w;
    w.ln1 = layout.Take(h * kBf16);
    w.wqkv = layout.Take(static_cast<size_t>(c.qkv_rows()) * h * kBf16);
    w.wo = layout.Take(h * static_cast<size_t>(c.q_rows()) * kBf16);
    w.ln2 = layout.Take(h * kBf16);
    w.wgu = layout.Take(2 * i * h * kBf16);
    w.wd = layout.Take(h * i * kBf16);
    o.layers.push_back(w);
  }
  o.norm_f = layout.Take(h * kBf16);
  o.embed = layout.Take(v * h * kBf16);
  o.lm_head = c.tie_word_embeddings ? o.embed : layout.Take(v * h * kBf16);
  o.inv_freq = layout.Take(static_cast<size_t>(c.head_dim / 2) * sizeof(float));
  return o;
}

}  // namespace

absl::StatusOr<Model> Model::Upload(const Device& device, const Checkpoint& checkpoint) {
  Model m;
  m.config_ = checkpoint.config();
  const LlamaConfig& c = m.config_;
  Carving layout;
  const Offsets o = Place(c, layout);
  KPACK_ASSIGN_OR_RETURN(m.memory_, DeviceBuffer::Allocate(device, layout.size(), "the weights"));
  const CUdeviceptr base = m.memory_.get();

  // Copies checkpoint tensor `name` to base + offset.
  auto put = [&](const std::string& name, size_t offset) -> absl::Status {
    const std::span<const std::byte> bytes = checkpoint.Bytes(name);
    if (bytes.empty()) {
      return absl::InternalError(absl::StrCat("the checkpoint did not check tensor '", name, "'"));
    }
    return device.Check(device.driver().MemcpyHtoD(base + offset, bytes.data(), bytes.size()),
                        absl::StrCat("uploading tensor '", name, "'"));
  };
  const size_t h = static_cast<size_t>(c.hidden_size);
  const size_t q_bytes = static_cast<size_t>(c.q_rows()) * h * kBf16;
  const size_t kv_bytes = static_cast<size_t>(c.kv_rows()) * h * kBf16;
  const size_t gate_bytes = static_cast<size_t>(c.intermediate_size) * h * kBf16;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const Offsets::Layer& w = o.layers[static_cast<size_t>(l)];
    KPACK_RETURN_IF_ERROR(put(LayerTensorName(l, "input_layernorm"), w.ln1));
    KPACK_RETURN_IF_ERROR(put(LayerTensorName(l, "self_attn.q_proj"), w.wqkv));
    KPACK_RETURN_IF_ERROR(put(LayerTensorName(l, "self_attn.k_proj"), w.wqkv + q_bytes));
    KPACK_RETURN_IF_ERROR(put(LayerTensorName(l, "self_attn.v_proj"), w.wqkv + q_bytes + kv_bytes));
    KPACK_RETURN_IF_ERROR(put(LayerTensorName(l, "self_attn.o_proj"), w.wo));
    KPACK_RETURN_IF_ERROR(put(LayerTensorName(l, "post_attention_layernorm"), w.ln2));
    KPACK_RETURN_IF_ERROR(put(LayerTensorName(l, "mlp.gate_proj"), w.wgu));
    KPACK_RETURN_IF_ERROR(put(LayerTensorName(l, "mlp.up_proj"), w.wgu + gate_bytes));
    KPACK_RETURN_IF_ERROR(put(LayerTensorName(l, "mlp.down_proj"), w.wd));
    m.layers_.push_back({.ln1 = base + w.ln1,
                         .wqkv = base + w.wqkv,
                         .wo = base + w.wo,
                         .ln2 = base + w.ln2,
                         .wgu = base + w.wgu,
                         .wd = base + w.wd});
  }
  KPACK_RETURN_IF_ERROR(put("model.norm.weight", o.norm_f));
  KPACK_RETURN_IF_ERROR(put("model.embed_tokens.weight", o.embed));
  if (!c.tie_word_embeddings) KPACK_RETURN_IF_ERROR(put("lm_head.weight", o.lm_head));
  const std::vector<float> inv_freq = RopeInvFreq(c);
  KPACK_RETURN_IF_ERROR(device.Check(device.driver().MemcpyHtoD(base + o.inv_freq, inv_freq.data(),
                                                                inv_freq.size() * sizeof(float)),
                                     "uploading inv_freq"));

  m.embed_ = base + o.embed;
  m.lm_head_ = base + o.lm_head;
  m.norm_f_ = base + o.norm_f;
  m.inv_freq_ = base + o.inv_freq;
  const size_t v = static_cast<size_t>(c.vocab_size);
  const size_t per_layer =
      (2 * h + static_cast<size_t>(c.qkv_rows()) * h + h * static_cast<size_t>(c.q_rows()) +
       3 * static_cast<size_t>(c.intermediate_size) * h) *
      kBf16;
  m.step_weight_bytes_ =
      per_layer * static_cast<size_t>(c.num_hidden_layers) + h * kBf16 + v * h * kBf16;
  return m;
}

}  // namespace kpack::llama
