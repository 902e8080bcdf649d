#include "engine.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"
#include "util/status_macros.h"

namespace kpack::llama {
namespace {

// docs/llama.md's kernels: pack name, then the call parameters' Triton types in order.
struct Signature {
  absl::string_view kernel;
  std::initializer_list<absl::string_view> types;
  size_t m_arg;  // the index of M (rows of the step)
  // The index of S (decode attention's splits, which follow the batch above 64 rows:
  // DecodeSplits); -1 for the other kernels.
  int s_arg = -1;
};
constexpr absl::string_view kEmbed = "llama_embed", kRmsNorm = "llama_rmsnorm",
                            kQkvRope = "llama_qkv_rope", kAttnDecode = "llama_attn_decode",
                            kAttnPrefill = "llama_attn_prefill", kOProj = "llama_o_proj",
                            kGateUp = "llama_gate_up", kDownProj = "llama_down_proj",
                            kLmHead = "llama_lm_head";
const Signature kSignatures[] = {
    {kEmbed, {"*i32", "*bf16", "*fp32", "i32", "i32"}, 3},
    {kRmsNorm, {"*fp32", "*bf16", "*bf16", "i32", "i32", "fp32"}, 3},
    {kQkvRope,
     {"*fp32", "*bf16", "*bf16", "*bf16", "*fp32", "*i32", "*i32", "*bf16", "*bf16", "*bf16", "i32",
      "i32", "i32", "i32", "i32", "fp32"},
     10},
    {kAttnDecode,
     {"*bf16", "*bf16", "*bf16", "*i32", "*i32", "*fp32", "*fp32", "*i32", "*bf16", "i32", "i32",
      "i32", "i32", "i32", "fp32"},
     9, 13},
    {kAttnPrefill,
     {"*bf16", "*bf16", "*bf16", "*i32", "*i32", "*bf16", "i32", "i32", "i32", "i32", "fp32"},
     6},
    {kOProj, {"*bf16", "*bf16", "*fp32", "*fp32", "*i32", "i32", "i32", "i32"}, 5},
    {kGateUp, {"*fp32", "*bf16", "*bf16", "*bf16", "*bf16", "i32", "i32", "i32", "fp32"}, 5},
    {kDownProj, {"*bf16", "*bf16", "*fp32", "*fp32", "*i32", "i32", "i32", "i32"}, 5},
    {kLmHead,
     {"*fp32", "*bf16", "*bf16", "*bf16", "*fp32", "*fp32", "*i32", "*i32", "*i32", "*i32", "i32",
      "i32", "i32", "fp32", "i32", "i32"},
     10},
};

const Signature& SignatureOf(absl::string_view kernel) {
  for (const Signature& s : kSignatures) {
    if (s.kernel == kernel) return s;
  }
  std::abort();  // only called with the names above
}

// kpack's API speaks std::string_view; this abseil's string_view is its own type.
std::string_view Std(absl::string_view s) { return std::string_view(s.data(), s.size()); }
absl::string_view Absl(std::string_view s) { return absl::string_view(s.data(), s.size()); }

// The integer `key` of a variant's constexprs (VariantInfo::constexprs_json, parsed);
// nullopt when it has none or another type.
std::optional<int64_t> IntConstexpr(const nlohmann::json& c, const char* key) {
  const auto it = c.is_object() ? c.find(key) : c.end();
  if (it == c.end() || !it->is_number_integer()) return std::nullopt;
  return it->get<int64_t>();
}

// The o or down projection's variants against the split-K scratch StepBuffers sizes
// (docs/llama.md): each has an integer SPLIT; one above 1 needs tiles of at least
// kProjSplitMinTileRows x kProjSplitMinTileCols, at most kMaxProjSplits, in a bucket of at
// most kProjSplitMaxRows rows.
absl::Status CheckSplits(const Runtime& runtime, absl::string_view name, const Kernel& k) {
  for (const VariantInfo& v : k.info().variants) {
    auto fail = [&](absl::string_view why) {
      return absl::FailedPreconditionError(absl::StrCat("pack ", runtime.pack().dir(),
                                                        ": kernel '", name, "' variant '", v.name,
                                                        "' ", why));
    };
    const nlohmann::json c = nlohmann::json::parse(v.constexprs_json, nullptr, false);
    const std::optional<int64_t> split = IntConstexpr(c, "SPLIT");
    if (!split || *split < 1) return fail("needs an integer SPLIT >= 1");
    if (*split == 1) continue;
    const std::optional<int64_t> block_m = IntConstexpr(c, "BLOCK_M"),
                                 block_n = IntConstexpr(c, "BLOCK_N");
    if (*split > kMaxProjSplits || !block_m || *block_m < kProjSplitMinTileRows || !block_n ||
        *block_n < kProjSplitMinTileCols) {
      return fail(absl::StrCat("splits K in ", *split, " with BLOCK_M ", block_m.value_or(0),
                               ", BLOCK_N ", block_n.value_or(0), "; the engine's scratch holds ",
                               kMaxProjSplits, " splits of tiles of at least ",
                               kProjSplitMinTileRows, " x ", kProjSplitMinTileCols));
    }
    const std::optional<int64_t> high =
        v.bucket.size() == 1 && k.info().buckets.size() == 1
            ? k.info().buckets[0].RangeOf(static_cast<size_t>(v.bucket[0])).high
            : std::nullopt;
    if (!high || *high > kProjSplitMaxRows) {
      return fail(absl::StrCat("splits K in ", *split, " for more than ", kProjSplitMaxRows,
                               " rows; the engine's scratch holds that many"));
    }
  }
  return absl::OkStatus();
}

// The kernel `name`, checked against docs/llama.md: its parameter types, its grid
// expressions (the engine launches with them, so that step graphs pad tolerant grids),
// and, for kernels compiled per head size, HEAD_DIM == head_dim in every variant.
absl::StatusOr<Kernel> FindKernel(const Runtime& runtime, absl::string_view name,
                                  int64_t head_dim) {
  KPACK_ASSIGN_OR_RETURN(Kernel k, runtime.Find(Std(name)));
  const Signature& sig = SignatureOf(name);
  std::vector<std::string> have;
  for (size_t i = 0; i < k.num_args(); ++i) {
    have.push_back(absl::StrCat(Absl(k.arg_name(i)), " ", Absl(k.arg_type(i))));
  }
  bool same = k.num_args() == sig.types.size();
  for (size_t i = 0; same && i < k.num_args(); ++i) {
    same = Absl(k.arg_type(i)) == *(sig.types.begin() + i);
  }
  if (!same) {
    return absl::FailedPreconditionError(absl::StrCat(
        "pack ", runtime.pack().dir(), ": kernel '", name, "' takes (", absl::StrJoin(have, ", "),
        "), but docs/llama.md's takes parameters of types (", absl::StrJoin(sig.types, ", "), ")"));
  }
  if (k.info().grid.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("pack ", runtime.pack().dir(), ": kernel '", name,
                     "' has no grid expressions; the engine launches with them"));
  }
  if (name == kQkvRope || name == kAttnDecode || name == kAttnPrefill) {
    for (const VariantInfo& v : k.info().variants) {
      const std::optional<int64_t> built =
          IntConstexpr(nlohmann::json::parse(v.constexprs_json, nullptr, false), "HEAD_DIM");
      if (!built) {
        return absl::FailedPreconditionError(absl::StrCat("pack ", runtime.pack().dir(),
                                                          ": kernel '", name, "' variant '", v.name,
                                                          "' has no integer HEAD_DIM constexpr"));
      }
      if (*built != head_dim) {
        return absl::FailedPreconditionError(absl::StrCat(
            "pack ", runtime.pack().dir(), ": kernel '", name, "' variant '", v.name,
            "' is built for HEAD_DIM ", *built, ", but the checkpoint's head_dim is ", head_dim,
            " (build a pack for it)"));
      }
    }
  }
  if (name == kOProj || name == kDownProj) KPACK_RETURN_IF_ERROR(CheckSplits(runtime, name, k));
  return k;
}

int32_t I32(int64_t v) { return static_cast<int32_t>(v); }

}  // namespace

