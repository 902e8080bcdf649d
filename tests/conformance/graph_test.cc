// kpack::StepGraph's behaviour, written once (see conformance.h) and run on the fake driver
// (CPU tier, kernels emulated) and on a GPU (GPU tier): a step of the example kernels
// (kernels/graphpack: vector add, softmax, layer norm, matmul) whose sizes and pointers
// change every step, crossing buckets and specializations, replayed from its graphs and
// compared bit for bit with the same step launched eagerly; replays on another stream than
// the one the launches were bound to; two graphs of one step replayed concurrently on two
// streams, each with its own scratch memory (kernels/testpack's `scratch`, which keeps a
// TMA descriptor per program in Triton's global scratch); a chain of PDL kernels joined by
// programmatic edges; a replay captured into the caller's graph that outlives its
// StepGraph; building while another thread captures in global mode. What only the fake can
// observe (which nodes are patched, signature keys, edge types, errors) is
// tests/unit/step_graph_test.cc.

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <latch>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "conformance.h"
#include "gmock/gmock.h"
#include "util/status_macros.h"

namespace kpack::conformance {
namespace {

// Exactly representable fp16 values for the fp16 inputs.
constexpr uint16_t kHalves[] = {0x0000, 0x3c00, 0xbc00, 0x3800, 0xb800, 0x4000,
                                0xc000, 0x3400, 0xb400, 0x3e00, 0xbe00};

class GraphTest : public ConformanceTest {
 public:
  // For GraphStep, which builds a step's buffers through the fixture.
  using ConformanceTest::Alloc;
  using ConformanceTest::Download;
  using ConformanceTest::RandomFloats;
  using ConformanceTest::Sync;
  using ConformanceTest::Upload;

  std::vector<uint16_t> RandomHalves(size_t n, uint32_t seed) {
    std::mt19937 gen(seed);
    std::vector<uint16_t> v(n);
    for (uint16_t& h : v) h = kHalves[gen() % std::size(kHalves)];
    return v;
  }
};

// The sizes of one step. Each crosses bucket edges of its kernel across steps.
struct Sizes {
  int n = 1000;     // vector adds: buckets at 4096 (and 65536)
  int cols = 100;   // softmax row length: bucket edge 1024
  int N = 300;      // layer norm row length and the matmul's K: bucket edge 1024
  int M = 10;       // matmul rows: bucket edges 16, 64
  int out_set = 0;  // which of two output buffers the matmul writes (a pointer change)
};

// A step of 6 launches of kernels/graphpack on `rt`, with its own buffers:
//   t = x + y (n);  s = softmax(t as 8 rows of `cols`, row stride 2048);  u = s + x (n);
//   ly = layer_norm(lx) (80 rows of N, stride 2048);  c[out_set] = ly[:M] @ wmat (K = N);
//   v = u + t (n)
// Inputs are filled once; Reset fills every output with 0xff bytes.
class GraphStep {
 public:
  static constexpr int kMaxN = 16384, kRows = 8, kStride = 2048, kLnRows = 80, kMmN = 16;

  GraphStep(GraphTest& test, Runtime& rt, CUstream stream, uint32_t seed) : test_(test) {
    const std::vector<float> x = GraphTest::RandomFloats(kMaxN, seed);
    const std::vector<float> y = GraphTest::RandomFloats(kMaxN, seed + 1);
    x_ = test.Upload(x);
    y_ = test.Upload(y);
    lx_ = test.Upload(test.RandomHalves(size_t{kLnRows} * kStride, seed + 2));
    w_ = test.Upload(test.RandomHalves(kStride, seed + 3));
    b_ = test.Upload(test.RandomHalves(kStride, seed + 4));
    wmat_ = test.Upload(test.RandomHalves(size_t{kStride} * kMmN, seed + 5));
    outputs_ = {{&t_, kMaxN * 4}, {&s_, kRows * kStride * 4}, {&u_, kMaxN * 4},
                {&ly_, kLnRows * kStride * 2}, {&c_[0], kLnRows * kMmN * 2},
                {&c_[1], kLnRows * kMmN * 2}, {&v_, kMaxN * 4}};
    for (auto& [buffer, bytes] : outputs_) *buffer = test.Alloc(bytes);
    const Sizes z;
    Bind(rt, "vector_add", stream, {x_, y_, t_, z.n});
    Bind(rt, "softmax", stream, {s_, t_, kStride, kStride, kRows, z.cols});
    Bind(rt, "vector_add", stream, {s_, x_, u_, z.n});
    Bind(rt, "layer_norm", stream, {lx_, ly_, w_, b_, kStride, kLnRows, z.N, 1e-5f});
    Bind(rt, "matmul_fp16", stream,
         {ly_, wmat_, c_[0], z.M, kMmN, z.N, kStride, 1, kMmN, 1, kMmN, 1});
    Bind(rt, "vector_add", stream, {u_, t_, v_, z.n});
  }

