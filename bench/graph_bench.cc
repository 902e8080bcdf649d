// kpack::StepGraph against the same step launched eagerly through kpack, in one process
// (bench/RESULTS.md, "CUDA graphs"):
//
//   graph_bench [--pack DIR] [--steps N] [--gpu-reps N] [--json FILE] [--smoke]
//
// The step: layers of four launches of kernels/graphpack -- layer_norm (64 rows of N),
// matmul_fp16 (M rows of the norm's output times a K=N by 1024 matrix), softmax (32 rows
// of `cols`), vector_add (n) -- 8 layers (32 kernels) and 16 layers (64 kernels), every
// layer with its own buffers. Every step draws new sizes inside fixed buckets (N in
// 1025..4096, M in 17..64, cols in 1025..8192, n in 4097..65536; sizes multiples of 16
// except M, so the specializations stay), sets them on the BoundLaunches and sends the
// step: eagerly (BoundLaunch::Launch per kernel) or as one StepGraph::Replay, which patches
// the nodes whose arguments changed (all of them: every size changes every step) and
// launches the bucket's graph, whose grids stay at the buckets' upper edges for the two
// grid-tolerant kernels and are fixed for the other two.
//
// Measured, per step size:
//  - host time: per step, the stream synchronized before and outside the timed region, so
//    only the host's work is timed: sending (launches / replay) alone, and with the Sets;
//    median per kernel, eager and graph, and their ratio; and the driver's own floor for
//    such a replay: the same kernels in a graph built here without kpack, every node's
//    parameters set with cuGraphExecKernelNodeSetParams from buffers prepared beforehand
//    (two, in turn, so the bytes change every step), then cuGraphLaunch;
//  - GPU time of a step: after a gate (three 4096^3 matmuls, long enough for the host to
//    enqueue the whole eager step behind it), an event before and after the step; median;
//  - building and instantiating a bucket graph: StepGraph::Build for 8 bucket signatures
//    (M, cols and n in each of their buckets the buffers allow), and the same step captured
//    with cuStreamBeginCapture and
//    instantiated, for comparison; device memory per graph (cuMemGetInfo before and after,
//    2 MiB granularity) and scratch bytes;
//  - outputs: 20 random steps whose sizes cross buckets, replayed and launched eagerly,
//    compared bit for bit (the thorough check is the GPU test Graph/GraphTest).
//
// Targets (issue 16): host per kernel <= 0.5 us and >= 7x below eager; GPU time of the
// step <= 1.10x eager's; build + instantiate of a 32-kernel bucket graph <= 1 ms. Each
// line says met or missed. --smoke runs a few steps (CI runs it on the fake driver, whose
// times mean nothing). Needs a current-capable device 0 (KPACK_CUDA_DRIVER may name the
// fake driver).

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "driver/driver.h"
#include "kpack/kpack.h"
#include "nlohmann/json.hpp"

