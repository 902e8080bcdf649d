// ParallelFor and ParallelPipeline on std::threads started per call (Open runs them a few
// times per pack; a pool would outlive what it serves).

#include "util/parallel.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <mutex>
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

void ParallelPipelineUntyped(
    unsigned threads, const std::function<void(const std::function<void(void*)>& post)>& produce,
    const std::function<void(void*)>& consume) {
  std::mutex mu;
  std::condition_variable posted;
  std::deque<void*> ready;  // guarded by mu
  bool closed = false;      // guarded by mu: nothing more will be posted
  auto work = [&] {
    while (true) {
      void* item;
      {
        std::unique_lock<std::mutex> lock(mu);
        posted.wait(lock, [&] { return !ready.empty() || closed; });
        if (ready.empty()) return;
        item = ready.front();
        ready.pop_front();
      }
      consume(item);
    }
  };
  std::vector<std::thread> helpers;
  for (unsigned t = 1; t < threads; ++t) {
    try {
      helpers.emplace_back(work);
    } catch (const std::system_error&) {
      break;  // no more threads to be had: the caller consumes what they leave
    }
  }
  auto close = [&] {
    {
      std::lock_guard<std::mutex> lock(mu);
      closed = true;
    }
    posted.notify_all();
  };
  try {
    produce([&](void* item) {
      {
        std::lock_guard<std::mutex> lock(mu);
        ready.push_back(item);
      }
      posted.notify_one();
    });
  } catch (...) {
    close();  // the helpers finish what was posted and return
    for (std::thread& h : helpers) h.join();
    throw;
  }
  close();
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
