// Host cost per launch, every path on the same cubins in one process (bench_setup.h):
//
//   raw_params/argsN            cuLaunchKernelEx, a params array (CUfunction) built once
//   raw_params_fresh/argsN      the same with the params array built at each call, as a
//                               caller whose arguments change passes them (pointers to the
//                               same values kpack's paths read)
//   raw_params_cukernel/args4   the same with the CUkernel handle kpack launches by
//   raw_params_ctx_query/args4  raw plus the cuCtxGetCurrent kpack makes per launch
//   raw_extra/argsN             cuLaunchKernelEx, a packed `extra` buffer
//   kpack_by_name/argsN         Runtime::Launch("argsN", grid, stream, args...)
//   kpack_by_kernel/argsN       Kernel::Launch(grid, stream, args...)
//   kpack_by_kernel_no_nvtx/args4  the same, NVTX ranges off
//   kpack_bound/argsN           BoundLaunch::Launch() (arguments packed once)
//   raw_dynamic_shapes          axpy, n cycling through 3 buckets, variants chosen by hand
//   kpack_dynamic_shapes        the same through kpack's dispatch and grid expressions
//   {raw_params,kpack_by_kernel,kpack_bound}/args4/mt/threads:T
//                               T = 1, 2, 4, 8 threads, each on its own stream
//   dispatch_only               Kernel::SelectVariant alone, ns per call
//   paired/{kpack_by_name,kpack_by_kernel,kpack_bound}/argsN
//                               each against raw_params, alternating (RunPaired)
//   paired/raw_params_fresh/argsN
//                               the per-call params array against the one built once
//   paired/kpack_by_kernel_vs_fresh/argsN
//                               by Kernel against raw_params_fresh: both pass the
//                               arguments at each call
//   paired/tma_matmul_3desc/{kpack_by_kernel,kpack_bound}
//                               the example pack's persistent TMA matmul (three tensor
//                               descriptors, 64x64x64: one tile) against a raw
//                               cuLaunchKernelEx of the same prepared buffer: by kernel,
//                               the same three descriptors every launch, whose maps
//                               kpack copies from each parameter's memo
//   paired/tma_matmul_3desc/kpack_by_kernel_miss
//                               by kernel, each operand cycling through more buffers
//                               than a memo holds: three checks and encodes per launch
//   paired/tma_matmul_3desc/raw_encode3
//                               the driver's floor for that: the raw launch plus three
//                               cuTensorMapEncodeTiled calls of similar maps
//
// N = 4, 14, 32 call arguments. Each iteration enqueues a batch of kBatch launches and is
// timed by hand; the stream is synchronized outside the timed region, so the GPU queue
// never fills and only host time is measured. With T threads, Google Benchmark divides the
// threads' summed batch time by T and by all threads' batches, so the figure is the
// aggregate time per launch (its inverse, the aggregate launch rate). The summary prints
// each path's median per launch over the repetitions and its ratio to the raw path of the
// same kernel measured in the same process.
//
//   kpack_launch_bench --benchmark_repetitions=10 --benchmark_enable_random_interleaving=true
//
// KPACK_CUDA_DRIVER may point at another driver library (e.g. the tests' fake driver, to
// measure kpack's own cost with no GPU; bench/overhead_bench.cc does that for CI).

#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "bench_setup.h"