int BatchBucket(int batch) {
  for (size_t i = 0; i < kBatchBucketEdges.size(); ++i) {
    if (batch <= kBatchBucketEdges[i]) return static_cast<int>(i);
  }
  return static_cast<int>(kBatchBucketEdges.size());
}

int DecodeSplits(int batch, int num_key_value_heads) {
  const int bucket = BatchBucket(batch);
  const int edge = bucket < 4 ? kBatchBucketEdges[static_cast<size_t>(bucket)] : batch;
  const int programs = kDecodeSplitPrograms[static_cast<size_t>(bucket)];
  return std::max(1, std::min(kMaxDecodeSplits, programs / (edge * num_key_value_heads)));
}

bool ProgrammaticEdges(int batch) { return batch >= 1; }

// One batch bucket's decode step: its launches bound once, in step order, and their graph.
struct Engine::Bucket {
  int batch = 0;   // the batch size the launches hold; 0: unknown (a Set failed)
  int splits = 0;  // the S decode attention's launches hold; 0: unknown (a Set failed)
  std::vector<BoundLaunch> launches;
  std::vector<BoundLaunch*> order;
  std::vector<size_t> m_arg;
  std::vector<int> s_arg;  // Signature::s_arg of each launch
  std::optional<StepGraph> graph;  // declared after the launches: destroyed before them
};

