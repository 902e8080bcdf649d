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

// Teacher-forced against numpy_model.py's run in `oracle_dir` (--batch 3 --prompt-lens
// 5,9,3 --steps 16 --seed 0 --teacher-force): every row's prefill and step logits within
// `relative_tolerance` of the largest oracle logit, and the same argmax wherever the
// oracle's top two logits are further apart than `margin` of it. Returns the worst
// relative difference seen.
double ExpectMatchesOracle(Engine& engine, const Device& device, const std::string& oracle_dir,
                           double relative_tolerance, double margin);

}  // namespace kpack::llama::testing

#endif  // KPACK_TESTS_LLAMA_HARNESS_H_
