// kpack's own host cost of a StepGraph replay, with no GPU: steps of 32, 64 and 82 launches
// of kernels/graphpack (layer_norm, matmul_fp16, softmax, vector_add, in turn) replayed
// against the tests' fake driver with its launches made no-ops (KPACK_FAKE_LAUNCH_NOOP=1:
// cuGraphLaunch returns at once), so what is left is kpack's replay -- resolving grids,
// finding the graph, patching nodes -- plus the fake's cuGraphExecKernelNodeSetParams for
// each node patched.
//
//   KPACK_FAKE_LAUNCH_NOOP=1 KPACK_CUDA_DRIVER=.../libkpack_fake_cuda.so \
//     kpack_graph_replay_cost [--replays N] [--rounds R] [--case NAME]
//
// Cases, per step size K (the name is `CASE/K`):
//  - unchanged: nothing Set between replays (a decode step whose inputs live on the
//    device);
//  - one_set: one launch's size Set (alternating between two values) between replays;
//  - pointers: every launch's output pointer Set (alternating) between replays;
//  - sizes: every launch's sizes Set, drawn inside fixed buckets as bench/graph_bench.cc
//    draws them (every size changes every step), between replays.
// The Sets are not timed (the clock and callgrind's collection cover Replay only).
// Prints `NAME ns_per_replay ns_per_node nodes_patched_per_replay` (the best of R rounds).
// Under
//   valgrind --tool=callgrind --collect-atstart=no kpack_graph_replay_cost --rounds 1
// collection is on only around each Replay of a case's first round and dumped after it
// under the case's name (CALLGRIND_DUMP_STATS_AT): a dump holds exactly N replays.

#if __has_include(<valgrind/callgrind.h>)
#include <valgrind/callgrind.h>
#else
#define CALLGRIND_TOGGLE_COLLECT
#define CALLGRIND_DUMP_STATS_AT(name) ((void)(name))
#endif

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "driver/driver.h"
#include "kpack/kpack.h"

namespace {

using kpack::Arg;
using kpack::BoundLaunch;

[[noreturn]] void Fail(const std::string& what) {
  std::fprintf(stderr, "kpack_graph_replay_cost: %s\n", what.c_str());
  std::exit(1);
}
void Check(const absl::Status& s, const std::string& what) {
  if (!s.ok()) Fail(absl::StrCat(what, ": ", s.ToString()));
}

// Made-up device addresses: the no-op fake never touches memory.
constexpr CUdeviceptr kBase = CUdeviceptr{1} << 40;
constexpr int kMaxN = 4096, kMmCols = 1024, kMaxCols = 8192, kMaxVec = 65536;

int Mult16(std::mt19937& gen, int lo, int hi) {
  const int a = (lo + 15) / 16, b = hi / 16;
  return 16 * (a + static_cast<int>(gen() % static_cast<uint32_t>(b - a + 1)));
}

struct Step {
  std::vector<std::unique_ptr<BoundLaunch>> launches;
  std::vector<BoundLaunch*> raw;
};

Step MakeStep(const kpack::Runtime& rt, CUstream stream, int kernels) {
  Step s;
  for (int i = 0; i < kernels; ++i) {
    const CUdeviceptr p = kBase + (CUdeviceptr{static_cast<uint64_t>(i)} << 24);
    std::vector<Arg> args;
    const char* name = nullptr;
    switch (i % 4) {
      case 0:
        name = "layer_norm";
        args = {p, p + 0x100000, p + 0x200000, p + 0x300000, kMaxN, 64, kMaxN, 1e-5f};
        break;
      case 1:
        name = "matmul_fp16";
        args = {p, p + 0x100000, p + 0x200000, 64, kMmCols, kMaxN, kMaxN, 1, kMmCols, 1,
                kMmCols, 1};
        break;
      case 2:
        name = "softmax";
        args = {p, p + 0x100000, kMaxCols, kMaxCols, 32, kMaxCols};
        break;
      default:
        name = "vector_add";
        args = {p, p + 0x100000, p + 0x200000, kMaxVec};
    }
    absl::StatusOr<kpack::BoundLaunch> b = rt.Find(name)->Bind(stream, args);
    Check(b.status(), absl::StrCat("binding ", name));
    s.launches.push_back(std::make_unique<BoundLaunch>(*std::move(b)));
    s.raw.push_back(s.launches.back().get());
  }
  return s;
}

// Every launch's sizes, inside the buckets graph_bench times.
void SetSizes(Step& s, std::mt19937& gen) {
  for (size_t i = 0; i < s.launches.size(); ++i) {
    BoundLaunch& b = *s.launches[i];
    switch (i % 4) {
      case 0:
        Check(b.Set(6, Mult16(gen, 1025, kMaxN)), "layer_norm N");
        break;
      case 1:
        Check(b.Set(3, 17 + static_cast<int>(gen() % 48)), "matmul M");
        Check(b.Set(5, Mult16(gen, 1025, kMaxN)), "matmul K");
        break;
      case 2:
        Check(b.Set(5, Mult16(gen, 1025, kMaxCols)), "softmax cols");
        break;
      default:
        Check(b.Set(3, Mult16(gen, 4097, kMaxVec)), "vector_add n");
    }
  }
}

// Every launch's output pointer, one of two values by `phase`.
void SetPointers(Step& s, long phase) {
  for (size_t i = 0; i < s.launches.size(); ++i) {
    const CUdeviceptr p = kBase + (CUdeviceptr{i} << 24) + 0x800000 + 0x1000 * (phase & 1);
    const size_t out = i % 4 == 2 ? 0 : i % 4 == 3 ? 2 : 1;
    Check(s.launches[i]->Set(out, p), "output pointer");
  }
}

}  // namespace

