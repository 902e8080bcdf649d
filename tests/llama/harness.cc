#include "harness.h"

#include <cmath>
#include <cstring>
#include <span>

#include "gtest/gtest.h"
#include "npy.h"

namespace kpack::llama::testing {

absl::StatusOr<Rig> Rig::Open(const std::string& driver, const std::string& pack,
                              const std::string& checkpoint) {
  Rig rig;
  absl::StatusOr<std::unique_ptr<Device>> device = Device::Open(driver, 0);
  if (!device.ok()) return device.status();
  rig.device = *std::move(device);
  Options options;
  options.driver_path = driver;
  absl::StatusOr<Runtime> runtime = Runtime::Open(pack, options);
  if (!runtime.ok()) return runtime.status();
  rig.runtime = std::make_unique<Runtime>(*std::move(runtime));
  absl::StatusOr<Checkpoint> ck = Checkpoint::Open(checkpoint);
  if (!ck.ok()) return ck.status();
  rig.checkpoint = std::make_unique<Checkpoint>(*std::move(ck));
  absl::StatusOr<Model> model = Model::Upload(*rig.device, *rig.checkpoint);
  if (!model.ok()) return model.status();
  rig.model = std::make_unique<Model>(*std::move(model));
  return rig;
}

absl::StatusOr<std::unique_ptr<Engine>> Rig::MakeEngine(int max_batch, int max_prompt,
                                                        int capacity, bool read_logits) const {
  EngineOptions o;
  o.max_batch = max_batch;
  o.max_prompt = max_prompt;
  o.capacity = capacity;
  o.read_logits = read_logits;
  return Engine::Create(*runtime, *device, *model, o);
}

RunResult ExpectGraphEqualsEager(const Rig& rig, int batch, const std::vector<int>& prompt_lens,
                                 int steps, int capacity) {
  int longest = 0;
  for (int i = 0; i < batch; ++i) {
    longest = std::max(longest, prompt_lens[static_cast<size_t>(i) % prompt_lens.size()]);
  }
  absl::StatusOr<std::unique_ptr<Engine>> engine = rig.MakeEngine(batch, longest, capacity, true);
  EXPECT_TRUE(engine.ok()) << engine.status();
  if (!engine.ok()) return {};
  RunOptions run;
  run.batch = batch;
  run.prompt_lens = prompt_lens;
  run.steps = steps;
  run.digests = true;
  run.warmup_seqs = 0;
  run.timed_seqs = 1;
  run.graphs = false;
  absl::StatusOr<RunResult> eager = RunSequences(**engine, run);
  EXPECT_TRUE(eager.ok()) << eager.status();
  run.graphs = true;
  run.warmup_seqs = 1;
  absl::StatusOr<RunResult> graph = RunSequences(**engine, run);
  EXPECT_TRUE(graph.ok()) << graph.status();
  if (!eager.ok() || !graph.ok()) return {};
  EXPECT_EQ(graph->generated, eager->generated);
  EXPECT_EQ(graph->prefill_digests, eager->prefill_digests);
  EXPECT_EQ(graph->step_digests.size(), static_cast<size_t>(steps));
  for (size_t i = 0; i < graph->step_digests.size() && i < eager->step_digests.size(); ++i) {
    EXPECT_EQ(graph->step_digests[i], eager->step_digests[i]) << "step " << i;
  }
  EXPECT_EQ(graph->graphs_built, 1u);
  return *std::move(graph);
}

namespace {

cli::NpyArray Read(const std::string& dir, const std::string& name) {
  absl::StatusOr<cli::NpyArray> a = cli::ReadNpy(dir + "/" + name);
  EXPECT_TRUE(a.ok()) << a.status();
  return a.ok() ? *std::move(a) : cli::NpyArray{};
}

float F32At(const cli::NpyArray& a, size_t i) {
  float v;
  std::memcpy(&v, a.data.data() + 4 * i, 4);
  return v;
}

}  // namespace

double ExpectMatchesOracle(Engine& engine, const Device& device, const std::string& oracle_dir,
                           double relative_tolerance, double margin) {
  constexpr int kBatch = 3, kSteps = 16;
  const int vocab = static_cast<int>(engine.config().vocab_size);
  const std::vector<int> lens = {5, 9, 3};
  const cli::NpyArray prefill = Read(oracle_dir, "prefill_logits.npy"),
                      steps = Read(oracle_dir, "step_logits.npy"),
                      inputs = Read(oracle_dir, "inputs.npy");
  EXPECT_EQ(prefill.shape, (std::vector<int64_t>{kBatch, vocab}));
  EXPECT_EQ(steps.shape, (std::vector<int64_t>{kSteps, kBatch, vocab}));
  EXPECT_EQ(inputs.shape, (std::vector<int64_t>{kSteps, kBatch}));
  EXPECT_EQ(inputs.dtype, "<i4");
  if (::testing::Test::HasFailure()) return 1;

  double worst = 0;
  int decided = 0;
  auto compare = [&](std::span<const float> got, const cli::NpyArray& want, size_t base,
                     const std::string& what) {
    for (int b = 0; b < kBatch; ++b) {
      double scale = 0, diff = 0;
      int best = 0, best_want = 0;
      float top = -INFINITY, second = -INFINITY;
      for (int v = 0; v < vocab; ++v) {
        const size_t i = static_cast<size_t>(b * vocab + v);
        const float w = F32At(want, base + i);
        scale = std::max(scale, std::fabs(static_cast<double>(w)));
        diff = std::max(diff, std::fabs(static_cast<double>(got[i]) - w));
        if (got[i] > got[static_cast<size_t>(b * vocab + best)]) best = v;
        if (w > top) {
          second = top;
          top = w;
          best_want = v;
        } else if (w > second) {
          second = w;
        }
      }
      EXPECT_GT(scale, 0) << what;
      const double rel = diff / scale;
      worst = std::max(worst, rel);
      EXPECT_LT(rel, relative_tolerance)
          << what << " row " << b << ": max |dlogit| " << diff << " of " << scale;
      if (top - second > margin * scale) {
        ++decided;
        EXPECT_EQ(best, best_want) << what << " row " << b;
      }
    }
  };
  for (int b = 0; b < kBatch; ++b) {
    std::vector<int32_t> prompt;
    for (int i = 0; i < lens[static_cast<size_t>(b)]; ++i) {
      prompt.push_back(PromptToken(b, i, 0, vocab));
    }
    const absl::Status s = engine.Prefill(b, prompt);
    EXPECT_TRUE(s.ok()) << s;
  }
  EXPECT_TRUE(engine.EnqueueReadback(0, kBatch).ok());
  absl::StatusOr<Engine::Readback> r = engine.WaitReadback(0);
  EXPECT_TRUE(r.ok()) << r.status();
  if (!r.ok()) return 1;
  compare(r->logits, prefill, 0, "prefill");
  for (int t = 0; t < kSteps; ++t) {
    // Teacher forcing: the oracle's input tokens replace the ones the LM head wrote.
    EXPECT_EQ(device.driver().MemcpyHtoD(engine.buffers().tokens(),
                                         inputs.data.data() + 4 * kBatch * static_cast<size_t>(t),
                                         4 * kBatch),
              CUDA_SUCCESS);
    const absl::Status s = engine.Decode(kBatch, Engine::Mode::kGraph);
    EXPECT_TRUE(s.ok()) << s;
    EXPECT_TRUE(engine.EnqueueReadback(t % 2, kBatch).ok());
    r = engine.WaitReadback(t % 2);
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok() || !s.ok()) return 1;
    compare(r->logits, steps, static_cast<size_t>(t) * kBatch * static_cast<size_t>(vocab),
            "step " + std::to_string(t));
  }
  EXPECT_GT(decided, 24) << "too few clear argmaxes to compare tokens";
  return worst;
}

}  // namespace kpack::llama::testing
