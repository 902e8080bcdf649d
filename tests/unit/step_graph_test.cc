// kpack::StepGraph (kpack/graph.h) against the recording fake driver: what only the fake can
// observe -- which graphs are built (signature keys, node grids, attributes), which nodes
// a replay patches and which bytes change, scratch ownership -- and the errors for bad
// cases. The outputs of replays against eager launches are the conformance suite's
// (tests/conformance/graph_test.cc), on the fake and on a GPU.
//
// Packs: kernels/dispatchpack's axpy (n bucketed at 4096 and 262144, grid cdiv(n, BLOCK)
// with BLOCK 256 / 1024 / 4096 per bucket), copied with a kpack/2 `grid_tolerance`; and
// kernels/testpack's add, cluster (num_ctas 2), pdl and scratch (128 bytes of global
// scratch per program), which have no grid expressions and no tolerance.

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <latch>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "fake_driver.h"
#include "fake_runtime.h"
#include "gmock/gmock.h"
#include "graph/graph_grid.h"
#include "gtest/gtest.h"
#include "kpack/kpack.h"

namespace kpack {
namespace {

using ::kpack::testing::At;
using ::kpack::testing::OpenFake;
using ::kpack::testing::TempPack;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

const CUdeviceptr kX = 0x100000, kY = 0x200000, kOut = 0x300000, kOut2 = 0x400000;

std::string Msg(const absl::Status& s) { return std::string(s.message()); }

// The byte ranges [begin, end) where two parameter buffers differ.
std::vector<std::pair<size_t, size_t>> Differences(const std::byte* a, const std::byte* b,
                                                   size_t n) {
  std::vector<std::pair<size_t, size_t>> ranges;
  for (size_t i = 0; i < n; ++i) {
    if (a[i] == b[i]) continue;
    if (!ranges.empty() && ranges.back().second == i) {
      ranges.back().second = i + 1;
    } else {
      ranges.push_back({i, i + 1});
    }
  }
  return ranges;
}

// The slot of call parameter `param` in variant `variant` of `k`.
LayoutSlotInfo Slot(const Kernel& k, std::string_view variant, std::string_view param) {
  for (const VariantInfo& v : k.info().variants) {
    if (v.name != variant) continue;
    for (const LayoutSlotInfo& s : v.layout) {
      if (s.name == param) return s;
    }
  }
  ADD_FAILURE() << "no slot " << param << " in " << variant;
  return {};
}

class StepGraphTest : public ::testing::Test {
 protected:
  void SetUp() override {
    testing::ResetFake();
    ASSERT_EQ(testing::FakeDriver().StreamCreate(&stream_, 0), CUDA_SUCCESS);
    ASSERT_EQ(testing::FakeDriver().StreamCreate(&other_, 0), CUDA_SUCCESS);
  }
  void TearDown() override {
    graph_.reset();
    binds_.clear();
    rt_.reset();
    fake::Reset();
  }

  // The dispatch pack with axpy made grid-tolerant (`max`: the open-ended bucket's;
  // `grid`: other grid expressions than its own, cdiv(n, BLOCK)).
  void OpenTolerant(std::optional<int64_t> max = std::nullopt,
                    std::vector<std::string> grid = {}) {
    pack_ = std::make_unique<TempPack>(KPACK_DISPATCH_PACK_DIR);
    pack_->manifest()["format"] = "kpack/2";
    nlohmann::json tolerance = {{"proof", "gpu"}};
    if (max.has_value()) tolerance["max"] = {{"n", *max}};
    pack_->kernel("axpy")["grid_tolerance"] = tolerance;
    if (!grid.empty()) pack_->kernel("axpy")["grid"] = grid;
    pack_->Save();
    Open(pack_->dir());
    axpy_ = *rt_->Find("axpy");
    ASSERT_TRUE(axpy_.info().grid_tolerant);
  }
  void Open(const std::string& dir) {
    auto rt = OpenFake(dir);
    ASSERT_TRUE(rt.ok()) << rt.status();
    rt_ = std::make_unique<Runtime>(std::move(*rt));
  }
  BoundLaunch& BindAxpy(int64_t n, CUdeviceptr out = kOut) {
    const Arg args[] = {Arg(kX), Arg(kY), Arg(out), Arg(n), Arg(3), Arg(2.0f)};
    auto b = axpy_.Bind(stream_, args);
    EXPECT_TRUE(b.ok()) << b.status();
    binds_.push_back(std::make_unique<BoundLaunch>(std::move(*b)));
    return *binds_.back();
  }
  BoundLaunch& Bind(const char* kernel, const Grid& grid, std::vector<Arg> args) {
    auto b = rt_->Find(kernel)->Bind(grid, stream_, args);
    EXPECT_TRUE(b.ok()) << b.status();
    binds_.push_back(std::make_unique<BoundLaunch>(std::move(*b)));
    return *binds_.back();
  }
  StepGraph& MakeGraph(StepGraph::Options options = {}) {
    std::vector<BoundLaunch*> step;
    for (auto& b : binds_) step.push_back(b.get());
    auto g = StepGraph::Create(step, options);
    EXPECT_TRUE(g.ok()) << g.status();
    graph_ = std::make_unique<StepGraph>(std::move(*g));
    return *graph_;
  }
  // The exec graph most recently instantiated.
  CUgraphExec LastExec() {
    std::vector<CUgraphExec> execs = fake::LiveExecs();
    EXPECT_FALSE(execs.empty());
    return execs.empty() ? nullptr : execs.back();
  }
  // The scratch pointer a launch of testpack's `scratch` kernel passes.
  CUdeviceptr ScratchOf(const fake::LaunchRecord& r) {
    const size_t slot = Slot(*rt_->Find("scratch"), "default", "$global_scratch").offset;
    CUdeviceptr p;
    std::memcpy(&p, r.params.data() + slot, 8);
    return p;
  }
  // Ends the capture on `stream`, expecting it valid, and returns its graph.
  CUgraph EndCapture(CUstream stream) {
    CUgraph graph = nullptr;
    EXPECT_EQ(testing::FakeDriver().StreamEndCapture(stream, &graph), CUDA_SUCCESS)
        << "the caller's capture was invalidated";
    return graph;
  }

  // What the last replay's `nodes` nodes launched, in node order (the fake records every
  // node a cuGraphLaunch runs).
  std::vector<fake::LaunchRecord> LastReplay(size_t nodes) {
    std::vector<fake::LaunchRecord> out;
    for (int64_t i = fake::LaunchCount() - static_cast<int64_t>(nodes); i < fake::LaunchCount();
         ++i) {
      out.push_back(fake::GetLaunch(i));
      EXPECT_TRUE(out.back().graph_replay);
    }
    return out;
  }
  // Replays the graph on stream_ and expects every node to launch the bytes its BoundLaunch
  // sends eagerly (each then launched eagerly), with the x grids `grids`, in node order.
  // Returns what the replay launched.
  std::vector<fake::LaunchRecord> ReplayAndExpectEagerBytes(StepGraph& g,
                                                            const std::vector<unsigned>& grids) {
    const absl::Status s = g.Replay(stream_);
    EXPECT_TRUE(s.ok()) << s;
    const std::vector<fake::LaunchRecord> replayed = LastReplay(binds_.size());
    EXPECT_EQ(replayed.size(), grids.size());
    for (size_t i = 0; i < binds_.size() && i < grids.size(); ++i) {
      EXPECT_TRUE(binds_[i]->Launch().ok());
      const fake::LaunchRecord eager = fake::GetLaunch(fake::LaunchCount() - 1);
      EXPECT_FALSE(eager.graph_replay);
      EXPECT_EQ(eager.param_size, replayed[i].param_size) << "launch " << i;
      EXPECT_THAT(Differences(eager.params.data(), replayed[i].params.data(),
                              std::min(eager.param_size, replayed[i].param_size)),
                  IsEmpty())
          << "launch " << i;
      EXPECT_EQ(replayed[i].grid[0], grids[i]) << "launch " << i;
      EXPECT_EQ(std::string(replayed[i].entry.data()), std::string(eager.entry.data()));
    }
    return replayed;
  }