int main(int argc, char** argv) {
  long replays = 2000;
  int rounds = 7;
  std::string only;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--replays" && i + 1 < argc) {
      replays = std::atol(argv[++i]);
    } else if (a == "--rounds" && i + 1 < argc) {
      rounds = std::atoi(argv[++i]);
    } else if (a == "--case" && i + 1 < argc) {
      only = argv[++i];
    } else {
      std::fprintf(stderr, "usage: %s [--replays N] [--rounds R] [--case NAME]\n", argv[0]);
      return 2;
    }
  }
  if (replays <= 0 || rounds <= 0) Fail("--replays and --rounds must be positive");
  const char* noop = std::getenv("KPACK_FAKE_LAUNCH_NOOP");
  if (noop == nullptr || std::strcmp(noop, "1") != 0) {
    std::fprintf(stderr,
                 "kpack_graph_replay_cost: set KPACK_FAKE_LAUNCH_NOOP=1 and KPACK_CUDA_DRIVER to "
                 "the tests' fake driver; this benchmark measures kpack without a GPU\n");
    return 2;
  }
  absl::StatusOr<std::shared_ptr<const kpack::internal::Driver>> loaded =
      kpack::internal::Driver::Load("");
  Check(loaded.status(), "loading the CUDA driver");
  const kpack::internal::Driver& d = **loaded;
  CUdevice device;
  CUcontext ctx;
  CUstream stream;
  if (d.DeviceGet(&device, 0) != CUDA_SUCCESS ||
      d.DevicePrimaryCtxRetain(&ctx, device) != CUDA_SUCCESS ||
      d.CtxSetCurrent(ctx) != CUDA_SUCCESS ||
      d.StreamCreate(&stream, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS) {
    Fail("no context or stream on device 0");
  }
  absl::StatusOr<kpack::Runtime> rt = kpack::Runtime::Open(KPACK_GRAPH_PACK_DIR, {.preload = true});
  Check(rt.status(), "opening " KPACK_GRAPH_PACK_DIR);

  struct Case {
    const char* name;
    std::function<void(Step&, std::mt19937&, long)> set;
  };
  const Case cases[] = {
      {"unchanged", [](Step&, std::mt19937&, long) {}},
      {"one_set",
       [](Step& s, std::mt19937&, long i) {
         // A vector_add in the middle of the step: n inside its bucket.
         Check(s.launches[s.launches.size() / 8 * 4 + 3]->Set(3, 8192 + 64 * (i & 1)), "n");
       }},
      {"pointers", [](Step& s, std::mt19937&, long i) { SetPointers(s, i); }},
      {"sizes", [](Step& s, std::mt19937& gen, long) { SetSizes(s, gen); }},
  };
  bool found = only.empty();
  for (int kernels : {32, 64, 82}) {
    for (const Case& c : cases) {
      const std::string name = absl::StrCat(c.name, "/", kernels);
      if (!only.empty() && name != only) continue;
      found = true;
      Step step = MakeStep(*rt, stream, kernels);
      absl::StatusOr<kpack::StepGraph> graph = kpack::StepGraph::Create(step.raw);
      Check(graph.status(), "StepGraph::Create");
      std::mt19937 gen(7);
      SetSizes(step, gen);
      Check(graph->Build(), "StepGraph::Build");
      graph->set_unseen(kpack::StepGraph::Unseen::kError);  // the timed loop must not build
      long phase = 0;
      for (int i = 0; i < 200; ++i) {  // warm caches and branch predictors
        c.set(step, gen, phase++);
        Check(graph->Replay(stream), "StepGraph::Replay");
      }
      double best = 1e300;
      uint64_t patched = 0;
      for (int r = 0; r < rounds; ++r) {
        const uint64_t before = graph->stats().nodes_patched;
        std::chrono::steady_clock::duration total{};
        for (long i = 0; i < replays; ++i) {
          c.set(step, gen, phase++);
          if (r == 0) CALLGRIND_TOGGLE_COLLECT;
          const auto t0 = std::chrono::steady_clock::now();
          const absl::Status s = graph->Replay(stream);
          total += std::chrono::steady_clock::now() - t0;
          if (r == 0) CALLGRIND_TOGGLE_COLLECT;
          Check(s, "StepGraph::Replay");
        }
        if (r == 0) CALLGRIND_DUMP_STATS_AT(name.c_str());
        patched = graph->stats().nodes_patched - before;
        best = std::min(best, std::chrono::duration<double, std::nano>(total).count());
      }
      std::printf("%s %.1f %.2f %.1f\n", name.c_str(), best / replays, best / replays / kernels,
                  static_cast<double>(patched) / replays);
    }
  }
  if (!found) Fail("no case named " + only);
  return 0;
}
