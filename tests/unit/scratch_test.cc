// Scratch arenas' lifetimes and locking against the fake driver, where only the fake can
// place one call inside another (fake::OnNextCall) and hold a stream's work "in flight"
// behind a host function: no scratch lock is held across a driver call, a graph arena's
// return never blocks the driver's thread, a thread's CU_STREAM_PER_THREAD arenas go when
// it exits (not before its last launch is done, and also when the Runtime is gone
// first), and all of it under concurrency (run under ThreadSanitizer in CI).

#include "launch/scratch.h"

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <future>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "driver/driver.h"
#include "fake_driver.h"
#include "fake_runtime.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kpack/kpack.h"

namespace kpack {
namespace {

using ::kpack::testing::At;
using ::kpack::testing::LastLaunch;
using ::testing::IsEmpty;

const CUdeviceptr kX = 0x7f0000001000, kOut = 0x7f0000003000;

// The test pack's scratch kernel as a GPU would run it, as far as scratch goes: each
// program touches its 128 bytes of global scratch, which must be live device memory.
void TouchScratch(const fake::EmulatedLaunch& l) {
  const uint64_t programs = uint64_t{l.grid[0]} * l.grid[1] * l.grid[2];
  fake::DeviceMemory(l.Param<CUdeviceptr>(32), programs * 128, "scratch $global_scratch");
}

// A latch a host function waits on: the stream's later work stays "in flight" until the
// test opens it.
struct Gate {
  std::atomic<bool> open{false};
  static void Wait(void* gate) { static_cast<Gate*>(gate)->open.wait(false); }
  void Open() {
    open = true;
    open.notify_all();
  }
};

class ScratchTest : public testing::FakeRuntimeTest {
 protected:
  void SetUp() override {
    FakeRuntimeTest::SetUp();
    fake::SetKernelEmulator("scratch_kernel", &TouchScratch);
    ASSERT_EQ(d().CtxGetCurrent(&context_), CUDA_SUCCESS);
  }
  void TearDown() override {
    EXPECT_THAT(fake::Faults(), IsEmpty());
    FakeRuntimeTest::TearDown();
  }

