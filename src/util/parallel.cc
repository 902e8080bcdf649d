#include "util/parallel.h"

#include <algorithm>
#include <atomic>
#include <system_error>
#include <thread>
#include <vector>

namespace kpack::internal {

void ParallelFor(size_t n, unsigned threads, const std::function<bool(size_t)>& task) {
  std::atomic<size_t> next{0};
  std::atomic<bool> stop{false};
  auto work = [&] {
    while (!stop.load(std::memory_order_relaxed)) {
      const size_t i = next.fetch_add(1, std::memory_order_relaxed);
      if (i >= n) return;
      if (!task(i)) stop.store(true, std::memory_order_relaxed);
    }
  };
  std::vector<std::thread> helpers;
  for (unsigned t = 1; t < threads && t < n; ++t) {
    try {
      helpers.emplace_back(work);
    } catch (const std::system_error&) {
      break;  // no more threads to be had: the ones running do the work
    }
  }
  work();
  for (std::thread& h : helpers) h.join();
}

unsigned ThreadsFor(size_t work, size_t per_thread) {
  constexpr size_t kMaxThreads = 8;
  const size_t cores = std::max(1u, std::thread::hardware_concurrency());
  return static_cast<unsigned>(
      std::clamp<size_t>(work / per_thread, 1, std::min(cores, kMaxThreads)));
}

}  // namespace kpack::internal
