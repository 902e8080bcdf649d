// What the Llama engine's CPU tier (fake driver, emulated kernels) and GPU tier (the real
// driver) share: the pieces of an engine opened on a pack and a checkpoint, and the checks
// both tiers make -- graph replays bit-identical to eager steps, and logits against the
// numpy oracle (numpy_model.py, teacher-forced).

#ifndef KPACK_TESTS_LLAMA_HARNESS_H_
#define KPACK_TESTS_LLAMA_HARNESS_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "checkpoint.h"
#include "device.h"
#include "engine.h"
#include "kpack/kpack.h"
#include "model.h"
#include "run.h"

namespace kpack::llama::testing {

// A device, the pack, a checkpoint and its weights uploaded. Members in destruction order
// (last first).
struct Rig {
  std::unique_ptr<Device> device;
  std::unique_ptr<Runtime> runtime;
  std::unique_ptr<Checkpoint> checkpoint;
  std::unique_ptr<Model> model;

  // `driver` empty: $KPACK_CUDA_DRIVER, else libcuda.so.1.
  static absl::StatusOr<Rig> Open(const std::string& driver, const std::string& pack,
                                  const std::string& checkpoint);
  absl::StatusOr<std::unique_ptr<Engine>> MakeEngine(int max_batch, int max_prompt, int capacity,
                                                     bool read_logits) const;
};

// Runs `steps` decode steps after prefilling `prompt_lens` (cycled over `batch` rows),
// eagerly and then (after a warm-up sequence) through step graphs, and expects the same
// tokens and logits bits at every step. Returns the graph run (empty on failure).
RunResult ExpectGraphEqualsEager(const Rig& rig, int batch, const std::vector<int>& prompt_lens,
                                 int steps, int capacity);

// The engine teacher-forced against numpy_model.py's run in `oracle_dir` (--batch 3
// --prompt-lens 5,9,3 --steps 16 --seed 0 --teacher-force): prefill, then each step with
// the oracle's input tokens written over the ones the LM head wrote. Per row and step,
// the largest |Δlogit| relative to the largest oracle logit; and the argmax compared
// wherever the oracle's top two logits are further apart than `margin` of it.
// `position_offset` is added to row 0's device position after its prefill: a negative
// control, the off-by-one a real bug would make.
struct OracleComparison {
  double worst = 0;      // the largest relative |Δlogit| of any row and step
  int compared = 0;      // row-steps compared (prefill included)
  int decided = 0;       // those with a clear oracle argmax
  int agreed = 0;        // of those, where the engine's argmax is the oracle's
  std::string worst_at;  // "step 3 row 2"
};
absl::StatusOr<OracleComparison> CompareWithOracle(Engine& engine, const Device& device,
                                                   const std::string& oracle_dir, double margin,
                                                   int position_offset = 0);

// CompareWithOracle, expecting every row-step within `relative_tolerance` and every clear
// argmax the oracle's. Returns the comparison.
OracleComparison ExpectMatchesOracle(Engine& engine, const Device& device,
                                     const std::string& oracle_dir, double relative_tolerance,
                                     double margin);

}  // namespace kpack::llama::testing

#endif  // KPACK_TESTS_LLAMA_HARNESS_H_