namespace {

using kpack::bench::ArgsKernel;
using kpack::bench::BenchSetup;

constexpr int kBatch = 256;
constexpr int kMaxThreads = 8;

BenchSetup* g = nullptr;

// Seconds for kBatch launches of `launch` after a synchronize; negative if one failed.
template <typename F>
double TimeBatch(CUstream stream, F& launch) {
  g->driver().StreamSynchronize(stream);
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < kBatch; ++i) {
    if (!launch()) return -1;
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Times `launch` kBatch times per iteration (TimeBatch). Threads other than the main one
// make the bench context current first.
template <typename F>
void RunBatches(benchmark::State& state, CUstream stream, F&& launch) {
  g->driver().CtxSetCurrent(g->context());
  for (auto _ : state) {
    const double seconds = TimeBatch(stream, launch);
    if (seconds < 0) {
      state.SkipWithError("launch failed");
      return;
    }
    state.SetIterationTime(seconds);
  }
  g->driver().StreamSynchronize(stream);
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// A kpack path and its raw reference in alternating batches of one benchmark (raw first,
// then kpack first, ...): each adjacent pair sees the same machine state, so the median
// of the pairs' ratios cancels the drift between separately run benchmarks. Reports the
// kpack batches' time and the counter x_raw, the median kpack/raw ratio.
template <typename Raw, typename Kpack>
void RunPaired(benchmark::State& state, CUstream stream, Raw raw, Kpack kpack) {
  g->driver().CtxSetCurrent(g->context());
  std::vector<double> ratios, over;
  bool kpack_first = false;
  for (auto _ : state) {
    double t_raw, t_kpack;
    if (kpack_first) {
      t_kpack = TimeBatch(stream, kpack);
      t_raw = TimeBatch(stream, raw);
    } else {
      t_raw = TimeBatch(stream, raw);
      t_kpack = TimeBatch(stream, kpack);
    }
    kpack_first = !kpack_first;
    if (t_raw <= 0 || t_kpack <= 0) {
      state.SkipWithError("launch failed");
      return;
    }
    ratios.push_back(t_kpack / t_raw);
    over.push_back((t_kpack - t_raw) / kBatch * 1e6);
    state.SetIterationTime(t_kpack);
  }
  g->driver().StreamSynchronize(stream);
  state.counters["x_raw"] = benchmark::Counter(Median(ratios), benchmark::Counter::kAvgThreads);
  // Microseconds per launch above raw: the absolute cost (the TMA target is stated so).
  state.counters["us_over_raw"] =
      benchmark::Counter(Median(over), benchmark::Counter::kAvgThreads);
}

CUstream ThreadStream(const benchmark::State& state) { return g->stream(state.thread_index()); }

void BM_RawParams(benchmark::State& state, const ArgsKernel* k) {
  CUstream s = ThreadStream(state);
  RunBatches(state, s, [&] { return g->RawParams(*k, k->raw_function, s); });
}
void BM_RawParamsCuKernel(benchmark::State& state, const ArgsKernel* k) {
  CUstream s = ThreadStream(state);
  RunBatches(state, s, [&] { return g->RawParams(*k, k->raw_kernel, s); });
}
void BM_RawParamsCtxQuery(benchmark::State& state, const ArgsKernel* k) {
  CUstream s = ThreadStream(state);
  RunBatches(state, s, [&] { return g->RawParamsWithCtxQuery(*k, s); });
}
void BM_RawParamsFresh(benchmark::State& state, const ArgsKernel* k) {
  CUstream s = ThreadStream(state);
  RunBatches(state, s, [&] { return g->RawParamsFresh(*k, s); });
}
void BM_RawExtra(benchmark::State& state, const ArgsKernel* k) {
  CUstream s = ThreadStream(state);
  RunBatches(state, s, [&] { return g->RawExtra(*k, s); });
}
void BM_KpackByName(benchmark::State& state, const ArgsKernel* k) {
  CUstream s = ThreadStream(state);
  RunBatches(state, s, [&] { return g->KpackByName(*k, s); });
}
void BM_KpackByKernel(benchmark::State& state, const ArgsKernel* k) {
  CUstream s = ThreadStream(state);
  RunBatches(state, s, [&] { return g->KpackByKernel(k->kernel, k->inputs, s); });
}
void BM_KpackByKernelNoNvtx(benchmark::State& state, const ArgsKernel* k) {
  CUstream s = ThreadStream(state);
  RunBatches(state, s, [&] { return g->KpackByKernel(k->kernel_no_nvtx, k->inputs, s); });
}
void BM_KpackBound(benchmark::State& state, const ArgsKernel* k) {
  CUstream s = ThreadStream(state);
  auto bound = g->Bind(*k, s);
  if (!bound.ok()) {
    state.SkipWithError("bind failed");
    return;
  }
  RunBatches(state, s, [&] { return bound->Launch().ok(); });
}
void BM_RawDynamic(benchmark::State& state) {
  size_t i = 0;
  RunBatches(state, g->stream(0), [&] { return g->RawDynamic(i++, g->stream(0)); });
}
void BM_KpackDynamic(benchmark::State& state) {
  size_t i = 0;
  RunBatches(state, g->stream(0), [&] { return g->KpackDynamic(i++, g->stream(0)); });
}

// Paired: kpack path against raw params on the same kernel (see RunPaired). kRawFresh:
// the raw params array built per call against the one built once (what passing the
// arguments per call costs the raw caller); kByKernelVsFresh: by Kernel against that
// per-call raw launch.
enum class KpackPath { kByName, kByKernel, kBound, kRawFresh, kByKernelVsFresh };
void BM_Paired(benchmark::State& state, const ArgsKernel* k, KpackPath path) {
  CUstream s = ThreadStream(state);
  auto raw = [&] { return g->RawParams(*k, k->raw_function, s); };
  auto fresh = [&] { return g->RawParamsFresh(*k, s); };
  switch (path) {
    case KpackPath::kRawFresh:
      return RunPaired(state, s, raw, fresh);
    case KpackPath::kByKernelVsFresh:
      return RunPaired(state, s, fresh,
                       [&] { return g->KpackByKernel(k->kernel, k->inputs, s); });
    case KpackPath::kByName:
      return RunPaired(state, s, raw, [&] { return g->KpackByName(*k, s); });
    case KpackPath::kByKernel:
      return RunPaired(state, s, raw, [&] { return g->KpackByKernel(k->kernel, k->inputs, s); });
    case KpackPath::kBound: {
      auto bound = g->Bind(*k, s);
      if (!bound.ok()) {
        state.SkipWithError("bind failed");
        return;
      }
      return RunPaired(state, s, raw, [&] { return bound->Launch().ok(); });
    }
  }
}
void BM_PairedDynamic(benchmark::State& state) {
  size_t i = 0, j = 0;
  CUstream s = g->stream(0);
  RunPaired(
      state, s, [&] { return g->RawDynamic(i++, s); }, [&] { return g->KpackDynamic(j++, s); });
}

// Tensor descriptors: the example pack's matmul_tma (a_desc, b_desc, c_desc) on 64x64
// fp16 operands (one tile: the GPU work is negligible), opened once. The raw reference is
// cuLaunchKernelEx of the very buffer a BoundLaunch prepared (maps encoded once).
struct TmaBench {
  // Buffers per operand for the miss row: more than a memo holds (DescMemo::kWays = 4).
  static constexpr int kCycle = 5;
  std::optional<kpack::Runtime> runtime;
  kpack::Kernel mm;
  CUdeviceptr a = 0, b = 0, c = 0;
  CUdeviceptr cycle[3][kCycle] = {};
  std::string error;
};
TmaBench& Tma() {
  static TmaBench* t = [] {
    auto* t = new TmaBench;
    kpack::Options options;
    options.preload = true;  // in the bench context, current on this thread
    auto rt = kpack::Runtime::Open(KPACK_EXAMPLE_PACK_DIR, options);
    if (!rt.ok()) {
      t->error = std::string(rt.status().message());
      return t;
    }
    t->runtime.emplace(*std::move(rt));
    t->mm = *t->runtime->Find("matmul_tma");
    std::vector<CUdeviceptr*> buffers = {&t->a, &t->b, &t->c};
    for (auto& operand : t->cycle) {
      for (CUdeviceptr& p : operand) buffers.push_back(&p);
    }
    for (CUdeviceptr* p : buffers) {
      if (g->driver().MemAlloc(p, 64 * 64 * 2) != CUDA_SUCCESS ||
          g->driver().MemsetD8(*p, 0, 64 * 64 * 2) != CUDA_SUCCESS) {
        t->error = "cuMemAlloc/cuMemsetD8 failed";
      }
    }
    return t;
  }();
  return *t;
}
// What the driver alone charges for a launch's three descriptors: raw cuLaunchKernelEx
// plus three cuTensorMapEncodeTiled calls of 2-D fp16 maps (64x64 boxes, 128-byte
// swizzle, like the kernel's), against the raw launch: the floor of a by-kernel launch
// that encodes every time.
enum class TmaPath { kByKernel, kByKernelMiss, kBound, kRawEncode };
void BM_PairedTma(benchmark::State& state, TmaPath path) {
  g->driver().CtxSetCurrent(g->context());
  TmaBench& t = Tma();
  if (!t.error.empty()) {
    state.SkipWithError(t.error.c_str());
    return;
  }
  CUstream s = g->stream(0);
  const kpack::TensorDesc a = kpack::TensorDesc::RowMajor(t.a, {64, 64});
  const kpack::TensorDesc b = kpack::TensorDesc::RowMajor(t.b, {64, 64});
  const kpack::TensorDesc c = kpack::TensorDesc::RowMajor(t.c, {64, 64});
  auto bl = t.mm.BindArgs(s, a, b, c, 64, 64, 64, 132);
  absl::StatusOr<kpack::PreparedLaunch> p =
      bl.ok() ? bl->Prepare() : absl::StatusOr<kpack::PreparedLaunch>(bl.status());
  if (!p.ok()) {
    state.SkipWithError(std::string(p.status().message()).c_str());
    return;
  }
  auto raw = [&] {
    return g->driver().LaunchKernelEx(&p->config, p->function, nullptr, p->extra) ==
           CUDA_SUCCESS;
  };
  if (path == TmaPath::kBound) return RunPaired(state, s, raw, [&] { return bl->Launch().ok(); });
  if (path == TmaPath::kByKernel) {
    return RunPaired(state, s, raw,
                     [&] { return t.mm.Launch(s, a, b, c, 64, 64, 64, 132).ok(); });
  }
  if (path == TmaPath::kByKernelMiss) {
    std::vector<kpack::TensorDesc> descs[3];
    for (int o = 0; o < 3; ++o) {
      for (CUdeviceptr p : t.cycle[o]) descs[o].push_back(kpack::TensorDesc::RowMajor(p, {64, 64}));
    }
    size_t i = 0;
    return RunPaired(state, s, raw, [&] {
      const size_t k = i++ % TmaBench::kCycle;
      return t.mm.Launch(s, descs[0][k], descs[1][k], descs[2][k], 64, 64, 64, 132).ok();
    });
  }
  alignas(64) CUtensorMap maps[3];
  const cuuint64_t dims[2] = {64, 64}, strides[1] = {128};
  const cuuint32_t box[2] = {64, 64}, element_strides[2] = {1, 1};
  auto encode_and_launch = [&] {
    const CUdeviceptr bases[3] = {t.a, t.b, t.c};
    for (int i = 0; i < 3; ++i) {
      if (g->driver().TensorMapEncodeTiled(
              &maps[i], CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 2, reinterpret_cast<void*>(bases[i]),
              dims, strides, box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
              CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
              CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS) {
        return false;
      }
    }
    benchmark::DoNotOptimize(maps);
    return raw();
  };
  RunPaired(state, s, raw, encode_and_launch);
}

// The dispatch step alone (argument count, bucket, property mask, table lookup): no
// packing, no driver call. Timed per call, not per batch.
void BM_DispatchOnly(benchmark::State& state) {
  std::vector<std::vector<kpack::Arg>> args;
  for (const BenchSetup::Shape& s : g->shapes()) {
    args.push_back({g->input(0), g->input(1), g->output(), s.n, 1, 2.0f});
  }
  size_t i = 0;
  for (auto _ : state) {
    auto v = g->axpy().SelectVariant(args[i++ % args.size()]);
    benchmark::DoNotOptimize(v);
  }
}

// The raw path each row is compared with: same kernel (and thread count), raw params.
std::string Reference(const std::string& name) {
  if (absl::StrContains(name, "dynamic")) return "raw_dynamic_shapes";
  size_t slash = name.find('/');
  if (slash == std::string::npos) return "";
  return "raw_params" + name.substr(slash);
}

// Collects per-repetition times and prints medians and ratios at the end.
class RatioReporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    for (const Run& r : runs) {
      if (r.error_occurred) {
        std::fprintf(stderr, "kpack_launch_bench: %s failed: %s\n", r.benchmark_name().c_str(),
                     r.error_message.c_str());
        failed_ = true;
      }
      if (r.run_type != Run::RT_Iteration || r.error_occurred) continue;
      std::string name = r.run_name.function_name;
      if (!r.run_name.threads.empty()) absl::StrAppend(&name, "/", r.run_name.threads);
      if (absl::StartsWith(name, "paired/")) {
        auto ratio = r.counters.find("x_raw");
        if (ratio != r.counters.end()) paired_[name].push_back(ratio->second.value);
        auto over = r.counters.find("us_over_raw");
        if (over != r.counters.end()) over_raw_[name].push_back(over->second.value);
        continue;
      }
      if (name == "dispatch_only") {
        dispatch_ns_.push_back(r.GetAdjustedRealTime());
      } else {
        // Iterations are batches of kBatch launches; report per launch.
        times_[name].push_back(r.GetAdjustedRealTime() / kBatch);
      }
    }
    ConsoleReporter::ReportRuns(runs);
  }
  void Summarize() const {
    std::printf("\n%-40s %10s %10s %10s %8s %10s\n", "path (host time per launch)", "median us",
                "min us", "max us", "x raw", "Mlaunch/s");
    for (const auto& [name, v] : times_) {
      double m = Median(v);
      auto ref = times_.find(Reference(name));
      std::string ratio = ref == times_.end() ? "-" : absl::StrCat(m / Median(ref->second));
      std::printf("%-40s %10.3f %10.3f %10.3f %8.8s %10.3f\n", name.c_str(), m / 1e3,
                  *std::min_element(v.begin(), v.end()) / 1e3,
                  *std::max_element(v.begin(), v.end()) / 1e3, ratio.c_str(), 1e3 / m);
    }
    std::printf(
        "(x raw: each row over raw_params with the same kernel and thread count; the dynamic "
        "rows over raw_dynamic_shapes. Thread rows: aggregate time per launch.)\n");
    if (!paired_.empty()) {
      std::printf("\n%-40s %10s %10s %10s %12s\n", "paired with raw (kpack / raw)", "median",
                  "min", "max", "us over raw");
      for (const auto& [name, v] : paired_) {
        auto over = over_raw_.find(name);
        std::printf("%-40s %10.3f %10.3f %10.3f %12.3f\n", name.c_str(), Median(v),
                    *std::min_element(v.begin(), v.end()), *std::max_element(v.begin(), v.end()),
                    over == over_raw_.end() ? 0.0 : Median(over->second));
      }
      std::printf(
          "(each repetition's median ratio of alternating kpack and raw batches, and median "
          "host microseconds per launch above raw; statistics over repetitions. Thread rows: "
          "every thread alternates on its own stream.)\n");
    }
    if (!dispatch_ns_.empty()) {
      std::printf("dispatch_only: %.1f ns per SelectVariant (median)\n", Median(dispatch_ns_));
    }
  }
  bool failed() const { return failed_; }

 private:
  std::map<std::string, std::vector<double>> times_;
  std::map<std::string, std::vector<double>> paired_;
  std::map<std::string, std::vector<double>> over_raw_;
  bool failed_ = false;
  std::vector<double> dispatch_ns_;
};

using ArgsFn = void (*)(benchmark::State&, const ArgsKernel*);

void Register(const std::string& name, ArgsFn fn, const ArgsKernel* k) {
  benchmark::RegisterBenchmark(name.c_str(), fn, k)->UseManualTime()->Unit(benchmark::kNanosecond);
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  auto setup = BenchSetup::Create(kMaxThreads);
  if (!setup.ok()) {
    std::fprintf(stderr, "kpack_launch_bench: cannot run: %s\n",
                 std::string(setup.status().message()).c_str());
    return 1;
  }
  g = setup->get();
  benchmark::AddCustomContext("launches_per_iteration", std::to_string(kBatch));
  for (const ArgsKernel& k : g->kernels()) {
    const std::string suffix = "/" + k.name;
    Register("raw_params" + suffix, BM_RawParams, &k);
    Register("raw_params_fresh" + suffix, BM_RawParamsFresh, &k);
    Register("raw_extra" + suffix, BM_RawExtra, &k);
    Register("kpack_by_name" + suffix, BM_KpackByName, &k);
    Register("kpack_by_kernel" + suffix, BM_KpackByKernel, &k);
    Register("kpack_bound" + suffix, BM_KpackBound, &k);
  }
  const ArgsKernel* args4 = &g->args_kernel(4);
  Register("raw_params_cukernel/args4", BM_RawParamsCuKernel, args4);
  Register("raw_params_ctx_query/args4", BM_RawParamsCtxQuery, args4);
  Register("kpack_by_kernel_no_nvtx/args4", BM_KpackByKernelNoNvtx, args4);
  const std::pair<const char*, ArgsFn> threaded[] = {{"raw_params/args4/mt", BM_RawParams},
                                                     {"kpack_by_kernel/args4/mt", BM_KpackByKernel},
                                                     {"kpack_bound/args4/mt", BM_KpackBound}};
  for (const auto& [name, fn] : threaded) {
    for (int threads : {1, 2, 4, 8}) {
      benchmark::RegisterBenchmark(name, fn, args4)
          ->UseManualTime()
          ->Unit(benchmark::kNanosecond)
          ->Threads(threads);
    }
  }
  const std::pair<const char*, KpackPath> paired[] = {
      {"kpack_by_name", KpackPath::kByName},
      {"kpack_by_kernel", KpackPath::kByKernel},
      {"kpack_bound", KpackPath::kBound},
      {"raw_params_fresh", KpackPath::kRawFresh},
      {"kpack_by_kernel_vs_fresh", KpackPath::kByKernelVsFresh}};
  for (const auto& [name, path] : paired) {
    for (const ArgsKernel& k : g->kernels()) {
      benchmark::RegisterBenchmark(absl::StrCat("paired/", name, "/", k.name).c_str(), BM_Paired,
                                   &k, path)
          ->UseManualTime()
          ->Unit(benchmark::kNanosecond);
    }
    if (path != KpackPath::kByKernel && path != KpackPath::kBound) continue;
    for (int threads : {1, 2, 4, 8}) {
      benchmark::RegisterBenchmark(absl::StrCat("paired/", name, "/args4/mt").c_str(), BM_Paired,
                                   args4, path)
          ->UseManualTime()
          ->Unit(benchmark::kNanosecond)
          ->Threads(threads);
    }
  }
  benchmark::RegisterBenchmark("paired/kpack_dynamic_shapes", BM_PairedDynamic)
      ->UseManualTime()
      ->Unit(benchmark::kNanosecond);
  for (auto [name, path] : {std::pair{"paired/tma_matmul_3desc/kpack_by_kernel", TmaPath::kByKernel},
                            {"paired/tma_matmul_3desc/kpack_by_kernel_miss",
                             TmaPath::kByKernelMiss},
                            {"paired/tma_matmul_3desc/kpack_bound", TmaPath::kBound},
                            {"paired/tma_matmul_3desc/raw_encode3", TmaPath::kRawEncode}}) {
    benchmark::RegisterBenchmark(name, BM_PairedTma, path)
        ->UseManualTime()
        ->Unit(benchmark::kNanosecond);
  }
  using Fn = void (*)(benchmark::State&);
  const std::pair<const char*, Fn> dynamic[] = {{"raw_dynamic_shapes", BM_RawDynamic},
                                                {"kpack_dynamic_shapes", BM_KpackDynamic}};
  for (const auto& [name, fn] : dynamic) {
    benchmark::RegisterBenchmark(name, fn)->UseManualTime()->Unit(benchmark::kNanosecond);
  }
  benchmark::RegisterBenchmark("dispatch_only", BM_DispatchOnly)->Unit(benchmark::kNanosecond);
  RatioReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  reporter.Summarize();
  benchmark::Shutdown();
  return reporter.failed() ? 1 : 0;
}
