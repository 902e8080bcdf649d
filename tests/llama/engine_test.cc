// The Llama engine end to end on the fake driver, every kernel emulated on the host
// (llama_emulators.h): the tiny checkpoint make_checkpoint.py wrote (ctest fixture), its
// upload, the KV cache's refusals, which step graphs get built as batch and context
// change, graph replays bit-identical to eager steps, the numpy oracle's logits
// (numpy_model.py, teacher-forced, another ctest fixture), the kpack-llama command line,
// and the engine's NVTX ranges.

#include "engine.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/str_cat.h"
#include "checkpoint.h"
#include "cli.h"
#include "device.h"
#include "fake_driver.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "harness.h"
#include "kpack/kpack.h"
#include "llama_emulators.h"
#include "model.h"
#include "npy.h"
#include "nvtx_inject/nvtx_inject.h"
#include "rope.h"
#include "run.h"
#include "test_files.h"

namespace kpack::llama {
namespace {

using ::kpack::llama::testing::CompareWithOracle;
using ::kpack::llama::testing::EmulatedLaunches;
using ::kpack::llama::testing::ExpectGraphEqualsEager;
using ::kpack::llama::testing::ExpectMatchesOracle;
using ::kpack::llama::testing::InstallLlamaEmulators;
using ::kpack::llama::testing::OracleComparison;
using ::kpack::llama::testing::Rig;
using ::kpack::llama::testing::TakeEmulatorErrors;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

#define LL_ASSERT_OK(expr)                       \
  do {                                           \
    const absl::Status s_ = (expr);              \
    ASSERT_TRUE(s_.ok()) << #expr << ": " << s_; \
  } while (0)

// The tiny preset's shape (ENGINE_IFACE.md).
constexpr int kLayers = 2, kVocab = 1000;
// Launches of a decode step: 5 per layer + 2 at one row; above one row also llama_rmsnorm
// before each layer's QKV and gate/up and before the LM head (docs/llama.md).
constexpr int LaunchesPerStep(int batch) {
  return batch > 1 ? 7 * kLayers + 3 : 5 * kLayers + 2;
}
// A prefill of more than one token: its rows normalized before QKV and gate/up; the LM
// head runs on the last row alone.
constexpr int kPrefillLaunches = 7 * kLayers + 2;
const std::vector<int> kPromptLens = {5, 9, 3};

std::vector<int32_t> Prompt(int row, int len, int seed = 0) {
  std::vector<int32_t> p;
  for (int i = 0; i < len; ++i) p.push_back(PromptToken(row, i, seed, kVocab));
  return p;
}

template <typename T>
std::vector<T> DeviceRead(const Device& device, CUdeviceptr p, size_t count) {
  std::vector<T> out(count);
  EXPECT_EQ(device.driver().MemcpyDtoH(out.data(), p, count * sizeof(T)), CUDA_SUCCESS);
  return out;
}

class LlamaEngineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    fake::Reset();
    absl::StatusOr<Rig> rig =
        Rig::Open(KPACK_FAKE_DRIVER, KPACK_LLAMA_PACK_DIR, KPACK_LLAMA_TINY_DIR);
    ASSERT_TRUE(rig.ok()) << rig.status();
    rig_ = *std::move(rig);
    device_ = rig_.device.get();
    checkpoint_ = rig_.checkpoint.get();
    model_ = rig_.model.get();
    LL_ASSERT_OK(InstallLlamaEmulators(rig_.runtime->pack(), 64));
  }

  void TearDown() override {
    engine_.reset();
    EXPECT_THAT(TakeEmulatorErrors(), IsEmpty());
    EXPECT_THAT(fake::Faults(), IsEmpty());
  }

  Engine& MakeEngine(int max_batch, int capacity = 64, bool read_logits = true,
                     int max_prompt = 9) {
    engine_.reset();
    absl::StatusOr<std::unique_ptr<Engine>> engine =
        rig_.MakeEngine(max_batch, max_prompt, capacity, read_logits);
    EXPECT_TRUE(engine.ok()) << engine.status();
    if (!engine.ok()) std::abort();
    engine_ = *std::move(engine);
    return *engine_;
  }

  void PrefillRows(int batch) {
    for (int b = 0; b < batch; ++b) {
      const int len = kPromptLens[static_cast<size_t>(b) % kPromptLens.size()];
      LL_ASSERT_OK(engine_->Prefill(b, Prompt(b, len)));
    }
  }

  Rig rig_;
  const Device* device_ = nullptr;
  const Checkpoint* checkpoint_ = nullptr;
  const Model* model_ = nullptr;
  std::unique_ptr<Engine> engine_;
};

TEST_F(LlamaEngineTest, TinyCheckpointLoads) {
  const LlamaConfig& c = checkpoint_->config();
  EXPECT_EQ(c.hidden_size, 256);
  EXPECT_EQ(c.num_hidden_layers, kLayers);
  EXPECT_EQ(c.num_attention_heads, 4);
  EXPECT_EQ(c.num_key_value_heads, 2);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.intermediate_size, 512);
  EXPECT_EQ(c.vocab_size, kVocab);
  EXPECT_TRUE(c.tie_word_embeddings);
  ASSERT_TRUE(c.rope_scaling.has_value());
  EXPECT_EQ(c.rope_scaling->factor, 32);
  EXPECT_THAT(checkpoint_->warnings(), IsEmpty());
}