namespace kpack::bench {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int kLnRows = 64, kMaxN = 4096, kMmCols = 1024, kSmRows = 32, kMaxCols = 8192,
              kMaxVec = 65536, kGate = 4096;

struct Args {
  std::string pack = KPACK_GRAPH_PACK_DIR;
  int steps = 2000;
  int gpu_reps = 50;
  std::string json;
  bool smoke = false;
};

[[noreturn]] void Fail(const std::string& what) {
  std::fprintf(stderr, "graph_bench: FAILED: %s\n", what.c_str());
  std::exit(1);
}
void Check(const absl::Status& s, const std::string& what) {
  if (!s.ok()) Fail(absl::StrCat(what, ": ", s.ToString()));
}
void CheckCu(const internal::Driver& d, CUresult r, const std::string& what) {
  Check(d.Check(r, what), what);
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double Micros(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::micro>(b - a).count();
}

// A multiple of 16 in [lo, hi] (lo, hi multiples of 16 or not).
int Mult16(std::mt19937& gen, int lo, int hi) {
  const int a = (lo + 15) / 16, b = hi / 16;
  return 16 * (a + static_cast<int>(gen() % static_cast<uint32_t>(b - a + 1)));
}

struct Sizes {
  int N, M, cols, n;
};

// Sizes inside the timed buckets (see the top of the file).
Sizes InBucket(std::mt19937& gen) {
  return {Mult16(gen, 1025, kMaxN), 17 + static_cast<int>(gen() % 48), Mult16(gen, 1025, kMaxCols),
          Mult16(gen, 4097, kMaxVec)};
}
// Sizes anywhere, crossing every bucket edge the step's buffers allow.
Sizes Anywhere(std::mt19937& gen) {
  return {Mult16(gen, 16, kMaxN), 1 + static_cast<int>(gen() % kLnRows),
          Mult16(gen, 16, kMaxCols), Mult16(gen, 16, kMaxVec)};
}

class Bench {
 public:
  explicit Bench(const Args& args) : args_(args) {}

  void SetUp() {
    absl::StatusOr<std::shared_ptr<const internal::Driver>> d = internal::Driver::Load("");
    Check(d.status(), "loading the CUDA driver");
    driver_ = *d;
    CUdevice device;
    CheckCu(*driver_, driver_->DeviceGet(&device, 0), "cuDeviceGet");
    CheckCu(*driver_, driver_->DevicePrimaryCtxRetain(&ctx_, device), "cuDevicePrimaryCtxRetain");
    CheckCu(*driver_, driver_->CtxSetCurrent(ctx_), "cuCtxSetCurrent");
    char name[256] = {};
    driver_->DeviceGetName(name, sizeof(name), device);
    device_ = name;
    CheckCu(*driver_, driver_->StreamCreate(&stream_, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
    CheckCu(*driver_, driver_->StreamCreate(&capture_, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
    CheckCu(*driver_, driver_->EventCreate(&start_, 0), "cuEventCreate");
    CheckCu(*driver_, driver_->EventCreate(&stop_, 0), "cuEventCreate");
    Options options;
    options.preload = true;
    absl::StatusOr<Runtime> rt = Runtime::Open(args_.pack, options);
    Check(rt.status(), "opening " + args_.pack);
    rt_ = std::make_unique<Runtime>(*std::move(rt));
    // The gate: a 4096^3 matmul (the open-ended bucket), three times per measurement.
    const CUdeviceptr ga = Alloc(size_t{kGate} * kGate * 2), gb = Alloc(size_t{kGate} * kGate * 2),
                      gc = Alloc(size_t{kGate} * kGate * 2);
    gate_ = Bind("matmul_fp16", {ga, gb, gc, kGate, kGate, kGate, kGate, 1, kGate, 1, kGate, 1});
  }

  // A step of `layers` layers of four launches, each layer with its own buffers.
  struct Step {
    std::vector<std::unique_ptr<BoundLaunch>> launches;
    std::vector<std::pair<CUdeviceptr, size_t>> outputs;
  };
  Step MakeStep(int layers) {
    Step s;
    for (int l = 0; l < layers; ++l) {
      const CUdeviceptr ln_x = Random(size_t{kLnRows} * kMaxN * 2, l),
                        ln_w = Random(kMaxN * 2, l + 1), ln_b = Random(kMaxN * 2, l + 2),
                        mm_b = Random(size_t{kMaxN} * kMmCols * 2, l + 3),
                        sm_in = Random(size_t{kSmRows} * kMaxCols * 4, l + 4, true),
                        va_x = Random(kMaxVec * 4, l + 5, true),
                        va_y = Random(kMaxVec * 4, l + 6, true);
      const size_t ln_bytes = size_t{kLnRows} * kMaxN * 2, mm_bytes = size_t{kLnRows} * kMmCols * 2,
                   sm_bytes = size_t{kSmRows} * kMaxCols * 4, va_bytes = kMaxVec * 4;
      const CUdeviceptr ln_y = Alloc(ln_bytes), mm_c = Alloc(mm_bytes), sm_out = Alloc(sm_bytes),
                        va_out = Alloc(va_bytes);
      s.outputs.insert(s.outputs.end(),
                       {{ln_y, ln_bytes}, {mm_c, mm_bytes}, {sm_out, sm_bytes}, {va_out, va_bytes}});
      const Sizes z{kMaxN, 64, kMaxCols, kMaxVec};
      s.launches.push_back(
          Bind("layer_norm", {ln_x, ln_y, ln_w, ln_b, kMaxN, kLnRows, z.N, 1e-5f}));
      s.launches.push_back(Bind("matmul_fp16", {ln_y, mm_b, mm_c, z.M, kMmCols, z.N, kMaxN, 1,
                                                kMmCols, 1, kMmCols, 1}));
      s.launches.push_back(
          Bind("softmax", {sm_out, sm_in, kMaxCols, kMaxCols, kSmRows, z.cols}));
      s.launches.push_back(Bind("vector_add", {va_x, va_y, va_out, z.n}));
    }
    return s;
  }
  void SetSizes(Step& s, std::mt19937& gen, bool anywhere) {
    for (size_t l = 0; l < s.launches.size() / 4; ++l) {
      const Sizes z = anywhere ? Anywhere(gen) : InBucket(gen);
      Check(s.launches[4 * l]->Set(6, z.N), "layer_norm N");
      Check(s.launches[4 * l + 1]->Set(3, z.M), "matmul M");
      Check(s.launches[4 * l + 1]->Set(5, z.N), "matmul K");
      Check(s.launches[4 * l + 2]->Set(5, z.cols), "softmax cols");
      Check(s.launches[4 * l + 3]->Set(3, z.n), "vector_add n");
    }
  }
  void Eager(Step& s) {
    for (auto& b : s.launches) Check(b->Launch(), "eager launch");
  }
  void Sync() { CheckCu(*driver_, driver_->StreamSynchronize(stream_), "cuStreamSynchronize"); }

  // The driver's floor for a replay that patches every node (see the top of the file):
  // the step's kernels as a chain of kernel nodes built here, with no kpack code between
  // the calls. Two parameter sets, each from one draw of sizes (the grids of the first:
  // every kernel masks by its sizes, and the buffers hold the largest).
  struct RawGraph {
    CUgraph graph = nullptr;
    CUgraphExec exec = nullptr;
    std::vector<CUgraphNode> nodes;
    std::vector<std::vector<std::byte>> bytes[2];
    std::vector<size_t> sizes;
    std::vector<std::array<void*, 5>> extra[2];
    std::vector<CUDA_KERNEL_NODE_PARAMS_v2> params[2];
  };
  std::unique_ptr<RawGraph> MakeRawGraph(Step& s, std::mt19937& gen) {
    auto raw = std::make_unique<RawGraph>();
    const size_t n = s.launches.size();
    raw->sizes.resize(n);
    for (int set = 0; set < 2; ++set) {
      SetSizes(s, gen, false);
      raw->bytes[set].resize(n);
      raw->extra[set].resize(n);
      raw->params[set].resize(n);
      for (size_t i = 0; i < n; ++i) {
        absl::StatusOr<PreparedLaunch> p = s.launches[i]->Prepare();
        Check(p.status(), "BoundLaunch::Prepare");
        if (p->function == nullptr || p->param_bytes == 0) Fail("an empty launch in the step");
        const auto* from = static_cast<const std::byte*>(p->params);
        raw->bytes[set][i].assign(from, from + p->param_bytes);
        raw->sizes[i] = p->param_bytes;
        raw->extra[set][i] = {CU_LAUNCH_PARAM_BUFFER_POINTER, raw->bytes[set][i].data(),
                              CU_LAUNCH_PARAM_BUFFER_SIZE, &raw->sizes[i], CU_LAUNCH_PARAM_END};
        for (unsigned a = 0; a < p->config.numAttrs; ++a) {
          // kpack sets the others on its nodes (bucket_graph.cc); a chain of full edges
          // stands for programmatic serialization here.
          if (p->config.attrs[a].id != CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION) {
            Fail(absl::StrCat("launch attribute ", p->config.attrs[a].id,
                              " in the step, which the raw graph does not set"));
          }
        }
        CUDA_KERNEL_NODE_PARAMS_v2& q = raw->params[set][i];
        q.func = p->function;
        q.gridDimX = p->config.gridDimX;
        q.gridDimY = p->config.gridDimY;
        q.gridDimZ = p->config.gridDimZ;
        q.blockDimX = p->config.blockDimX;
        q.blockDimY = p->config.blockDimY;
        q.blockDimZ = p->config.blockDimZ;
        q.sharedMemBytes = p->config.sharedMemBytes;
        q.extra = raw->extra[set][i].data();
        if (set == 1) {  // the node's grid stays the first draw's
          const CUDA_KERNEL_NODE_PARAMS_v2& first = raw->params[0][i];
          if (q.func != first.func || q.sharedMemBytes != first.sharedMemBytes) {
            Fail("the raw graph's two draws chose different variants");
          }
          q.gridDimX = first.gridDimX;
          q.gridDimY = first.gridDimY;
          q.gridDimZ = first.gridDimZ;
        }
      }
    }
    CheckCu(*driver_, driver_->GraphCreate(&raw->graph, 0), "cuGraphCreate");
    CUgraphNode previous = nullptr;
    for (size_t i = 0; i < n; ++i) {
      CUgraphNode node = nullptr;
      CheckCu(*driver_,
              driver_->GraphAddKernelNode(&node, raw->graph, previous ? &previous : nullptr,
                                          previous ? 1 : 0, &raw->params[0][i]),
              "cuGraphAddKernelNode");
      raw->nodes.push_back(node);
      previous = node;
    }
    CheckCu(*driver_, driver_->GraphInstantiateWithFlags(&raw->exec, raw->graph, 0),
            "cuGraphInstantiate");
    return raw;
  }
  void RawReplay(RawGraph& raw, int set) {
    for (size_t i = 0; i < raw.nodes.size(); ++i) {
      CheckCu(*driver_,
              driver_->GraphExecKernelNodeSetParams(raw.exec, raw.nodes[i], &raw.params[set][i]),
              "cuGraphExecKernelNodeSetParams");
    }
    CheckCu(*driver_, driver_->GraphLaunch(raw.exec, stream_), "cuGraphLaunch");
  }
  void DestroyRawGraph(RawGraph& raw) {
    driver_->GraphExecDestroy(raw.exec);
    driver_->GraphDestroy(raw.graph);
  }

  // The figures of one step size.
  nlohmann::json Run(int layers) {
    const int kernels = 4 * layers;
    std::printf("\n== %d-kernel step (%d layers)\n", kernels, layers);
    Step step = MakeStep(layers);
    std::vector<BoundLaunch*> launches;
    for (auto& b : step.launches) launches.push_back(b.get());
    absl::StatusOr<StepGraph> graph = StepGraph::Create(launches);
    Check(graph.status(), "StepGraph::Create");
    std::mt19937 gen(7);
    SetSizes(step, gen, false);
    Check(graph->Build(), "StepGraph::Build");
    graph->set_unseen(StepGraph::Unseen::kError);  // the timed loop must not build
    const std::unique_ptr<RawGraph> raw = MakeRawGraph(step, gen);

    // Host time, each mode's steps interleaved in blocks so that drift hits all alike
    // (mode 2, the driver's floor, sends a prepared set and ignores the Sets).
    std::vector<double> eager_send, eager_all, graph_send, graph_all, raw_send;
    const int steps = args_.smoke ? 20 : args_.steps;
    for (int i = 0; i < steps; ++i) {
      for (int mode = 0; mode < 3; ++mode) {
        Sync();
        const Clock::time_point t0 = Clock::now();
        SetSizes(step, gen, false);
        const Clock::time_point t1 = Clock::now();
        if (mode == 0) {
          Eager(step);
        } else if (mode == 1) {
          Check(graph->Replay(stream_), "StepGraph::Replay");
        } else {
          RawReplay(*raw, i % 2);
        }
        const Clock::time_point t2 = Clock::now();
        (mode == 0 ? eager_send : mode == 1 ? graph_send : raw_send).push_back(Micros(t1, t2));
        if (mode < 2) (mode == 0 ? eager_all : graph_all).push_back(Micros(t0, t2));
      }
    }
    Sync();
    DestroyRawGraph(*raw);
    const double es = Median(eager_send) / kernels, ea = Median(eager_all) / kernels,
                 gs = Median(graph_send) / kernels, ga = Median(graph_all) / kernels,
                 rs = Median(raw_send) / kernels;
    const StepGraph::Stats stats = graph->stats();
    std::printf("host us/kernel, sending only: eager %.3f, graph %.3f (%.1fx)\n", es, gs, es / gs);
    std::printf("host us/kernel, the driver alone setting every node's parameters and "
                "launching the graph: %.3f (kpack's replay %+.3f over it)\n", rs, gs - rs);
    std::printf("host us/kernel, with the Sets: eager %.3f, graph %.3f (%.1fx)\n", ea, ga, ea / ga);
    std::printf("nodes patched per replay: %.1f of %d; graphs built: %llu\n",
                static_cast<double>(stats.nodes_patched) / std::max<uint64_t>(1, stats.replays),
                kernels, static_cast<unsigned long long>(stats.graphs_built));

    // GPU time of the step, behind the gate.
    std::vector<double> gpu_eager, gpu_graph, gate_us;
    const int reps = args_.smoke ? 2 : args_.gpu_reps;
    for (int i = 0; i < reps; ++i) {
      for (int mode = 0; mode < 2; ++mode) {
        SetSizes(step, gen, false);
        Sync();
        for (int g = 0; g < 3; ++g) Check(gate_->Launch(), "gate");
        Record(start_);
        const Clock::time_point t0 = Clock::now();
        if (mode == 0) {
          Eager(step);
        } else {
          Check(graph->Replay(stream_), "StepGraph::Replay");
        }
        const double enqueue = Micros(t0, Clock::now());
        Record(stop_);
        (mode == 0 ? gpu_eager : gpu_graph).push_back(Elapsed());
        if (mode == 0) gate_us.push_back(enqueue);
      }
    }
    // The gate must have outlasted the eager step's enqueueing.
    Sync();
    Record(start_);
    for (int g = 0; g < 3; ++g) Check(gate_->Launch(), "gate");
    Record(stop_);
    const double gate = Elapsed();
    const double ge = Median(gpu_eager), gg = Median(gpu_graph);
    std::printf("GPU us/step: eager %.1f, graph %.1f (%.3fx); gate %.0f us vs eager enqueue "
                "%.0f us%s\n",
                ge, gg, gg / ge, gate, Median(gate_us),
                gate > Median(gate_us) ? "" : "  WARNING: the gate was too short");

    // Building: 8 bucket signatures, and the same steps by capture.
    std::vector<double> build_us, capture_us;
    size_t free_before = 0, free_after = 0, total = 0;
    driver_->MemGetInfo(&free_before, &total);
    absl::StatusOr<StepGraph> fresh = StepGraph::Create(launches);
    Check(fresh.status(), "StepGraph::Create");
    int built = 0;
    for (int m : {8, 40}) {  // every signature the step's buffers allow
      for (int n : {2048, 20000}) {
        for (int cols : {512, 5008}) {
          for (size_t l = 0; l < step.launches.size() / 4; ++l) {
            Check(step.launches[4 * l + 1]->Set(3, m), "matmul M");
            Check(step.launches[4 * l + 2]->Set(5, cols), "softmax cols");
            Check(step.launches[4 * l + 3]->Set(3, n), "vector_add n");
          }
          Check(fresh->Build(), "StepGraph::Build");
          ++built;
          capture_us.push_back(CaptureAndInstantiate(step));
        }
      }
    }
    driver_->MemGetInfo(&free_after, &total);
    for (const StepGraph::GraphInfo& info : fresh->graphs()) build_us.push_back(info.build_us);
    const double per_graph_mib =
        (static_cast<double>(free_before) - static_cast<double>(free_after)) / built / (1 << 20);
    std::printf("build + instantiate per bucket graph: %.0f us median, %.0f us max (by stream "
                "capture: %.0f us median); device memory per graph %.2f MiB (cuMemGetInfo), "
                "scratch %llu bytes\n",
                Median(build_us), *std::max_element(build_us.begin(), build_us.end()),
                Median(capture_us), per_graph_mib,
                static_cast<unsigned long long>(fresh->stats().scratch_bytes));

    // Outputs: random steps crossing buckets, replayed and eager, bit for bit.
    int identical = 0;
    constexpr int kChecks = 20;
    for (int i = 0; i < kChecks; ++i) {
      SetSizes(step, gen, true);
      Clear(step);
      Check(fresh->Replay(stream_), "StepGraph::Replay (check)");
      const std::vector<uint8_t> replayed = Outputs(step);
      Clear(step);
      Eager(step);
      identical += Outputs(step) == replayed;
    }
    std::printf("outputs bit-identical to the eager step: %d of %d random steps crossing "
                "buckets (%llu graphs built in all)\n",
                identical, kChecks, static_cast<unsigned long long>(fresh->stats().graphs_built));
    if (identical != kChecks) Fail("replayed outputs differ from the eager step's");

    const bool host_met = gs <= 0.5 && es / gs >= 7;
    const bool gpu_met = gg <= 1.10 * ge;
    const bool build_met = kernels != 32 || Median(build_us) <= 1000;
    std::printf("targets: host <= 0.5 us/kernel and >= 7x below eager: %s; GPU <= 1.10x "
                "eager: %s%s\n",
                host_met ? "met" : "MISSED", gpu_met ? "met" : "MISSED",
                kernels == 32 ? (build_met ? "; build <= 1 ms: met" : "; build <= 1 ms: MISSED")
                              : "");
    return {{"kernels", kernels},
            {"host_us_per_kernel",
             {{"eager_send", es}, {"graph_send", gs}, {"eager_with_set", ea},
              {"graph_with_set", ga}, {"ratio_send", es / gs}, {"driver_floor_send", rs}}},
            {"gpu_us_per_step", {{"eager", ge}, {"graph", gg}, {"ratio", gg / ge}}},
            {"gate_us", gate},
            {"nodes_patched_per_replay",
             static_cast<double>(stats.nodes_patched) / std::max<uint64_t>(1, stats.replays)},
            {"build_us", {{"median", Median(build_us)},
                          {"max", *std::max_element(build_us.begin(), build_us.end())},
                          {"capture_median", Median(capture_us)}}},
            {"device_mib_per_graph", per_graph_mib},
            {"scratch_bytes_per_graph", fresh->stats().scratch_bytes / std::max(1, built)},
            {"bit_identical_checks", identical},
            {"targets", {{"host", host_met}, {"gpu", gpu_met}, {"build", build_met}}}};
  }

  const std::string& device() const { return device_; }

 private:
  CUdeviceptr Alloc(size_t bytes) {
    CUdeviceptr p = 0;
    CheckCu(*driver_, driver_->MemAlloc(&p, bytes), "cuMemAlloc");
    CheckCu(*driver_, driver_->MemsetD8(p, 0, bytes), "cuMemsetD8");
    return p;
  }
  // Device memory of random bytes: fp16 values in [-2, 2] (or fp32 ones with `fp32`).
  CUdeviceptr Random(size_t bytes, uint32_t seed, bool fp32 = false) {
    std::mt19937 gen(seed);
    std::vector<uint8_t> host(bytes);
    if (fp32) {
      std::uniform_real_distribution<float> dist(-2, 2);
      for (size_t i = 0; i + 4 <= bytes; i += 4) {
        const float f = dist(gen);
        std::memcpy(&host[i], &f, 4);
      }
    } else {
      constexpr uint16_t kHalves[] = {0x0000, 0x3c00, 0xbc00, 0x3800, 0xb800, 0x4000, 0xc000};
      for (size_t i = 0; i + 2 <= bytes; i += 2) {
        std::memcpy(&host[i], &kHalves[gen() % std::size(kHalves)], 2);
      }
    }
    const CUdeviceptr p = Alloc(bytes);
    CheckCu(*driver_, driver_->MemcpyHtoD(p, host.data(), bytes), "cuMemcpyHtoD");
    return p;
  }
  std::unique_ptr<BoundLaunch> Bind(const char* kernel, std::vector<Arg> args) {
    absl::StatusOr<Kernel> k = rt_->Find(kernel);
    Check(k.status(), kernel);
    absl::StatusOr<BoundLaunch> b = k->Bind(stream_, args);
    Check(b.status(), absl::StrCat("binding ", kernel));
    return std::make_unique<BoundLaunch>(*std::move(b));
  }
  void Record(CUevent e) { CheckCu(*driver_, driver_->EventRecord(e, stream_), "cuEventRecord"); }
  double Elapsed() {
    CheckCu(*driver_, driver_->EventSynchronize(stop_), "cuEventSynchronize");
    float ms = 0;
    CheckCu(*driver_, driver_->EventElapsedTime(&ms, start_, stop_), "cuEventElapsedTime");
    return ms * 1000.0;
  }
  // The step's launches captured into a graph and instantiated: host microseconds.
  double CaptureAndInstantiate(Step& s) {
    const Clock::time_point t0 = Clock::now();
    CheckCu(*driver_, driver_->StreamBeginCapture(capture_, CU_STREAM_CAPTURE_MODE_RELAXED),
            "cuStreamBeginCapture");
    for (auto& b : s.launches) {
      b->set_stream(capture_);
      Check(b->Launch(), "captured launch");
    }
    CUgraph g = nullptr;
    CheckCu(*driver_, driver_->StreamEndCapture(capture_, &g), "cuStreamEndCapture");
    CUgraphExec exec = nullptr;
    CheckCu(*driver_, driver_->GraphInstantiateWithFlags(&exec, g, 0), "cuGraphInstantiate");
    const double us = Micros(t0, Clock::now());
    for (auto& b : s.launches) b->set_stream(stream_);
    driver_->GraphExecDestroy(exec);
    driver_->GraphDestroy(g);
    return us;
  }
  void Clear(Step& s) {
    for (auto [p, bytes] : s.outputs) CheckCu(*driver_, driver_->MemsetD8(p, 0xff, bytes), "memset");
    CheckCu(*driver_, driver_->StreamSynchronize(nullptr), "cuStreamSynchronize");
  }
  std::vector<uint8_t> Outputs(Step& s) {
    Sync();
    std::vector<uint8_t> all;
    for (auto [p, bytes] : s.outputs) {
      const size_t at = all.size();
      all.resize(at + bytes);
      CheckCu(*driver_, driver_->MemcpyDtoH(all.data() + at, p, bytes), "cuMemcpyDtoH");
    }
    return all;
  }

  Args args_;
  std::shared_ptr<const internal::Driver> driver_;
  CUcontext ctx_ = nullptr;
  CUstream stream_ = nullptr, capture_ = nullptr;
  CUevent start_ = nullptr, stop_ = nullptr;
  std::string device_;
  std::unique_ptr<Runtime> rt_;
  std::unique_ptr<BoundLaunch> gate_;
};

Args Parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) Fail(arg + " needs a value");
      return argv[++i];
    };
    if (arg == "--pack") {
      a.pack = value();
    } else if (arg == "--steps") {
      a.steps = std::atoi(value().c_str());
    } else if (arg == "--gpu-reps") {
      a.gpu_reps = std::atoi(value().c_str());
    } else if (arg == "--json") {
      a.json = value();
    } else if (arg == "--smoke") {
      a.smoke = true;
    } else {
      Fail("unknown argument " + arg +
           " (usage: graph_bench [--pack DIR] [--steps N] [--gpu-reps N] [--json FILE] [--smoke])");
    }
  }
  if (a.steps < 1 || a.gpu_reps < 1) Fail("--steps and --gpu-reps must be positive");
  return a;
}

}  // namespace
}  // namespace kpack::bench

int main(int argc, char** argv) {
  using namespace kpack::bench;  // NOLINT(build/namespaces)
  const Args args = Parse(argc, argv);
  Bench bench(args);
  bench.SetUp();
  std::printf("graph_bench: %s, pack %s, %d steps per mode%s\n", bench.device().c_str(),
              args.pack.c_str(), args.smoke ? 20 : args.steps, args.smoke ? " (smoke)" : "");
  nlohmann::json out = {{"device", bench.device()}, {"steps", args.steps}, {"runs", {}}};
  for (int layers : {8, 16}) out["runs"].push_back(bench.Run(layers));
  if (!args.json.empty()) std::ofstream(args.json) << out.dump(2) << "\n";
  return 0;
}