  absl::Status Set(const Sizes& z) {
    for (size_t i : {0, 2, 5}) KPACK_RETURN_IF_ERROR(launches_[i]->Set(3, z.n));
    KPACK_RETURN_IF_ERROR(launches_[1]->Set(5, z.cols));
    KPACK_RETURN_IF_ERROR(launches_[3]->Set(6, z.N));
    KPACK_RETURN_IF_ERROR(launches_[4]->Set(2, c_[z.out_set]));
    KPACK_RETURN_IF_ERROR(launches_[4]->Set(3, z.M));
    return launches_[4]->Set(5, z.N);
  }
  void Reset(const internal::Driver& d) {
    for (auto& [buffer, bytes] : outputs_) EXPECT_EQ(d.MemsetD8(*buffer, 0xff, bytes), CUDA_SUCCESS);
    test_.Sync();
  }
  absl::Status LaunchEagerly() {
    for (auto& b : launches_) KPACK_RETURN_IF_ERROR(b->Launch());
    return absl::OkStatus();
  }
  // Every output buffer's bytes, in order.
  std::vector<uint8_t> Outputs() {
    std::vector<uint8_t> all;
    for (auto& [buffer, bytes] : outputs_) {
      std::vector<uint8_t> one = test_.Download<uint8_t>(*buffer, bytes);
      all.insert(all.end(), one.begin(), one.end());
    }
    return all;
  }
  std::vector<BoundLaunch*> step() {
    std::vector<BoundLaunch*> out;
    for (auto& b : launches_) out.push_back(b.get());
    return out;
  }

 private:
  void Bind(Runtime& rt, const char* kernel, CUstream stream, std::vector<Arg> args) {
    absl::StatusOr<Kernel> k = rt.Find(kernel);
    ASSERT_TRUE(k.ok()) << k.status();
    absl::StatusOr<BoundLaunch> b = k->Bind(stream, args);
    ASSERT_TRUE(b.ok()) << kernel << ": " << b.status();
    launches_.push_back(std::make_unique<BoundLaunch>(*std::move(b)));
  }

