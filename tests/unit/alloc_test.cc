// The launch path allocates nothing, locks nothing and logs nothing (nor does the Llama
// engine's decode step, which is built on it). This binary replaces
// the global operator new and interposes pthread_mutex_lock to count both, attaches a
// counting sink to kpack's logger at trace level, then launches through every API path
// against the fake driver (launch entry made a no-op, so only kpack's own work is seen).
// Each count must be zero across the launches, and nonzero where the slow paths run
// (the positive controls show the counters work).

#include <dlfcn.h>
#include <pthread.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <vector>

#include "checkpoint.h"
#include "device.h"
#include "engine.h"
#include "fake_driver.h"
#include "fake_runtime.h"
#include "gtest/gtest.h"
#include "kpack/kpack.h"
#include "launch/tensordesc.h"
#include "model.h"
#include "nlohmann/json.hpp"
#include "spdlog/sinks/base_sink.h"
#include "spdlog/spdlog.h"
#include "test_files.h"

namespace {
std::atomic<long> g_allocations{0};
std::atomic<long> g_locks{0};
}  // namespace

void* operator new(std::size_t n) {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) { return operator new(n); }
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  return std::malloc(n ? n : 1);
}
void* operator new[](std::size_t n, const std::nothrow_t& t) noexcept { return operator new(n, t); }
void* operator new(std::size_t n, std::align_val_t a) {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::aligned_alloc(
          static_cast<size_t>(a),
          (n + static_cast<size_t>(a) - 1) / static_cast<size_t>(a) * static_cast<size_t>(a))) {
    return p;
  }
  throw std::bad_alloc();
}
void* operator new[](std::size_t n, std::align_val_t a) { return operator new(n, a); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }

// std::mutex locks through pthread_mutex_lock, and this definition interposes every call.
// Only calls from this executable's own code count: kpack is linked in statically, while
// the fake driver, a separate shared object, may lock as it likes (it is not kpack).
extern "C" char __executable_start;  // the executable's text, from the GNU linker
extern "C" char etext;
extern "C" int pthread_mutex_lock(pthread_mutex_t* m) {
  using Fn = int (*)(pthread_mutex_t*);
  static Fn real = reinterpret_cast<Fn>(dlsym(RTLD_NEXT, "pthread_mutex_lock"));
  auto caller = reinterpret_cast<uintptr_t>(__builtin_return_address(0));
  if (caller >= reinterpret_cast<uintptr_t>(&__executable_start) &&
      caller < reinterpret_cast<uintptr_t>(&etext)) {
    g_locks.fetch_add(1, std::memory_order_relaxed);
  }
  return real(m);
}

namespace kpack {
namespace {

class CountingSink : public spdlog::sinks::base_sink<std::mutex> {
 public:
  std::atomic<long> messages{0};

 protected:
  void sink_it_(const spdlog::details::log_msg&) override { messages.fetch_add(1); }
  void flush_() override {}
};

struct Counts {
  long allocations, locks, logs;
};

class LaunchPathTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { setenv("KPACK_LOG_LEVEL", "trace", 1); }
  void SetUp() override { testing::ResetFake(); }