Engine::Engine(const Runtime& runtime, const Device& device, const Model& model,
               const EngineOptions& options, KvCache kv, StepBuffers buffers, Stream stream)
    : runtime_(runtime),
      device_(device),
      model_(model),
      options_(options),
      nvtx_(options.nvtx),
      kv_(std::move(kv)),
      buffers_(std::move(buffers)),
      sequences_(options.max_batch, options.capacity),
      stream_(std::move(stream)) {}

Engine::~Engine() {
  if (stream_.get() != nullptr) stream_.Synchronize().IgnoreError();
}

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(const Runtime& runtime, const Device& device,
                                                       const Model& model,
                                                       const EngineOptions& options) {
  const LlamaConfig& c = model.config();
  // Decode attention's grid holds the batch along z, which the driver caps at 65535.
  if (options.max_batch > kMaxBatch) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a batch of up to ", options.max_batch, " rows: decode attention's grid holds the "
        "batch along z, which the driver limits to ", kMaxBatch));
  }
  if (options.max_prompt > options.capacity) {
    return absl::InvalidArgumentError(absl::StrCat("prompts of up to ", options.max_prompt,
                                                   " tokens do not fit a KV capacity of ",
                                                   options.capacity, " positions"));
  }
  Kernels k;
  KPACK_ASSIGN_OR_RETURN(k.embed, FindKernel(runtime, kEmbed, c.head_dim));
  KPACK_ASSIGN_OR_RETURN(k.rmsnorm, FindKernel(runtime, kRmsNorm, c.head_dim));
  KPACK_ASSIGN_OR_RETURN(k.qkv_rope, FindKernel(runtime, kQkvRope, c.head_dim));
  KPACK_ASSIGN_OR_RETURN(k.attn_decode, FindKernel(runtime, kAttnDecode, c.head_dim));
  KPACK_ASSIGN_OR_RETURN(k.attn_prefill, FindKernel(runtime, kAttnPrefill, c.head_dim));
  KPACK_ASSIGN_OR_RETURN(k.o_proj, FindKernel(runtime, kOProj, c.head_dim));
  KPACK_ASSIGN_OR_RETURN(k.gate_up, FindKernel(runtime, kGateUp, c.head_dim));
  KPACK_ASSIGN_OR_RETURN(k.down_proj, FindKernel(runtime, kDownProj, c.head_dim));
  KPACK_ASSIGN_OR_RETURN(k.lm_head, FindKernel(runtime, kLmHead, c.head_dim));

  KPACK_ASSIGN_OR_RETURN(KvCache kv,
                         KvCache::Allocate(device, c, options.max_batch, options.capacity));
  KPACK_ASSIGN_OR_RETURN(
      StepBuffers buffers,
      StepBuffers::Allocate(device, c,
                            {.max_batch = options.max_batch, .max_prompt = options.max_prompt}));
  KPACK_ASSIGN_OR_RETURN(Stream stream, Stream::Create(device));
  std::unique_ptr<Engine> e(new Engine(runtime, device, model, options, std::move(kv),
                                       std::move(buffers), std::move(stream)));
  e->kernels_ = k;

  const size_t batch = static_cast<size_t>(options.max_batch);
  KPACK_ASSIGN_OR_RETURN(
      e->prompt_staging_,
      PinnedBuffer::Allocate(device, batch * static_cast<size_t>(options.max_prompt) * 4,
                             "staging prompts"));
  KPACK_ASSIGN_OR_RETURN(e->pos_staging_,
                         PinnedBuffer::Allocate(device, batch * 4, "staging positions"));
  for (size_t i = 0; i < batch; ++i) {
    KPACK_ASSIGN_OR_RETURN(Event event, Event::Create(device));
    e->staged_.push_back(std::move(event));
  }
  e->staged_pending_.assign(batch, false);
  for (int slot = 0; slot < 2; ++slot) {
    KPACK_ASSIGN_OR_RETURN(e->readback_tokens_[slot],
                           PinnedBuffer::Allocate(device, batch * 4, "reading tokens back"));
    if (options.read_logits) {
      KPACK_ASSIGN_OR_RETURN(
          e->readback_logits_[slot],
          PinnedBuffer::Allocate(device, batch * static_cast<size_t>(c.vocab_size) * 4,
                                 "reading logits back"));
    }
    KPACK_ASSIGN_OR_RETURN(e->readback_ready_[slot], Event::Create(device));
  }
  return e;
}