// docs/llama.md's layout: wqkv = q|k|v rows, wgu = gate|up rows, the LM head the tied
// embedding, inv_freq the same bits as the Python engine's (config.rope_inv_freq).
TEST_F(LlamaEngineTest, WeightsUploadInTheContractLayout) {
  const Model& m = *model_;
  auto bytes = [&](CUdeviceptr p, size_t n) { return DeviceRead<std::byte>(*device_, p, n); };
  auto concat = [&](std::initializer_list<std::string> names) {
    std::vector<std::byte> out;
    for (const std::string& n : names) {
      const std::span<const std::byte> b = checkpoint_->Bytes(n);
      out.insert(out.end(), b.begin(), b.end());
    }
    return out;
  };
  for (int l = 0; l < kLayers; ++l) {
    const std::vector<std::byte> qkv =
        concat({LayerTensorName(l, "self_attn.q_proj"), LayerTensorName(l, "self_attn.k_proj"),
                LayerTensorName(l, "self_attn.v_proj")});
    EXPECT_EQ(bytes(m.layer(l).wqkv, qkv.size()), qkv) << l;
    const std::vector<std::byte> gu =
        concat({LayerTensorName(l, "mlp.gate_proj"), LayerTensorName(l, "mlp.up_proj")});
    EXPECT_EQ(bytes(m.layer(l).wgu, gu.size()), gu) << l;
    const std::vector<std::byte> wd = concat({LayerTensorName(l, "mlp.down_proj")});
    EXPECT_EQ(bytes(m.layer(l).wd, wd.size()), wd) << l;
    const std::vector<std::byte> ln2 = concat({LayerTensorName(l, "post_attention_layernorm")});
    EXPECT_EQ(bytes(m.layer(l).ln2, ln2.size()), ln2) << l;
  }
  EXPECT_EQ(m.lm_head(), m.embed());
  const std::vector<std::byte> embed = concat({"model.embed_tokens.weight"});
  EXPECT_EQ(bytes(m.embed(), embed.size()), embed);

  const std::vector<float> inv_freq = DeviceRead<float>(*device_, m.inv_freq(), 32);
  EXPECT_EQ(inv_freq, RopeInvFreq(checkpoint_->config()));
  absl::StatusOr<cli::NpyArray> python = cli::ReadNpy(KPACK_LLAMA_INV_FREQ);
  ASSERT_TRUE(python.ok()) << python.status();
  ASSERT_EQ(python->dtype, "<f4");
  ASSERT_EQ(python->data.size(), 32 * sizeof(float));
  EXPECT_EQ(std::memcmp(python->data.data(), inv_freq.data(), 32 * sizeof(float)), 0)
      << "C++ and Python inv_freq differ in their bits";
}

TEST_F(LlamaEngineTest, KvCacheLayout) {
  Engine& e = MakeEngine(3, /*capacity=*/40);
  const KvCache& kv = e.kv_cache();
  const size_t layer = size_t{3} * 2 * 40 * 64 * 2;  // seqs x NKV x CAP x D x bf16
  EXPECT_EQ(kv.k(1) - kv.k(0), layer);
  EXPECT_EQ(kv.v(1) - kv.v(0), layer);
  EXPECT_EQ(kv.total_bytes(), 2 * kLayers * layer);
  EXPECT_EQ(kv.bytes_per_position_per_layer(), size_t{2} * 2 * 64 * 2);
  EXPECT_EQ(kv.capacity(), 40);
  EXPECT_EQ(kv.max_seqs(), 3);
}

TEST_F(LlamaEngineTest, DecodeRefusesToStepPastTheCapacity) {
  Engine& e = MakeEngine(1, /*capacity=*/8, true, /*max_prompt=*/5);
  LL_ASSERT_OK(e.Prefill(0, Prompt(0, 5)));
  for (int step = 0; step < 3; ++step) LL_ASSERT_OK(e.Decode(1, Engine::Mode::kGraph));
  EXPECT_EQ(e.sequences().position(0), 8);
  const int64_t launches = fake::LaunchCount();
  const absl::Status s = e.Decode(1, Engine::Mode::kGraph);
  EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(s.message(), HasSubstr("decode row 0: sequence slot 0 is at position 8, and the KV "
                                     "cache holds 8 positions per sequence"));
  EXPECT_EQ(fake::LaunchCount(), launches) << "a refused step launched something";
  EXPECT_EQ(e.Decode(1, Engine::Mode::kEager).code(), absl::StatusCode::kOutOfRange);
  // The device positions advanced with the host's: 8 after three steps from a 5-token prompt.
  EXPECT_EQ(DeviceRead<int32_t>(*device_, e.buffers().pos(), 1)[0], 8);
  // A new prompt frees the slot.
  LL_ASSERT_OK(e.Prefill(0, Prompt(0, 2)));
  LL_ASSERT_OK(e.Decode(1, Engine::Mode::kEager));
}