  Counts Snapshot() const {
    return {g_allocations.load(), g_locks.load(), sink_ ? sink_->messages.load() : 0};
  }
  void AttachSink() {
    sink_ = std::make_shared<CountingSink>();
    spdlog::get("kpack")->sinks().push_back(sink_);
  }
  void TearDown() override {
    if (sink_) spdlog::get("kpack")->sinks().pop_back();
    fake::Reset();
  }
  std::shared_ptr<CountingSink> sink_;
};

const CUdeviceptr kX = 0x10000, kY = 0x20000, kOut = 0x30000;

TEST_F(LaunchPathTest, CountersSeeTheSlowPaths) {
  Counts before = Snapshot();
  auto rt = kpack::testing::OpenFake();
  ASSERT_TRUE(rt.ok()) << rt.status();
  AttachSink();
  ASSERT_TRUE(rt->Launch("add", Grid{1}, nullptr, kX, kY, kOut, 1).ok());  // lazy load
  Counts after = Snapshot();
  EXPECT_GT(after.allocations, before.allocations);
  EXPECT_GT(after.locks, before.locks);
  EXPECT_GT(after.logs, 0) << "the load is logged";
  // Errors may allocate (the message), but must still not reach the driver.
  EXPECT_FALSE(rt->Launch("add", Grid{1}, nullptr, kX).ok());
}

TEST_F(LaunchPathTest, NoAllocationLockOrLogPerLaunch) {
  auto rt = kpack::testing::OpenFake();
  ASSERT_TRUE(rt.ok()) << rt.status();
  ASSERT_TRUE(rt->Preload().ok());
  AttachSink();
  Kernel add = *rt->Find("add");
  Kernel scalars = *rt->Find("scalars");
  Kernel cluster = *rt->Find("cluster");
  Kernel scratch = *rt->Find("scratch");
  auto bound = add.BindArgs(Grid{4}, nullptr, kX, kY, kOut, 4096);
  ASSERT_TRUE(bound.ok());
  const Arg dynamic[] = {Arg(kX), Arg(kY), Arg(kOut), Arg(4096)};
  // Warm the scratch arenas: their growth is the documented slow path.
  CUstream stream = nullptr;
  ASSERT_EQ(testing::FakeDriver().StreamCreate(&stream, 0), CUDA_SUCCESS);
  for (CUstream s : {CUstream{nullptr}, CU_STREAM_PER_THREAD, stream}) {
    ASSERT_TRUE(scratch.Launch(Grid{8, 8}, s, kX, kOut, 256, 256, 256).ok());
  }
  // A caller's allocator, as Triton's: a bump pointer here.
  static CUdeviceptr next = 0x7f00000000;
  const ScratchAllocator allocator{[](size_t bytes, size_t, CUstream, void*) {
                                     next += (bytes + 255) / 256 * 256;
                                     return next;
                                   },
                                   nullptr};
  const Arg scratch_args[] = {Arg(kX), Arg(kOut), Arg(128), Arg(128), Arg(128)};
  fake::SetLaunchNoop(true);

  const int64_t launches_before = fake::CallCount("LaunchKernelEx");
  Counts before = Snapshot();
  bool ok = true;
  for (int i = 0; i < 1000; ++i) {
    ok &= rt->Launch("add", Grid{4}, nullptr, kX, kY, kOut, i).ok();
    ok &= add.Launch(Grid{4}, nullptr, kX, kY, kOut, i).ok();
    ok &= add.LaunchArgs(Grid{4}, nullptr, dynamic).ok();
    ok &= bound->Set(3, i).ok();
    ok &= bound->Launch().ok();
    ok &=
        scalars.Launch(Grid{2}, nullptr, kX, kOut, i, 0.5, 0.25f, 1.5, true, int64_t{1} << 40).ok();
    // Kinds the packing plan leaves to PackArg (unsigned n, a float for bf16 and an
    // unsigned for i64): the whole call repacked through PackEach, allocating nothing too.
    ok &= scalars
              .Launch(Grid{2}, nullptr, kX, kOut, static_cast<uint32_t>(i), 0.5f, 0.25f, 1.5, true,
                      uint64_t{1} << 40)
              .ok();
    ok &= cluster.Launch(Grid{3}, nullptr, kX, kOut, i).ok();
    ok &= scratch.Launch(Grid{4, 4}, nullptr, kX, kOut, 128, 128, 128).ok();
    ok &= scratch.Launch(Grid{4, 4}, CU_STREAM_PER_THREAD, kX, kOut, 128, 128, 128).ok();
    ok &= scratch.Launch(Grid{4, 4}, stream, kX, kOut, 128, 128, 128).ok();
    ok &= scratch.LaunchArgs(Grid{4, 4}, stream, scratch_args, allocator).ok();
  }
  Counts after = Snapshot();
  EXPECT_TRUE(ok);
  EXPECT_EQ(fake::CallCount("LaunchKernelEx") - launches_before, 11000);
  EXPECT_EQ(after.allocations - before.allocations, 0) << "heap allocations on the launch path";
  EXPECT_EQ(after.locks - before.locks, 0) << "mutex locks on the launch path";
  EXPECT_EQ(after.logs - before.logs, 0) << "log messages on the launch path";
}

TEST_F(LaunchPathTest, DispatchAndGridExpressionsAllocateNothing) {
  auto rt = kpack::testing::OpenFake(KPACK_DISPATCH_PACK_DIR);
  ASSERT_TRUE(rt.ok()) << rt.status();
  ASSERT_TRUE(rt->Preload().ok());
  AttachSink();
  Kernel axpy = *rt->Find("axpy");
  auto bound = axpy.BindArgs(nullptr, kX, kY, kOut, 64, 1, 2.0f);
  ASSERT_TRUE(bound.ok());
  fake::SetLaunchNoop(true);
  const int32_t sizes[] = {16, 4096, 5000, 300000, 4112, 1 << 24};
  const Arg probe[] = {Arg(kX), Arg(kY), Arg(kOut), Arg(4096), Arg(1), Arg(2.0f)};

  Counts before = Snapshot();
  bool ok = true;
  for (int i = 0; i < 1000; ++i) {
    const int32_t n = sizes[i % 6];
    ok &= axpy.Launch(nullptr, kX + 4 * (i % 2), kY, kOut, n, 1 + i % 3, 2.0f).ok();
    ok &= rt->Launch("axpy", Grid{3}, nullptr, kX, kY, kOut, n, 1, 1.0).ok();
    ok &= bound->Set(3, n).ok();  // re-selects the variant across buckets
    ok &= bound->Set(4, 1 + i % 2).ok();
    ok &= bound->Launch().ok();
    ok &= axpy.SelectVariant(probe).ok();
  }
  Counts after = Snapshot();
  EXPECT_TRUE(ok);
  EXPECT_EQ(after.allocations - before.allocations, 0) << "heap allocations on the launch path";
  EXPECT_EQ(after.locks - before.locks, 0) << "mutex locks on the launch path";
  EXPECT_EQ(after.logs - before.logs, 0) << "log messages on the launch path";
}

// Tensor descriptors: encoding (in place, by the fake's cuTensorMapEncodeTiled) and
// storing the map in the parameter's memo, copying a map from the memo, a BoundLaunch's
// Set of a descriptor and of the bucket parameter (repacking from its copies) take
// nothing either. `a` cycles through more bases than a memo holds, so its launches
// encode; b, c and c2 are copied.
TEST_F(LaunchPathTest, TensorDescriptorsAllocateNothing) {
  auto rt = kpack::testing::OpenFake(KPACK_EXAMPLES_PACK_DIR);
  ASSERT_TRUE(rt.ok()) << rt.status();
  ASSERT_TRUE(rt->Find("matmul_tma")->Preload().ok());
  AttachSink();
  Kernel mm = *rt->Find("matmul_tma");
  const TensorDesc a = TensorDesc::RowMajor(kX, {256, 512});
  const TensorDesc b = TensorDesc::RowMajor(kY, {512, 512});
  const TensorDesc c = TensorDesc::RowMajor(kOut, {256, 512});
  const TensorDesc c2 = TensorDesc::RowMajor(kOut + 4096, {256, 512});
  auto bound = mm.BindArgs(nullptr, a, b, c, 256, 512, 512, 132);
  ASSERT_TRUE(bound.ok());
  fake::SetLaunchNoop(true);
  const int64_t encodes_before = fake::TensorMapEncodeCount();
  Counts before = Snapshot();
  bool ok = true;
  // More bases than a memo holds, and odd: the variant that takes every 16th M (the one
  // that assumes M divisible by 16) sees all of them too.
  constexpr int kBases = internal::DescMemo::kWays + 3;
  for (int i = 0; i < 1000; ++i) {
    const TensorDesc ai = TensorDesc::RowMajor(a.base + 4096 * (i % kBases), {256, 512});
    ok &= mm.Launch(nullptr, ai, b, c, 64 + i % 300, 512, 512, 132).ok();
    ok &= bound->Set(2, i % 2 ? c : c2).ok();
    ok &= bound->Set(3, 64 + i % 300).ok();  // crosses the bucket edge: a repack
    ok &= bound->Launch().ok();
  }
  Counts after = Snapshot();
  EXPECT_TRUE(ok);
  EXPECT_GE(fake::TensorMapEncodeCount() - encodes_before, 1000) << "a's encodes";
  EXPECT_LT(fake::TensorMapEncodeCount() - encodes_before, 1100) << "b's and c's copies";
  EXPECT_EQ(after.allocations - before.allocations, 0) << "heap allocations on the launch path";
  EXPECT_EQ(after.locks - before.locks, 0) << "mutex locks on the launch path";
  EXPECT_EQ(after.logs - before.logs, 0) << "log messages on the launch path";
}

// A StepGraph replay (kpack/graph.h): resolving the grids, finding the signature's graph
// (here alternating between two), patching the changed nodes and launching allocates,
// locks and logs nothing once the graphs exist. (The fake driver's own bookkeeping of
// node updates reaches its capacity during the warm-up.)
TEST_F(LaunchPathTest, StepGraphReplaysAllocateLockAndLogNothing) {
  auto rt = kpack::testing::OpenFake(KPACK_DISPATCH_PACK_DIR);
  ASSERT_TRUE(rt.ok()) << rt.status();
  AttachSink();
  Kernel axpy = *rt->Find("axpy");
  auto a = axpy.BindArgs(nullptr, kX, kY, kOut, 17, 3, 2.0f);
  auto b = axpy.BindArgs(nullptr, kX, kY, kOut, 17, 3, 2.0f);
  ASSERT_TRUE(a.ok() && b.ok());
  BoundLaunch* step[] = {&*a, &*b};
  auto graph = StepGraph::Create(step);
  ASSERT_TRUE(graph.ok()) << graph.status();
  // n not divisible by 16 keeps the generic variant of bucket 0; n <= 256 one program.
  auto replay = [&](int i) {
    const int n = 17 + 16 * (i % 8) + (i % 3 == 0 ? 300 : 0);  // two grids: two graphs
    return a->Set(3, n).ok() && b->Set(3, n + 16).ok() && graph->Replay(nullptr).ok();
  };
  bool ok = true;
  for (int i = 0; i < 3000; ++i) ok &= replay(i);
  ASSERT_TRUE(ok);
  ASSERT_EQ(graph->stats().graphs_built, 2u);

  Counts before = Snapshot();
  for (int i = 0; i < 1000; ++i) ok &= replay(i);
  Counts after = Snapshot();
  EXPECT_TRUE(ok);
  EXPECT_EQ(graph->stats().graphs_built, 2u);
  EXPECT_EQ(after.allocations - before.allocations, 0) << "heap allocations per replay";
  EXPECT_EQ(after.locks - before.locks, 0) << "mutex locks per replay";
  EXPECT_EQ(after.logs - before.logs, 0) << "log messages per replay";

  // Replays with nothing changed, and with only a pointer changed (resolution skipped,
  // the bytes compared and patched).
  before = Snapshot();
  for (int i = 0; i < 1000; ++i) {
    ok &= graph->Replay(nullptr).ok();
    ok &= a->Set(2, i % 2 == 0 ? kOut : kX).ok() && graph->Replay(nullptr).ok();
  }
  after = Snapshot();
  EXPECT_TRUE(ok);
  EXPECT_EQ(graph->stats().last_nodes_patched, 1u);
  EXPECT_EQ(after.allocations - before.allocations, 0) << "heap allocations per replay";
  EXPECT_EQ(after.locks - before.locks, 0) << "mutex locks per replay";
  EXPECT_EQ(after.logs - before.logs, 0) << "log messages per replay";
}

// A kernel of more arguments than GridPlan's inline storage (16): the benchmark pack's
// 32-argument kernel, bucketed on n and grid-tolerant here, in a step whose n changes
// every replay inside its bucket, so that each replay pads the grid again. The padded
// arguments go to a scratch the plan sized at construction (an experiment that gave the
// Llama engine's decode attention 18 arguments found it: its steps allocated on every
// batch change).
TEST_F(LaunchPathTest, PaddingAGridOfManyArgumentsAllocatesNothing) {
  kpack::testing::TempPack pack(KPACK_BENCH_PACK_DIR);
  pack.manifest()["format"] = "kpack/2";
  nlohmann::json& k = pack.kernel("args32");
  k["buckets"] = nlohmann::json::array({{{"param", "n"}, {"edges", {1024, 65536}}}});
  k["grid_tolerance"] = {{"proof", "asserted"}};
  nlohmann::json variant = k["variants"][0];
  k["variants"] = nlohmann::json::array();
  for (int b = 0; b < 3; ++b) {
    variant["name"] = "b" + std::to_string(b);
    variant["bucket"] = {b};
    k["variants"].push_back(variant);
  }
  pack.Save();
  auto rt = kpack::testing::OpenFake(pack.dir());
  ASSERT_TRUE(rt.ok()) << rt.status();
  AttachSink();
  Kernel args32 = *rt->Find("args32");
  ASSERT_EQ(args32.num_args(), 32u);
  const CUdeviceptr p = kX;
  auto a = args32.BindArgs(nullptr, p, p, p, p, p, p, p, p, p, p, p, p, p, p, p, kOut, 100, 1, 1,
                           1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1);
  ASSERT_TRUE(a.ok()) << a.status();
  BoundLaunch* step[] = {&*a};
  auto graph = StepGraph::Create(step);
  ASSERT_TRUE(graph.ok()) << graph.status();
  auto replay = [&](int i) {  // n in 100..1000: bucket 0, exact grids of 1..8 programs
    return a->Set(16, 100 + 100 * (i % 10)).ok() && graph->Replay(nullptr).ok();
  };
  bool ok = true;
  for (int i = 0; i < 100; ++i) ok &= replay(i);
  ASSERT_TRUE(ok);
  Counts before = Snapshot();
  for (int i = 0; i < 1000; ++i) ok &= replay(i);
  Counts after = Snapshot();
  EXPECT_TRUE(ok);
  EXPECT_EQ(graph->stats().graphs_built, 1u) << "one padded grid: one graph";
  EXPECT_EQ(after.allocations - before.allocations, 0) << "heap allocations per replay";
  EXPECT_EQ(after.locks - before.locks, 0) << "mutex locks per replay";
  EXPECT_EQ(after.logs - before.logs, 0) << "log messages per replay";
}

// Unseen::kLaunchEagerly: a step whose signature has no graph, every launch prepared
// before any is sent, allocates, locks and logs nothing either.
TEST_F(LaunchPathTest, EagerStepsAllocateLockAndLogNothing) {
  auto rt = kpack::testing::OpenFake(KPACK_DISPATCH_PACK_DIR);
  ASSERT_TRUE(rt.ok()) << rt.status();
  ASSERT_TRUE(rt->Preload().ok());
  AttachSink();
  Kernel axpy = *rt->Find("axpy");
  auto a = axpy.BindArgs(nullptr, kX, kY, kOut, 17, 3, 2.0f);
  auto b = axpy.BindArgs(nullptr, kX, kY, kOut, 33, 3, 2.0f);
  ASSERT_TRUE(a.ok() && b.ok());
  BoundLaunch* step[] = {&*a, &*b};
  StepGraph::Options options;
  options.unseen = StepGraph::Unseen::kLaunchEagerly;
  auto graph = StepGraph::Create(step, options);
  ASSERT_TRUE(graph.ok()) << graph.status();
  auto eager = [&](int i) {
    const int n = 17 + 16 * (i % 8);
    return a->Set(3, n).ok() && b->Set(3, n + 16).ok() && graph->Replay(nullptr).ok();
  };
  bool ok = eager(0);
  Counts before = Snapshot();
  for (int i = 0; i < 1000; ++i) ok &= eager(i);
  Counts after = Snapshot();
  EXPECT_TRUE(ok);
  EXPECT_EQ(graph->stats().eager_steps, 1001u);
  EXPECT_EQ(graph->stats().graphs_built, 0u);
  EXPECT_EQ(after.allocations - before.allocations, 0) << "heap allocations per eager step";
  EXPECT_EQ(after.locks - before.locks, 0) << "mutex locks per eager step";
  EXPECT_EQ(after.logs - before.logs, 0) << "log messages per eager step";
}

// The Llama engine's decode step (examples/llama) after warm-up: graph replays, eager
// bound launches, a batch size changing inside its bucket, and the pinned read-backs. A
// micro model of the llama pack's head size, written here; no kernel emulated (the
// fake's launches do nothing), so only the engine's, kpack's and the driver's host work
// runs.
TEST_F(LaunchPathTest, LlamaDecodeStepsAllocateLockAndLogNothing) {
  llama::LlamaConfig config = llama::testing::MicroConfig();
  config.head_dim = 64;  // the pack's
  llama::testing::TempDir dir;
  llama::testing::WriteFile(dir.file("config.json"), llama::testing::ConfigJson(config));
  llama::testing::WriteFile(
      dir.file("model.safetensors"),
      llama::testing::SafetensorsOf(llama::testing::CheckpointTensors(config)));
  auto device = llama::Device::Open(KPACK_FAKE_DRIVER, 0);
  ASSERT_TRUE(device.ok()) << device.status();
  auto rt = kpack::testing::OpenFake(KPACK_LLAMA_PACK_DIR);
  ASSERT_TRUE(rt.ok()) << rt.status();
  auto checkpoint = llama::Checkpoint::Open(dir.path().string());
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  auto model = llama::Model::Upload(**device, *checkpoint);
  ASSERT_TRUE(model.ok()) << model.status();
  llama::EngineOptions options;
  options.max_batch = 3;
  options.max_prompt = 4;
  options.capacity = 4096;
  options.read_logits = true;
  auto engine = llama::Engine::Create(*rt, **device, *model, options);
  ASSERT_TRUE(engine.ok()) << engine.status();
  llama::Engine& e = **engine;
  const int32_t prompt[] = {1, 2, 3, 4};
  for (int row = 0; row < 3; ++row) ASSERT_TRUE(e.Prefill(row, prompt).ok());
  // A step: graph replay or eager launches, batch 3 or 2, read back a step late.
  int step = 0;
  auto decode = [&](int batch, llama::Engine::Mode mode) {
    bool ok = e.Decode(batch, mode).ok() && e.EnqueueReadback(step % 2, batch).ok();
    if (step > 0) ok &= e.WaitReadback((step - 1) % 2).ok();
    ++step;
    return ok;
  };
  for (llama::Engine::Mode mode : {llama::Engine::Mode::kGraph, llama::Engine::Mode::kEager}) {
    ASSERT_TRUE(decode(3, mode) && decode(2, mode));  // warm-up: bind, build, first NVTX
  }
  fake::SetLaunchNoop(true);
  AttachSink();

  Counts before = Snapshot();
  bool ok = true;
  for (int i = 0; i < 200; ++i) {
    const int batch = i % 10 == 0 ? 2 : 3;
    ok &= decode(batch, i % 4 == 3 ? llama::Engine::Mode::kEager : llama::Engine::Mode::kGraph);
  }
  Counts after = Snapshot();
  EXPECT_TRUE(ok);
  EXPECT_EQ(e.stats().graphs_built, 1u);
  EXPECT_EQ(after.allocations - before.allocations, 0) << "heap allocations per decode step";
  EXPECT_EQ(after.locks - before.locks, 0) << "mutex locks per decode step";
  EXPECT_EQ(after.logs - before.logs, 0) << "log messages per decode step";
}

}  // namespace
}  // namespace kpack