int Engine::launches_per_step(int batch) const {
  // Above one row, llama_rmsnorm before QKV, gate/up (each layer) and the LM head.
  const int64_t layers = model_.config().num_hidden_layers;
  return static_cast<int>(batch > 1 ? 7 * layers + 3 : 5 * layers + 2);
}

absl::StatusOr<std::unique_ptr<Engine::Bucket>> Engine::Bind(int bucket, int batch) {
  NvtxRange range(nvtx_, Nvtx::kBind, bucket);
  const LlamaConfig& c = model_.config();
  const StepBuffers& b = buffers_;
  const CUstream s = stream_.get();
  auto bk = std::make_unique<Bucket>();
  bk->batch = batch;
  bk->splits = DecodeSplits(batch, I32(c.num_key_value_heads));
  bk->launches.reserve(static_cast<size_t>(launches_per_step(batch)));
  const int32_t m = batch, h = I32(c.hidden_size), nh = I32(c.num_attention_heads),
                nkv = I32(c.num_key_value_heads), cap = kv_.capacity(),
                inter = I32(c.intermediate_size), v = I32(c.vocab_size), qd = I32(c.q_rows());
  const double eps = c.rms_norm_eps;
  const double sm_scale = 1.0 / std::sqrt(static_cast<double>(c.head_dim));
  auto add = [&](absl::string_view kernel, absl::StatusOr<BoundLaunch> bound) -> absl::Status {
    if (!bound.ok()) return bound.status();
    bk->launches.push_back(*std::move(bound));
    bk->m_arg.push_back(SignatureOf(kernel).m_arg);
    bk->s_arg.push_back(SignatureOf(kernel).s_arg);
    return absl::OkStatus();
  };
  const Kernels& k = kernels_;
  // Above one row the projections read llama_rmsnorm's rows (docs/llama.md). A bucket's
  // batches are all one row (bucket 0) or all more.
  const bool prenorm = batch > 1;
  auto norm = [&](CUdeviceptr norm_w) -> absl::Status {
    if (!prenorm) return absl::OkStatus();
    return add(kRmsNorm, k.rmsnorm.BindArgs(s, b.h(), norm_w, b.xn(), m, h, eps));
  };
  KPACK_RETURN_IF_ERROR(add(kEmbed, k.embed.BindArgs(s, b.tokens(), model_.embed(), b.h(), m, h)));
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const LayerWeights& w = model_.layer(l);
    KPACK_RETURN_IF_ERROR(norm(w.ln1));
    KPACK_RETURN_IF_ERROR(
        add(kQkvRope,
            k.qkv_rope.BindArgs(s, b.h(), b.xn(), w.ln1, w.wqkv, model_.inv_freq(), b.pos(),
                                b.seq(), b.q(), kv_.k(l), kv_.v(l), m, h, nh, nkv, cap, eps)));
    KPACK_RETURN_IF_ERROR(
        add(kAttnDecode, k.attn_decode.BindArgs(s, b.q(), kv_.k(l), kv_.v(l), b.pos(), b.seq(),
                                                b.o_part(), b.ml_part(), b.attn_counters(),
                                                b.attn(), m, nh, nkv, cap, bk->splits, sm_scale)));
    KPACK_RETURN_IF_ERROR(add(kOProj, k.o_proj.BindArgs(s, b.attn(), w.wo, b.h(), b.proj_part(),
                                                        b.proj_counters(), m, h, qd)));
    KPACK_RETURN_IF_ERROR(norm(w.ln2));
    KPACK_RETURN_IF_ERROR(add(
        kGateUp, k.gate_up.BindArgs(s, b.h(), b.xn(), w.ln2, w.wgu, b.act(), m, h, inter, eps)));
    KPACK_RETURN_IF_ERROR(
        add(kDownProj, k.down_proj.BindArgs(s, b.act(), w.wd, b.h(), b.proj_part(),
                                            b.proj_counters(), m, h, inter)));
  }
  KPACK_RETURN_IF_ERROR(norm(model_.norm_f()));
  KPACK_RETURN_IF_ERROR(
      add(kLmHead, k.lm_head.BindArgs(s, b.h(), b.xn(), model_.norm_f(), model_.lm_head(),
                                      b.logits(), b.part_max(), b.part_idx(), b.lm_counters(),
                                      b.tokens(), b.pos(), m, v, h, eps, int32_t{1},
                                      KeepLogits())));
  for (BoundLaunch& launch : bk->launches) bk->order.push_back(&launch);
  ++stats_.buckets_bound;
  return bk;
}

