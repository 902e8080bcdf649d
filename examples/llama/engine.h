// llama/engine.h: the Llama decode engine on kpack -- prefill and decode steps of a batch
// of sequences, eager or through step graphs (docs/llama.md, "Steps").
//
//   absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::Create(runtime, device, model,
//   options); for (int row = 0; row < batch; ++row) engine->Prefill(row, prompts[row]); for (int
//   step = 0; step < n; ++step) {
//     engine->Decode(batch, Engine::Mode::kGraph);   // enqueued; tokens stay on the device
//     engine->EnqueueReadback(step % 2, batch);       // async copy to pinned memory
//     if (step > 0) engine->WaitReadback((step - 1) % 2);  // the previous step's tokens
//   }
//
// Decode row b is KV-cache sequence slot b. `Prefill(row, prompt)` starts slot `row` over
// with `prompt` (one step of M = prompt length rows: kpack's bucket dispatch picks each
// kernel's variant for M), ending with the LM head on its last row, which writes the first
// generated token to the row's decode token (and, with read_logits, the logits to the
// row's logits row); the row's device position becomes the prompt length. `Decode(batch)`
// then runs one step of rows 0..batch-1: each row's token in, the next token out, and the
// LM head advances the rows' positions on the device, so consecutive steps need no host
// write at all.
//
// Decode steps per batch bucket (M edges 1, 4, 16, 64, 256): the first step of a batch in
// a bucket binds that bucket's 5 L + 2 launches (kpack::BoundLaunch, with the attention's
// split count S fixed per bucket) -- the warm-up, where the engine allocates. Later steps
// in the bucket Set only the batch size, and only when it changed. Mode::kGraph replays
// the bucket's kpack::StepGraph: its graph is built at the bucket's first graph step and
// reused for every batch size in the bucket and every context length (positions live in
// device memory; no argument changes as the context grows), so no graph is ever built
// after warm-up. Mode::kEager sends the same bound launches one by one; both compute the
// same bits.
//
// Read-backs: the tokens (and, with EngineOptions::read_logits, the logits) of rows
// 0..rows-1 are copied to one of two pinned slots and an event recorded after them; the
// host waits for a slot only when it wants those values, so step n+1 is enqueued before
// step n's tokens are read (issue 22).
//
// Host cost of a decode step after warm-up: no allocation, no lock, no formatting (errors
// aside); a graph step is the capacity check, the replay (node bytes compared, none
// patched while the batch stays) and its launch.
//
// Errors: Create names what the pack lacks (a kernel, grid expressions, a parameter list
// other than docs/llama.md's, a HEAD_DIM other than the checkpoint's head_dim); steps
// refuse rows without a sequence or past the KV capacity (llama/kv_cache.h) before
// launching anything; kpack's and the driver's errors pass through.
//
// Thread safety: one thread at a time, with the Device's context current. The Runtime,
// Device and Model must outlive the Engine; the Engine synchronizes its stream when
// destroyed.

#ifndef KPACK_EXAMPLES_LLAMA_ENGINE_H_
#define KPACK_EXAMPLES_LLAMA_ENGINE_H_

#include <cuda.h>

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "device.h"
#include "kpack/kpack.h"
#include "kv_cache.h"
#include "model.h"
#include "nvtx.h"
#include "step_buffers.h"

namespace kpack::llama {

struct EngineOptions {
  int max_batch = 1;         // decode rows, one KV-cache sequence slot each
  int max_prompt = 1;        // the longest prompt a Prefill takes
  int capacity = 16384;      // KV-cache positions per sequence
  // Read-backs carry the logits rows too. Without it the LM head does not write the
  // logits at all (the same tokens; batch 64 saves 64 × V × 4 bytes of stores per step):
  // buffers().logits() then holds no step's values.
  bool read_logits = false;
  bool nvtx = true;          // the engine's NVTX ranges (kpack's own: Options::nvtx)
};

// The most decode rows an engine takes: decode attention's grid (S, NKV, M) holds the
// batch along z, which the driver caps at 65535.
inline constexpr int kMaxBatch = 65535;

// The M buckets of docs/llama.md: 1, 2-4, 5-16, 17-64, 65-256, 257+.
inline constexpr std::array<int, 5> kBatchBucketEdges = {1, 4, 16, 64, 256};
inline constexpr int kBatchBuckets = 6;
int BatchBucket(int batch);
// The programs each bucket's decode attention aims at (P in DecodeSplits): 384 at 2-4
// rows, 512 elsewhere, measured on the H200 (docs/llama.md). The Python engine's
// config.DECODE_SPLIT_PROGRAMS.
inline constexpr std::array<int, kBatchBuckets> kDecodeSplitPrograms = {512, 384, 512,
                                                                        512, 512, 512};
// The decode attention's splits for a batch: max(1, min(S_MAX, P / (B_edge · NKV))),
// B_edge the upper edge of the batch's bucket (the batch itself above 64), P the bucket's
// kDecodeSplitPrograms. The kernel
// itself uses fewer at short contexts (docs/llama.md), so the grid never changes as the
// context grows.
int DecodeSplits(int batch, int num_key_value_heads);
// Whether a batch's step graph gives its PDL launches programmatic edges (the next
// kernel launched early, its prologue overlapping this one's tail): at every batch.
// Measured on the H200 (docs/llama.md has the figures): at batch 1 they save 78-89 µs
// per step, at 4-64 (context 128) 30-73 µs. Above one row the projections and decode
// attention trigger their dependents at exit; while attention triggered early, the
// edges made batch 16 at context 8192 228 µs per step slower, and until 2026-12-02 the
// engines gave them to batch 1 only.
bool ProgrammaticEdges(int batch);

class Engine {
 public:
  enum class Mode { kEager, kGraph };

