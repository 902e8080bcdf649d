// Host cost per launch: raw cuLaunchKernelEx against kpack by name, by Kernel and by
// BoundLaunch, all on the same Triton cubin (the test pack's `add`, one block), in one
// process. Each benchmark iteration enqueues a batch of launches and is timed by hand;
// the stream is synchronized outside the timed region, so the GPU queue never fills and
// only host time is measured. Google Benchmark's own lines give the time per batch of
// kBatch launches; the summary prints each path's median per launch over the repetitions
// and its ratio to raw cuLaunchKernelEx with a params array.
//
//   kpack_launch_bench --benchmark_repetitions=10 [--benchmark_min_time=0.2]
//
// KPACK_CUDA_DRIVER may point at another driver library (e.g. the tests' fake driver, to
// measure kpack's own cost with no GPU).

#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "driver/driver.h"
#include "kpack/kpack.h"

namespace {

using kpack::internal::Driver;

constexpr int kBatch = 256;

struct Setup {
  std::shared_ptr<const Driver> driver;
  CUcontext ctx = nullptr;
  CUstream stream = nullptr;
  std::unique_ptr<kpack::Runtime> runtime;
  kpack::Kernel add;
  std::unique_ptr<kpack::Runtime> runtime_no_nvtx;  // the same pack, Options::nvtx off
  kpack::Kernel add_no_nvtx;
  CUfunction raw_function = nullptr;  // cuModuleGetFunction on the same cubin
  CUfunction raw_kernel = nullptr;    // cuLibraryGetKernel on the same cubin, as kpack uses
  CUdeviceptr x = 0, y = 0, out = 0;
  int32_t n = 1;
  std::string error;

  // Dynamic shapes: the dispatch pack's axpy with n cycling across its three buckets.
  std::unique_ptr<kpack::Runtime> dispatch_runtime;
  kpack::Kernel axpy;
  struct Shape {
    int32_t n;
    CUfunction raw;  // the variant kpack picks for n, loaded by hand for the raw path
    unsigned grid;
    unsigned block;
  };
  std::vector<Shape> shapes;
};

Setup* g = nullptr;

std::vector<char> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<char>(std::istreambuf_iterator<char>(in), {});
}

bool Init() {
  g = new Setup();
  auto d = Driver::Load("");
  if (!d.ok()) {
    g->error = d.status().ToString();
    return false;
  }
  g->driver = *d;
  const Driver& drv = *g->driver;
  CUdevice dev;
  if (drv.DeviceGet(&dev, 0) != CUDA_SUCCESS || drv.DevicePrimaryCtxRetain(&g->ctx, dev) ||
      drv.CtxSetCurrent(g->ctx) || drv.StreamCreate(&g->stream, CU_STREAM_NON_BLOCKING)) {
    g->error = "could not set up a context and stream";
    return false;
  }
  auto rt = kpack::Runtime::Open(KPACK_TEST_PACK_DIR, {.preload = true});
  if (!rt.ok()) {
    g->error = rt.status().ToString();
    return false;
  }
  g->runtime = std::make_unique<kpack::Runtime>(std::move(*rt));
  g->add = *g->runtime->Find("add");
  auto quiet = kpack::Runtime::Open(KPACK_TEST_PACK_DIR, {.preload = true, .nvtx = false});
  if (!quiet.ok()) {
    g->error = quiet.status().ToString();
    return false;
  }
  g->runtime_no_nvtx = std::make_unique<kpack::Runtime>(std::move(*quiet));
  g->add_no_nvtx = *g->runtime_no_nvtx->Find("add");
  std::vector<char> cubin =
      ReadFile(std::string(KPACK_TEST_PACK_DIR) + "/cubins/add/default.cubin");
  CUmodule module;
  CUlibrary library;
  CUkernel kernel;
  if (drv.ModuleLoadData(&module, cubin.data()) ||
      drv.ModuleGetFunction(&g->raw_function, module, "add_kernel") ||
      drv.LibraryLoadData(&library, cubin.data(), nullptr, nullptr, 0, nullptr, nullptr, 0) ||
      drv.LibraryGetKernel(&kernel, library, "add_kernel")) {
    g->error = "raw cubin load failed";
    return false;
  }
  g->raw_kernel = reinterpret_cast<CUfunction>(kernel);
  // Big enough for the largest dynamic shape (n = 300000 floats).
  if (drv.MemAlloc(&g->x, 4 << 20) || drv.MemAlloc(&g->y, 4 << 20) ||
      drv.MemAlloc(&g->out, 4 << 20)) {
    g->error = "cuMemAlloc failed";
    return false;
  }

  auto drt = kpack::Runtime::Open(KPACK_DISPATCH_PACK_DIR, {.preload = true});
  if (!drt.ok()) {
    g->error = drt.status().ToString();
    return false;
  }
  g->dispatch_runtime = std::make_unique<kpack::Runtime>(std::move(*drt));
  g->axpy = *g->dispatch_runtime->Find("axpy");
  // One shape per bucket and one more: {n, variant kpack picks, BLOCK, num_warps}.
  struct {
    int32_t n;
    const char* variant;
    unsigned block_size, warps;
  } shapes[] = {{1024, "b0_div16_unit", 256, 2},
                {65536, "b1_div16_unit", 1024, 4},
                {300000, "b2_div16_unit", 4096, 8},
                {2048, "b0_div16_unit", 256, 2}};
  for (const auto& s : shapes) {
    const kpack::Arg args[] = {g->x, g->y, g->out, s.n, 1, 2.0f};
    auto chosen = g->axpy.SelectVariant(args);
    if (!chosen.ok() || *chosen != s.variant) {
      g->error = "dispatch pack selects an unexpected variant";
      return false;
    }
    std::vector<char> bin =
        ReadFile(std::string(KPACK_DISPATCH_PACK_DIR) + "/cubins/axpy/" + s.variant + ".cubin");
    CUmodule m;
    CUfunction f;
    if (drv.ModuleLoadData(&m, bin.data()) || drv.ModuleGetFunction(&f, m, "axpy_kernel")) {
      g->error = "raw load of a dispatch cubin failed";
      return false;
    }
    g->shapes.push_back({s.n, f, (s.n + s.block_size - 1) / s.block_size, 32 * s.warps});
  }
  return true;
}