absl::StatusOr<Engine::Bucket*> Engine::BucketFor(int batch) {
  std::unique_ptr<Bucket>& slot = buckets_[static_cast<size_t>(BatchBucket(batch))];
  if (slot == nullptr) {
    KPACK_ASSIGN_OR_RETURN(slot, Bind(BatchBucket(batch), batch));
  }
  return slot.get();
}

absl::Status Engine::SyntheticContext(int rows, int context, uint64_t seed, bool fill_cache) {
  const LlamaConfig& c = model_.config();
  if (rows < 1 || rows > options_.max_batch) {
    return absl::InvalidArgumentError(absl::StrCat(
        "synthetic context for ", rows, " rows: the engine has rows 1..", options_.max_batch));
  }
  if (context < 1 || context >= kv_.capacity()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "synthetic context of ", context, " positions: the KV capacity is ", kv_.capacity(),
        " (it must leave room "
        "for the decoded tokens)"));
  }
  KPACK_RETURN_IF_ERROR(Synchronize());
  uint64_t state = seed * 0x9e3779b97f4a7c15ull + 0x2545f4914f6cdd1dull;
  auto next = [&state] {  // xorshift64*
    state ^= state >> 12;
    state ^= state << 25;
    state ^= state >> 27;
    return state * 0x2545f4914f6cdd1dull;
  };
  // The tokens first: they must not depend on whether the cache is filled this time.
  std::vector<int32_t> tokens(static_cast<size_t>(rows)), pos(static_cast<size_t>(rows), context);
  for (int32_t& t : tokens) t = static_cast<int32_t>(next() % static_cast<uint64_t>(c.vocab_size));
  const internal::Driver& cu = device_.driver();
  if (fill_cache) {
    // One block of random bf16 values, copied over the rows' slots of every layer (slots
    // 0..rows-1 of a layer are contiguous).
    std::vector<uint16_t> block(size_t{4} << 20);
    for (uint16_t& value : block) {
      const float u = static_cast<float>(next() >> 40) * (2.0f / 16777216.0f) - 1.0f;
      uint32_t bits;
      std::memcpy(&bits, &u, sizeof(bits));
      value = static_cast<uint16_t>(bits >> 16);
    }
    const size_t region = static_cast<size_t>(rows) * static_cast<size_t>(kv_.capacity()) *
                          kv_.bytes_per_position_per_layer() / 2;  // K or V alone
    const size_t block_bytes = block.size() * sizeof(uint16_t);
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
      for (const CUdeviceptr base : {kv_.k(l), kv_.v(l)}) {
        for (size_t done = 0; done < region; done += block_bytes) {
          KPACK_RETURN_IF_ERROR(device_.Check(
              cu.MemcpyHtoD(base + done, block.data(), std::min(block_bytes, region - done)),
              "filling the KV cache with a synthetic context"));
        }
      }
    }
  }
  const StepBuffers& b = buffers_;
  KPACK_RETURN_IF_ERROR(device_.Check(cu.MemcpyHtoD(b.tokens(), tokens.data(), tokens.size() * 4),
                                      "setting synthetic tokens"));
  KPACK_RETURN_IF_ERROR(device_.Check(cu.MemcpyHtoD(b.pos(), pos.data(), pos.size() * 4),
                                      "setting synthetic positions"));
  for (int row = 0; row < rows; ++row) KPACK_RETURN_IF_ERROR(sequences_.Begin(row, context));
  return absl::OkStatus();
}

