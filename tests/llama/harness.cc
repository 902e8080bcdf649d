#include "harness.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <span>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "npy.h"
#include "util/status_macros.h"

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

absl::StatusOr<std::unique_ptr<Engine>> Rig::MakeEngine(int max_batch, int max_prompt, int capacity,
                                                        bool read_logits) const {
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

float F32At(const cli::NpyArray& a, size_t i) {
  float v;
  std::memcpy(&v, a.data.data() + 4 * i, 4);
  return v;
}

}  // namespace

absl::StatusOr<OracleComparison> CompareWithOracle(Engine& engine, const Device& device,
                                                   const std::string& oracle_dir, double margin,
                                                   int position_offset) {
  constexpr int kBatch = 3, kSteps = 16;
  const int vocab = static_cast<int>(engine.config().vocab_size);
  const std::vector<int> lens = {5, 9, 3};
  KPACK_ASSIGN_OR_RETURN(const cli::NpyArray prefill,
                         cli::ReadNpy(oracle_dir + "/prefill_logits.npy"));
  KPACK_ASSIGN_OR_RETURN(const cli::NpyArray steps, cli::ReadNpy(oracle_dir + "/step_logits.npy"));
  KPACK_ASSIGN_OR_RETURN(const cli::NpyArray inputs, cli::ReadNpy(oracle_dir + "/inputs.npy"));
  if (prefill.shape != std::vector<int64_t>{kBatch, vocab} ||
      steps.shape != std::vector<int64_t>{kSteps, kBatch, vocab} ||
      inputs.shape != std::vector<int64_t>{kSteps, kBatch} || inputs.dtype != "<i4" ||
      prefill.dtype != "<f4" || steps.dtype != "<f4") {
    return absl::FailedPreconditionError(
        absl::StrCat(oracle_dir, ": not the oracle run of 3 rows and 16 steps of this model"));
  }
  OracleComparison c;
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
      const double rel = scale > 0 ? diff / scale : INFINITY;
      if (rel > c.worst || c.compared == 0) {
        c.worst = std::max(c.worst, rel);
        c.worst_at = absl::StrCat(what, " row ", b);
      }
      ++c.compared;
      if (top - second > margin * scale) {
        ++c.decided;
        c.agreed += best == best_want;
      }
    }
  };
  for (int b = 0; b < kBatch; ++b) {
    std::vector<int32_t> prompt;
    for (int i = 0; i < lens[static_cast<size_t>(b)]; ++i) {
      prompt.push_back(PromptToken(b, i, 0, vocab));
    }
    KPACK_RETURN_IF_ERROR(engine.Prefill(b, prompt));
  }
  if (position_offset != 0) {
    const int32_t pos = lens[0] + position_offset;
    KPACK_RETURN_IF_ERROR(device.Check(
        device.driver().MemcpyHtoD(engine.buffers().pos(), &pos, sizeof(pos)), "offsetting row 0"));
  }
  KPACK_RETURN_IF_ERROR(engine.EnqueueReadback(0, kBatch));
  KPACK_ASSIGN_OR_RETURN(Engine::Readback r, engine.WaitReadback(0));
  compare(r.logits, prefill, 0, "prefill");
  for (int t = 0; t < kSteps; ++t) {
    KPACK_RETURN_IF_ERROR(device.Check(
        device.driver().MemcpyHtoD(engine.buffers().tokens(),
                                   inputs.data.data() + 4 * kBatch * static_cast<size_t>(t),
                                   4 * kBatch),
        "teacher forcing"));
    KPACK_RETURN_IF_ERROR(engine.Decode(kBatch, Engine::Mode::kGraph));
    KPACK_RETURN_IF_ERROR(engine.EnqueueReadback(t % 2, kBatch));
    KPACK_ASSIGN_OR_RETURN(r, engine.WaitReadback(t % 2));
    compare(r.logits, steps, static_cast<size_t>(t) * kBatch * static_cast<size_t>(vocab),
            absl::StrCat("step ", t));
  }
  return c;
}

OracleComparison ExpectMatchesOracle(Engine& engine, const Device& device,
                                     const std::string& oracle_dir, double relative_tolerance,
                                     double margin) {
  absl::StatusOr<OracleComparison> c = CompareWithOracle(engine, device, oracle_dir, margin);
  EXPECT_TRUE(c.ok()) << c.status();
  if (!c.ok()) return {};
  EXPECT_EQ(c->compared, 3 * 17);
  EXPECT_LT(c->worst, relative_tolerance) << "at " << c->worst_at;
  EXPECT_EQ(c->agreed, c->decided) << "argmaxes differ where the oracle's is clear";
  EXPECT_GT(c->decided, 24) << "too few clear argmaxes to compare tokens";
  std::printf(
      "against numpy: worst |dlogit| / max |logit| %.3g (%s); argmax agrees on %d of "
      "%d clear row-steps\n",
      c->worst, c->worst_at.c_str(), c->agreed, c->decided);
  return *c;
}

}  // namespace kpack::llama::testing
