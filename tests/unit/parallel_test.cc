#include "util/parallel.h"

#include <atomic>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace kpack::internal {
namespace {

TEST(ParallelForTest, RunsEveryTaskOnce) {
  for (unsigned threads : {1u, 2u, 8u}) {
    std::vector<std::atomic<int>> runs(1000);
    ParallelFor(runs.size(), threads, [&](size_t i) {
      runs[i].fetch_add(1);
      return true;
    });
    for (const auto& r : runs) EXPECT_EQ(r.load(), 1);
  }
}

TEST(ParallelForTest, AFailureStopsLaterTasksButEveryEarlierOneFinishes) {
  for (unsigned threads : {1u, 3u, 8u}) {
    std::mutex mu;
    std::set<size_t> done;
    ParallelFor(10000, threads, [&](size_t i) {
      std::lock_guard<std::mutex> lock(mu);
      done.insert(i);
      return i != 500;
    });
    for (size_t i = 0; i <= 500; ++i) ASSERT_TRUE(done.count(i)) << i << " with " << threads;
    // Only the tasks already claimed when 500 failed ran after it: a few per thread.
    EXPECT_LE(done.size(), 501u + threads) << threads;
  }
}

TEST(ParallelForTest, UsesTheThreadsItIsGiven) {
  std::mutex mu;
  std::set<std::thread::id> ids;
  std::atomic<int> waiting{0};
  ParallelFor(4, 4, [&](size_t) {
    {
      std::lock_guard<std::mutex> lock(mu);
      ids.insert(std::this_thread::get_id());
    }
    // Each task waits for the others, so four threads must be running them at once.
    waiting.fetch_add(1);
    while (waiting.load() < 4) std::this_thread::yield();
    return true;
  });
  EXPECT_EQ(ids.size(), 4u);
}

TEST(ParallelForTest, ThreadsForIsBetweenOneAndTheCores) {
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  EXPECT_EQ(ThreadsFor(0, 64), 1u);
  EXPECT_EQ(ThreadsFor(63, 64), 1u);
  EXPECT_EQ(ThreadsFor(128, 64), std::min(2u, cores));
  EXPECT_EQ(ThreadsFor(1 << 20, 64), std::min(8u, cores));
}

}  // namespace
}  // namespace kpack::internal