absl::Status Engine::Prefill(int row, std::span<const int32_t> prompt) {
  NvtxRange range(nvtx_, Nvtx::kPrefill, row);
  const LlamaConfig& c = model_.config();
  const int64_t m64 = static_cast<int64_t>(prompt.size());
  if (row < 0 || row >= options_.max_batch) {
    return absl::InvalidArgumentError(
        absl::StrCat("prefill of row ", row, ": the engine has rows 0..", options_.max_batch - 1));
  }
  if (m64 > options_.max_prompt) {
    return absl::InvalidArgumentError(absl::StrCat("prefill of row ", row, ": a prompt of ", m64,
                                                   " tokens; the engine takes up to ",
                                                   options_.max_prompt));
  }
  for (size_t i = 0; i < prompt.size(); ++i) {
    if (prompt[i] < 0 || prompt[i] >= c.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("prefill of row ", row, ": prompt token ", i,
                                                     " is ", prompt[i],
                                                     ", outside the vocabulary of ", c.vocab_size));
    }
  }
  // Slot `row` starts over (the checks of an empty or too long prompt are its).
  KPACK_RETURN_IF_ERROR(sequences_.Begin(row, static_cast<int>(m64)));
  const int32_t m = static_cast<int32_t>(m64);

  // The row's staging region may still feed a copy of its previous prefill.
  const size_t r = static_cast<size_t>(row);
  if (staged_pending_[r]) {
    KPACK_RETURN_IF_ERROR(staged_[r].Synchronize());
    staged_pending_[r] = false;
  }
  int32_t* staged_prompt =
      prompt_staging_.as<int32_t>() + r * static_cast<size_t>(options_.max_prompt);
  std::memcpy(staged_prompt, prompt.data(), prompt.size() * sizeof(int32_t));
  pos_staging_.as<int32_t>()[r] = m;
  const internal::Driver& cu = device_.driver();
  const CUstream s = stream_.get();
  const StepBuffers& b = buffers_;
  KPACK_RETURN_IF_ERROR(device_.Check(
      cu.MemcpyHtoDAsync(b.prefill_tokens(), staged_prompt, prompt.size() * sizeof(int32_t), s),
      "copying a prompt to the device"));
  KPACK_RETURN_IF_ERROR(device_.Check(
      cu.MemcpyHtoDAsync(b.pos() + r * 4, pos_staging_.as<int32_t>() + r, sizeof(int32_t), s),
      "setting a decode row's position"));
  KPACK_RETURN_IF_ERROR(staged_[r].Record(s));
  staged_pending_[r] = true;

  const int32_t h = I32(c.hidden_size), nh = I32(c.num_attention_heads),
                nkv = I32(c.num_key_value_heads), cap = kv_.capacity(),
                inter = I32(c.intermediate_size), v = I32(c.vocab_size), qd = I32(c.q_rows());
  const double eps = c.rms_norm_eps;
  const double sm_scale = 1.0 / std::sqrt(static_cast<double>(c.head_dim));
  const CUdeviceptr pos = b.prefill_pos(), seq = b.prefill_seq(row);
  const Kernels& k = kernels_;
  auto norm = [&](CUdeviceptr norm_w) -> absl::Status {
    if (m == 1) return absl::OkStatus();  // one row: the projections normalize it
    return k.rmsnorm.Launch(s, b.h(), norm_w, b.xn(), m, h, eps);
  };
  KPACK_RETURN_IF_ERROR(k.embed.Launch(s, b.prefill_tokens(), model_.embed(), b.h(), m, h));
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const LayerWeights& w = model_.layer(l);
    KPACK_RETURN_IF_ERROR(norm(w.ln1));
    KPACK_RETURN_IF_ERROR(k.qkv_rope.Launch(s, b.h(), b.xn(), w.ln1, w.wqkv, model_.inv_freq(), pos,
                                            seq, b.q(), kv_.k(l), kv_.v(l), m, h, nh, nkv, cap,
                                            eps));
    KPACK_RETURN_IF_ERROR(k.attn_prefill.Launch(s, b.q(), kv_.k(l), kv_.v(l), pos, seq, b.attn(), m,
                                                nh, nkv, cap, sm_scale));
    KPACK_RETURN_IF_ERROR(
        k.o_proj.Launch(s, b.attn(), w.wo, b.h(), b.proj_part(), b.proj_counters(), m, h, qd));
    KPACK_RETURN_IF_ERROR(norm(w.ln2));
    KPACK_RETURN_IF_ERROR(
        k.gate_up.Launch(s, b.h(), b.xn(), w.ln2, w.wgu, b.act(), m, h, inter, eps));
    KPACK_RETURN_IF_ERROR(k.down_proj.Launch(s, b.act(), w.wd, b.h(), b.proj_part(),
                                             b.proj_counters(), m, h, inter));
  }
  // The LM head on the last prompt row (one row: it normalizes h itself), into the
  // sequence's decode row; advance 0 (the decode row's position was set to the prompt
  // length above); the logits written only when read back.
  const size_t vocab_row = r * static_cast<size_t>(v) * 4;
  KPACK_RETURN_IF_ERROR(
      k.lm_head.Launch(s, b.h() + static_cast<size_t>(m - 1) * static_cast<size_t>(h) * 4, b.xn(),
                       model_.norm_f(), model_.lm_head(), b.logits() + vocab_row,
                       b.part_max() + vocab_row, b.part_idx() + vocab_row, b.lm_counters() + r * 4,
                       b.tokens() + r * 4, b.pos() + r * 4, int32_t{1}, v, h, eps, int32_t{0},
                       KeepLogits()));
  ++stats_.prefills;
  return absl::OkStatus();
}

