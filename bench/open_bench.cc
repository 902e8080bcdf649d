// What opening a pack costs: Runtime::Open (lazy: read, validate, build the launch
// tables, load the driver; nothing loaded into it) and Pack::Read (the same checks without
// a driver) on generated packs of about 100 and 1,000 variants.
//
// A generated pack is the committed example pack (kernels/examplepack: vector add,
// softmax, layer norms, matmuls, TMA matmul and attention; about 16 KiB per cubin) copied
// under new kernel names until it holds at least the asked-for number of variants, every
// variant with its own cubin file, so the work is what a real pack of that size costs:
// one manifest to parse and validate, and per variant a file to read, a sha256, an ELF to
// check, a grid to compile, a share of a dispatch table. Counters: `per_variant`, wall
// time per variant (the figure the README quotes; Open spreads its work over up to 8
// threads, so this depends on the idle cores), and `cpu_per_variant`, the CPU time of all
// threads.
//
//   KPACK_CUDA_DRIVER=build/tests/fake_driver/libkpack_fake_cuda.so build/bench/kpack_open_bench
//
// Runtime::Open needs a driver with a device (the tests' fake will do: Open is lazy and
// loads nothing into it); Pack::Read needs none. A benchmark that cannot open its pack (no
// driver: set KPACK_CUDA_DRIVER) says why and makes the program exit 1.

#include <benchmark/benchmark.h>
#include <sys/resource.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>

#include "kpack/kpack.h"
#include "nlohmann/json.hpp"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// A generated pack of at least `min_variants` variants in a temporary directory, made once
// per size and removed at exit.
class GeneratedPack {
 public:
  explicit GeneratedPack(int min_variants) {
    char tmpl[] = "/tmp/kpack_open_bench_XXXXXX";
    root_ = mkdtemp(tmpl);
    const fs::path source = KPACK_EXAMPLE_PACK_DIR;
    json manifest = json::parse(std::ifstream(source / "manifest.json"));
    json kernels = json::array();
    for (int copy = 0; variants_ < min_variants; ++copy) {
      for (json kernel : manifest["kernels"]) {
        const std::string name = kernel["name"].get<std::string>() + "_" + std::to_string(copy);
        kernel["name"] = name;
        fs::create_directories(root_ / "cubins" / name);
        for (json& variant : kernel["variants"]) {
          const std::string cubin =
              "cubins/" + name + "/" + variant["name"].get<std::string>() + ".cubin";
          fs::copy_file(source / variant["cubin"].get<std::string>(), root_ / cubin);
          variant["cubin"] = cubin;
          ++variants_;
        }
        kernels.push_back(kernel);
      }
    }
    manifest["kernels"] = kernels;
    std::ofstream(root_ / "manifest.json") << manifest.dump(1);
  }
  ~GeneratedPack() { fs::remove_all(root_); }

  std::string dir() const { return root_.string(); }
  int variants() const { return variants_; }

 private:
  fs::path root_;
  int variants_ = 0;
};

const GeneratedPack& PackOf(int min_variants) {
  // Destroyed at exit, which removes the generated directories.
  static std::map<int, std::unique_ptr<GeneratedPack>> packs;
  auto& pack = packs[min_variants];
  if (pack == nullptr) pack = std::make_unique<GeneratedPack>(min_variants);
  return *pack;
}

// Set when a benchmark could not open its pack: the program then exits 1 (Google
// Benchmark reports the error and would exit 0).
bool g_failed = false;

// CPU seconds used by the whole process (all threads) so far.
double ProcessCpuSeconds() {
  rusage usage;
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_utime.tv_sec + usage.ru_stime.tv_sec +
         1e-6 * (usage.ru_utime.tv_usec + usage.ru_stime.tv_usec);
}

void Report(benchmark::State& state, const GeneratedPack& pack, double cpu_seconds) {
  state.counters["variants"] = pack.variants();
  // On an idle machine wall time is what a caller waits; on a busy one this is the
  // steadier figure.
  state.counters["cpu_per_variant"] =
      benchmark::Counter(cpu_seconds / pack.variants(), benchmark::Counter::kAvgIterations);
  // Inverted rate: seconds per iteration / variants (printed as e.g. "20us").
  state.counters["per_variant"] = benchmark::Counter(
      pack.variants(), benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
}

// Times `open(dir)` (returning a StatusOr) on the generated pack of state.range(0) variants.
template <typename OpenFn>
void TimeOpen(benchmark::State& state, OpenFn open) {
  const GeneratedPack& pack = PackOf(static_cast<int>(state.range(0)));
  const double cpu_start = ProcessCpuSeconds();
  for (auto _ : state) {
    auto opened = open(pack.dir());
    if (!opened.ok()) {
      g_failed = true;
      state.SkipWithError(std::string(opened.status().message()).c_str());
      return;
    }
    benchmark::DoNotOptimize(opened);
  }
  Report(state, pack, ProcessCpuSeconds() - cpu_start);
}

void BM_RuntimeOpen(benchmark::State& state) {
  TimeOpen(state, [](const std::string& dir) { return kpack::Runtime::Open(dir); });
}
BENCHMARK(BM_RuntimeOpen)->Arg(100)->Arg(1000)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_PackRead(benchmark::State& state) {
  TimeOpen(state, [](const std::string& dir) { return kpack::Pack::Read(dir); });
}
BENCHMARK(BM_PackRead)->Arg(1000)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  if (g_failed) {
    std::fprintf(stderr,
                 "kpack_open_bench: a pack could not be opened (above). Runtime::Open needs a "
                 "CUDA driver with a device: set KPACK_CUDA_DRIVER, e.g. to "
                 "build/tests/fake_driver/libkpack_fake_cuda.so\n");
    return 1;
  }
  return 0;
}