  static absl::StatusOr<std::unique_ptr<Engine>> Create(const Runtime& runtime,
                                                        const Device& device, const Model& model,
                                                        const EngineOptions& options);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Enqueues the prefill of `prompt` into decode row `row` (see the top of this file).
  // INVALID_ARGUMENT for a row past max_batch, an empty prompt, one longer than
  // max_prompt or the capacity, or a token outside the vocabulary.
  absl::Status Prefill(int row, std::span<const int32_t> prompt);

  // Rows 0..rows-1 as if each had prefilled `context` tokens, for benchmarks that need a
  // long context without the cost of prefilling it: with `fill_cache`, the K and V of
  // every layer at those rows' slots hold pseudo-random bf16 values (uniform in [-1, 1),
  // from `seed`; the whole slot, so also positions the decode steps overwrite); each row's
  // decode token is pseudo-random in the vocabulary and its position is `context`.
  // Synchronous (it waits for the stream first). INVALID_ARGUMENT for rows outside
  // [1, max_batch] or a context outside [1, capacity - 1].
  absl::Status SyntheticContext(int rows, int context, uint64_t seed, bool fill_cache);

  // Enqueues one decode step of rows 0..batch-1 (see the top of this file).
  absl::Status Decode(int batch, Mode mode);

  // Enqueues the copy of rows 0..rows-1's tokens (and logits) into read-back slot `slot`
  // (0 or 1). The slot must not be waited on by then, nor be refilled before it is read.
  absl::Status EnqueueReadback(int slot, int rows);
  struct Readback {
    std::span<const int32_t> tokens;  // rows
    std::span<const float> logits;    // rows × V; empty without read_logits
  };
  // Waits for slot `slot`'s last copy; the spans stay valid until it is refilled.
  absl::StatusOr<Readback> WaitReadback(int slot);
  absl::Status Synchronize();

  struct Stats {
    uint64_t buckets_bound = 0;  // batch buckets whose launches were bound
    uint64_t graphs_built = 0;   // over all buckets' step graphs
    uint64_t replays = 0;
    uint64_t nodes_patched = 0;  // over all replays
    uint64_t last_nodes_patched = 0;
    uint64_t batch_sets = 0;  // steps that had to Set a new batch size
    uint64_t prefills = 0;
    uint64_t decode_steps = 0;
  };
  Stats stats() const;
  // Graphs built by batch bucket `bucket`'s step graph (0 if it has none).
  uint64_t graphs_built(int bucket) const;
  // Programmatic (PDL) edges in the graphs of bucket `bucket`'s step graph.
  uint64_t programmatic_edges(int bucket) const;

  const LlamaConfig& config() const { return model_.config(); }
  const Device& device() const { return device_; }
  const EngineOptions& options() const { return options_; }
  const SequenceTable& sequences() const { return sequences_; }
  const StepBuffers& buffers() const { return buffers_; }
  const KvCache& kv_cache() const { return kv_; }
  CUstream stream() const { return stream_.get(); }
  // Launches of a decode step of `batch` rows: 5 per layer + 2 at one row; above, also
  // llama_rmsnorm before each layer's QKV and gate/up and before the LM head.
  int launches_per_step(int batch) const;

 private:
  struct Kernels {
    Kernel embed, rmsnorm, qkv_rope, attn_decode, attn_prefill, o_proj, gate_up, down_proj, lm_head;
  };
  struct Bucket;

  Engine(const Runtime& runtime, const Device& device, const Model& model,
         const EngineOptions& options, KvCache kv, StepBuffers buffers, Stream stream);
  absl::StatusOr<Bucket*> BucketFor(int batch);
  absl::StatusOr<std::unique_ptr<Bucket>> Bind(int bucket, int batch);
  // The LM head's keep_logits: 1 when the read-backs carry the logits, else 0.
  int32_t KeepLogits() const { return options_.read_logits ? 1 : 0; }

  const Runtime& runtime_;
  const Device& device_;
  const Model& model_;
  const EngineOptions options_;
  const Nvtx nvtx_;
  Kernels kernels_;
  KvCache kv_;
  StepBuffers buffers_;
  SequenceTable sequences_;
  Stream stream_;
  std::array<std::unique_ptr<Bucket>, kBatchBuckets> buckets_;
  // Prefill inputs staged in pinned memory, one region per row, each reusable once the
  // event recorded after its copies has passed.
  PinnedBuffer prompt_staging_;  // i32 [max_batch, max_prompt]
  PinnedBuffer pos_staging_;     // i32 [max_batch]
  std::vector<Event> staged_;
  std::vector<bool> staged_pending_;
  // Read-back slots.
  std::array<PinnedBuffer, 2> readback_tokens_;
  std::array<PinnedBuffer, 2> readback_logits_;
  std::array<Event, 2> readback_ready_;
  std::array<int, 2> readback_rows_ = {0, 0};
  Stats stats_;
  int last_graph_bucket_ = -1;  // the bucket of the last graph replay
};

}  // namespace kpack::llama

#endif  // KPACK_EXAMPLES_LLAMA_ENGINE_H_