absl::Status Engine::Decode(int batch, Mode mode) {
  NvtxRange range(nvtx_, Nvtx::kDecodeStep, static_cast<int64_t>(stats_.decode_steps));
  KPACK_RETURN_IF_ERROR(sequences_.CheckDecode(batch));
  KPACK_ASSIGN_OR_RETURN(Bucket * bk, BucketFor(batch));
  if (bk->batch != batch) {
    // M, and S where the batch changes it (above 64 rows DecodeSplits follows the batch
    // itself), as a bucket bound at this batch would hold them.
    NvtxRange set(nvtx_, Nvtx::kSetBatch, batch);
    const int splits = DecodeSplits(batch, I32(model_.config().num_key_value_heads));
    const bool new_splits = splits != bk->splits;
    bk->batch = 0;
    if (new_splits) bk->splits = 0;
    for (size_t i = 0; i < bk->launches.size(); ++i) {
      KPACK_RETURN_IF_ERROR(bk->launches[i].Set(bk->m_arg[i], int32_t{batch}));
      if (new_splits && bk->s_arg[i] >= 0) {
        KPACK_RETURN_IF_ERROR(
            bk->launches[i].Set(static_cast<size_t>(bk->s_arg[i]), int32_t{splits}));
      }
    }
    bk->batch = batch;
    bk->splits = splits;
    ++stats_.batch_sets;
  }
  if (mode == Mode::kGraph) {
    if (!bk->graph.has_value()) {
      StepGraph::Options graph_options;
      graph_options.programmatic_edges = ProgrammaticEdges(batch);
      KPACK_ASSIGN_OR_RETURN(bk->graph, StepGraph::Create(bk->order, graph_options));
    }
    NvtxRange replay(nvtx_, Nvtx::kReplay, batch);
    KPACK_RETURN_IF_ERROR(bk->graph->Replay(stream_.get()));
    last_graph_bucket_ = BatchBucket(batch);
  } else {
    NvtxRange launch(nvtx_, Nvtx::kLaunch, batch);
    for (BoundLaunch& l : bk->launches) KPACK_RETURN_IF_ERROR(l.Launch());
  }
  sequences_.Advance(batch);
  ++stats_.decode_steps;
  return absl::OkStatus();
}

