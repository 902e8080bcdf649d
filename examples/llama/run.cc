#include "run.h"

#include <algorithm>
#include <bit>
#include <chrono>
#include <cstring>
#include <span>

#include "absl/strings/str_cat.h"
#include "device.h"
#include "util/sha256.h"
#include "util/status_macros.h"

namespace kpack::llama {
namespace {

using Clock = std::chrono::steady_clock;

static_assert(std::endian::native == std::endian::little, "digests hash little-endian fp32");

// The first sequence's outputs, which every later one must repeat.
absl::Status SameAsFirst(const RunResult& first, const RunResult& now, int sequence) {
  for (size_t b = 0; b < first.generated.size(); ++b) {
    for (size_t i = 0; i < first.generated[b].size(); ++i) {
      if (first.generated[b][i] != now.generated[b][i]) {
        return absl::InternalError(absl::StrCat(
            "sequence ", sequence, " row ", b, " generated token ", now.generated[b][i],
            " at index ", i, " where sequence 0 generated ", first.generated[b][i],
            ": the steps are not deterministic, or state leaks from one sequence into the next"));
      }
    }
  }
  if (first.step_digests != now.step_digests || first.prefill_digests != now.prefill_digests) {
    return absl::InternalError(
        absl::StrCat("sequence ", sequence,
                     " computed other logits than sequence 0: the steps "
                     "are not deterministic, or state leaks between sequences"));
  }
  return absl::OkStatus();
}

}  // namespace

int32_t PromptToken(int64_t row, int64_t i, int64_t seed, int64_t vocab) {
  const int64_t t = (1 + 7919 * row + 104729 * i + 15485863 * seed) % vocab;
  return static_cast<int32_t>(t < 0 ? t + vocab : t);
}

std::string Fp32Digest(std::span<const float> values) {
  return internal::Sha256Hex(std::as_bytes(values));
}

absl::StatusOr<std::vector<int>> RowPromptLens(const RunOptions& o) {
  if (o.prompt_lens.empty()) return absl::InvalidArgumentError("--prompt-lens: no lengths given");
  if (o.batch < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--batch ", o.batch, ": at least 1"));
  }
  std::vector<int> lens;
  for (int b = 0; b < o.batch; ++b) {
    const int len = o.prompt_lens[static_cast<size_t>(b) % o.prompt_lens.size()];
    if (len < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("--prompt-lens: ", len, " is not a prompt length"));
    }
    lens.push_back(len);
  }
  return lens;
}

