#include "launch/scratch.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "util/status_macros.h"

namespace kpack::internal {

const ScratchArenas::Buffer* ScratchArenas::Find(CUstream stream, CUcontext ctx) const {
  // Slots are claimed in probe order and never released, so the first unused slot ends
  // the search. A slot whose keys are still being written reads as a mismatch and sends
  // the caller to the locked path, which sees it complete.
  for (size_t i = 0, h = Hash(stream, ctx); i < kCapacity; ++i, h = (h + 1) % kCapacity) {
    const Slot& slot = slots_[h];
    if (!slot.used.load(std::memory_order_acquire)) return nullptr;
    if (slot.stream.load(std::memory_order_relaxed) == stream &&
        slot.ctx.load(std::memory_order_relaxed) == ctx) {
      return slot.buffer.load(std::memory_order_acquire);
    }
  }
  return nullptr;
}

absl::StatusOr<CUdeviceptr> ScratchArenas::Grow(CUstream stream, CUcontext ctx, uint64_t bytes) {
  std::lock_guard<std::mutex> lock(grow_mu_);
  Slot* slot = nullptr;
  for (size_t i = 0, h = Hash(stream, ctx); i < kCapacity; ++i, h = (h + 1) % kCapacity) {
    Slot& s = slots_[h];
    if (!s.used.load(std::memory_order_relaxed)) {
      slot = &s;
      break;
    }
    if (s.stream.load(std::memory_order_relaxed) == stream &&
        s.ctx.load(std::memory_order_relaxed) == ctx) {
      slot = &s;
      break;
    }
  }
  if (slot == nullptr) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "scratch arenas exist for ", kCapacity,
        " streams already; kpack keeps one per stream that launches kernels with scratch "
        "memory, so reuse streams"));
  }
  const Buffer* current = slot->buffer.load(std::memory_order_relaxed);
  if (current != nullptr && current->size >= bytes) return current->aligned;  // raced

  uint64_t size = std::max<uint64_t>(bytes, current != nullptr ? 2 * current->size : 0);
  size = (size + kAlign - 1) / kAlign * kAlign;
  auto buffer = std::make_unique<Buffer>();
  buffer->ctx = ctx;
  buffer->size = size;
  KPACK_RETURN_IF_ERROR(driver_.Check(driver_.CtxPushCurrent(ctx), "cuCtxPushCurrent"));
  CUresult alloc = driver_.MemAlloc(&buffer->base, size + kAlign - 1);
  CUcontext popped = nullptr;
  driver_.CtxPopCurrent(&popped);
  KPACK_RETURN_IF_ERROR(driver_.Check(
      alloc, absl::StrCat("cuMemAlloc of a ", size + kAlign - 1, "-byte scratch arena")));
  buffer->aligned = (buffer->base + kAlign - 1) / kAlign * kAlign;

  if (!slot->used.load(std::memory_order_relaxed)) {
    slot->stream.store(stream, std::memory_order_relaxed);
    slot->ctx.store(ctx, std::memory_order_relaxed);
    slot->used.store(true, std::memory_order_release);
    arenas_.fetch_add(1, std::memory_order_relaxed);
  }
  bytes_.fetch_add(size, std::memory_order_relaxed);
  slot->buffer.store(buffer.get(), std::memory_order_release);
  CUdeviceptr result = buffer->aligned;
  buffers_.push_back(std::move(buffer));
  return result;
}

absl::Status ScratchArenas::Reserve(CUstream stream, uint64_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  return Get(stream, bytes).status();
}

ScratchArenas::~ScratchArenas() {
  std::lock_guard<std::mutex> lock(grow_mu_);
  for (const auto& b : buffers_) {
    if (driver_.CtxPushCurrent(b->ctx) != CUDA_SUCCESS) continue;  // context already gone
    driver_.MemFree(b->base);
    CUcontext popped = nullptr;
    driver_.CtxPopCurrent(&popped);
  }
}

}  // namespace kpack::internal
