#include "launch/scratch_pool.h"

#include <algorithm>
#include <atomic>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "util/status_macros.h"

namespace kpack::internal {

struct ArenaPool::Loan {
  std::shared_ptr<Returns> returns;  // moved out by Return
  Loan* next = nullptr;              // in Returns::head's list
};

struct ArenaPool::Returns {
  std::atomic<Loan*> head{nullptr};
  // Only once the pool is gone and the last loan came back: those never drained leak
  // their arenas (no CUDA call may free them from a user object's destructor).
  ~Returns() {
    for (Loan* loan = head.load(std::memory_order_acquire); loan != nullptr;) {
      delete std::exchange(loan, loan->next);
    }
  }
};

ArenaPool::ArenaPool(const Driver& driver)
    : driver_(driver), returns_(std::make_shared<Returns>()) {}

ArenaPool::~ArenaPool() {
  std::vector<Arena> arenas;
  {
    std::lock_guard<std::mutex> lock(mu_);
    DrainLocked();
    arenas = std::move(idle_);
    arenas.insert(arenas.end(), leftovers_.begin(), leftovers_.end());
    idle_.clear();
    leftovers_.clear();
  }
  for (const Arena& arena : arenas) FreeOne(arena);
}

std::optional<Arena> ArenaPool::TakeIdle(uint64_t context_id, uint64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  DrainLocked();
  auto best = idle_.end();
  for (auto it = idle_.begin(); it != idle_.end(); ++it) {
    if (it->context_id == context_id && it->size >= bytes &&
        (best == idle_.end() || it->size < best->size)) {
      best = it;
    }
  }
  if (best == idle_.end()) return std::nullopt;
  const Arena arena = *best;
  idle_.erase(best);
  return arena;
}

absl::StatusOr<Arena> ArenaPool::TakeOrAllocate(CUcontext context, uint64_t context_id,
                                                uint64_t bytes) {
  // The arena is `bytes` rounded up to kScratchAlign, allocated kScratchAlign - 1 larger
  // to align its base: both sums must fit 64 bits, or a size near 2^64 would wrap to a
  // short arena. (No device holds that much.)
  if (bytes > std::numeric_limits<uint64_t>::max() - 2 * (kScratchAlign - 1)) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "a scratch arena of ", bytes, " bytes: its size, aligned, does not fit 64 bits"));
  }
  if (std::optional<Arena> idle = TakeIdle(context_id, bytes)) return *idle;
  Arena arena;
  arena.context = context;
  arena.context_id = context_id;
  arena.size = (bytes + kScratchAlign - 1) / kScratchAlign * kScratchAlign;
  KPACK_RETURN_IF_ERROR(driver_.Check(driver_.CtxPushCurrent(context), "cuCtxPushCurrent"));
  const CUresult alloc = driver_.MemAlloc(&arena.base, arena.size + kScratchAlign - 1);
  CUcontext popped = nullptr;
  const CUresult pop = driver_.CtxPopCurrent(&popped);
  if (alloc == CUDA_SUCCESS && pop != CUDA_SUCCESS) {
    driver_.MemFree(arena.base);
    return driver_.Error(pop, "cuCtxPopCurrent after allocating a scratch arena");
  }
  KPACK_RETURN_IF_ERROR(driver_.Check(
      alloc,
      absl::StrCat("cuMemAlloc of a ", arena.size + kScratchAlign - 1, "-byte scratch arena")));
  arena.aligned = (arena.base + kScratchAlign - 1) / kScratchAlign * kScratchAlign;
  return arena;
}

void ArenaPool::PutIdle(std::span<const Arena> arenas) {
  if (arenas.empty()) return;
  std::lock_guard<std::mutex> lock(mu_);
  idle_.insert(idle_.end(), arenas.begin(), arenas.end());
}

void ArenaPool::Free(std::span<const Arena> arenas) {
  std::vector<Arena> refused;
  for (const Arena& arena : arenas) {
    if (!FreeOne(arena)) refused.push_back(arena);
  }
  if (refused.empty()) return;
  std::lock_guard<std::mutex> lock(mu_);
  leftovers_.insert(leftovers_.end(), refused.begin(), refused.end());
}

void* ArenaPool::Lend(const Arena& arena, const LoanTag& tag) {
  auto* loan = new Loan{returns_};
  std::lock_guard<std::mutex> lock(mu_);
  lent_.push_back({loan, tag, arena});
  return loan;
}

std::optional<Arena> ArenaPool::FindLent(const LoanTag& tag) {
  std::lock_guard<std::mutex> lock(mu_);
  DrainLocked();
  for (const Lent& l : lent_) {
    if (l.tag == tag) return l.arena;
  }
  return std::nullopt;
}

void ArenaPool::Return(void* payload) {
  auto* loan = static_cast<Loan*>(payload);
  // Keeps the list alive through the push even if the pool is gone meanwhile; once
  // pushed, the loan is the drainer's (or ~Returns'), and is not touched here again.
  const std::shared_ptr<Returns> returns = std::move(loan->returns);
  Loan* head = returns->head.load(std::memory_order_relaxed);
  do {
    loan->next = head;
  } while (!returns->head.compare_exchange_weak(head, loan, std::memory_order_release,
                                                std::memory_order_relaxed));
}

void ArenaPool::DrainLocked() const {
  for (Loan* loan = returns_->head.exchange(nullptr, std::memory_order_acquire); loan != nullptr;) {
    auto it =
        std::find_if(lent_.begin(), lent_.end(), [&](const Lent& l) { return l.loan == loan; });
    if (it != lent_.end()) {
      idle_.push_back(it->arena);
      lent_.erase(it);
    }
    delete std::exchange(loan, loan->next);
  }
}

bool ArenaPool::FreeOne(const Arena& arena) const {
  unsigned long long id = 0;  // NOLINT(runtime/int)
  // A context destroyed since (its handle perhaps reused by a new one) took the memory
  // with it: nothing to free, and nothing of the new context's may be freed.
  const CUresult r = driver_.CtxGetId(arena.context, &id);
  if (r == CUDA_ERROR_CONTEXT_IS_DESTROYED || r == CUDA_ERROR_INVALID_CONTEXT ||
      (r == CUDA_SUCCESS && id != arena.context_id)) {
    return true;
  }
  if (r != CUDA_SUCCESS) return false;
  if (driver_.CtxPushCurrent(arena.context) != CUDA_SUCCESS) return false;
  const bool freed = driver_.MemFree(arena.base) == CUDA_SUCCESS;
  CUcontext popped = nullptr;
  driver_.CtxPopCurrent(&popped);
  return freed;
}

ArenaPool::Stats ArenaPool::stats() const {
  Stats stats;
  std::lock_guard<std::mutex> lock(mu_);
  DrainLocked();
  stats.idle = idle_.size();
  stats.lent = lent_.size();
  for (const Arena& a : idle_) stats.bytes += a.size;
  for (const Lent& l : lent_) stats.bytes += l.arena.size;
  for (const Arena& a : leftovers_) stats.bytes += a.size;
  return stats;
}

}  // namespace kpack::internal