  CUstream stream_ = nullptr, other_ = nullptr;
  std::unique_ptr<TempPack> pack_;
  std::unique_ptr<Runtime> rt_;
  Kernel axpy_;
  std::vector<std::unique_ptr<BoundLaunch>> binds_;
  std::unique_ptr<StepGraph> graph_;
};

TEST_F(StepGraphTest, OneGraphPerBucketSignatureWithGridsAtTheBucketsUpperEdges) {
  OpenTolerant();
  BoundLaunch& a = BindAxpy(100);     // bucket 0: BLOCK 256, padded to cdiv(4096, 256)
  BindAxpy(5000);                     // bucket 1: BLOCK 1024, padded to cdiv(262144, 1024)
  StepGraph& g = MakeGraph();
  EXPECT_EQ(*g.Signature(), "axpy/b0_generic[16,1,1]; axpy/b1_generic[256,1,1]");
  KP_ASSERT_OK(g.Replay(stream_));
  EXPECT_EQ(g.stats().graphs_built, 1u);
  EXPECT_EQ(g.stats().replays, 1u);
  EXPECT_EQ(fake::CallCount("GraphCreate"), 1);
  EXPECT_EQ(fake::CallCount("GraphAddKernelNode"), 2);
  EXPECT_EQ(fake::CallCount("GraphInstantiateWithFlags"), 1);
  std::vector<fake::LaunchRecord> nodes = fake::ExecNodes(LastExec());
  ASSERT_EQ(nodes.size(), 2u);
  EXPECT_EQ(nodes[0].grid[0], 16u);
  EXPECT_EQ(nodes[1].grid[0], 256u);
  // The replay ran the nodes on the replay stream, as launches of the graph.
  const fake::LaunchRecord last = fake::GetLaunch(fake::LaunchCount() - 1);
  EXPECT_TRUE(last.graph_replay);
  EXPECT_EQ(last.stream, stream_);

  // Every size of bucket 0 shares that graph (sizes not divisible by 16 keep the generic
  // variant): only n's bytes change, in node 0 only.
  for (int64_t n : {1, 2047, 4095}) {
    KP_ASSERT_OK(a.Set(3, n));
    EXPECT_EQ(*g.Signature(), "axpy/b0_generic[16,1,1]; axpy/b1_generic[256,1,1]") << n;
    KP_ASSERT_OK(g.Replay(stream_));
    EXPECT_EQ(g.stats().last_nodes_patched, 1u) << n;
  }
  EXPECT_EQ(g.stats().graphs_built, 1u);
  EXPECT_EQ(g.graphs().size(), 1u);
  EXPECT_EQ(g.graphs()[0].replays, 4u);
  std::vector<fake::NodeUpdate> updates = fake::NodeUpdates();
  ASSERT_EQ(updates.size(), 3u);
  const LayoutSlotInfo n_slot = Slot(axpy_, "b0_generic", "n");
  for (size_t u = 0; u < updates.size(); ++u) {
    EXPECT_EQ(updates[u].exec, fake::ExecId(LastExec()));
    EXPECT_EQ(updates[u].node, 0u);
    EXPECT_EQ(updates[u].launch.grid[0], 16u) << "the grid stays";
    const std::byte* before = u == 0 ? nodes[0].params.data() : updates[u - 1].launch.params.data();
    const auto differ = Differences(before, updates[u].launch.params.data(), nodes[0].param_size);
    ASSERT_FALSE(differ.empty());
    for (auto [begin, end] : differ) {
      EXPECT_GE(begin, n_slot.offset) << "update " << u;
      EXPECT_LE(end, n_slot.offset + n_slot.size) << "update " << u << ": only n's bytes";
    }
  }
  // A replay with nothing changed patches nothing.
  KP_ASSERT_OK(g.Replay(other_));
  EXPECT_EQ(g.stats().last_nodes_patched, 0u);
  EXPECT_EQ(fake::NodeUpdates().size(), 3u);
  EXPECT_EQ(fake::GraphLaunches(), 5);
  EXPECT_EQ(g.stats().nodes_patched, 3u);
}

TEST_F(StepGraphTest, PointersArePatchedLikeAnyOtherBytes) {
  OpenTolerant();
  BoundLaunch& a = BindAxpy(100);
  StepGraph& g = MakeGraph();
  KP_ASSERT_OK(g.Replay(stream_));
  KP_ASSERT_OK(a.Set(2, kOut2));
  KP_ASSERT_OK(g.Replay(stream_));
  ASSERT_EQ(fake::NodeUpdates().size(), 1u);
  const fake::LaunchRecord patched = fake::NodeUpdates()[0].launch;
  const LayoutSlotInfo out = Slot(axpy_, "b0_generic", "out_ptr");
  CUdeviceptr value;
  std::memcpy(&value, patched.params.data() + out.offset, 8);
  EXPECT_EQ(value, kOut2);
  // The bytes the graph replays are those an eager launch of the BoundLaunch sends.
  KP_ASSERT_OK(a.Launch());
  const fake::LaunchRecord eager = fake::GetLaunch(fake::LaunchCount() - 1);
  const fake::LaunchRecord replayed = fake::GetLaunch(fake::LaunchCount() - 2);
  ASSERT_TRUE(replayed.graph_replay);
  EXPECT_THAT(Differences(eager.params.data(), replayed.params.data(), eager.param_size),
              IsEmpty());
  EXPECT_EQ(eager.grid[0], 1u);
  EXPECT_EQ(replayed.grid[0], 16u) << "the bucket's grid";
}

TEST_F(StepGraphTest, ANewBucketOrSpecializationIsANewSignature) {
  OpenTolerant();
  BoundLaunch& a = BindAxpy(100);
  StepGraph& g = MakeGraph();
  KP_ASSERT_OK(g.Replay(stream_));
  KP_ASSERT_OK(a.Set(3, 5000));  // bucket 1: another variant, another grid
  EXPECT_EQ(*g.Signature(), "axpy/b1_generic[256,1,1]");
  KP_ASSERT_OK(g.Replay(stream_));
  KP_ASSERT_OK(a.Set(3, 4096));  // div16 now (n and the pointers): another variant
  KP_ASSERT_OK(a.Set(4, 1));     // stride_x == 1 is compiled away: a shorter buffer
  EXPECT_EQ(*g.Signature(), "axpy/b0_div16_unit[16,1,1]");
  KP_ASSERT_OK(g.Replay(stream_));
  EXPECT_EQ(g.stats().graphs_built, 3u);
  KP_ASSERT_OK(a.Set(3, 16));  // the same signature, another size
  KP_ASSERT_OK(g.Replay(stream_));
  EXPECT_EQ(g.stats().last_nodes_patched, 1u);
  KP_ASSERT_OK(a.Set(3, 101));  // back to a signature seen before
  KP_ASSERT_OK(a.Set(4, 3));
  KP_ASSERT_OK(g.Replay(stream_));
  EXPECT_EQ(g.stats().graphs_built, 3u);
  std::vector<std::string> keys;
  for (const StepGraph::GraphInfo& info : g.graphs()) keys.push_back(info.signature);
  EXPECT_THAT(keys, ElementsAre("axpy/b0_generic[16,1,1]", "axpy/b1_generic[256,1,1]",
                                "axpy/b0_div16_unit[16,1,1]"));
}

TEST_F(StepGraphTest, DeclaredSignaturesThenAnUnseenOneIsAnErrorNamingTheLaunch) {
  OpenTolerant();
  BoundLaunch& a = BindAxpy(100);
  BoundLaunch& b = BindAxpy(100, kOut2);
  StepGraph& g = MakeGraph();
  // Declare: both launches in bucket 0, then b in bucket 1.
  KP_ASSERT_OK(g.Build());
  KP_ASSERT_OK(b.Set(3, 5000));
  KP_ASSERT_OK(g.Build());
  KP_ASSERT_OK(g.Build());  // already there
  EXPECT_EQ(g.stats().graphs_built, 2u);
  EXPECT_EQ(fake::GraphLaunches(), 0) << "Build launches nothing";
  g.set_unseen(StepGraph::Unseen::kError);
  KP_ASSERT_OK(a.Set(3, 3000));  // still bucket 0
  KP_ASSERT_OK(g.Replay(stream_));
  KP_ASSERT_OK(a.Set(3, 300001));  // bucket 2: never declared
  absl::Status s = g.Replay(stream_);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(Msg(s), AllOf(HasSubstr("new signatures are errors"),
                            HasSubstr("launch 0 is kernel 'axpy' variant 'b2_generic' "
                                      "(bucket n >= 262145) with grid (74, 1, 1)"),
                            HasSubstr("they have variant 'b0_generic' grid (16, 1, 1)"),
                            HasSubstr("its variant changed")));
  // Each launch's shape declared, but not together: (b1, b1) declared now, then (b1, b0).
  KP_ASSERT_OK(a.Set(3, 5000));
  KP_ASSERT_OK(b.Set(3, 5000));
  KP_ASSERT_OK(g.Build());
  KP_ASSERT_OK(b.Set(3, 100));
  s = g.Replay(stream_);
  EXPECT_THAT(Msg(s), HasSubstr("every launch's variant and grid was built, but not in this "
                                "combination: axpy/b1_generic[256,1,1]; axpy/b0_generic[16,1,1]"));
  EXPECT_EQ(g.stats().graphs_built, 3u);
  EXPECT_EQ(g.stats().replays, 1u);
}

TEST_F(StepGraphTest, OpenEndedBucketKeepsExactGridsUnlessThePackDeclaresAMaximum) {
  OpenTolerant();
  BoundLaunch& a = BindAxpy(300001);  // bucket 2 is open-ended: cdiv(n, 4096) exact
  StepGraph& g = MakeGraph();
  EXPECT_EQ(*g.Signature(), "axpy/b2_generic[74,1,1]");
  KP_ASSERT_OK(g.Replay(stream_));
  KP_ASSERT_OK(a.Set(3, 400001));
  EXPECT_EQ(*g.Signature(), "axpy/b2_generic[98,1,1]");
  g.set_unseen(StepGraph::Unseen::kError);
  EXPECT_THAT(Msg(g.Replay(stream_)),
              AllOf(HasSubstr("launch 0 is kernel 'axpy' variant 'b2_generic'"),
                    HasSubstr("its bucket is open-ended and the pack declares no "
                              "grid_tolerance.max, so its exact grid is part of the signature")));

  graph_.reset();
  binds_.clear();
  OpenTolerant(/*max=*/1 << 20);
  BoundLaunch& m = BindAxpy(300001);
  StepGraph& h = MakeGraph();
  EXPECT_EQ(*h.Signature(), "axpy/b2_generic[256,1,1]") << "padded to max 2^20";
  KP_ASSERT_OK(m.Set(3, (1 << 20) - 1));
  EXPECT_EQ(*h.Signature(), "axpy/b2_generic[256,1,1]");
  KP_ASSERT_OK(m.Set(3, (1 << 20) + 1));
  EXPECT_EQ(*h.Signature(), "axpy/b2_generic[257,1,1]") << "above the maximum: exact";
}

TEST_F(StepGraphTest, AKernelWithoutTheFlagKeepsItsExactGridInTheSignature) {
  Open(KPACK_TEST_PACK_DIR);
  BoundLaunch& add = Bind("add", Grid{4}, {Arg(kX), Arg(kY), Arg(kOut), Arg(4096)});
  StepGraph& g = MakeGraph();
  KP_ASSERT_OK(g.Replay(stream_));
  add.set_grid(Grid{5});
  KP_ASSERT_OK(g.Replay(stream_));
  EXPECT_EQ(g.stats().graphs_built, 2u) << "a different grid is a different graph";
  add.set_grid(Grid{6});
  g.set_unseen(StepGraph::Unseen::kError);
  absl::Status s = g.Replay(stream_);
  EXPECT_THAT(Msg(s), AllOf(HasSubstr("launch 0 is kernel 'add' variant 'default' (no buckets) "
                                      "with grid (6, 1, 1)"),
                            HasSubstr("its variant was declared with other grids: kernel 'add' "
                                      "has no grid_tolerance in its pack, so its exact grid is "
                                      "part of the signature")));
  s = g.PinGrid(0, Grid{8});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(s), HasSubstr("kernel 'add' has no grid_tolerance in its pack"));
}

TEST_F(StepGraphTest, APinnedGridServesEveryLaunchGridUpToIt) {
  OpenTolerant();
  const Arg args[] = {Arg(kX), Arg(kY), Arg(kOut), Arg(100), Arg(3), Arg(2.0f)};
  auto b = axpy_.Bind(Grid{2}, stream_, args);  // an explicit grid: exact unless pinned
  ASSERT_TRUE(b.ok());
  binds_.push_back(std::make_unique<BoundLaunch>(std::move(*b)));
  StepGraph& g = MakeGraph();
  EXPECT_EQ(*g.Signature(), "axpy/b0_generic[2,1,1]");
  KP_ASSERT_OK(g.PinGrid(0, Grid{16}));
  EXPECT_EQ(*g.Signature(), "axpy/b0_generic[16,1,1]");
  KP_ASSERT_OK(g.Replay(stream_));
  binds_[0]->set_grid(Grid{9});
  KP_ASSERT_OK(g.Replay(stream_));
  EXPECT_EQ(g.stats().graphs_built, 1u);
  binds_[0]->set_grid(Grid{17});
  absl::Status s = g.Replay(stream_);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(s), HasSubstr("step graph launch 0: kernel 'axpy': the launch's grid (17, 1, 1) "
                                "exceeds the grid pinned for the graph (16, 1, 1)"));
  EXPECT_EQ(g.PinGrid(1, Grid{1}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(g.PinGrid(0, Grid{0}).code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(StepGraphTest, EagerFallbackOnlyWhenAskedFor) {
  OpenTolerant();
  BoundLaunch& a = BindAxpy(100);
  StepGraph::Options options;
  options.unseen = StepGraph::Unseen::kLaunchEagerly;
  StepGraph& g = MakeGraph(options);
  KP_ASSERT_OK(g.Replay(other_));
  EXPECT_EQ(g.stats().eager_steps, 1u);
  EXPECT_EQ(g.stats().graphs_built, 0u);
  const fake::LaunchRecord r = fake::GetLaunch(fake::LaunchCount() - 1);
  EXPECT_FALSE(r.graph_replay);
  EXPECT_EQ(r.grid[0], 1u) << "eagerly: the exact grid";
  EXPECT_EQ(r.stream, other_) << "on the replay's stream";
  KP_ASSERT_OK(g.Build());
  KP_ASSERT_OK(a.Set(3, 200));
  KP_ASSERT_OK(g.Replay(other_));
  EXPECT_EQ(g.stats().replays, 1u) << "a declared signature replays its graph";
  EXPECT_EQ(g.stats().eager_steps, 1u);
}

// A graph's scratch laid out past any device's memory is an error naming the launch and
// its grid, never a size wrapped in 64 bits: 2^25 * 65535^2 programs of 128 bytes are
// about 2^64 bytes.
TEST_F(StepGraphTest, ScratchPastAnyDeviceIsAnError) {
  Open(KPACK_TEST_PACK_DIR);
  const std::vector<Arg> args = {Arg(kX), Arg(kOut), Arg(64), Arg(64), Arg(64)};
  Bind("scratch", Grid{1u << 25, 65535, 65535}, args);
  StepGraph& g = MakeGraph();
  const absl::Status s = g.Replay(stream_);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_THAT(Msg(s), AllOf(HasSubstr("step graph launch 0"), HasSubstr("kernel 'scratch'"),
                            HasSubstr("its scratch memory for grid (33554432, 65535, 65535) "
                                      "passes 2^62 bytes")));
  EXPECT_EQ(g.stats().graphs_built, 0u);
  EXPECT_EQ(rt_->stats().scratch_in_graphs, 0u);
}

TEST_F(StepGraphTest, TheGraphOwnsItsScratchApartFromStreamsAndOtherGraphs) {
  Open(KPACK_TEST_PACK_DIR);
  const std::vector<Arg> args = {Arg(kX), Arg(kOut), Arg(64), Arg(64), Arg(64)};
  Bind("scratch", Grid{2, 2}, args);
  StepGraph& g = MakeGraph();
  KP_ASSERT_OK(g.Replay(stream_));
  EXPECT_EQ(g.stats().scratch_bytes, 4u * 128u);
  EXPECT_EQ(g.graphs()[0].scratch_bytes, 4u * 128u);
  EXPECT_EQ(rt_->stats().scratch_in_graphs, 1u);
  const size_t slot = Slot(*rt_->Find("scratch"), "default", "$global_scratch").offset;
  auto scratch_of = [&](const fake::LaunchRecord& r) {
    CUdeviceptr p;
    std::memcpy(&p, r.params.data() + slot, 8);
    return p;
  };
  const CUdeviceptr graph_scratch = scratch_of(fake::GetLaunch(fake::LaunchCount() - 1));
  EXPECT_NE(graph_scratch, 0u);
  EXPECT_EQ(graph_scratch % 128, 0u);
  // An eager launch of the same BoundLaunch on the replay stream uses the stream's arena.
  KP_ASSERT_OK(binds_[0]->Launch());
  EXPECT_NE(scratch_of(fake::GetLaunch(fake::LaunchCount() - 1)), graph_scratch);
  // The graph's pointer is not the BoundLaunch's: replaying after the eager launch (which
  // wrote the stream arena's pointer into the BoundLaunch's buffer) patches nothing.
  KP_ASSERT_OK(g.Replay(stream_));
  EXPECT_EQ(g.stats().last_nodes_patched, 0u);
  EXPECT_EQ(scratch_of(fake::GetLaunch(fake::LaunchCount() - 1)), graph_scratch);
  // A second graph of the same step has its own.
  std::vector<BoundLaunch*> step = {binds_[0].get()};
  auto second = StepGraph::Create(step);
  ASSERT_TRUE(second.ok());
  KP_ASSERT_OK(second->Replay(other_));
  EXPECT_NE(scratch_of(fake::GetLaunch(fake::LaunchCount() - 1)), graph_scratch);
  EXPECT_EQ(rt_->stats().scratch_in_graphs, 2u);
  // Destroyed, the graphs give their arenas back to the pool.
  second = absl::UnknownError("gone");
  graph_.reset();
  EXPECT_EQ(rt_->stats().scratch_in_graphs, 0u);
  EXPECT_EQ(rt_->stats().scratch_idle, 2u);
  EXPECT_EQ(fake::LiveGraphs(), 0);
  EXPECT_EQ(fake::LiveUserObjects(), 0);
}

// The edges of a graph as (from, to, programmatic) triples.
std::vector<std::tuple<size_t, size_t, bool>> Edges(const std::vector<fake::GraphEdge>& edges) {
  std::vector<std::tuple<size_t, size_t, bool>> out;
  for (const fake::GraphEdge& e : edges) {
    EXPECT_EQ(e.from_port, e.type == CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC
                               ? CU_GRAPH_KERNEL_NODE_PORT_PROGRAMMATIC
                               : CU_GRAPH_KERNEL_NODE_PORT_DEFAULT);
    out.emplace_back(e.from, e.to, e.type == CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC);
  }
  return out;
}

TEST_F(StepGraphTest, LaunchAttributesBecomeNodeAttributesAndPdlAProgrammaticEdge) {
  Open(KPACK_TEST_PACK_DIR);
  Bind("cluster", Grid{3}, {Arg(kX), Arg(kOut), Arg(4096)});
  Bind("pdl", Grid{2}, {Arg(kX), Arg(kOut), Arg(2048)});
  Bind("pdl", Grid{2}, {Arg(kOut), Arg(kOut2), Arg(2048)});
  Bind("add", Grid{1}, {Arg(kX), Arg(kY), Arg(kOut), Arg(16)});
  StepGraph& g = MakeGraph();
  KP_ASSERT_OK(g.Replay(stream_));
  // Each PDL launch waits for the one before through a programmatic edge; the plain
  // launch after them through a full one.
  EXPECT_THAT(Edges(fake::ExecEdges(LastExec())),
              ElementsAre(std::tuple{0u, 1u, true}, std::tuple{1u, 2u, true},
                          std::tuple{2u, 3u, false}));
  EXPECT_EQ(g.graphs()[0].programmatic_edges, 2u);
  EXPECT_EQ(g.graphs()[0].pdl_fallback, "");
  std::vector<fake::LaunchRecord> nodes = fake::ExecNodes(LastExec());
  ASSERT_EQ(nodes.size(), 4u);
  EXPECT_EQ(nodes[0].grid[0], 6u) << "x times num_ctas, as eagerly";
  bool cluster = false;
  for (unsigned i = 0; i < nodes[0].num_attrs; ++i) {
    if (nodes[0].attrs[i].id == CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION) {
      cluster = true;
      EXPECT_EQ(nodes[0].attrs[i].value.clusterDim.x, 2u);
    }
  }
  EXPECT_TRUE(cluster);
  for (unsigned i = 0; i < nodes[1].num_attrs; ++i) {
    EXPECT_NE(nodes[1].attrs[i].id, CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION);
  }
}

TEST_F(StepGraphTest, WithoutProgrammaticEdgesPdlLaunchesGetFullEdgesAndNoFallback) {
  Open(KPACK_TEST_PACK_DIR);
  Bind("pdl", Grid{2}, {Arg(kX), Arg(kOut), Arg(2048)});
  Bind("pdl", Grid{2}, {Arg(kOut), Arg(kOut2), Arg(2048)});
  Bind("add", Grid{1}, {Arg(kX), Arg(kY), Arg(kOut), Arg(16)});
  StepGraph::Options options;
  options.programmatic_edges = false;
  StepGraph& g = MakeGraph(options);
  KP_ASSERT_OK(g.Replay(stream_));
  EXPECT_THAT(Edges(fake::ExecEdges(LastExec())),
              ElementsAre(std::tuple{0u, 1u, false}, std::tuple{1u, 2u, false}));
  EXPECT_EQ(g.graphs()[0].programmatic_edges, 0u);
  EXPECT_EQ(g.graphs()[0].pdl_fallback, "") << "asked for, not a fallback";
  EXPECT_EQ(g.stats().pdl_fallbacks, 0u);
  // The PDL attribute does not become a node attribute either way.
  for (const fake::LaunchRecord& node : fake::ExecNodes(LastExec())) {
    for (unsigned i = 0; i < node.num_attrs; ++i) {
      EXPECT_NE(node.attrs[i].id, CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION);
    }
  }
}

TEST_F(StepGraphTest, APdlLaunchFirstOrAfterAnEmptyGridHasNoEdgeToIt) {
  Open(KPACK_TEST_PACK_DIR);
  Bind("pdl", Grid{2}, {Arg(kX), Arg(kOut), Arg(2048)});
  BoundLaunch& empty = Bind("add", Grid{0}, {Arg(kX), Arg(kY), Arg(kOut2), Arg(0)});
  Bind("pdl", Grid{2}, {Arg(kOut), Arg(kOut2), Arg(2048)});
  StepGraph& g = MakeGraph();
  KP_ASSERT_OK(g.Replay(stream_));
  // No node for the empty launch: the second PDL launch follows the first, as on a stream.
  EXPECT_THAT(Edges(fake::ExecEdges(LastExec())), ElementsAre(std::tuple{0u, 1u, true}));
  empty.set_grid(Grid{1});
  KP_ASSERT_OK(g.Replay(stream_));
  EXPECT_THAT(Edges(fake::ExecEdges(LastExec())),
              ElementsAre(std::tuple{0u, 1u, false}, std::tuple{1u, 2u, true}));
}

TEST_F(StepGraphTest, ProgrammaticEdgesRefusedAtInstantiationFallBackToFullEdgesAndSaySo) {
  Open(KPACK_TEST_PACK_DIR);
  Bind("add", Grid{1}, {Arg(kX), Arg(kY), Arg(kOut), Arg(16)});
  Bind("pdl", Grid{2}, {Arg(kOut), Arg(kOut2), Arg(2048)});
  StepGraph& g = MakeGraph();
  fake::FailNext("GraphInstantiateWithFlags", CUDA_ERROR_NOT_SUPPORTED);
  KP_ASSERT_OK(g.Replay(stream_));
  EXPECT_EQ(fake::CallCount("GraphInstantiateWithFlags"), 2);
  EXPECT_THAT(Edges(fake::ExecEdges(LastExec())), ElementsAre(std::tuple{0u, 1u, false}));
  ASSERT_EQ(g.graphs().size(), 1u);
  EXPECT_EQ(g.graphs()[0].programmatic_edges, 0u);
  EXPECT_THAT(g.graphs()[0].pdl_fallback,
              AllOf(HasSubstr("the driver refused the programmatic (PDL) edges of this "
                              "signature's graph when instantiating it"),
                    HasSubstr("CUDA_ERROR_NOT_SUPPORTED"), HasSubstr("without the overlap")));
  EXPECT_EQ(g.stats().pdl_fallbacks, 1u);
  EXPECT_EQ(g.stats().graphs_built, 1u);
  EXPECT_EQ(fake::LiveGraphs(), 2) << "the refused graph is gone: one graph, one executable";

  // A graph without programmatic edges that fails to instantiate is an error, as before.
  binds_[1]->set_grid(Grid{0});
  fake::FailNext("GraphInstantiateWithFlags", CUDA_ERROR_NOT_SUPPORTED);
  absl::Status s = g.Replay(stream_);
  EXPECT_THAT(Msg(s), AllOf(HasSubstr("cuGraphInstantiateWithFlags for a step graph of 1 nodes"),
                            HasSubstr("CUDA_ERROR_NOT_SUPPORTED")));
  EXPECT_EQ(g.stats().pdl_fallbacks, 1u);
}

TEST_F(StepGraphTest, ProgrammaticEdgesRefusedAtAnUpdateFallBackToFullEdgesAndSaySo) {
  Open(KPACK_TEST_PACK_DIR);
  Bind("add", Grid{1}, {Arg(kX), Arg(kY), Arg(kOut), Arg(16)});
  BoundLaunch& pdl = Bind("pdl", Grid{2}, {Arg(kOut), Arg(kOut2), Arg(2048)});
  StepGraph& g = MakeGraph();
  KP_ASSERT_OK(g.Replay(stream_));
  EXPECT_EQ(g.graphs()[0].programmatic_edges, 1u);
  KP_ASSERT_OK(pdl.Set(2, 1000));
  fake::FailNext("GraphExecKernelNodeSetParams", CUDA_ERROR_NOT_SUPPORTED);
  KP_ASSERT_OK(g.Replay(stream_));
  EXPECT_THAT(Edges(fake::ExecEdges(LastExec())), ElementsAre(std::tuple{0u, 1u, false}));
  ASSERT_EQ(g.graphs().size(), 1u);
  EXPECT_THAT(g.graphs()[0].pdl_fallback,
              AllOf(HasSubstr("when updating its nodes"), HasSubstr("CUDA_ERROR_NOT_SUPPORTED")));
  EXPECT_EQ(g.stats().pdl_fallbacks, 1u);
  EXPECT_EQ(g.stats().replays, 2u);
  // The rebuilt graph launched the new bytes.
  const fake::LaunchRecord last = fake::GetLaunch(fake::LaunchCount() - 1);
  EXPECT_TRUE(last.graph_replay);
  EXPECT_EQ(At<int32_t>(last, Slot(*rt_->Find("pdl"), "default", "n").offset), 1000);
  EXPECT_EQ(fake::LiveGraphs(), 2) << "the refused graph and its executable are gone";
  // Later patches of the rebuilt graph are plain ones.
  KP_ASSERT_OK(pdl.Set(2, 999));
  KP_ASSERT_OK(g.Replay(stream_));
  EXPECT_EQ(g.stats().last_nodes_patched, 1u);
}

// Only a failure that may be the driver refusing programmatic edges (an unsupported or
// invalid update) falls back to full edges; any other failure of a graph with them is
// returned as it is, keeps the edges, and the next replay patches or builds again.
TEST_F(StepGraphTest, OtherFailuresOfAGraphWithProgrammaticEdgesAreErrors) {
  Open(KPACK_TEST_PACK_DIR);
  Bind("add", Grid{1}, {Arg(kX), Arg(kY), Arg(kOut), Arg(16)});
  BoundLaunch& pdl = Bind("pdl", Grid{2}, {Arg(kOut), Arg(kOut2), Arg(2048)});
  StepGraph& g = MakeGraph();
  fake::FailNext("GraphInstantiateWithFlags", CUDA_ERROR_OUT_OF_MEMORY);
  absl::Status s = g.Replay(stream_);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_THAT(Msg(s), AllOf(HasSubstr("cuGraphInstantiateWithFlags"),
                            HasSubstr("CUDA_ERROR_OUT_OF_MEMORY")));
  EXPECT_EQ(g.stats().graphs_built, 0u);
  KP_ASSERT_OK(g.Replay(stream_));
  ASSERT_EQ(g.graphs().size(), 1u);
  EXPECT_EQ(g.graphs()[0].programmatic_edges, 1u);

  KP_ASSERT_OK(pdl.Set(2, 1000));
  fake::FailNext("GraphExecKernelNodeSetParams", CUDA_ERROR_OUT_OF_MEMORY);
  s = g.Replay(stream_);
  EXPECT_THAT(Msg(s), AllOf(HasSubstr("cuGraphExecKernelNodeSetParams"),
                            HasSubstr("CUDA_ERROR_OUT_OF_MEMORY")));
  KP_ASSERT_OK(g.Replay(stream_));
  EXPECT_EQ(g.stats().last_nodes_patched, 1u);
  EXPECT_EQ(g.stats().graphs_built, 1u);
  EXPECT_EQ(g.stats().pdl_fallbacks, 0u);
  EXPECT_TRUE(g.graphs()[0].pdl_fallback.empty());
  EXPECT_EQ(g.graphs()[0].programmatic_edges, 1u);
  const fake::LaunchRecord last = fake::GetLaunch(fake::LaunchCount() - 1);
  EXPECT_EQ(At<int32_t>(last, Slot(*rt_->Find("pdl"), "default", "n").offset), 1000);
}

TEST_F(StepGraphTest, EmptyGridsHaveNoNode) {
  Open(KPACK_TEST_PACK_DIR);
  BoundLaunch& add = Bind("add", Grid{0}, {Arg(kX), Arg(kY), Arg(kOut), Arg(0)});
  Bind("add", Grid{1}, {Arg(kX), Arg(kY), Arg(kOut2), Arg(16)});
  StepGraph& g = MakeGraph();
  KP_ASSERT_OK(g.Replay(stream_));
  EXPECT_EQ(g.graphs()[0].nodes, 1u);
  EXPECT_EQ(fake::ExecNodes(LastExec()).size(), 1u);
  add.set_grid(Grid{1});
  KP_ASSERT_OK(g.Replay(stream_));
  EXPECT_EQ(g.graphs()[1].nodes, 2u);
}

TEST_F(StepGraphTest, BadStepsAndContexts) {
  OpenTolerant();
  BoundLaunch& a = BindAxpy(100);
  std::vector<BoundLaunch*> step;
  EXPECT_THAT(Msg(StepGraph::Create(step).status()), HasSubstr("at least one launch"));
  step = {&a, nullptr};
  EXPECT_THAT(Msg(StepGraph::Create(step).status()), HasSubstr("step graph launch 1 is null"));
  step = {&a, &a};
  EXPECT_THAT(Msg(StepGraph::Create(step).status()),
              HasSubstr("launch 1 (kernel 'axpy') is listed twice"));
  // Moving a BoundLaunch keeps it in the step.
  step = {&a};
  auto g = StepGraph::Create(step);
  ASSERT_TRUE(g.ok());
  BoundLaunch moved = std::move(a);
  KP_ASSERT_OK(g->Replay(stream_));
  KP_ASSERT_OK(moved.Set(3, 200));
  KP_ASSERT_OK(g->Replay(stream_));
  EXPECT_EQ(g->stats().last_nodes_patched, 1u);
  // Another context current: refused, nothing launched.
  CUdevice device;
  CUcontext second = nullptr;
  ASSERT_EQ(testing::FakeDriver().DeviceGet(&device, 0), CUDA_SUCCESS);
  ASSERT_EQ(testing::FakeDriver().CtxCreate(&second, nullptr, 0, device), CUDA_SUCCESS);
  absl::Status s = g->Replay(nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(Msg(s), HasSubstr("the step graph belongs to the CUDA context current at its "
                                "creation"));
  ASSERT_EQ(testing::FakeDriver().CtxDestroy(second), CUDA_SUCCESS);
  KP_ASSERT_OK(g->Replay(stream_));
}

TEST_F(StepGraphTest, TooManyGraphsNamesTheLaunchThatKeepsChanging) {
  Open(KPACK_TEST_PACK_DIR);
  Bind("add", Grid{1}, {Arg(kX), Arg(kY), Arg(kOut), Arg(16)});
  BoundLaunch& changing = Bind("add", Grid{1}, {Arg(kX), Arg(kY), Arg(kOut2), Arg(16)});
  StepGraph::Options options;
  options.max_graphs = 2;
  StepGraph& g = MakeGraph(options);
  KP_ASSERT_OK(g.Replay(stream_));
  changing.set_grid(Grid{2});
  KP_ASSERT_OK(g.Replay(stream_));
  changing.set_grid(Grid{3});
  absl::Status s = g.Replay(stream_);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(Msg(s), AllOf(HasSubstr("already holds 2 graphs"),
                            HasSubstr("launch 1 is now add/default[3,1,1], was add/default[2,1,1]"),
                            HasSubstr("no grid_tolerance")));
}

TEST_F(StepGraphTest, AFailedPatchIsRetriedByTheNextReplay) {
  OpenTolerant();
  BoundLaunch& a = BindAxpy(100);
  StepGraph& g = MakeGraph();
  KP_ASSERT_OK(g.Replay(stream_));
  KP_ASSERT_OK(a.Set(3, 300));
  fake::FailNext("GraphExecKernelNodeSetParams", CUDA_ERROR_INVALID_VALUE);
  absl::Status s = g.Replay(stream_);
  EXPECT_THAT(Msg(s), AllOf(HasSubstr("cuGraphExecKernelNodeSetParams for step graph launch 0 "
                                      "(kernel 'axpy' variant 'b0_generic')"),
                            HasSubstr("CUDA_ERROR_INVALID_VALUE")));
  EXPECT_EQ(fake::GraphLaunches(), 1) << "nothing launched";
  KP_ASSERT_OK(g.Replay(stream_));
  EXPECT_EQ(g.stats().last_nodes_patched, 1u);
  ASSERT_EQ(fake::NodeUpdates().size(), 1u);
}


TEST_F(StepGraphTest, EmptyWorkKeepsAnEmptyGridWhereTheGridToleranceProofStarts) {
  OpenTolerant();
  BoundLaunch& a = BindAxpy(0);
  StepGraph& g = MakeGraph();
  // n = 0: an eager launch sends nothing, and the graph has no node (the pack's proof of
  // grid tolerance starts its buckets at 1: the padded grid is unproven at 0).
  KP_ASSERT_OK(a.Launch());
  EXPECT_EQ(fake::LaunchCount(), 0);
  EXPECT_THAT(*g.Signature(), HasSubstr("[0,1,1]"));
  KP_ASSERT_OK(g.Replay(stream_));
  EXPECT_EQ(g.graphs()[0].nodes, 0u);
  EXPECT_EQ(fake::LaunchCount(), 0) << "the replay launched no program";
  KP_ASSERT_OK(a.Set(3, 1));
  EXPECT_EQ(*g.Signature(), "axpy/b0_generic[16,1,1]") << "from 1 on: padded";
  // A pinned grid too keeps empty work empty.
  KP_ASSERT_OK(g.PinGrid(0, Grid{32}));
  KP_ASSERT_OK(a.Set(3, 0));
  EXPECT_THAT(*g.Signature(), HasSubstr("[0,1,1]"));
}

TEST_F(StepGraphTest, GraphPaddingIntervalsStartAtOneAndCoverTheBucket) {
  using internal::PaddingInterval;
  const std::vector<int64_t> edges = {16, 64};
  EXPECT_EQ(PaddingInterval(edges, std::nullopt, 0), (std::pair<int64_t, int64_t>{1, 16}));
  EXPECT_EQ(PaddingInterval(edges, std::nullopt, 1), (std::pair<int64_t, int64_t>{17, 64}));
  EXPECT_EQ(PaddingInterval(edges, std::nullopt, 2), std::nullopt) << "open-ended";
  EXPECT_EQ(PaddingInterval(edges, 100, 2), (std::pair<int64_t, int64_t>{65, 100}));
  const std::vector<int64_t> from_zero = {0, 8};
  EXPECT_EQ(PaddingInterval(from_zero, std::nullopt, 0), std::nullopt) << "only sizes < 1";
  EXPECT_EQ(PaddingInterval(from_zero, std::nullopt, 1), (std::pair<int64_t, int64_t>{1, 8}));
  // Buckets of values below 1 keep the exact grid; one reaching across 1 pads from 1.
  const std::vector<int64_t> negative = {-10, -5, 100};
  EXPECT_EQ(PaddingInterval(negative, std::nullopt, 0), std::nullopt);
  EXPECT_EQ(PaddingInterval(negative, std::nullopt, 1), std::nullopt);
  EXPECT_EQ(PaddingInterval(negative, std::nullopt, 2), (std::pair<int64_t, int64_t>{1, 100}));
  // No value lies above INT64_MAX: no interval, and no overflow.
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  const std::vector<int64_t> top = {16, kMax};
  EXPECT_EQ(PaddingInterval(top, kMax, 2), std::nullopt);
  EXPECT_EQ(PaddingInterval(top, kMax, 1), (std::pair<int64_t, int64_t>{17, kMax}));
}

TEST_F(StepGraphTest, AnEagerStepPreparesEveryLaunchBeforeSendingAny) {
  Open(KPACK_TEST_PACK_DIR);
  Bind("add", Grid{1}, {Arg(kX), Arg(kY), Arg(kOut), Arg(16)});
  BoundLaunch& scratch = Bind("scratch", Grid{2, 2}, {Arg(kX), Arg(kOut), Arg(64), Arg(64), Arg(64)});
  scratch.set_scratch_allocator(
      {[](size_t, size_t, CUstream, void*) -> CUdeviceptr { return 0; }, nullptr});
  StepGraph::Options options;
  options.unseen = StepGraph::Unseen::kLaunchEagerly;
  StepGraph& g = MakeGraph(options);
  absl::Status s = g.Replay(stream_);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(Msg(s), AllOf(HasSubstr("step graph launch 1: kernel 'scratch'"),
                            HasSubstr("ScratchAllocator returned null")));
  EXPECT_EQ(fake::LaunchCount(), 0) << "launch 0 was not sent either";
  EXPECT_EQ(g.stats().eager_steps, 0u);
}

TEST_F(StepGraphTest, AReplayOnACapturedStreamGoesIntoTheCaptureAndNeverBuilds) {
  Open(KPACK_TEST_PACK_DIR);
  Bind("add", Grid{1}, {Arg(kX), Arg(kY), Arg(kOut), Arg(16)});
  Bind("scratch", Grid{2, 2}, {Arg(kX), Arg(kOut), Arg(64), Arg(64), Arg(64)});
  StepGraph& g = MakeGraph();
  const internal::Driver& d = testing::FakeDriver();

  // Nothing loaded yet: refused, naming Preload; the capture stays valid.
  ASSERT_EQ(d.StreamBeginCapture(other_, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  absl::Status s = g.Replay(other_);
  CUgraph graph = EndCapture(other_);
  ASSERT_EQ(d.GraphDestroy(graph), CUDA_SUCCESS);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(Msg(s), AllOf(HasSubstr("step graph launch 0"), HasSubstr("Preload")));
  // Loaded, but no scratch reserved for the capture: refused, naming ReserveScratch.
  KP_ASSERT_OK(rt_->Preload());
  ASSERT_EQ(d.StreamBeginCapture(other_, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  s = g.Replay(other_);
  graph = EndCapture(other_);
  ASSERT_EQ(d.GraphDestroy(graph), CUDA_SUCCESS);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(Msg(s), AllOf(HasSubstr("step graph launch 1"), HasSubstr("ReserveScratch")));
  EXPECT_EQ(fake::LaunchCount(), 0) << "nothing went into the capture";

  // Reserved: the step's launches go into the caller's capture, with their exact grids and
  // the capture's own scratch. No graph is built (building would allocate inside the
  // capture), and none is launched (a graph launch cannot be captured).
  KP_ASSERT_OK(rt_->ReserveScratch(other_, 1 << 16));
  ASSERT_EQ(d.StreamBeginCapture(other_, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  KP_ASSERT_OK(g.Replay(other_));
  graph = EndCapture(other_);
  EXPECT_EQ(g.stats().captured_steps, 1u);
  EXPECT_EQ(g.stats().graphs_built, 0u);
  EXPECT_EQ(g.stats().replays, 0u);
  EXPECT_EQ(fake::CallCount("GraphCreate"), 0);
  std::vector<fake::LaunchRecord> captured = fake::GraphNodes(graph);
  ASSERT_EQ(captured.size(), 2u);
  EXPECT_EQ(captured[0].stream, other_);
  EXPECT_TRUE(captured[1].captured);
  const CUdeviceptr capture_scratch = ScratchOf(captured[1]);
  EXPECT_NE(capture_scratch, 0u);
  EXPECT_EQ(rt_->stats().scratch_in_graphs, 1u) << "the caller's graph owns the capture's arena";
  ASSERT_EQ(d.GraphDestroy(graph), CUDA_SUCCESS);
  EXPECT_EQ(rt_->stats().scratch_in_graphs, 0u);
}

TEST_F(StepGraphTest, AReplayCapturedIntoTheCallersGraphOwesNothingToTheStepGraph) {
  Open(KPACK_TEST_PACK_DIR);
  Bind("scratch", Grid{2, 2}, {Arg(kX), Arg(kOut), Arg(64), Arg(64), Arg(64)});
  StepGraph& g = MakeGraph();
  KP_ASSERT_OK(g.Replay(stream_));  // the step's graph, with its own scratch
  const CUdeviceptr graph_scratch = ScratchOf(fake::GetLaunch(fake::LaunchCount() - 1));
  const internal::Driver& d = testing::FakeDriver();
  KP_ASSERT_OK(rt_->ReserveScratch(other_, 1 << 16));
  ASSERT_EQ(d.StreamBeginCapture(other_, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  KP_ASSERT_OK(g.Replay(other_));
  CUgraph outer = EndCapture(other_);
  ASSERT_NE(outer, nullptr);
  ASSERT_EQ(fake::GraphNodes(outer).size(), 1u);
  const CUdeviceptr outer_scratch = ScratchOf(fake::GraphNodes(outer)[0]);
  EXPECT_NE(outer_scratch, graph_scratch) << "the caller's graph uses the capture's arena";
  EXPECT_EQ(rt_->stats().scratch_in_graphs, 2u);
  // The StepGraph destroyed: its arena is idle, and nothing of the caller's graph uses it.
  graph_.reset();
  EXPECT_EQ(rt_->stats().scratch_idle, 1u);
  EXPECT_EQ(rt_->stats().scratch_in_graphs, 1u) << "the caller's graph keeps its own";
  CUgraphExec exec = nullptr;
  ASSERT_EQ(d.GraphInstantiateWithFlags(&exec, outer, 0), CUDA_SUCCESS);
  ASSERT_EQ(d.GraphLaunch(exec, stream_), CUDA_SUCCESS);
  EXPECT_EQ(ScratchOf(fake::GetLaunch(fake::LaunchCount() - 1)), outer_scratch);
  ASSERT_EQ(d.GraphExecDestroy(exec), CUDA_SUCCESS);
  ASSERT_EQ(d.GraphDestroy(outer), CUDA_SUCCESS);
  EXPECT_EQ(rt_->stats().scratch_in_graphs, 0u);
  EXPECT_EQ(fake::LiveUserObjects(), 0);
}

TEST_F(StepGraphTest, ReplaysRefuseCapturesTheyCannotJoinAndLeaveThemAlone) {
  OpenTolerant();
  BindAxpy(100);
  StepGraph& g = MakeGraph();
  KP_ASSERT_OK(g.Replay(stream_));
  const int64_t launched = fake::LaunchCount();
  // The legacy stream while a blocking stream of the context is captured (the driver says
  // so with CUDA_ERROR_STREAM_CAPTURE_IMPLICIT): a graph launch there would invalidate it.
  fake::FailNext("StreamIsCapturing", CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
  absl::Status s = g.Replay(nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(Msg(s), HasSubstr("legacy (NULL) stream while a blocking stream of the context is "
                                "being captured"));
  // A capture already invalidated: nothing is sent into it.
  const internal::Driver& d = testing::FakeDriver();
  ASSERT_EQ(d.StreamBeginCapture(other_, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  ASSERT_EQ(d.StreamSynchronize(other_), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  s = g.Replay(other_);
  EXPECT_THAT(Msg(s), HasSubstr("the stream's capture has been invalidated"));
  CUgraph graph = nullptr;
  EXPECT_EQ(d.StreamEndCapture(other_, &graph), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  EXPECT_EQ(fake::LaunchCount(), launched);
  EXPECT_EQ(g.stats().replays, 1u);
}

TEST_F(StepGraphTest, BuildingWhileAnotherThreadCapturesInGlobalModeLeavesItsCaptureAlone) {
  Open(KPACK_TEST_PACK_DIR);
  Bind("add", Grid{1}, {Arg(kX), Arg(kY), Arg(kOut), Arg(16)});
  BoundLaunch& scratch = Bind("scratch", Grid{2, 2}, {Arg(kX), Arg(kOut), Arg(64), Arg(64), Arg(64)});
  StepGraph& g = MakeGraph();
  const internal::Driver& d = testing::FakeDriver();
  CUcontext context = nullptr;
  ASSERT_EQ(d.CtxGetCurrent(&context), CUDA_SUCCESS);
  std::latch capturing(1), built(1);
  CUresult ended = CUDA_ERROR_UNKNOWN;
  std::thread other([&] {
    d.CtxSetCurrent(context);
    CUstream s = nullptr;
    d.StreamCreate(&s, CU_STREAM_NON_BLOCKING);
    d.StreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL);
    capturing.count_down();
    built.wait();
    CUgraph graph = nullptr;
    ended = d.StreamEndCapture(s, &graph);
    if (graph != nullptr) d.GraphDestroy(graph);
    d.StreamDestroy(s);
  });
  capturing.wait();
  // Loading the variants, allocating the graph's scratch, instantiating: all while the
  // other thread's global capture forbids such calls to threads in the default mode.
  absl::Status first = g.Build();
  absl::Status replayed = g.Replay(stream_);  // on a stream of this thread's, not captured
  KP_ASSERT_OK(scratch.Set(2, 32));
  scratch.set_grid(Grid{2, 1});
  absl::Status second = g.Replay(stream_);
  graph_.reset();  // destroying the executables, too
  const CUstreamCaptureMode mode = fake::ThreadCaptureMode();
  built.count_down();
  other.join();
  KP_ASSERT_OK(first);
  KP_ASSERT_OK(replayed);
  KP_ASSERT_OK(second);
  EXPECT_EQ(ended, CUDA_SUCCESS) << "the other thread's capture was invalidated";
  EXPECT_EQ(mode, CU_STREAM_CAPTURE_MODE_GLOBAL) << "the thread's own mode is restored";
  EXPECT_EQ(fake::LiveGraphs(), 0);
}

// Replays skip launches whose BoundLaunch did not change (BoundState::version): nothing is
// resolved or compared, and the graph launched is the same, with the same bytes.
TEST_F(StepGraphTest, AReplayAfterNoChangeResolvesAndPatchesNothingAndLaunchesTheSameGraph) {
  OpenTolerant();
  BindAxpy(100);
  BindAxpy(200, kOut2);
  BindAxpy(5000);
  StepGraph& g = MakeGraph();
  KP_ASSERT_OK(g.Replay(stream_));
  EXPECT_EQ(g.stats().last_launches_resolved, 3u) << "the first replay resolves every launch";
  const std::vector<fake::LaunchRecord> first = LastReplay(3);
  for (int r = 0; r < 3; ++r) {
    KP_ASSERT_OK(g.Replay(stream_));
    EXPECT_EQ(g.stats().last_launches_resolved, 0u);
    EXPECT_EQ(g.stats().last_nodes_patched, 0u);
    const std::vector<fake::LaunchRecord> again = LastReplay(3);
    for (size_t i = 0; i < 3; ++i) {
      EXPECT_THAT(Differences(first[i].params.data(), again[i].params.data(),
                              first[i].param_size),
                  IsEmpty());
      EXPECT_EQ(again[i].grid, first[i].grid);
    }
  }
  EXPECT_THAT(fake::NodeUpdates(), IsEmpty());
  EXPECT_EQ(fake::GraphLaunches(), 4);
  EXPECT_EQ(fake::LiveExecs().size(), 1u);
  EXPECT_EQ(g.stats().graphs_built, 1u);
  KP_ASSERT_OK(g.Build());
  EXPECT_EQ(g.stats().last_launches_resolved, 0u);
}

TEST_F(StepGraphTest, ASetOnOneLaunchResolvesAndPatchesExactlyThatNode) {
  OpenTolerant();
  BindAxpy(100);
  BoundLaunch& b = BindAxpy(200, kOut2);
  BindAxpy(300);
  StepGraph& g = MakeGraph();
  KP_ASSERT_OK(g.Replay(stream_));
  KP_ASSERT_OK(b.Set(3, 250));
  ReplayAndExpectEagerBytes(g, {16, 16, 16});
  EXPECT_EQ(g.stats().last_launches_resolved, 1u);
  EXPECT_EQ(g.stats().last_nodes_patched, 1u);
  ASSERT_EQ(fake::NodeUpdates().size(), 1u);
  EXPECT_EQ(fake::NodeUpdates()[0].node, 1u);
  // The value already bound: resolved again, the bytes compared, nothing patched.
  KP_ASSERT_OK(b.Set(3, 250));
  KP_ASSERT_OK(g.Replay(stream_));
  EXPECT_EQ(g.stats().last_launches_resolved, 1u);
  EXPECT_EQ(g.stats().last_nodes_patched, 0u);
  // A refused Set leaves the bound value, so the same.
  EXPECT_FALSE(b.Set(3, 2.5f).ok());
  ReplayAndExpectEagerBytes(g, {16, 16, 16});
  EXPECT_EQ(g.stats().last_launches_resolved, 1u);
  EXPECT_EQ(g.stats().last_nodes_patched, 0u);
  EXPECT_EQ(fake::NodeUpdates().size(), 1u);
}

// Each kind of change reaches the graph: a pointer (bytes only), a size inside its bucket,
// a size in another bucket (another graph), back to a graph whose node launched other
// bytes, and a grid expression reading an argument that is no bucket parameter.
TEST_F(StepGraphTest, EveryChangeReachesItsNodeAsTheEagerLaunchSendsIt) {
  // The y grid reads stride_x, which no bucket pads.
  OpenTolerant(std::nullopt, {"cdiv(n, BLOCK)", "stride_x"});
  BoundLaunch& a = BindAxpy(100);
  BindAxpy(200, kOut2);
  StepGraph& g = MakeGraph();
  EXPECT_EQ(*g.Signature(), "axpy/b0_generic[16,3,1]; axpy/b0_generic[16,3,1]");
  ReplayAndExpectEagerBytes(g, {16, 16});
  KP_ASSERT_OK(a.Set(2, kOut2));
  ReplayAndExpectEagerBytes(g, {16, 16});
  EXPECT_EQ(g.stats().last_nodes_patched, 1u);
  KP_ASSERT_OK(a.Set(3, 5000));  // bucket 1: another variant and grid
  ReplayAndExpectEagerBytes(g, {256, 16});
  EXPECT_EQ(g.stats().graphs_built, 2u);
  KP_ASSERT_OK(a.Set(3, 300));  // bucket 0 again, a size its graph never launched
  ReplayAndExpectEagerBytes(g, {16, 16});
  EXPECT_EQ(g.stats().graphs_built, 2u);
  EXPECT_EQ(g.stats().last_nodes_patched, 1u);
  KP_ASSERT_OK(a.Set(4, 5));  // the y grid: another signature
  EXPECT_EQ(*g.Signature(), "axpy/b0_generic[16,5,1]; axpy/b0_generic[16,3,1]");
  EXPECT_EQ(ReplayAndExpectEagerBytes(g, {16, 16})[0].grid[1], 5u);
  EXPECT_EQ(g.stats().graphs_built, 3u);
  KP_ASSERT_OK(a.Set(3, 17));  // inside the bucket: the padded grid stays
  EXPECT_EQ(ReplayAndExpectEagerBytes(g, {16, 16})[0].grid[1], 5u);
  EXPECT_EQ(g.stats().last_nodes_patched, 1u);
  EXPECT_EQ(g.stats().graphs_built, 3u);
  KP_ASSERT_OK(a.Set(4, 3));
  EXPECT_EQ(ReplayAndExpectEagerBytes(g, {16, 16})[0].grid[1], 3u);
  EXPECT_EQ(g.stats().graphs_built, 3u);
}

TEST_F(StepGraphTest, AGridOnlyChangeAndAPinAfterReplaysReachTheGraph) {
  Open(KPACK_TEST_PACK_DIR);
  BoundLaunch& add = Bind("add", Grid{1}, {Arg(kX), Arg(kY), Arg(kOut), Arg(16)});
  StepGraph& g = MakeGraph();
  ReplayAndExpectEagerBytes(g, {1});
  add.set_grid(Grid{3});
  ReplayAndExpectEagerBytes(g, {3});
  EXPECT_EQ(g.stats().last_launches_resolved, 1u);
  EXPECT_EQ(g.stats().graphs_built, 2u);
  add.set_grid(Grid{1});
  ReplayAndExpectEagerBytes(g, {1});
  EXPECT_EQ(g.stats().graphs_built, 2u);

  graph_.reset();
  binds_.clear();
  OpenTolerant();
  BindAxpy(100);
  StepGraph& t = MakeGraph();
  ReplayAndExpectEagerBytes(t, {16});
  KP_ASSERT_OK(t.PinGrid(0, Grid{32}));  // the launch did not change; its plan did
  ReplayAndExpectEagerBytes(t, {32});
  EXPECT_EQ(t.stats().last_launches_resolved, 1u);
}

// Each StepGraph (and each of its graphs) keeps its own record of what its nodes launch.
TEST_F(StepGraphTest, TwoStepGraphsOverOneLaunchEachPatchTheirOwnNode) {
  OpenTolerant();
  BoundLaunch& a = BindAxpy(100);
  StepGraph& g1 = MakeGraph();
  BoundLaunch* step[] = {&a};
  absl::StatusOr<StepGraph> g2 = StepGraph::Create(step);
  ASSERT_TRUE(g2.ok()) << g2.status();
  KP_ASSERT_OK(g1.Replay(stream_));
  KP_ASSERT_OK(g2->Replay(stream_));
  KP_ASSERT_OK(a.Set(3, 200));
  KP_ASSERT_OK(g1.Replay(stream_));
  EXPECT_EQ(g1.stats().last_nodes_patched, 1u);
  KP_ASSERT_OK(g1.Replay(stream_));
  EXPECT_EQ(g1.stats().last_nodes_patched, 0u);
  ReplayAndExpectEagerBytes(*g2, {16});
  EXPECT_EQ(g2->stats().last_nodes_patched, 1u);
  EXPECT_EQ(g2->stats().last_launches_resolved, 1u);
}

}  // namespace
}  // namespace kpack