  GraphTest& test_;
  CUdeviceptr x_ = 0, y_ = 0, lx_ = 0, w_ = 0, b_ = 0, wmat_ = 0;
  CUdeviceptr t_ = 0, s_ = 0, u_ = 0, ly_ = 0, c_[2] = {0, 0}, v_ = 0;
  std::vector<std::pair<CUdeviceptr*, size_t>> outputs_;
  std::vector<std::unique_ptr<BoundLaunch>> launches_;
};

// Random sizes: each one in a random bucket of its kernel, mostly multiples of 16 (the
// div16 variants) and sometimes not (the generic ones).
Sizes RandomSizes(std::mt19937& gen) {
  auto pick = [&](std::initializer_list<std::pair<int, int>> buckets) {
    const auto [lo, hi] = *(buckets.begin() + gen() % buckets.size());
    int v = lo + static_cast<int>(gen() % static_cast<uint32_t>(hi - lo + 1));
    if (gen() % 5 != 0) v = std::max(16, v / 16 * 16);
    return v;
  };
  Sizes z;
  z.n = pick({{1, 4096}, {4097, GraphStep::kMaxN}});
  z.cols = pick({{1, 1024}, {1025, GraphStep::kStride}});
  z.N = pick({{1, 1024}, {1025, 1536}});
  z.M = pick({{1, 16}, {17, 64}, {65, GraphStep::kLnRows}});
  z.out_set = static_cast<int>(gen() % 2);
  return z;
}

TEST_P(GraphTest, ReplaysAreBitIdenticalToEagerStepsOverRandomSizeSequences) {
  auto rt = Open(KPACK_GRAPH_PACK_DIR);
  ASSERT_NE(rt, nullptr);
  GraphStep step(*this, *rt, main_.stream, 11);
  absl::StatusOr<StepGraph> graph = StepGraph::Create(step.step());
  ASSERT_TRUE(graph.ok()) << graph.status();
  std::mt19937 gen(2024);
  constexpr int kSteps = 240;
  int crossed = 0;
  Sizes previous;
  for (int i = 0; i < kSteps; ++i) {
    const Sizes z = RandomSizes(gen);
    crossed += (z.M > 16) != (previous.M > 16) || (z.n > 4096) != (previous.n > 4096);
    previous = z;
    SCOPED_TRACE(::testing::Message() << "step " << i << ": n " << z.n << ", cols " << z.cols
                                      << ", N " << z.N << ", M " << z.M);
    KP_ASSERT_OK(step.Set(z));
    step.Reset(d());
    KP_ASSERT_OK(graph->Replay(main_.replay));
    const std::vector<uint8_t> replayed = step.Outputs();
    step.Reset(d());
    KP_ASSERT_OK(step.LaunchEagerly());
    const std::vector<uint8_t> eager = step.Outputs();
    ASSERT_EQ(replayed.size(), eager.size());
    size_t first = 0;
    while (first < eager.size() && replayed[first] == eager[first]) ++first;
    ASSERT_EQ(first, eager.size()) << "replayed outputs differ from the eager step's from byte "
                                   << first << "; graph " << *graph->Signature();
  }
  const StepGraph::Stats stats = graph->stats();
  std::printf("[ graph ] %d random steps (%d crossed a bucket edge of M or n): %llu graphs "
              "built, %llu nodes patched (%.2f per replay)\n",
              kSteps, crossed, static_cast<unsigned long long>(stats.graphs_built),
              static_cast<unsigned long long>(stats.nodes_patched),
              static_cast<double>(stats.nodes_patched) / kSteps);
  EXPECT_EQ(stats.replays, static_cast<uint64_t>(kSteps));
  EXPECT_GT(crossed, kSteps / 4);
  EXPECT_LT(stats.graphs_built, static_cast<uint64_t>(kSteps)) << "signatures repeat";
  EXPECT_GT(stats.nodes_patched, 0u);
}

TEST_P(GraphTest, ReplaysOnOtherStreamsThanTheLaunchesAndTheFirstReplay) {
  auto rt = Open(KPACK_GRAPH_PACK_DIR);
  ASSERT_NE(rt, nullptr);
  GraphStep step(*this, *rt, main_.stream, 21);
  absl::StatusOr<StepGraph> graph = StepGraph::Create(step.step());
  ASSERT_TRUE(graph.ok()) << graph.status();
  Sizes z;
  z.n = 5000;
  z.M = 40;
  KP_ASSERT_OK(step.Set(z));
  KP_ASSERT_OK(graph->Build());  // declared ahead: built on no stream at all
  step.Reset(d());
  KP_ASSERT_OK(step.LaunchEagerly());  // on the launches' own stream
  const std::vector<uint8_t> eager = step.Outputs();
  const Streams other = NewStreams();
  for (CUstream stream : {main_.replay, other.stream, other.replay, main_.stream}) {
    step.Reset(d());
    KP_ASSERT_OK(graph->Replay(stream));
    EXPECT_TRUE(step.Outputs() == eager) << "replay on another stream";
  }
  EXPECT_EQ(graph->stats().graphs_built, 1u);
}

TEST_P(GraphTest, TwoGraphsOfOneStepReplayConcurrentlyWithTheirOwnScratch) {
  // kernels/testpack's scratch kernel: a 32x32 tile per program, doubled, through a TMA
  // descriptor each program writes into its 128 bytes of global scratch.
  auto rt = Open(KPACK_TEST_PACK_DIR);
  ASSERT_NE(rt, nullptr);
  constexpr int kDim = 64, kRounds = 12;
  const std::vector<float> input = RandomFloats(kDim * kDim, 31);
  const CUdeviceptr x = Upload(input);
  struct Graph {
    std::vector<CUdeviceptr> outs;
    std::unique_ptr<BoundLaunch> launch;
    std::optional<StepGraph> graph;
    CUstream stream;
  } graphs[2];
  const Streams other = NewStreams();
  graphs[0].stream = main_.replay;
  graphs[1].stream = other.replay;
  for (Graph& g : graphs) {
    for (int r = 0; r < kRounds; ++r) g.outs.push_back(Alloc(kDim * kDim * 4));
    absl::StatusOr<BoundLaunch> b =
        rt->Find("scratch")->BindArgs(Grid{2, 2}, main_.stream, x, g.outs[0], kDim, kDim, kDim);
    ASSERT_TRUE(b.ok()) << b.status();
    g.launch = std::make_unique<BoundLaunch>(*std::move(b));
    BoundLaunch* step[] = {g.launch.get()};
    absl::StatusOr<StepGraph> built = StepGraph::Create(step);
    ASSERT_TRUE(built.ok()) << built.status();
    g.graph.emplace(*std::move(built));
    KP_ASSERT_OK(g.graph->Build());
  }
  // Both graphs in flight at once: no synchronization until the end.
  for (int r = 0; r < kRounds; ++r) {
    for (Graph& g : graphs) {
      KP_ASSERT_OK(g.launch->Set(1, g.outs[r]));
      KP_ASSERT_OK(g.graph->Replay(g.stream));
    }
  }
  std::vector<float> want(input.size());
  for (size_t i = 0; i < input.size(); ++i) want[i] = input[i] * 2;
  for (Graph& g : graphs) {
    for (int r = 0; r < kRounds; ++r) {
      EXPECT_TRUE(Download<float>(g.outs[r], want.size()) == want) << "round " << r;
    }
    EXPECT_EQ(g.graph->stats().scratch_bytes, 4u * 128u);
  }
  EXPECT_EQ(rt->stats().scratch_in_graphs, 2u) << "one arena per graph";

  // And two graphs of the example step, replayed concurrently, each equal to the eager step.
  auto packed = Open(KPACK_GRAPH_PACK_DIR);
  ASSERT_NE(packed, nullptr);
  GraphStep a(*this, *packed, main_.stream, 41), b(*this, *packed, other.stream, 41);
  Sizes z;
  z.n = 9000;
  z.cols = 1500;
  z.M = 70;
  KP_ASSERT_OK(a.Set(z));
  KP_ASSERT_OK(b.Set(z));
  a.Reset(d());
  KP_ASSERT_OK(a.LaunchEagerly());
  const std::vector<uint8_t> eager = a.Outputs();
  absl::StatusOr<StepGraph> ga = StepGraph::Create(a.step());
  absl::StatusOr<StepGraph> gb = StepGraph::Create(b.step());
  ASSERT_TRUE(ga.ok() && gb.ok());
  a.Reset(d());
  b.Reset(d());
  for (int r = 0; r < 4; ++r) {
    KP_ASSERT_OK(ga->Replay(main_.replay));
    KP_ASSERT_OK(gb->Replay(other.replay));
  }
  EXPECT_TRUE(a.Outputs() == eager);
  EXPECT_TRUE(b.Outputs() == eager);
}

// Waits (up to 2 s) until the runtime's graphs hold `arenas` scratch arenas: a destroyed
// graph's arena returns when the driver runs its user object's destructor, on the real
// driver asynchronously.
void AwaitScratchInGraphs(const Runtime& rt, size_t arenas) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (rt.stats().scratch_in_graphs != arenas && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_EQ(rt.stats().scratch_in_graphs, arenas);
}

// kernels/testpack's pdl kernel (out = 2x after gdc_wait, gdc_launch_dependents before its
// store) three times in a chain: each reads what the one before wrote. In the graph the
// second and third depend on the one before through programmatic edges, so they may
// start early, and gdc_wait orders their reads after the writes.
TEST_P(GraphTest, APdlChainReplaysThroughProgrammaticEdgesBitIdenticalToEager) {
  auto rt = Open(KPACK_TEST_PACK_DIR);
  ASSERT_NE(rt, nullptr);
  constexpr int kMaxN = 1 << 18;
  const std::vector<float> input = RandomFloats(kMaxN, 71);
  const CUdeviceptr x = Upload(input);
  const CUdeviceptr buffers[3] = {Alloc(kMaxN * 4), Alloc(kMaxN * 4), Alloc(kMaxN * 4)};
  absl::StatusOr<Kernel> pdl = rt->Find("pdl");
  ASSERT_TRUE(pdl.ok()) << pdl.status();
  std::vector<std::unique_ptr<BoundLaunch>> chain;
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<BoundLaunch> b = pdl->BindArgs(Grid{Cdiv(kMaxN, 1024)}, main_.stream,
                                                  i == 0 ? x : buffers[i - 1], buffers[i], kMaxN);
    ASSERT_TRUE(b.ok()) << b.status();
    chain.push_back(std::make_unique<BoundLaunch>(*std::move(b)));
  }
  std::vector<BoundLaunch*> step;
  for (auto& b : chain) step.push_back(b.get());
  absl::StatusOr<StepGraph> graph = StepGraph::Create(step);
  ASSERT_TRUE(graph.ok()) << graph.status();
  auto reset = [&] {
    for (CUdeviceptr b : buffers) ASSERT_EQ(d().MemsetD8(b, 0xff, kMaxN * 4), CUDA_SUCCESS);
    Sync();
  };
  for (int n : {kMaxN, 1000, 4097, kMaxN - 5, kMaxN}) {
    SCOPED_TRACE(::testing::Message() << "n " << n);
    for (auto& b : chain) {
      KP_ASSERT_OK(b->Set(2, n));
      b->set_grid(Grid{Cdiv(n, 1024)});
    }
    reset();
    KP_ASSERT_OK(graph->Replay(main_.replay));
    const std::vector<float> replayed = Download<float>(buffers[2], kMaxN);
    reset();
    for (auto& b : chain) KP_ASSERT_OK(b->Launch());
    const std::vector<float> eager = Download<float>(buffers[2], kMaxN);
    EXPECT_EQ(std::memcmp(replayed.data(), eager.data(), kMaxN * 4), 0)
        << "the replay differs from the eager chain";
    size_t wrong = 0;
    for (int i = 0; i < n; ++i) wrong += replayed[i] != input[i] * 8;
    EXPECT_EQ(wrong, 0u) << "of " << n << " outputs are not 8x the input";
  }
  ASSERT_FALSE(graph->graphs().empty());
  for (const StepGraph::GraphInfo& info : graph->graphs()) {
    EXPECT_EQ(info.programmatic_edges, 2u) << info.signature;
    EXPECT_EQ(info.pdl_fallback, "") << "the driver refused programmatic edges";
  }
  EXPECT_EQ(graph->stats().pdl_fallbacks, 0u);
}

// A replay on a stream the caller captures goes into the caller's graph with the capture's
// own scratch, so the caller's graph may outlive the StepGraph: here it runs after the
// StepGraph is gone, concurrently with a second StepGraph that took the first one's
// scratch arena from the pool, and each computes its own result.
TEST_P(GraphTest, AReplayCapturedIntoTheCallersGraphOutlivesTheStepGraph) {
  auto rt = Open(KPACK_TEST_PACK_DIR);
  ASSERT_NE(rt, nullptr);
  constexpr int kDim = 64, kRounds = 12;
  const std::vector<float> in_a = RandomFloats(kDim * kDim, 81);
  const std::vector<float> in_b = RandomFloats(kDim * kDim, 82);
  const CUdeviceptr xa = Upload(in_a), xb = Upload(in_b);
  const CUdeviceptr out_a = Alloc(kDim * kDim * 4);
  std::vector<CUdeviceptr> outs_b;
  for (int r = 0; r < kRounds; ++r) outs_b.push_back(Alloc(kDim * kDim * 4));
  const Streams other = NewStreams();
  absl::StatusOr<Kernel> scratch = rt->Find("scratch");
  ASSERT_TRUE(scratch.ok());

  absl::StatusOr<BoundLaunch> a =
      scratch->BindArgs(Grid{2, 2}, main_.stream, xa, out_a, kDim, kDim, kDim);
  ASSERT_TRUE(a.ok()) << a.status();
  BoundLaunch* step_a[] = {&*a};
  std::optional<StepGraph> graph_a;
  {
    absl::StatusOr<StepGraph> g = StepGraph::Create(step_a);
    ASSERT_TRUE(g.ok()) << g.status();
    graph_a.emplace(*std::move(g));
  }
  KP_ASSERT_OK(graph_a->Replay(main_.replay));  // its graph, and that graph's scratch
  Sync();
  ASSERT_EQ(rt->stats().scratch_in_graphs, 1u);
  KP_ASSERT_OK(rt->ReserveScratch(main_.capture, kCaptureScratch));
  CU_ASSERT(d().StreamBeginCapture(main_.capture, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
  const absl::Status captured = graph_a->Replay(main_.capture);
  CUgraph outer = nullptr;
  CU_ASSERT(d().StreamEndCapture(main_.capture, &outer));  // the capture stayed valid
  KP_ASSERT_OK(captured);
  EXPECT_EQ(graph_a->stats().captured_steps, 1u);
  CUgraphExec exec = nullptr;
  CU_ASSERT(d().GraphInstantiateWithFlags(&exec, outer, 0));
  CU_ASSERT(d().GraphDestroy(outer));
  graph_a.reset();
  AwaitScratchInGraphs(*rt, 1);  // the caller's graph's own arena only
  EXPECT_EQ(rt->stats().scratch_idle, 1u) << "the StepGraph's arena is back in the pool";

  absl::StatusOr<BoundLaunch> b =
      scratch->BindArgs(Grid{2, 2}, main_.stream, xb, outs_b[0], kDim, kDim, kDim);
  ASSERT_TRUE(b.ok()) << b.status();
  BoundLaunch* step_b[] = {&*b};
  absl::StatusOr<StepGraph> graph_b = StepGraph::Create(step_b);
  ASSERT_TRUE(graph_b.ok()) << graph_b.status();
  KP_ASSERT_OK(graph_b->Build());
  EXPECT_EQ(rt->stats().scratch_idle, 0u) << "the second StepGraph took the pooled arena";
  for (int r = 0; r < kRounds; ++r) {
    CU_ASSERT(d().GraphLaunch(exec, main_.replay));
    KP_ASSERT_OK(b->Set(1, outs_b[r]));
    KP_ASSERT_OK(graph_b->Replay(other.replay));
  }
  std::vector<float> want_a(in_a.size()), want_b(in_b.size());
  for (size_t i = 0; i < in_a.size(); ++i) want_a[i] = in_a[i] * 2;
  for (size_t i = 0; i < in_b.size(); ++i) want_b[i] = in_b[i] * 2;
  EXPECT_TRUE(Download<float>(out_a, want_a.size()) == want_a) << "the caller's graph";
  for (int r = 0; r < kRounds; ++r) {
    EXPECT_TRUE(Download<float>(outs_b[r], want_b.size()) == want_b) << "round " << r;
  }
  CU_ASSERT(d().GraphExecDestroy(exec));
  graph_b = absl::UnknownError("gone");
  Sync();
  AwaitScratchInGraphs(*rt, 0);
}

// Build() loads the variants, allocates the graph's scratch and instantiates, and a
// StepGraph is destroyed, while another thread holds a capture in global mode, which
// forbids such calls to threads in the default mode: StepGraph makes them in RELAXED mode,
// so neither refuses the other. The graph built then replays correctly afterwards.
TEST_P(GraphTest, BuildingWhileAnotherThreadCapturesInGlobalMode) {
  auto rt = Open(KPACK_TEST_PACK_DIR);  // nothing loaded yet
  ASSERT_NE(rt, nullptr);
  constexpr int kDim = 64;
  const std::vector<float> input = RandomFloats(kDim * kDim, 91);
  const CUdeviceptr x = Upload(input), out = Alloc(kDim * kDim * 4), other_out = Alloc(16 * 4);
  const Streams other = NewStreams();
  absl::StatusOr<BoundLaunch> b =
      rt->Find("scratch")->BindArgs(Grid{2, 2}, main_.stream, x, out, kDim, kDim, kDim);
  absl::StatusOr<BoundLaunch> add =
      rt->Find("add")->BindArgs(Grid{1}, main_.stream, x, x, other_out, 16);
  ASSERT_TRUE(b.ok() && add.ok());
  BoundLaunch* step[] = {&*b};
  BoundLaunch* doomed_step[] = {&*add};
  absl::StatusOr<StepGraph> graph = StepGraph::Create(step);
  std::optional<StepGraph> doomed;
  {
    absl::StatusOr<StepGraph> g = StepGraph::Create(doomed_step);
    ASSERT_TRUE(graph.ok() && g.ok());
    doomed.emplace(*std::move(g));
  }
  KP_ASSERT_OK(doomed->Build());  // a graph to destroy during the capture
  std::latch capturing(1), done(1);
  CUresult began = CUDA_ERROR_UNKNOWN, ended = CUDA_ERROR_UNKNOWN;
  std::thread capturer([&] {
    d().CtxSetCurrent(primary_);
    began = d().StreamBeginCapture(other.capture, CU_STREAM_CAPTURE_MODE_GLOBAL);
    capturing.count_down();
    done.wait();
    CUgraph g = nullptr;
    ended = d().StreamEndCapture(other.capture, &g);
    if (g != nullptr) d().GraphDestroy(g);
  });
  capturing.wait();
  const absl::Status built = graph->Build();
  doomed.reset();  // cuGraphExecDestroy, cuGraphDestroy
  done.count_down();
  capturer.join();
  ASSERT_EQ(began, CUDA_SUCCESS);
  EXPECT_EQ(ended, CUDA_SUCCESS) << "the other thread's capture was invalidated";
  KP_ASSERT_OK(built);
  KP_ASSERT_OK(graph->Replay(main_.replay));
  EXPECT_EQ(graph->stats().graphs_built, 1u);
  std::vector<float> want(input.size());
  for (size_t i = 0; i < input.size(); ++i) want[i] = input[i] * 2;
  EXPECT_TRUE(Download<float>(out, want.size()) == want);
}

// What the fake driver models and StepGraph's design rests on: an executable graph cannot
// be launched into a capture (the driver refuses and invalidates the capture).
TEST_P(GraphTest, TheDriverRefusesAGraphLaunchIntoACapture) {
  auto rt = Open(KPACK_TEST_PACK_DIR);
  ASSERT_NE(rt, nullptr);
  KP_ASSERT_OK(rt->Preload());
  const CUdeviceptr x = Upload(RandomFloats(1024, 95)), out = Alloc(1024 * 4);
  CU_ASSERT(d().StreamBeginCapture(main_.capture, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
  const absl::Status launched = rt->Launch("pdl", Grid{1}, main_.capture, x, out, 1024);
  CUgraph graph = nullptr;
  CU_ASSERT(d().StreamEndCapture(main_.capture, &graph));
  KP_ASSERT_OK(launched);
  CUgraphExec exec = nullptr;
  CU_ASSERT(d().GraphInstantiateWithFlags(&exec, graph, 0));
  CU_ASSERT(d().StreamBeginCapture(main_.capture, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
  EXPECT_EQ(d().GraphLaunch(exec, main_.capture), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  CUgraph refused = nullptr;
  EXPECT_EQ(d().StreamEndCapture(main_.capture, &refused), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  if (refused != nullptr) EXPECT_EQ(d().GraphDestroy(refused), CUDA_SUCCESS);
  CU_ASSERT(d().GraphExecDestroy(exec));
  CU_ASSERT(d().GraphDestroy(graph));
}

INSTANTIATE_TEST_SUITE_P(Graph, GraphTest, ::testing::Values(Mode{TheBackend(), false}),
                         ModeName);

}  // namespace
}  // namespace kpack::conformance
