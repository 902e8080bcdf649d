// llama/nvtx.h: the engine's NVTX ranges (domain "kpack-llama"), around each step and
// each phase of it, on top of kpack's per-launch ranges (domain "kpack").
//
// Range names are registered once, at construction; pushing one is a call into the NVTX
// injection (or nothing without a profiler attached): no allocation, no formatting. The
// step number rides in the range's int64 payload. Off when `enabled` is false, when the
// environment sets KPACK_NVTX=0 (as for kpack's own ranges), or when built with
// KPACK_ENABLE_NVTX=0.
//
// Thread safety: an Nvtx is immutable after construction; ranges nest per thread.

#ifndef KPACK_EXAMPLES_LLAMA_NVTX_H_
#define KPACK_EXAMPLES_LLAMA_NVTX_H_

#include <cstdint>

namespace kpack::llama {

class Nvtx {
 public:
  enum Name : int {
    kPrefill,     // one row's prefill (payload: the row)
    kDecodeStep,  // one decode step (payload: the engine's step count)
    kSetBatch,    // rebinding the batch size on a bucket's launches
    kBind,        // binding a batch bucket's launches (warm-up)
    kReplay,      // the step graph's replay
    kLaunch,      // the step's eager launches
    kReadback,    // enqueueing the token (and logits) copy
    kWait,        // waiting for a read-back
    kSequence,    // one whole sequence run (payload: its index)
    kCount,
  };

  explicit Nvtx(bool enabled);
  ~Nvtx();
  Nvtx(const Nvtx&) = delete;
  Nvtx& operator=(const Nvtx&) = delete;

  void Push(Name name, int64_t payload) const;
  void Pop() const;
  bool enabled() const { return domain_ != nullptr; }

 private:
  void* domain_ = nullptr;
  void* names_[kCount] = {};
};

// Push on construction, pop on destruction.
class NvtxRange {
 public:
  NvtxRange(const Nvtx& nvtx, Nvtx::Name name, int64_t payload = 0) : nvtx_(nvtx) {
    nvtx_.Push(name, payload);
  }
  ~NvtxRange() { nvtx_.Pop(); }
  NvtxRange(const NvtxRange&) = delete;
  NvtxRange& operator=(const NvtxRange&) = delete;

 private:
  const Nvtx& nvtx_;
};

}  // namespace kpack::llama

#endif  // KPACK_EXAMPLES_LLAMA_NVTX_H_
