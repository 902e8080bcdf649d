// llama/run.h: whole sequence runs of the engine, timed, as `kpack-llama` makes them
// (/work: ENGINE_IFACE, mirrored by the Python engine).
//
// A sequence run prefills every row's prompt (row b's prompt length is
// prompt_lens[b % size], its tokens PromptToken(b, i, seed, V)), reads the first tokens
// back, then makes `steps` decode steps of the whole batch: each step is enqueued before
// the previous step's tokens are read (double-buffered pinned read-backs), so the host
// stays off the GPU's critical path. Warm-up sequences come first (they bind the batch's
// bucket and build its graph); the timed ones follow. Every sequence must generate the
// same tokens (and, with digests, the same logits) as the first: a difference is an
// INTERNAL error (nondeterminism, or state leaking from one sequence into the next).
//
// With RunOptions::context, rows start over a synthetic context instead of their prompts
// (benchmarks); the first token of each row is then the synthetic one.
//
// Timing per timed sequence: GPU time of its decode steps (an event before the first and
// after the last) over `steps`, and the host's time to issue each step (Engine::Decode
// plus enqueueing its read-back), averaged over all timed steps.

#ifndef KPACK_EXAMPLES_LLAMA_RUN_H_
#define KPACK_EXAMPLES_LLAMA_RUN_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine.h"
#include "nlohmann/json.hpp"

namespace kpack::llama {

// Prompt token i of row b: (1 + 7919 b + 104729 i + 15485863 seed) mod vocab, in 64 bits.
int32_t PromptToken(int64_t row, int64_t i, int64_t seed, int64_t vocab);

struct RunOptions {
  int batch = 1;
  std::vector<int> prompt_lens = {32};  // cycled over the rows
  int steps = 127;
  bool graphs = true;
  int64_t seed = 0;
  int warmup_seqs = 1;
  int timed_seqs = 1;
  bool digests = false;  // read the logits back every step and hash them
  // > 0: no prefill; every row starts at this position over a synthetic KV cache
  // (Engine::SyntheticContext, filled once, before the first sequence), for timing decode
  // at a long context without prefilling it. The prompt lengths are then unused.
  int context = 0;
};

struct RunResult {
  std::vector<int> prompt_lens;                 // per row
  std::vector<std::vector<int32_t>> generated;  // per row: prefill's token, then one per step
  std::vector<std::string> prefill_digests;     // per row (with digests)
  std::vector<std::string> step_digests;        // per step (with digests)
  double us_per_step = 0;                       // GPU µs per decode step, timed mean
  double tokens_per_s = 0;                      // batch / us_per_step
  double host_us_per_step = 0;                  // host µs to issue a decode step
  uint64_t graphs_built = 0;
};

// The prompt length of each row, checked: INVALID_ARGUMENT for an empty list or lengths
// below 1.
absl::StatusOr<std::vector<int>> RowPromptLens(const RunOptions& options);

// Runs warmup_seqs + timed_seqs sequences on `engine` (built with max_batch >= batch,
// max_prompt >= the longest prompt, and read_logits when digests). INVALID_ARGUMENT when
// the prompts plus the steps do not fit the KV capacity.
absl::StatusOr<RunResult> RunSequences(Engine& engine, const RunOptions& options);

// sha256 (lowercase hex) of `values` as little-endian fp32 bytes.
std::string Fp32Digest(std::span<const float> values);

// The --json document (ENGINE_IFACE.md).
nlohmann::json ResultJson(const LlamaConfig& config, const RunOptions& options,
                          const RunResult& result, const std::string& device);

}  // namespace kpack::llama

#endif  // KPACK_EXAMPLES_LLAMA_RUN_H_