// Times `launch` kBatch times per iteration, the stream synchronized before each batch.
template <typename F>
void RunBatches(benchmark::State& state, F&& launch) {
  for (auto _ : state) {
    g->driver->StreamSynchronize(g->stream);
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < kBatch; ++i) {
      if (!launch()) {
        state.SkipWithError("launch failed");
        return;
      }
    }
    auto t1 = std::chrono::steady_clock::now();
    state.SetIterationTime(std::chrono::duration<double>(t1 - t0).count());
  }
  g->driver->StreamSynchronize(g->stream);
}

CUlaunchConfig RawConfig() {
  CUlaunchConfig c = {};
  c.gridDimX = c.gridDimY = c.gridDimZ = 1;
  c.blockDimX = 128;  // 4 warps, as the add variant's metadata says
  c.blockDimY = c.blockDimZ = 1;
  c.hStream = g->stream;
  return c;
}

void BM_RawParams(benchmark::State& state, CUfunction f) {
  CUdeviceptr scratch = 0;
  void* params[] = {&g->x, &g->y, &g->out, &g->n, &scratch, &scratch};
  RunBatches(state, [&] {
    CUlaunchConfig c = RawConfig();
    return g->driver->LaunchKernelEx(&c, f, params, nullptr) == CUDA_SUCCESS;
  });
}

// Raw launch plus the cuCtxGetCurrent that kpack makes per launch to pick the loading
// context's CUfunction: what that query costs in the real driver.
void BM_RawParamsWithCtxQuery(benchmark::State& state) {
  CUdeviceptr scratch = 0;
  void* params[] = {&g->x, &g->y, &g->out, &g->n, &scratch, &scratch};
  RunBatches(state, [&] {
    CUcontext ctx;
    g->driver->CtxGetCurrent(&ctx);
    CUlaunchConfig c = RawConfig();
    return g->driver->LaunchKernelEx(&c, g->raw_function, params, nullptr) == CUDA_SUCCESS;
  });
}

void BM_RawExtra(benchmark::State& state) {
  struct {
    CUdeviceptr x, y, out;
    int32_t n, pad;
    CUdeviceptr gs, ps;
  } buf = {g->x, g->y, g->out, g->n, 0, 0, 0};
  size_t size = sizeof(buf);
  void* extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, &buf, CU_LAUNCH_PARAM_BUFFER_SIZE, &size,
                   CU_LAUNCH_PARAM_END};
  RunBatches(state, [&] {
    CUlaunchConfig c = RawConfig();
    return g->driver->LaunchKernelEx(&c, g->raw_function, nullptr, extra) == CUDA_SUCCESS;
  });
}

// Raw driver with the shape changing every call: the caller's own bucket logic reduced to
// a precomputed table, so this is the floor for a dynamic-shape launch.
void BM_RawDynamic(benchmark::State& state) {
  CUdeviceptr scratch = 0;
  float alpha = 2.0f;
  size_t i = 0;
  RunBatches(state, [&] {
    const Setup::Shape& s = g->shapes[i++ % g->shapes.size()];
    int32_t n = s.n;
    void* params[] = {&g->x, &g->y, &g->out, &n, &alpha, &scratch, &scratch};
    CUlaunchConfig c = RawConfig();
    c.gridDimX = s.grid;
    c.blockDimX = s.block;
    return g->driver->LaunchKernelEx(&c, s.raw, params, nullptr) == CUDA_SUCCESS;
  });
}

// kpack choosing the variant per call (bucket + specialization) and computing the grid
// from the manifest's expression.
void BM_KpackDynamic(benchmark::State& state) {
  size_t i = 0;
  RunBatches(state, [&] {
    int32_t n = g->shapes[i++ % g->shapes.size()].n;
    return g->axpy.Launch(g->stream, g->x, g->y, g->out, n, 1, 2.0f).ok();
  });
}