  static absl::Status LaunchScratch(const Runtime& rt, CUstream stream, uint32_t blocks = 2) {
    return rt.Launch("scratch", Grid{blocks, blocks}, stream, kX, kOut, 32 * blocks, 32 * blocks,
                     32 * blocks);
  }
  // A thread with this test's context current that runs `body` and exits.
  std::thread Thread(std::function<void()> body) {
    return std::thread([this, body = std::move(body)] {
      ASSERT_EQ(d().CtxSetCurrent(context_), CUDA_SUCCESS);
      body();
    });
  }
  // A captured graph that owns a scratch arena (reserved on a stream of its own).
  CUgraph GraphWithScratch(Runtime& rt) {
    CUstream stream = NewStream();
    EXPECT_TRUE(rt.Preload().ok());
    EXPECT_TRUE(rt.ReserveScratch(stream, 1 << 16).ok());
    CUgraph graph = nullptr;
    EXPECT_EQ(d().StreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
    EXPECT_TRUE(LaunchScratch(rt, stream).ok());
    EXPECT_EQ(d().StreamEndCapture(stream, &graph), CUDA_SUCCESS);
    EXPECT_EQ(rt.stats().scratch_in_graphs, 1u);
    return graph;
  }
  // Runs `probe` on another thread from inside the next call of driver function `fn`
  // and records whether it finished while that call was under way. A probe that takes
  // kpack's scratch locks cannot finish while one is held across the call: it waits up
  // to 20 s (then the held lock is a deadlock in the making: on a GPU the driver call may
  // wait for work that waits for the probe).
  void ProbeInside(std::string_view fn, std::function<void()> probe) {
    finished_.store(-1);
    fake::OnNextCall(fn, [this, probe = std::move(probe)] {
      std::future<void> f = std::async(std::launch::async, probe);
      finished_.store(f.wait_for(std::chrono::seconds(20)) == std::future_status::ready);
      // A blocked probe finishes once the call returns: it is waited for then, not here.
      std::lock_guard<std::mutex> lock(probes_mu_);
      probes_.push_back(std::move(f));
    });
  }
  // Runs `body` on a thread of this test's context, and returns once that thread's exit
  // is inside a cuMemFree (true), or the thread is gone without one (false). Then
  // JoinExiting() waits for it.
  bool StartAndWaitForExitsFree(std::function<void()> body) {
    exit_state_ = 0;
    fake::OnNextCall("MemFree", [this] {
      exit_state_ = 1;
      exit_state_.notify_all();
    });
    exiting_ = Thread(std::move(body));
    joiner_ = std::thread([this] {
      exiting_.join();
      exit_state_ = 2;
      exit_state_.notify_all();
    });
    exit_state_.wait(0);
    return exit_state_.load() == 1;
  }
  void JoinExiting() { joiner_.join(); }
  // -1: the probed call was not made; 0: the probe was blocked; 1: it finished.
  int probe_finished() const { return finished_.load(); }
  // Before what the probes use goes away.
  void WaitForProbes() {
    std::lock_guard<std::mutex> lock(probes_mu_);
    for (std::future<void>& f : probes_) f.wait();
    probes_.clear();
  }

  CUcontext context_ = nullptr;
  std::atomic<int> finished_{-1};
  std::mutex probes_mu_;
  std::vector<std::future<void>> probes_;  // waited for by the destructor
  std::atomic<int> exit_state_{0};         // 1: the exit is freeing; 2: the thread is gone
  std::thread exiting_, joiner_;
};

// ---- no lock across driver calls ----

// Every scratch path that allocates or frees does so with no scratch lock held: another
// thread's stats() (which takes every scratch lock) and launches go on meanwhile.
TEST_F(ScratchTest, NoScratchLockIsHeldAcrossAllocationOrFree) {
  Runtime rt = Open();
  CUstream busy = NewStream(), other = NewStream();
  KP_ASSERT_OK(LaunchScratch(rt, other));
  auto probe = [&] {
    (void)rt.stats();
    ASSERT_EQ(d().CtxSetCurrent(context_), CUDA_SUCCESS);
    EXPECT_TRUE(LaunchScratch(rt, other).ok());
  };

  ProbeInside("MemAlloc", probe);  // a stream's arena grows
  KP_ASSERT_OK(LaunchScratch(rt, busy, 8));
  EXPECT_EQ(probe_finished(), 1) << "growing a stream's arena";

  ProbeInside("MemAlloc", probe);  // its arena is large enough: the reservation allocates
  KP_ASSERT_OK(rt.ReserveScratch(busy, 4096));
  EXPECT_EQ(probe_finished(), 1) << "ReserveScratch";

  ProbeInside("MemFree", probe);
  KP_ASSERT_OK(rt.ReleaseScratch(busy));
  EXPECT_EQ(probe_finished(), 1) << "ReleaseScratch";

  // A stream destroyed without ReleaseScratch, then one at its address: the old arena is
  // freed by the new stream's first launch.
  fake::SetHandleReuse(true);
  CUstream first = NewStream();
  KP_ASSERT_OK(LaunchScratch(rt, first));
  ASSERT_EQ(d().StreamDestroy(first), CUDA_SUCCESS);
  CUstream second = NewStream();
  ASSERT_EQ(second, first);
  ProbeInside("MemFree", probe);
  KP_ASSERT_OK(LaunchScratch(rt, second));
  EXPECT_EQ(probe_finished(), 1) << "freeing a destroyed stream's arena";

  // A thread's exit.
  ProbeInside("MemFree", probe);
  std::thread t = Thread([&] { EXPECT_TRUE(LaunchScratch(rt, CU_STREAM_PER_THREAD).ok()); });
  t.join();
  EXPECT_EQ(probe_finished(), 1) << "freeing an exited thread's arena";
  WaitForProbes();
}

// The arena of a graph built node by node (StepGraph's), from an idle arena or cuMemAlloc
// with no lock held, and the user object that holds it: retained by another graph (a
// caller's capture the graph was launched into), it keeps the arena until both are gone.
TEST_F(ScratchTest, AGraphsArenaLivesAsLongAsEveryGraphThatRetainsItsUserObject) {
  internal::ScratchArenas arenas(d());
  unsigned long long context_id = 0;  // NOLINT(runtime/int)
  ASSERT_EQ(d().CtxGetId(nullptr, &context_id), CUDA_SUCCESS);
  CUgraph graph = nullptr, outer = nullptr;
  ASSERT_EQ(d().GraphCreate(&graph, 0), CUDA_SUCCESS);
  ASSERT_EQ(d().GraphCreate(&outer, 0), CUDA_SUCCESS);
  CUuserObject object = nullptr;
  ProbeInside("MemAlloc", [&] { (void)arenas.stats(); });
  absl::StatusOr<CUdeviceptr> base = arenas.ForGraph(graph, context_id, 1000, &object);
  ASSERT_TRUE(base.ok()) << base.status();
  EXPECT_EQ(probe_finished(), 1) << "ForGraph allocates with no lock held";
  EXPECT_EQ(*base % 4096, 0u);
  ASSERT_NE(object, nullptr);
  EXPECT_EQ(arenas.stats().in_graphs, 1u);
  ASSERT_EQ(d().GraphRetainUserObject(outer, object, 1, 0), CUDA_SUCCESS);
  ASSERT_EQ(d().GraphDestroy(graph), CUDA_SUCCESS);
  EXPECT_EQ(arenas.stats().in_graphs, 1u) << "the outer graph still holds it";
  ASSERT_EQ(d().GraphDestroy(outer), CUDA_SUCCESS);
  EXPECT_EQ(arenas.stats().in_graphs, 0u);
  EXPECT_EQ(arenas.stats().idle, 1u);
  // The next graph takes it instead of allocating.
  const int64_t allocations = fake::CallCount("MemAlloc");
  ASSERT_EQ(d().GraphCreate(&graph, 0), CUDA_SUCCESS);
  ASSERT_TRUE(arenas.ForGraph(graph, context_id, 1000).ok());
  EXPECT_EQ(fake::CallCount("MemAlloc"), allocations);
  EXPECT_EQ(arenas.stats().idle, 0u);
  ASSERT_EQ(d().GraphDestroy(graph), CUDA_SUCCESS);
  WaitForProbes();
}

// ---- the graph arena's return on the driver's thread ----

// The deadlock of issue 23: ReleaseScratch's cuMemFree waits for GPU work, which waits
// for a host function queued on the driver's thread behind the destructor of a graph
// that owned scratch. The destructor must return the arena without waiting for anything
// ReleaseScratch holds (the fake reports a wait that never ends as a fault).
TEST_F(ScratchTest, AGraphsArenaReturnsWhileReleaseScratchWaitsForTheGpu) {
  fake::SetAsyncDestructors(true);  // as libcuda: cuGraphDestroy does not wait for them
  Runtime rt = Open();
  CUstream stream = NewStream(), host = NewStream();
  KP_ASSERT_OK(LaunchScratch(rt, stream));
  CUgraph graph = GraphWithScratch(rt);
  fake::OnNextCall("MemFree", [&] {
    ASSERT_EQ(d().GraphDestroy(graph), CUDA_SUCCESS);  // its destructor is queued...
    ASSERT_EQ(d().LaunchHostFunc(
                  host, [](void*) {}, nullptr),
              CUDA_SUCCESS);  // ...before this
  });
  KP_EXPECT_OK(rt.ReleaseScratch(stream));
  EXPECT_THAT(fake::Faults(), IsEmpty()) << "the destructor blocked the driver's thread";
  fake::DrainDriverThread();
  EXPECT_EQ(rt.stats().scratch_in_graphs, 0u);
  EXPECT_EQ(rt.stats().scratch_idle, 1u) << "back in the pool";
}

// A graph destroyed after the Runtime: its destructor still runs without blocking or a
// CUDA call, and the arena (which nothing may free from there) is not freed twice.
TEST_F(ScratchTest, AGraphThatOutlivesTheRuntimeReturnsItsArenaHarmlessly) {
  fake::SetAsyncDestructors(true);
  std::optional<Runtime> rt = Open();
  CUgraph graph = GraphWithScratch(*rt);
  rt.reset();
  EXPECT_EQ(fake::LiveAllocations(), 1) << "the graph's arena, still in use by it";
  const int64_t calls = fake::CallCount("MemFree");
  ASSERT_EQ(d().GraphDestroy(graph), CUDA_SUCCESS);
  fake::DrainDriverThread();
  EXPECT_EQ(fake::CallCount("MemFree"), calls);
}

// ---- per-thread arenas ----

// Fifty short-lived threads that launch once (and a few that reserve) leave nothing.
TEST_F(ScratchTest, AThreadsPerThreadArenasGoWhenItExits) {
  Runtime rt = Open();
  std::vector<std::thread> threads;
  for (int t = 0; t < 50; ++t) {
    threads.push_back(Thread([&, t] {
      EXPECT_TRUE(LaunchScratch(rt, CU_STREAM_PER_THREAD).ok());
      if (t % 10 == 0) EXPECT_TRUE(rt.ReserveScratch(CU_STREAM_PER_THREAD, 8192).ok());
    }));
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(fake::CallCount("MemAlloc"), 50 + 2 * 5) << "a reservation grows the arena too";
  const Runtime::Stats stats = rt.stats();
  EXPECT_EQ(stats.scratch_arenas, 0u);
  EXPECT_EQ(stats.scratch_reserved, 0u);
  EXPECT_EQ(stats.scratch_bytes, 0u);
  EXPECT_EQ(fake::LiveAllocations(), 0);
  EXPECT_EQ(fake::CallCount("MemFree"), fake::CallCount("MemAlloc"));
}

// Freed when the thread exits, but not before its last launch is done: the exit waits in
// cuMemFree for the work still queued on its stream (here held behind a host function),
// and nothing else gets that memory meanwhile.
TEST_F(ScratchTest, AnExitingThreadsArenaOutlivesItsLastLaunch) {
  Runtime rt = Open();
  CUstream other = NewStream();
  Gate gate;
  std::atomic<uint64_t> mine{0};
  EXPECT_TRUE(StartAndWaitForExitsFree([&] {
    ASSERT_EQ(d().LaunchHostFunc(CU_STREAM_PER_THREAD, &Gate::Wait, &gate), CUDA_SUCCESS);
    EXPECT_TRUE(LaunchScratch(rt, CU_STREAM_PER_THREAD).ok());  // runs once the gate opens
    mine = At<uint64_t>(LastLaunch(), 32);
  })) << "the thread exited without freeing its arena";
  EXPECT_EQ(fake::LiveAllocations(), 1) << "freed while its launch was in flight";
  KP_EXPECT_OK(LaunchScratch(rt, other));
  EXPECT_NE(At<uint64_t>(LastLaunch(), 32), mine.load()) << "reused while in flight";
  gate.Open();
  JoinExiting();
  EXPECT_EQ(fake::LiveAllocations(), 1) << "only the other stream's";
  EXPECT_EQ(rt.stats().scratch_arenas, 1u);
}

// A thread's exit frees while another thread captures in global mode, where an unsafe
// call (cuMemFree) from a thread in the default interaction mode would fail and invalidate
// that capture: the exit frees in relaxed mode, and the capture goes on.
TEST_F(ScratchTest, AThreadsExitLeavesAGlobalCaptureAlone) {
  Runtime rt = Open();
  CUstream stream = NewStream();
  Gate launched, go;
  std::thread t = Thread([&] {
    EXPECT_TRUE(LaunchScratch(rt, CU_STREAM_PER_THREAD).ok());
    launched.Open();
    go.open.wait(false);
  });
  launched.open.wait(false);
  ASSERT_EQ(d().StreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  go.Open();
  t.join();  // its exit frees its arena during the capture
  CUgraph graph = nullptr;
  EXPECT_EQ(d().StreamEndCapture(stream, &graph), CUDA_SUCCESS) << "the exit invalidated it";
  if (graph != nullptr) EXPECT_EQ(d().GraphDestroy(graph), CUDA_SUCCESS);
  EXPECT_EQ(fake::LiveAllocations(), 0) << "freed, not left for the Runtime's destruction";
  EXPECT_EQ(rt.stats().scratch_bytes, 0u);
}

// A thread that exits after the Runtime is destroyed: the destruction freed its arena,
// and the exit does nothing (no call into a destroyed Runtime, no second cuMemFree).
TEST_F(ScratchTest, AThreadThatExitsAfterTheRuntimeLeavesItAlone) {
  std::optional<Runtime> rt = Open();
  Gate launched, destroyed;
  std::thread t = Thread([&] {
    EXPECT_TRUE(LaunchScratch(*rt, CU_STREAM_PER_THREAD).ok());
    launched.Open();
    destroyed.open.wait(false);
  });
  launched.open.wait(false);
  rt.reset();
  EXPECT_EQ(fake::LiveAllocations(), 0);
  const int64_t frees = fake::CallCount("MemFree");
  destroyed.Open();
  t.join();
  EXPECT_EQ(fake::CallCount("MemFree"), frees);
}

// A thread whose exit is freeing (waiting for its work in flight) while the Runtime is
// destroyed on another thread: the destruction waits for that free, and frees the rest.
TEST_F(ScratchTest, TheRuntimeWaitsForAnExitingThreadsFree) {
  std::optional<Runtime> rt = Open();
  KP_ASSERT_OK(LaunchScratch(*rt, nullptr));
  Gate gate;
  EXPECT_TRUE(StartAndWaitForExitsFree([&] {
    ASSERT_EQ(d().LaunchHostFunc(CU_STREAM_PER_THREAD, &Gate::Wait, &gate), CUDA_SUCCESS);
    EXPECT_TRUE(LaunchScratch(*rt, CU_STREAM_PER_THREAD).ok());
  })) << "the thread exited without freeing its arena";
  std::thread destroy = Thread([&] { rt.reset(); });
  gate.Open();
  destroy.join();
  JoinExiting();
  EXPECT_EQ(fake::LiveAllocations(), 0);
  EXPECT_EQ(fake::CallCount("MemFree"), fake::CallCount("MemAlloc"));
}

// ---- everything at once (ThreadSanitizer in CI) ----

// Threads that come and go launching on their per-thread streams, a capturer whose graphs
// replay and die (their destructors on the driver's thread, as with libcuda), a stream
// reserved and released over and over, eager launches on a shared stream, and stats():
// every status OK, no fault, and once the Runtime is gone nothing left.
TEST_F(ScratchTest, ArenasComeAndGoUnderConcurrency) {
  fake::SetAsyncDestructors(true);
  std::optional<Runtime> rt = Open();
  KP_ASSERT_OK(rt->Preload());
  constexpr int kRounds = 40;
  std::atomic<int> failures{0};
  auto check = [&](bool ok) {
    if (!ok) failures.fetch_add(1);
  };
  const CUstream shared = NewStream(), capture = NewStream(), replay = NewStream(),
                 churn = NewStream();
  std::vector<std::thread> workers;
  workers.push_back(Thread([&] {  // short-lived threads
    for (int i = 0; i < kRounds; ++i) {
      std::thread t = Thread([&, i] {
        check(LaunchScratch(*rt, CU_STREAM_PER_THREAD, 1 + i % 5).ok());
        if (i % 3 == 0) check(rt->ReserveScratch(CU_STREAM_PER_THREAD, 4096 * (1 + i % 4)).ok());
        check(LaunchScratch(*rt, shared, 1 + i % 7).ok());
      });
      t.join();
    }
  }));
  workers.push_back(Thread([&] {  // captures whose graphs replay and are destroyed
    for (int i = 0; i < kRounds; ++i) {
      check(rt->ReserveScratch(capture, 1 << 14).ok());
      CUgraph graph = nullptr;
      CUgraphExec exec = nullptr;
      check(d().StreamBeginCapture(capture, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL) == CUDA_SUCCESS);
      check(LaunchScratch(*rt, capture, 1 + i % 4).ok());
      check(d().StreamEndCapture(capture, &graph) == CUDA_SUCCESS);
      check(d().GraphInstantiateWithFlags(&exec, graph, 0) == CUDA_SUCCESS);
      check(d().GraphDestroy(graph) == CUDA_SUCCESS);
      check(d().GraphLaunch(exec, replay) == CUDA_SUCCESS);
      check(d().GraphExecDestroy(exec) == CUDA_SUCCESS);
    }
  }));
  workers.push_back(Thread([&] {  // reserve, launch, release
    for (int i = 0; i < kRounds; ++i) {
      check(rt->ReserveScratch(churn, 4096 * (1 + i % 3)).ok());
      check(LaunchScratch(*rt, churn, 1 + i % 6).ok());
      check(rt->ReleaseScratch(churn).ok());
    }
  }));
  workers.push_back(Thread([&] {  // the legacy stream and stats
    for (int i = 0; i < kRounds; ++i) {
      check(LaunchScratch(*rt, nullptr, 1 + i % 9).ok());
      const Runtime::Stats stats = rt->stats();
      check(stats.scratch_arenas <= 5);
    }
  }));
  for (std::thread& w : workers) w.join();
  EXPECT_EQ(failures.load(), 0);
  fake::DrainDriverThread();
  EXPECT_EQ(rt->stats().scratch_in_graphs, 0u);
  rt.reset();
  EXPECT_EQ(fake::LiveAllocations(), 0);
}

}  // namespace
}  // namespace kpack