absl::StatusOr<RunResult> RunSequences(Engine& engine, const RunOptions& o) {
  KPACK_ASSIGN_OR_RETURN(const std::vector<int> lens, RowPromptLens(o));
  const LlamaConfig& c = engine.config();
  const int longest = *std::max_element(lens.begin(), lens.end());
  if (o.steps < 0 || o.warmup_seqs < 0 || o.timed_seqs < 0 || o.warmup_seqs + o.timed_seqs < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--steps ", o.steps, ", --warmup-seqs ", o.warmup_seqs, ", --timed-seqs ",
                     o.timed_seqs, ": none may be negative, and one sequence must run"));
  }
  if (o.context < 0) {
    return absl::InvalidArgumentError(absl::StrCat("--context ", o.context, ": not a context"));
  }
  // Rows start at position `context` (SyntheticContext); the steps write positions
  // context .. context + steps - 1.
  if (o.context > 0 && static_cast<int64_t>(o.context) + o.steps > engine.kv_cache().capacity()) {
    return absl::InvalidArgumentError(
        absl::StrCat("a context of ", o.context, " positions and ", o.steps,
                     " decode steps need ", static_cast<int64_t>(o.context) + o.steps,
                     " KV positions per sequence; the capacity is ",
                     engine.kv_cache().capacity(), " (raise --capacity)"));
  }
  if (o.context == 0 && static_cast<int64_t>(longest) + o.steps > engine.kv_cache().capacity()) {
    return absl::InvalidArgumentError(
        absl::StrCat("a prompt of ", longest, " tokens and ", o.steps, " decode steps need ",
                     longest + o.steps, " KV positions per sequence; the capacity is ",
                     engine.kv_cache().capacity(), " (raise --capacity)"));
  }
  // The prompt formula in 64 bits, as the Python engine refuses past them.
  const __int128 largest = __int128{1} + __int128{7919} * (o.batch - 1) +
                           __int128{104729} * (longest - 1) + __int128{15485863} * o.seed;
  if (o.seed < 0 || largest >= (__int128{1} << 63)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--seed ", o.seed,
                     ": the prompt tokens' formula leaves 64 bits (seeds are 0 "
                     "up to about 5.9e11)"));
  }
  if (o.digests && !engine.options().read_logits) {
    return absl::InvalidArgumentError("digests need an engine that reads logits back");
  }
  std::vector<std::vector<int32_t>> prompts;
  for (int b = 0; b < o.batch; ++b) {
    std::vector<int32_t> p;
    for (int i = 0; i < lens[static_cast<size_t>(b)]; ++i) {
      p.push_back(PromptToken(b, i, o.seed, c.vocab_size));
    }
    prompts.push_back(std::move(p));
  }
  const Engine::Mode mode = o.graphs ? Engine::Mode::kGraph : Engine::Mode::kEager;
  const size_t vocab = static_cast<size_t>(c.vocab_size);
  KPACK_ASSIGN_OR_RETURN(Event start, Event::Create(engine.device()));
  KPACK_ASSIGN_OR_RETURN(Event stop, Event::Create(engine.device()));

  RunResult first;
  double gpu_us = 0, host_us = 0;
  int64_t timed_steps = 0;
  for (int sequence = 0; sequence < o.warmup_seqs + o.timed_seqs; ++sequence) {
    const bool timed = sequence >= o.warmup_seqs;
    RunResult now;
    now.prompt_lens = lens;
    now.generated.assign(static_cast<size_t>(o.batch), {});
    if (o.context > 0) {
      KPACK_RETURN_IF_ERROR(engine.SyntheticContext(o.batch, o.context,
                                                    static_cast<uint64_t>(o.seed), sequence == 0));
    } else {
      for (int b = 0; b < o.batch; ++b)
        KPACK_RETURN_IF_ERROR(engine.Prefill(b, prompts[static_cast<size_t>(b)]));
    }
    KPACK_RETURN_IF_ERROR(engine.EnqueueReadback(0, o.batch));
    KPACK_ASSIGN_OR_RETURN(Engine::Readback prefill, engine.WaitReadback(0));
    for (int b = 0; b < o.batch; ++b) {
      now.generated[static_cast<size_t>(b)].push_back(prefill.tokens[static_cast<size_t>(b)]);
      if (o.digests && o.context == 0) {
        now.prefill_digests.push_back(
            Fp32Digest(prefill.logits.subspan(static_cast<size_t>(b) * vocab, vocab)));
      }
    }
    // Takes step `step`'s read-back from its slot.
    auto collect = [&](int step) -> absl::Status {
      KPACK_ASSIGN_OR_RETURN(Engine::Readback r, engine.WaitReadback(step % 2));
      for (int b = 0; b < o.batch; ++b) {
        now.generated[static_cast<size_t>(b)].push_back(r.tokens[static_cast<size_t>(b)]);
      }
      if (o.digests) now.step_digests.push_back(Fp32Digest(r.logits));
      return absl::OkStatus();
    };
    KPACK_RETURN_IF_ERROR(start.Record(engine.stream()));
    for (int step = 0; step < o.steps; ++step) {
      const Clock::time_point t0 = Clock::now();
      KPACK_RETURN_IF_ERROR(engine.Decode(o.batch, mode));
      KPACK_RETURN_IF_ERROR(engine.EnqueueReadback(step % 2, o.batch));
      const Clock::time_point t1 = Clock::now();
      if (timed) {
        host_us += std::chrono::duration<double, std::micro>(t1 - t0).count();
        ++timed_steps;
      }
      if (step > 0) KPACK_RETURN_IF_ERROR(collect(step - 1));
    }
    KPACK_RETURN_IF_ERROR(stop.Record(engine.stream()));
    if (o.steps > 0) KPACK_RETURN_IF_ERROR(collect(o.steps - 1));
    KPACK_RETURN_IF_ERROR(stop.Synchronize());
    KPACK_ASSIGN_OR_RETURN(const float ms, stop.MillisecondsSince(start));
    if (timed && o.steps > 0) gpu_us += 1000.0 * ms / o.steps;
    if (sequence == 0) {
      first = std::move(now);
    } else {
      KPACK_RETURN_IF_ERROR(SameAsFirst(first, now, sequence));
    }
  }
  if (o.timed_seqs > 0 && o.steps > 0) {
    first.us_per_step = gpu_us / o.timed_seqs;
    first.tokens_per_s = first.us_per_step > 0 ? o.batch * 1e6 / first.us_per_step : 0;
    first.host_us_per_step = host_us / static_cast<double>(timed_steps);
  }
  first.graphs_built = engine.stats().graphs_built;
  return first;
}

nlohmann::json ResultJson(const LlamaConfig& c, const RunOptions& o, const RunResult& r,
                          const std::string& device) {
  nlohmann::json j = {
      {"config", ConfigToJson(c)}, {"batch", o.batch},   {"prompt_lens", r.prompt_lens},
      {"steps", o.steps},          {"graphs", o.graphs}, {"generated", r.generated},
  };
  if (o.context > 0) j["context"] = o.context;  // synthetic: no prefill
  if (o.digests) {
    j["step_digests"] = r.step_digests;
    j["prefill_digests"] = r.prefill_digests;
  }
  j["us_per_step"] = r.us_per_step;
  j["tokens_per_s"] = r.tokens_per_s;
  j["host_us_per_step"] = r.host_us_per_step;
  j["graphs_built"] = r.graphs_built;
  j["device"] = device;
  return j;
}

}  // namespace kpack::llama