// The dispatch step alone (argument count, bucket, property mask, table lookup): no
// packing, no driver call. Timed per call, not per batch.
void BM_DispatchOnly(benchmark::State& state) {
  std::vector<std::vector<kpack::Arg>> args;
  for (const Setup::Shape& s : g->shapes) {
    args.push_back({g->x, g->y, g->out, s.n, 1, 2.0f});
  }
  size_t i = 0;
  for (auto _ : state) {
    auto v = g->axpy.SelectVariant(args[i++ % args.size()]);
    benchmark::DoNotOptimize(v);
  }
}

void BM_KpackByName(benchmark::State& state) {
  RunBatches(state, [&] {
    return g->runtime->Launch("add", kpack::Grid{1}, g->stream, g->x, g->y, g->out, g->n).ok();
  });
}

void BM_KpackByKernel(benchmark::State& state) {
  RunBatches(state, [&] {
    return g->add.Launch(kpack::Grid{1}, g->stream, g->x, g->y, g->out, g->n).ok();
  });
}

void BM_KpackByKernelNoNvtx(benchmark::State& state) {
  RunBatches(state, [&] {
    return g->add_no_nvtx.Launch(kpack::Grid{1}, g->stream, g->x, g->y, g->out, g->n).ok();
  });
}

void BM_KpackBound(benchmark::State& state) {
  auto bound = g->add.BindArgs(kpack::Grid{1}, g->stream, g->x, g->y, g->out, g->n);
  if (!bound.ok()) {
    state.SkipWithError("bind failed");
    return;
  }
  RunBatches(state, [&] { return bound->Launch().ok(); });
}

// Collects per-repetition times and prints medians and ratios at the end.
class RatioReporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    for (const Run& r : runs) {
      if (r.run_type != Run::RT_Iteration || r.error_occurred) continue;
      if (r.run_name.function_name == "dispatch_only") {
        dispatch_ns_.push_back(r.GetAdjustedRealTime());
      } else {
        // Iterations are batches of kBatch launches; report per launch.
        times_[r.run_name.function_name].push_back(r.GetAdjustedRealTime() / kBatch);
      }
    }
    ConsoleReporter::ReportRuns(runs);
  }
  void Summarize() const {
    auto median = [](std::vector<double> v) {
      std::sort(v.begin(), v.end());
      size_t n = v.size();
      return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
    };
    auto raw = times_.find("raw_params_cufunction");
    auto raw_dynamic = times_.find("raw_dynamic_shapes");
    if (raw == times_.end()) return;
    double base = median(raw->second);
    std::printf("\n%-28s %12s %12s %12s %8s\n", "path (host time per launch)", "median us",
                "min us", "max us", "x raw");
    for (const auto& [name, v] : times_) {
      double m = median(v);
      // Dynamic shapes compare with raw dynamic shapes (same kernels, same shapes).
      double ref = name.find("dynamic") != std::string::npos && raw_dynamic != times_.end()
                       ? median(raw_dynamic->second)
                       : base;
      std::printf("%-28s %12.3f %12.3f %12.3f %8.3f\n", name.c_str(), m / 1e3,
                  *std::min_element(v.begin(), v.end()) / 1e3,
                  *std::max_element(v.begin(), v.end()) / 1e3, m / ref);
    }
    std::printf(
        "(x raw: each row over raw_params_cufunction; the dynamic rows over "
        "raw_dynamic_shapes)\n");
    if (!dispatch_ns_.empty()) {
      std::printf("dispatch_only: %.1f ns per SelectVariant (median)\n", median(dispatch_ns_));
    }
  }

 private:
  std::map<std::string, std::vector<double>> times_;
  std::vector<double> dispatch_ns_;
};

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (!Init()) {
    std::fprintf(stderr, "kpack_launch_bench: cannot run: %s\n", g->error.c_str());
    return 1;
  }
  auto reg = [](const char* name, auto fn) {
    benchmark::RegisterBenchmark(name, fn)->UseManualTime()->Unit(benchmark::kNanosecond);
  };
  reg("raw_params_cufunction", [](benchmark::State& s) { BM_RawParams(s, g->raw_function); });
  reg("raw_params_cukernel", [](benchmark::State& s) { BM_RawParams(s, g->raw_kernel); });
  reg("raw_extra_cufunction", BM_RawExtra);
  reg("raw_params_ctx_query", BM_RawParamsWithCtxQuery);
  reg("kpack_by_kernel_no_nvtx", BM_KpackByKernelNoNvtx);
  reg("kpack_by_name", BM_KpackByName);
  reg("kpack_by_kernel", BM_KpackByKernel);
  reg("kpack_bound_launch", BM_KpackBound);
  reg("raw_dynamic_shapes", BM_RawDynamic);
  reg("kpack_dynamic_shapes", BM_KpackDynamic);
  benchmark::RegisterBenchmark("dispatch_only", BM_DispatchOnly)->Unit(benchmark::kNanosecond);
  RatioReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  reporter.Summarize();
  benchmark::Shutdown();
  return 0;
}