absl::Status Engine::EnqueueReadback(int slot, int rows) {
  NvtxRange range(nvtx_, Nvtx::kReadback, slot);
  if ((slot != 0 && slot != 1) || rows < 1 || rows > options_.max_batch) {
    return absl::InvalidArgumentError(absl::StrCat("read-back slot ", slot, " of ", rows,
                                                   " rows: slots are 0 and 1, rows 1..",
                                                   options_.max_batch));
  }
  const internal::Driver& cu = device_.driver();
  const CUstream s = stream_.get();
  const size_t i = static_cast<size_t>(slot);
  KPACK_RETURN_IF_ERROR(
      device_.Check(cu.MemcpyDtoHAsync(readback_tokens_[i].as<int32_t>(), buffers_.tokens(),
                                       static_cast<size_t>(rows) * 4, s),
                    "reading tokens back"));
  if (options_.read_logits) {
    KPACK_RETURN_IF_ERROR(device_.Check(
        cu.MemcpyDtoHAsync(
            readback_logits_[i].as<float>(), buffers_.logits(),
            static_cast<size_t>(rows) * static_cast<size_t>(model_.config().vocab_size) * 4, s),
        "reading logits back"));
  }
  KPACK_RETURN_IF_ERROR(readback_ready_[i].Record(s));
  readback_rows_[i] = rows;
  return absl::OkStatus();
}

absl::StatusOr<Engine::Readback> Engine::WaitReadback(int slot) {
  NvtxRange range(nvtx_, Nvtx::kWait, slot);
  if (slot != 0 && slot != 1) {
    return absl::InvalidArgumentError(absl::StrCat("read-back slot ", slot, ": slots are 0 and 1"));
  }
  const size_t i = static_cast<size_t>(slot);
  if (readback_rows_[i] == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("read-back slot ", slot, " was never filled"));
  }
  KPACK_RETURN_IF_ERROR(readback_ready_[i].Synchronize());
  const size_t rows = static_cast<size_t>(readback_rows_[i]);
  Readback r;
  r.tokens = std::span<const int32_t>(readback_tokens_[i].as<int32_t>(), rows);
  if (options_.read_logits) {
    r.logits = std::span<const float>(readback_logits_[i].as<float>(),
                                      rows * static_cast<size_t>(model_.config().vocab_size));
  }
  return r;
}

absl::Status Engine::Synchronize() { return stream_.Synchronize(); }

Engine::Stats Engine::stats() const {
  Stats s = stats_;
  for (const std::unique_ptr<Bucket>& b : buckets_) {
    if (b == nullptr || !b->graph.has_value()) continue;
    const StepGraph::Stats g = b->graph->stats();
    s.graphs_built += g.graphs_built;
    s.replays += g.replays;
    s.nodes_patched += g.nodes_patched;
  }
  if (last_graph_bucket_ >= 0) {
    s.last_nodes_patched =
        buckets_[static_cast<size_t>(last_graph_bucket_)]->graph->stats().last_nodes_patched;
  }
  return s;
}

uint64_t Engine::graphs_built(int bucket) const {
  if (bucket < 0 || bucket >= kBatchBuckets) return 0;
  const std::unique_ptr<Bucket>& b = buckets_[static_cast<size_t>(bucket)];
  return b != nullptr && b->graph.has_value() ? b->graph->stats().graphs_built : 0;
}

uint64_t Engine::programmatic_edges(int bucket) const {
  if (bucket < 0 || bucket >= kBatchBuckets) return 0;
  const std::unique_ptr<Bucket>& b = buckets_[static_cast<size_t>(bucket)];
  uint64_t edges = 0;
  if (b != nullptr && b->graph.has_value()) {
    for (const StepGraph::GraphInfo& g : b->graph->graphs()) edges += g.programmatic_edges;
  }
  return edges;
}

}  // namespace kpack::llama
