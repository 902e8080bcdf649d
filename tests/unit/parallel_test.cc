#include "util/parallel.h"

#include <atomic>
#include <chrono>
#include <deque>
#include <functional>
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
      {
        std::lock_guard<std::mutex> lock(mu);
        done.insert(i);
      }
      // Tasks after the failing one take 1 ms, so that the others cannot run through the
      // rest of the loop while the thread of task 500 waits to be scheduled between its
      // return and ParallelFor's stop (a sanitized CI run on 2 cores once ran 4650 tasks
      // after it when they took no time).
      if (i > 500) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      return i != 500;
    });
    for (size_t i = 0; i <= 500; ++i) ASSERT_TRUE(done.count(i)) << i << " with " << threads;
    if (threads == 1) {
      EXPECT_EQ(done.size(), 501u);  // nothing after the failure
    } else {
      // The tasks other threads claimed before they saw the failure still run: a few per
      // thread, however the scheduler delays the failing thread, never the loop's rest.
      EXPECT_LT(done.size(), 2000u) << threads;
    }
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

TEST(ParallelPipelineTest, ConsumesEveryPostedItemOnce) {
  for (unsigned threads : {1u, 2u, 8u}) {
    std::deque<std::atomic<int>> items;
    ParallelPipeline<std::atomic<int>>(
        threads,
        [&](const std::function<void(std::atomic<int>*)>& post) {
          for (int i = 0; i < 1000; ++i) post(&items.emplace_back(0));
        },
        [](std::atomic<int>* item) { item->fetch_add(1); });
    ASSERT_EQ(items.size(), 1000u);
    for (const auto& item : items) EXPECT_EQ(item.load(), 1) << threads;
  }
}

TEST(ParallelPipelineTest, ConsumesWhileTheProducerIsStillProducing) {
  // The producer waits, before posting the second item, until the first is consumed:
  // with a helper thread that happens; the caller alone consumes only afterwards.
  std::deque<std::atomic<bool>> items;
  std::atomic<bool> consumed_while_producing{false};
  ParallelPipeline<std::atomic<bool>>(
      2,
      [&](const std::function<void(std::atomic<bool>*)>& post) {
        post(&items.emplace_back(false));
        while (!items.front().load()) std::this_thread::yield();
        consumed_while_producing = true;
        post(&items.emplace_back(false));
      },
      [](std::atomic<bool>* item) { item->store(true); });
  EXPECT_TRUE(consumed_while_producing.load());
  EXPECT_TRUE(items.back().load());
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