// The benchmark's way to a long context: rows start at `context` over a random cache,
// graph and eager steps then agree with each other from there, and the bounds are checked.
TEST_F(LlamaEngineTest, SyntheticContextStartsRowsAtAPositionOverARandomCache) {
  Engine& e = MakeEngine(3, /*capacity=*/40);
  EXPECT_EQ(e.SyntheticContext(0, 8, 1, true).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(e.SyntheticContext(4, 8, 1, true).code(), absl::StatusCode::kInvalidArgument);
  const absl::Status full = e.SyntheticContext(2, 40, 1, true);
  EXPECT_EQ(full.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(full.message(), HasSubstr("the KV capacity is 40"));

  LL_ASSERT_OK(e.SyntheticContext(2, 30, 7, true));
  EXPECT_EQ(e.sequences().position(0), 30);
  EXPECT_EQ(e.sequences().position(1), 30);
  EXPECT_FALSE(e.sequences().active(2));
  EXPECT_EQ(DeviceRead<int32_t>(*device_, e.buffers().pos(), 2), (std::vector<int32_t>{30, 30}));
  // Row 1's slot of layer 0 holds random values, not zeros, in K and in V.
  const size_t slot_values = static_cast<size_t>(e.kv_cache().capacity()) *
                             e.kv_cache().bytes_per_position_per_layer() / 4;
  for (const CUdeviceptr base : {e.kv_cache().k(0), e.kv_cache().v(0)}) {
    const std::vector<uint16_t> values =
        DeviceRead<uint16_t>(*device_, base + slot_values * 2, slot_values);
    const auto zeros = std::count(values.begin(), values.end(), uint16_t{0});
    EXPECT_LT(zeros, static_cast<int64_t>(values.size() / 100));
  }
  // The same rows decoded eagerly and through the graph, from the same synthetic start.
  std::vector<std::vector<int32_t>> tokens;
  for (const Engine::Mode mode : {Engine::Mode::kEager, Engine::Mode::kGraph}) {
    LL_ASSERT_OK(e.SyntheticContext(2, 30, 7, /*fill_cache=*/false));
    for (int step = 0; step < 4; ++step) LL_ASSERT_OK(e.Decode(2, mode));
    LL_ASSERT_OK(e.Synchronize());
    tokens.push_back(DeviceRead<int32_t>(*device_, e.buffers().tokens(), 2));
    EXPECT_EQ(e.sequences().position(1), 34);
  }
  EXPECT_EQ(tokens[0], tokens[1]);
  // The start tokens follow from the seed alone, whether or not the cache is filled again:
  // the benchmark fills it once and compares every sequence with the first.
  LL_ASSERT_OK(e.SyntheticContext(2, 30, 7, /*fill_cache=*/true));
  const std::vector<int32_t> filled = DeviceRead<int32_t>(*device_, e.buffers().tokens(), 2);
  LL_ASSERT_OK(e.SyntheticContext(2, 30, 7, /*fill_cache=*/false));
  EXPECT_EQ(DeviceRead<int32_t>(*device_, e.buffers().tokens(), 2), filled);
  RunOptions run;
  run.batch = 2;
  run.steps = 3;
  run.context = 30;
  run.warmup_seqs = 1;
  run.timed_seqs = 2;
  const absl::StatusOr<RunResult> repeated = RunSequences(e, run);
  EXPECT_TRUE(repeated.ok()) << repeated.status();
  // The steps write positions 30 .. 39: they fill the 40 positions exactly; one more does
  // not fit.
  run.steps = 10;
  const absl::StatusOr<RunResult> filled_up = RunSequences(e, run);
  EXPECT_TRUE(filled_up.ok()) << filled_up.status();
  EXPECT_EQ(e.sequences().position(0), 40);
  run.steps = 11;
  const absl::StatusOr<RunResult> over = RunSequences(e, run);
  EXPECT_EQ(over.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(over.status().message(),
              HasSubstr("a context of 30 positions and 11 decode steps need 41 KV positions "
                        "per sequence; the capacity is 40"));
}

// docs/llama.md: decode attention splits a row's context only beyond 4 KV tiles, then
// over cdiv(tiles, cdiv(tiles, S)) splits (S = 32 here), whose partials the last one
// combines; below, split 0 writes out alone. At context 600 (10 tiles of 64; 19 of 32, 5
// of 128, whatever the pack's BLOCK_N) the partials are a prefix of the S slots, and graph
// and eager steps agree through the combine.
TEST_F(LlamaEngineTest, LongContextsSplitTheAttention) {
  Engine& e = MakeEngine(1, /*capacity=*/640, /*read_logits=*/false);
  const int64_t nh = checkpoint_->config().num_attention_heads, splits = 32;
  ASSERT_EQ(DecodeSplits(1, static_cast<int>(checkpoint_->config().num_key_value_heads)), splits);
  auto sums = [&] {  // ml_part's sums of row 0, head 0: [(m·NH + head)·S + s]·2 + 1
    std::vector<float> ml = DeviceRead<float>(*device_, e.buffers().ml_part(),
                                              static_cast<size_t>(nh * splits * 2));
    std::vector<float> out;
    for (int64_t s = 0; s < splits; ++s) out.push_back(ml[static_cast<size_t>(s * 2 + 1)]);
    return out;
  };
  LL_ASSERT_OK(e.SyntheticContext(1, 30, 3, /*fill_cache=*/true));
  LL_ASSERT_OK(e.Decode(1, Engine::Mode::kEager));
  LL_ASSERT_OK(e.Synchronize());
  EXPECT_THAT(sums(), ::testing::Each(0.0f)) << "a 31-position context wrote partials";

  std::vector<std::vector<int32_t>> tokens;
  for (const Engine::Mode mode : {Engine::Mode::kEager, Engine::Mode::kGraph}) {
    LL_ASSERT_OK(e.SyntheticContext(1, 600, 3, /*fill_cache=*/mode == Engine::Mode::kEager));
    for (int step = 0; step < 3; ++step) LL_ASSERT_OK(e.Decode(1, mode));
    LL_ASSERT_OK(e.Synchronize());
    tokens.push_back(DeviceRead<int32_t>(*device_, e.buffers().tokens(), 1));
  }
  EXPECT_EQ(tokens[0], tokens[1]);
  const std::vector<float> s = sums();
  const auto used = std::find(s.begin(), s.end(), 0.0f) - s.begin();
  EXPECT_THAT(used, ::testing::AnyOf(19, 10, 5));
  for (auto i = used; i < splits; ++i) EXPECT_EQ(s[static_cast<size_t>(i)], 0.0f) << i;
}

// Above 64 rows decode attention's S follows the batch itself (DecodeSplits): a bucket
// bound at one batch and stepped at another launches the S a bucket bound at that batch
// would (the tiny model's 2 KV heads: 3 splits at 65 rows, 2 at 100), eager and replayed.
TEST_F(LlamaEngineTest, SplitsFollowTheBatchInsideABucket) {
  Engine& e = MakeEngine(100, /*capacity=*/64, /*read_logits=*/false);
  const int nkv = static_cast<int>(checkpoint_->config().num_key_value_heads);
  ASSERT_EQ(BatchBucket(65), BatchBucket(100));
  ASSERT_EQ(DecodeSplits(65, nkv), 3);
  ASSERT_EQ(DecodeSplits(100, nkv), 2);
  auto last_attention_grid = [] {  // (S, NKV, M) of the last decode attention launched
    for (int64_t i = fake::LaunchCount() - 1; i >= 0; --i) {
      const fake::LaunchRecord r = fake::GetLaunch(i);
      if (std::string_view(r.entry.data()) == "llama_attn_decode") return r.grid;
    }
    return std::array<unsigned, 3>{};
  };
  for (const Engine::Mode mode : {Engine::Mode::kEager, Engine::Mode::kGraph}) {
    LL_ASSERT_OK(e.SyntheticContext(100, 30, 5, /*fill_cache=*/true));
    for (const int batch : {65, 100, 65}) {
      LL_ASSERT_OK(e.Decode(batch, mode));
      LL_ASSERT_OK(e.Synchronize());
      // A replay's grid covers the bucket's largest batch on its M axis (the kernels
      // check M themselves: grid tolerance); S and NKV are the batch's.
      const std::array<unsigned, 3> grid = last_attention_grid();
      EXPECT_EQ(grid[0], static_cast<unsigned>(DecodeSplits(batch, nkv)))
          << "batch " << batch << (mode == Engine::Mode::kGraph ? ", replayed" : ", eager");
      EXPECT_EQ(grid[1], static_cast<unsigned>(nkv));
      const int rows = mode == Engine::Mode::kGraph
                           ? kBatchBucketEdges[static_cast<size_t>(BatchBucket(batch))]
                           : batch;
      EXPECT_EQ(grid[2], static_cast<unsigned>(rows));
    }
  }
}

TEST_F(LlamaEngineTest, DecodeRefusesRowsWithoutASequence) {
  Engine& e = MakeEngine(3);
  LL_ASSERT_OK(e.Prefill(0, Prompt(0, 4)));
  const absl::Status s = e.Decode(2, Engine::Mode::kGraph);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("decode row 1: sequence slot 1 holds no sequence"));
  EXPECT_EQ(e.Decode(4, Engine::Mode::kEager).code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(LlamaEngineTest, PrefillRefusesBadPrompts) {
  Engine& e = MakeEngine(2, /*capacity=*/8, true, /*max_prompt=*/6);
  EXPECT_THAT(e.Prefill(2, Prompt(0, 3)).message(),
              HasSubstr("prefill of row 2: the engine has rows 0..1"));
  EXPECT_THAT(e.Prefill(0, Prompt(0, 7)).message(),
              HasSubstr("a prompt of 7 tokens; the engine takes up to 6"));
  EXPECT_THAT(e.Prefill(0, {}).message(), HasSubstr("a prompt of 0 tokens"));
  std::vector<int32_t> bad = Prompt(0, 3);
  bad[1] = kVocab;
  EXPECT_THAT(e.Prefill(0, bad).message(),
              HasSubstr("prompt token 1 is 1000, outside the vocabulary of 1000"));
  EXPECT_EQ(e.stats().prefills, 0u);
  EXPECT_EQ(fake::LaunchCount(), 0);
}

// The o and down projections' split-K variants must fit the scratch StepBuffers sizes:
// a pack edited to split K too often, in too narrow tiles, for more than 64 rows, or in
// fewer than one part is refused, naming the variant.
TEST_F(LlamaEngineTest, EngineRefusesSplitKBeyondItsScratch) {
  struct Case {
    const char* variant;
    int64_t split;
    int64_t block_m;
    const char* message;
  };
  const Case cases[] = {
      {"b4_aligned", 2, 64, "variant 'b4_aligned' splits K in 2 for more than 64 rows"},
      {"b1_aligned", 16, 16, "variant 'b1_aligned' splits K in 16 with BLOCK_M 16"},
      {"b2_generic", 4, 4, "variant 'b2_generic' splits K in 4 with BLOCK_M 4"},
      {"b0_aligned", 0, 1, "variant 'b0_aligned' needs an integer SPLIT >= 1"},
  };
  const std::filesystem::path pack = KPACK_LLAMA_PACK_DIR;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.variant);
    testing::TempDir dir;
    std::filesystem::copy(pack / "cubins", dir.path() / "cubins",
                          std::filesystem::copy_options::recursive);
    std::ifstream in(pack / "manifest.json");
    nlohmann::json manifest = nlohmann::json::parse(in);
    for (nlohmann::json& kernel : manifest["kernels"]) {
      if (kernel["name"] != "llama_down_proj") continue;
      for (nlohmann::json& v : kernel["variants"]) {
        if (v["name"] != c.variant) continue;
        v["constexprs"]["SPLIT"] = c.split;
        v["constexprs"]["BLOCK_M"] = c.block_m;
      }
    }
    testing::WriteFile(dir.file("manifest.json"), manifest.dump());
    Options options;
    options.driver_path = KPACK_FAKE_DRIVER;
    absl::StatusOr<Runtime> runtime = Runtime::Open(dir.path().string(), options);
    ASSERT_TRUE(runtime.ok()) << runtime.status();
    absl::StatusOr<std::unique_ptr<Engine>> e =
        Engine::Create(*runtime, *device_, *model_, EngineOptions{});
    EXPECT_EQ(e.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(e.status().message(), HasSubstr("kernel 'llama_down_proj'"));
    EXPECT_THAT(e.status().message(), HasSubstr(c.message));
  }
}

TEST_F(LlamaEngineTest, EngineRefusesPromptsLongerThanTheCache) {
  EngineOptions o;
  o.max_prompt = 65;
  o.capacity = 64;
  absl::StatusOr<std::unique_ptr<Engine>> e = Engine::Create(*rig_.runtime, *device_, *model_, o);
  EXPECT_THAT(e.status().message(),
              HasSubstr("prompts of up to 65 tokens do not fit a KV capacity of 64 positions"));
}

// Decode attention's grid holds the batch along z: past the driver's 65535 the engine is
// refused before it allocates anything.
TEST_F(LlamaEngineTest, EngineRefusesABatchPastTheGridLimit) {
  EngineOptions o;
  o.max_batch = kMaxBatch + 1;
  o.capacity = 64;
  const int64_t allocations = fake::LiveAllocations();
  absl::StatusOr<std::unique_ptr<Engine>> e = Engine::Create(*rig_.runtime, *device_, *model_, o);
  EXPECT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(e.status().message(),
              HasSubstr("a batch of up to 65536 rows: decode attention's grid holds the batch "
                        "along z, which the driver limits to 65535"));
  EXPECT_EQ(fake::LiveAllocations(), allocations);
}

// The pack must be docs/llama.md's and built for the checkpoint's head size.
TEST_F(LlamaEngineTest, EngineRefusesAPackThatDoesNotServeTheModel) {
  testing::TempDir dir;
  testing::WriteFile(dir.file("config.json"), testing::ConfigJson(testing::MicroConfig()));
  testing::WriteFile(dir.file("model.safetensors"),
                     testing::SafetensorsOf(testing::CheckpointTensors(testing::MicroConfig())));
  absl::StatusOr<Checkpoint> micro = Checkpoint::Open(dir.path().string());
  ASSERT_TRUE(micro.ok()) << micro.status();
  absl::StatusOr<Model> model = Model::Upload(*device_, *micro);
  ASSERT_TRUE(model.ok()) << model.status();
  EngineOptions o;
  absl::StatusOr<std::unique_ptr<Engine>> e = Engine::Create(*rig_.runtime, *device_, *model, o);
  EXPECT_EQ(e.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(e.status().message(), HasSubstr("kernel 'llama_qkv_rope' variant"));
  EXPECT_THAT(e.status().message(),
              HasSubstr("is built for HEAD_DIM 64, but the checkpoint's head_dim is 4"));

  Options options;
  options.driver_path = KPACK_FAKE_DRIVER;
  absl::StatusOr<Runtime> other = Runtime::Open(KPACK_TEST_PACK_DIR, options);
  ASSERT_TRUE(other.ok()) << other.status();
  e = Engine::Create(*other, *device_, *model_, o);
  EXPECT_EQ(e.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(e.status().message(), HasSubstr("llama_embed"));
}

// docs/llama.md: S = max(1, min(S_MAX, P / (B_edge · NKV))), B_edge the bucket's upper
// edge (the batch itself above 64), P 384 at 2-4 rows and 512 otherwise; the Python
// engine's config.decode_splits agrees.
TEST(LlamaDecodeSplitsTest, FollowTheBatchBucket) {
  // Llama-3.2-1B (8 kv heads): 32, 12, 4, 1 over the buckets 1, 2-4, 5-16, 17-64.
  EXPECT_EQ(DecodeSplits(1, 8), 32);
  EXPECT_EQ(DecodeSplits(2, 8), 12);  // 384 programs at 2-4 rows
  EXPECT_EQ(DecodeSplits(4, 8), 12);
  EXPECT_EQ(DecodeSplits(5, 8), 4);
  EXPECT_EQ(DecodeSplits(17, 8), 1);
  EXPECT_EQ(DecodeSplits(64, 8), 1);
  EXPECT_EQ(DecodeSplits(3, 2), 32);   // capped at S_MAX
  EXPECT_EQ(DecodeSplits(64, 2), 4);
  EXPECT_EQ(DecodeSplits(200, 1), 2);  // above 64: the batch itself
  EXPECT_EQ(DecodeSplits(600, 1), 1);
}

// The two engines' rules agree wherever a test could reach: batches 1-300, 1-16 kv heads
// (the fixture writes the Python engine's, tiny_fixture.py).
TEST(LlamaDecodeSplitsTest, AgreeWithThePythonEngine) {
  absl::StatusOr<cli::NpyArray> python = cli::ReadNpy(KPACK_LLAMA_DECODE_SPLITS);
  ASSERT_TRUE(python.ok()) << python.status();
  ASSERT_EQ(python->dtype, "<i4");
  ASSERT_EQ(python->shape, (std::vector<int64_t>{300, 16}));
  ASSERT_EQ(python->data.size(), 300 * 16 * sizeof(int32_t));
  for (int batch = 1; batch <= 300; ++batch) {
    for (int nkv = 1; nkv <= 16; ++nkv) {
      int32_t s = 0;
      std::memcpy(&s, python->data.data() + ((batch - 1) * 16 + (nkv - 1)) * sizeof(int32_t),
                  sizeof(s));
      ASSERT_EQ(DecodeSplits(batch, nkv), s) << "batch " << batch << ", " << nkv << " kv heads";
    }
  }
}

TEST(LlamaProgrammaticEdgesTest, AtEveryBatch) {
  for (int batch : {1, 2, 4, 5, 64, 300}) EXPECT_TRUE(ProgrammaticEdges(batch)) << batch;
}

// One graph per batch bucket, built at the bucket's first graph step; nothing built or
// patched while the context grows; only the batch size patched when it changes.
TEST_F(LlamaEngineTest, OneGraphPerBatchBucketNoneAsTheContextGrows) {
  Engine& e = MakeEngine(5, /*capacity=*/128, /*read_logits=*/false);
  PrefillRows(5);
  EXPECT_EQ(e.stats().buckets_bound, 0u);
  for (int i = 0; i < 3; ++i) LL_ASSERT_OK(e.Decode(1, Engine::Mode::kGraph));
  EXPECT_EQ(e.stats().buckets_bound, 1u);
  EXPECT_EQ(e.stats().graphs_built, 1u);
  EXPECT_EQ(e.graphs_built(0), 1u);
  EXPECT_EQ(e.stats().last_nodes_patched, 0u);

  LL_ASSERT_OK(e.Decode(3, Engine::Mode::kGraph));  // bucket 2-4: bound and built
  EXPECT_EQ(e.stats().buckets_bound, 2u);
  EXPECT_EQ(e.graphs_built(1), 1u);
  const uint64_t sets = e.stats().batch_sets;
  LL_ASSERT_OK(e.Decode(2, Engine::Mode::kGraph));  // same bucket: M set on every launch
  EXPECT_EQ(e.stats().batch_sets, sets + 1);
  EXPECT_EQ(e.stats().last_nodes_patched, static_cast<uint64_t>(LaunchesPerStep(2)));
  EXPECT_EQ(e.graphs_built(1), 1u);
  LL_ASSERT_OK(e.Decode(2, Engine::Mode::kGraph));
  EXPECT_EQ(e.stats().last_nodes_patched, 0u);
  LL_ASSERT_OK(e.Decode(4, Engine::Mode::kGraph));
  EXPECT_EQ(e.graphs_built(1), 1u);
  LL_ASSERT_OK(e.Decode(5, Engine::Mode::kGraph));  // bucket 5-16
  EXPECT_EQ(e.graphs_built(2), 1u);
  EXPECT_EQ(e.stats().graphs_built, 3u);
  // PDL edges at every batch (ProgrammaticEdges): every launch of the step but the first
  // follows a node and is a PDL launch.
  EXPECT_EQ(e.programmatic_edges(0), static_cast<uint64_t>(LaunchesPerStep(1) - 1));
  EXPECT_EQ(e.programmatic_edges(1), static_cast<uint64_t>(LaunchesPerStep(4) - 1));
  EXPECT_EQ(e.programmatic_edges(2), static_cast<uint64_t>(LaunchesPerStep(5) - 1));

  // The context grows by 30 tokens in the warm buckets: nothing is built or patched.
  const int64_t graph_launches = fake::GraphLaunches();
  for (int i = 0; i < 10; ++i) {
    for (int batch : {1, 1, 1}) {
      LL_ASSERT_OK(e.Decode(batch, Engine::Mode::kGraph));
      EXPECT_EQ(e.stats().last_nodes_patched, 0u);
    }
  }
  EXPECT_EQ(e.stats().graphs_built, 3u);
  EXPECT_EQ(fake::GraphLaunches() - graph_launches, 30);
  // Patched only where the batch changed inside a bucket: 3 -> 2 and 2 -> 4.
  EXPECT_EQ(fake::NodeUpdates().size(), 2u * LaunchesPerStep(2));
  // Eager steps use the same bound launches and build nothing.
  LL_ASSERT_OK(e.Decode(4, Engine::Mode::kEager));
  EXPECT_EQ(e.stats().graphs_built, 3u);
  EXPECT_EQ(e.stats().buckets_bound, 3u);
  EXPECT_EQ(fake::LiveExecs().size(), 3u);
  // Row 0 took part in all 39 steps after its 5-token prompt.
  EXPECT_EQ(e.sequences().position(0), 5 + 39);
}

// An engine that does not read the logits back has the LM head leave them unwritten
// (keep_logits 0: 64 × V × 4 bytes of stores saved per batch-64 step) and generates the
// same tokens as one that does, at one row and at three, through graphs and eagerly.
TEST_F(LlamaEngineTest, WithoutLogitReadBacksTheLmHeadWritesNoLogits) {
  for (const bool graphs : {false, true}) {
    for (const int batch : {1, 3}) {
      SCOPED_TRACE(absl::StrCat(graphs ? "graph" : "eager", " batch ", batch));
      RunOptions run;
      run.batch = batch;
      run.prompt_lens = kPromptLens;
      run.steps = 6;
      run.graphs = graphs;
      run.warmup_seqs = 0;
      std::vector<std::vector<std::vector<int32_t>>> generated;
      std::vector<bool> logits_written;
      for (const bool read_logits : {true, false}) {
        Engine& e = MakeEngine(3, /*capacity=*/64, read_logits);
        const absl::StatusOr<RunResult> r = RunSequences(e, run);
        ASSERT_TRUE(r.ok()) << r.status();
        generated.push_back(r->generated);
        const std::vector<float> logits = DeviceRead<float>(
            *device_, e.buffers().logits(), static_cast<size_t>(3) * kVocab);
        logits_written.push_back(
            std::any_of(logits.begin(), logits.end(), [](float x) { return x != 0.0f; }));
      }
      EXPECT_EQ(generated[0], generated[1]);
      EXPECT_TRUE(logits_written[0]);
      EXPECT_FALSE(logits_written[1]) << "the LM head wrote logits nobody reads";
    }
  }
}

// Every step of graph replays computes the eager steps' bits (logits and tokens), at
// batch 1 and 3 with mixed prompt lengths; sequences repeat themselves exactly.
TEST_F(LlamaEngineTest, GraphStepsEqualEagerStepsBitForBit) {
  for (int batch : {1, 3}) {
    SCOPED_TRACE(batch);
    const int64_t before = EmulatedLaunches();
    const RunResult graph = ExpectGraphEqualsEager(rig_, batch, kPromptLens, 16, 64);
    // Every launch ran: per sequence (eager, graph warm-up, graph timed) a prefill of
    // 7 L + 2 launches per row (every prompt has more than one token) and 16 decode steps.
    EXPECT_EQ(EmulatedLaunches() - before,
              3 * (batch * kPrefillLaunches + 16 * LaunchesPerStep(batch)));
    ASSERT_EQ(graph.generated.size(), static_cast<size_t>(batch));
    for (const std::vector<int32_t>& row : graph.generated) {
      ASSERT_EQ(row.size(), 17u);
      for (int32_t t : row) {
        EXPECT_GE(t, 0);
        EXPECT_LT(t, kVocab);
      }
    }
    // The logits change from step to step (a step that did nothing would repeat them).
    ASSERT_EQ(graph.step_digests.size(), 16u);
    EXPECT_NE(graph.step_digests[0], graph.step_digests[1]);
  }
}

// The engine against numpy_model.py (docs/llama.md's math in numpy), teacher-forced with
// the oracle's inputs: prefill logits and 16 decode steps at batch 3, prompts 5, 9, 3.
// The tolerance: bf16 stores round to 8 significant bits, so a rounding that goes the
// other way in one activation moves a logit by a few 1e-3 of the largest; 1e-2 of it.
TEST_F(LlamaEngineTest, MatchesTheNumpyOracle) {
  Engine& e = MakeEngine(3);
  const OracleComparison c = ExpectMatchesOracle(e, *device_, KPACK_LLAMA_ORACLE_DIR, 1e-2, 2e-2);
  RecordProperty("worst_relative_logit_error", std::to_string(c.worst));
}

// The tolerance is one a real bug breaks: row 0 one position off (its RoPE angle and KV
// slot, the classic off-by-one) is far outside it.
TEST_F(LlamaEngineTest, TheOracleCatchesAPositionOffByOne) {
  Engine& e = MakeEngine(3);
  absl::StatusOr<OracleComparison> c =
      CompareWithOracle(e, *device_, KPACK_LLAMA_ORACLE_DIR, 2e-2, /*position_offset=*/1);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_GT(c->worst, 5e-2) << "at " << c->worst_at;  // 5x the tolerance
  std::printf("row 0 one position off: worst |dlogit| / max |logit| %.3g (%s)\n", c->worst,
              c->worst_at.c_str());
}

// The command line, in-process: the JSON document of ENGINE_IFACE.md, graphs on and off
// agreeing on every token and digest.
TEST_F(LlamaEngineTest, CommandLineWritesTheJsonDocument) {
  setenv("KPACK_CUDA_DRIVER", KPACK_FAKE_DRIVER, 1);
  auto run = [&](const std::string& graphs) -> nlohmann::json {
    const std::string json = ::testing::TempDir() + "/kpack_llama_" + graphs + ".json";
    const std::string tiny = KPACK_LLAMA_TINY_DIR;
    const char* argv[] = {"kpack-llama",
                          "--pack",
                          KPACK_LLAMA_PACK_DIR,
                          "--checkpoint",
                          tiny.c_str(),
                          "--batch",
                          "3",
                          "--prompt-lens",
                          "5,9,3",
                          "--steps",
                          "4",
                          "--capacity",
                          "32",
                          "--graphs",
                          graphs.c_str(),
                          "--json",
                          json.c_str(),
                          "--digests",
                          "--warmup-seqs",
                          "1",
                          "--timed-seqs",
                          "2"};
    std::ostringstream out, err;
    const int rc = KpackLlamaMain(static_cast<int>(std::size(argv)), argv, out, err);
    EXPECT_EQ(rc, 0) << err.str();
    EXPECT_THAT(out.str(), HasSubstr("row 2 (prompt 3): "));
    EXPECT_THAT(out.str(), HasSubstr(" us/step, "));
    std::ifstream in(json);
    return nlohmann::json::parse(in, nullptr, false);
  };
  const nlohmann::json on = run("on"), off = run("off");
  unsetenv("KPACK_CUDA_DRIVER");
  ASSERT_TRUE(on.is_object());
  for (const char* key : {"config", "batch", "prompt_lens", "steps", "graphs", "generated",
                          "step_digests", "prefill_digests", "us_per_step", "tokens_per_s",
                          "host_us_per_step", "graphs_built", "device"}) {
    EXPECT_TRUE(on.contains(key)) << key;
  }
  EXPECT_EQ(on["config"]["hidden_size"], 256);
  EXPECT_EQ(on["batch"], 3);
  EXPECT_EQ(on["prompt_lens"], nlohmann::json({5, 9, 3}));
  EXPECT_EQ(on["steps"], 4);
  EXPECT_EQ(on["graphs"], true);
  EXPECT_EQ(off["graphs"], false);
  EXPECT_EQ(on["graphs_built"], 1);
  EXPECT_EQ(off["graphs_built"], 0);
  EXPECT_EQ(on["device"], "Fake H200");
  ASSERT_EQ(on["generated"].size(), 3u);
  EXPECT_EQ(on["generated"][0].size(), 5u);
  EXPECT_EQ(on["step_digests"].size(), 4u);
  EXPECT_EQ(on["prefill_digests"].size(), 3u);
  EXPECT_EQ(on["generated"], off["generated"]);
  EXPECT_EQ(on["step_digests"], off["step_digests"]);
  EXPECT_EQ(on["prefill_digests"], off["prefill_digests"]);
  EXPECT_GT(on["host_us_per_step"].get<double>(), 0);
}

TEST_F(LlamaEngineTest, CommandLineErrors) {
  setenv("KPACK_CUDA_DRIVER", KPACK_FAKE_DRIVER, 1);
  const std::string tiny = KPACK_LLAMA_TINY_DIR;
  auto rc = [&](std::vector<const char*> args, std::string* err_text) {
    args.insert(args.begin(), "kpack-llama");
    std::ostringstream out, err;
    const int code = KpackLlamaMain(static_cast<int>(args.size()), args.data(), out, err);
    *err_text = err.str();
    return code;
  };
  std::string err;
  EXPECT_EQ(rc({"--checkpoint", tiny.c_str()}, &err), 2);
  EXPECT_THAT(err, HasSubstr("--pack"));
  EXPECT_EQ(
      rc({"--pack", KPACK_LLAMA_PACK_DIR, "--checkpoint", tiny.c_str(), "--graphs", "maybe"}, &err),
      2);
  EXPECT_EQ(rc({"--pack", KPACK_LLAMA_PACK_DIR, "--checkpoint", tiny.c_str(), "--steps", "40",
                "--prompt-lens", "30", "--capacity", "64"},
               &err),
            1);
  EXPECT_THAT(err, HasSubstr("a prompt of 30 tokens and 40 decode steps need 70 KV positions "
                             "per sequence; the capacity is 64"));
  EXPECT_EQ(
      rc({"--pack", KPACK_LLAMA_PACK_DIR, "--checkpoint", tiny.c_str(), "--seed", "-1"}, &err), 1);
  EXPECT_THAT(err, HasSubstr("--seed -1: the prompt tokens' formula leaves 64 bits"));
  EXPECT_EQ(rc({"--pack", KPACK_LLAMA_PACK_DIR, "--checkpoint", "/nonexistent"}, &err), 1);
  EXPECT_THAT(err, HasSubstr("/nonexistent/config.json"));
  unsetenv("KPACK_CUDA_DRIVER");
}

// The engine's own NVTX domain: a range per decode step, with the replay (or the eager
// launches) inside it and kpack's per-launch ranges inside those. Built with
// -DKPACK_ENABLE_NVTX=OFF, neither kpack nor the engine makes an NVTX call: no range.
TEST_F(LlamaEngineTest, NvtxRangesPerStepAndPhase) {
  constexpr bool kCompiledIn = KPACK_ENABLE_NVTX;
  ASSERT_EQ(kpack_nvtx_inject_initialized(), kCompiledIn)
      << "NVTX loaded the injection library: " << kpack_nvtx_inject_initialized();
  Engine& e = MakeEngine(1, 64, /*read_logits=*/false);
  LL_ASSERT_OK(e.Prefill(0, Prompt(0, 4)));
  LL_ASSERT_OK(e.Decode(1, Engine::Mode::kGraph));  // warm-up: binds and builds
  LL_ASSERT_OK(e.Decode(1, Engine::Mode::kEager));
  kpack_nvtx_inject_reset();
  LL_ASSERT_OK(e.Decode(1, Engine::Mode::kGraph));
  LL_ASSERT_OK(e.Decode(1, Engine::Mode::kEager));
  std::vector<std::string> pushes;
  for (size_t i = 0; i < kpack_nvtx_inject_push_count(); ++i) {
    const char* domain = kpack_nvtx_inject_push_domain(i);
    const char* text = kpack_nvtx_inject_push_text(i);
    pushes.push_back(std::string(domain ? domain : "?") + ":" + (text ? text : "?"));
  }
  if (!kCompiledIn) {
    EXPECT_THAT(pushes, IsEmpty());
    return;
  }
  // Graph step: the step and its replay. Eager step: the step, its launches, and one
  // kpack range per kernel.
  std::vector<std::string> want = {"kpack-llama:decode step", "kpack-llama:replay",
                                   "kpack-llama:decode step", "kpack-llama:launch"};
  for (const std::string& kernel :
       {"llama_embed", "llama_qkv_rope", "llama_attn_decode", "llama_o_proj", "llama_gate_up",
        "llama_down_proj", "llama_qkv_rope", "llama_attn_decode", "llama_o_proj", "llama_gate_up",
        "llama_down_proj", "llama_lm_head"}) {
    want.push_back("kpack:" + kernel);
  }
  EXPECT_EQ(pushes, want);
  EXPECT_EQ(kpack_nvtx_inject_pop_count(), kpack_nvtx_inject_push_count());
  EXPECT_EQ(kpack_nvtx_inject_max_depth(), 3);
}

}  // namespace
}  // namespace kpack::llama

int main(int argc, char** argv) {
  // NVTX reads this once, at the process's first NVTX call.
  setenv("NVTX_INJECTION64_PATH", KPACK_NVTX_INJECT_PATH, 1);
  ::testing::InitGoogleMock(&argc, argv);
  return RUN_ALL_TESTS();
}
