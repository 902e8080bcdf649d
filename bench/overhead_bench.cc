// kpack's own host cost per launch, with no GPU: every launch path of bench_setup.h run
// against a driver whose launch does nothing (the tests' fake driver with
// KPACK_FAKE_LAUNCH_NOOP=1), so what is left is kpack's work -- dispatch, argument
// checks and packing, attribute setup, the context query -- plus a call into the fake.
// `raw_params` is the same loop calling the fake's cuLaunchKernelEx directly: the floor.
//
//   KPACK_FAKE_LAUNCH_NOOP=1 KPACK_CUDA_DRIVER=.../libkpack_fake_cuda.so \
//     kpack_overhead_bench [--launches N] [--rounds R] [--path NAME] [--evict-kb K]
//                          [--evict-code-kb C]
//
// Prints one line per path: `NAME ns_per_launch` (the best of R rounds of N launches:
// the least disturbed round on a shared machine). Under
//   valgrind --tool=callgrind --callgrind-out-file=F kpack_overhead_bench --rounds 1
// the counters are zeroed before each path's first round (CALLGRIND_ZERO_STATS) and dumped
// after it under the path's name (CALLGRIND_DUMP_STATS_AT), so a dump holds exactly N
// launches of one path. bench/overhead_check.py runs both and compares them with
// bench/overhead_baseline.json.

#if __has_include(<valgrind/callgrind.h>)
#include <valgrind/callgrind.h>
#else  // no valgrind headers: timing only (overhead_check.py then reports no instructions)
#define CALLGRIND_ZERO_STATS
#define CALLGRIND_DUMP_STATS_AT(name) ((void)(name))
#endif

#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "bench_setup.h"

namespace {

using kpack::bench::ArgsKernel;
using kpack::bench::BenchSetup;

struct Path {
  std::string name;
  std::function<bool()> launch;
};

}  // namespace

int main(int argc, char** argv) {
  long launches = 20000;
  int rounds = 15;
  long evict_kb = 0;
  long evict_code_kb = 0;
  std::string only;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--launches" && i + 1 < argc) {
      launches = std::atol(argv[++i]);
    } else if (a == "--rounds" && i + 1 < argc) {
      rounds = std::atoi(argv[++i]);
    } else if (a == "--path" && i + 1 < argc) {
      only = argv[++i];
    } else if (a == "--evict-kb" && i + 1 < argc) {
      evict_kb = std::atol(argv[++i]);
    } else if (a == "--evict-code-kb" && i + 1 < argc) {
      evict_code_kb = std::atol(argv[++i]);
    } else {
      std::fprintf(stderr,
                   "usage: %s [--launches N] [--rounds R] [--path NAME] [--evict-kb K] "
                   "[--evict-code-kb C]\n",
                   argv[0]);
      return 2;
    }
  }
  if (launches <= 0 || rounds <= 0) {
    std::fprintf(stderr, "kpack_overhead_bench: --launches and --rounds must be positive\n");
    return 2;
  }
  const char* noop = std::getenv("KPACK_FAKE_LAUNCH_NOOP");
  if (noop == nullptr || std::strcmp(noop, "1") != 0) {
    std::fprintf(stderr,
                 "kpack_overhead_bench: set KPACK_FAKE_LAUNCH_NOOP=1 and KPACK_CUDA_DRIVER to "
                 "the tests' fake driver; this benchmark measures kpack without a GPU\n");
    return 2;
  }
  auto setup = BenchSetup::Create(1);
  if (!setup.ok()) {
    std::fprintf(stderr, "kpack_overhead_bench: cannot run: %s\n",
                 std::string(setup.status().message()).c_str());
    return 1;
  }
  BenchSetup& g = **setup;
  CUstream s = g.stream(0);
  const ArgsKernel& args4 = g.args_kernel(4);
  const ArgsKernel& args32 = g.args_kernel(32);
  std::vector<Path> paths = {
      {"raw_params/args4", [&] { return g.RawParams(args4, args4.raw_function, s); }},
      {"raw_params/args32", [&] { return g.RawParams(args32, args32.raw_function, s); }},
      {"raw_params_fresh/args4", [&] { return g.RawParamsFresh(args4, s); }},
      {"raw_params_fresh/args32", [&] { return g.RawParamsFresh(args32, s); }},
  };
  for (const ArgsKernel& k : g.kernels()) {
    paths.push_back({"kpack_by_kernel/" + k.name,
                     [&g, &k, s] { return g.KpackByKernel(k.kernel, k.inputs, s); }});
  }
  paths.push_back({"kpack_by_kernel_no_nvtx/args4",
                   [&] { return g.KpackByKernel(args4.kernel_no_nvtx, args4.inputs, s); }});
  for (const ArgsKernel& k : g.kernels()) {
    paths.push_back({"kpack_by_name/" + k.name, [&g, &k, s] { return g.KpackByName(k, s); }});
  }
  std::vector<kpack::BoundLaunch> bound;  // args4's, args32's
  bound.reserve(2);
  for (const ArgsKernel* k : {&args4, &args32}) {
    auto b = g.Bind(*k, s);
    if (!b.ok()) {
      std::fprintf(stderr, "kpack_overhead_bench: bind failed: %s\n",
                   std::string(b.status().message()).c_str());
      return 1;
    }
    bound.push_back(*std::move(b));
    kpack::BoundLaunch* launch = &bound.back();
    paths.push_back({"kpack_bound/" + k->name, [launch] { return launch->Launch().ok(); }});
  }
  size_t shape = 0;
  paths.push_back({"kpack_dynamic_shapes", [&] { return g.KpackDynamic(shape++, s); }});
  // Many properties: the example pack's layer_norm_bwd, whose contig variants assume div16
  // on 13 arguments (8 pointers, 4 row strides, N), with N cycling through its 3 buckets.
  // The launch never touches memory (no-op fake), so the buffers are made-up aligned
  // addresses.
  auto example = kpack::Runtime::Open(KPACK_EXAMPLE_PACK_DIR, {.preload = true});
  if (!example.ok()) {
    std::fprintf(stderr, "kpack_overhead_bench: %s\n",
                 std::string(example.status().message()).c_str());
    return 1;
  }
  const kpack::Kernel ln_bwd = *example->Find("layer_norm_bwd");
  const CUdeviceptr base = g.input(0);
  const int32_t widths[] = {512, 2048, 8192};
  size_t width = 0;
  paths.push_back({"kpack_many_properties", [&] {
                     const int32_t n = widths[width++ % 3];
                     return ln_bwd
                         .Launch(s, base, base + 0x1000, base + 0x2000, base + 0x3000,
                                 base + 0x4000, base + 0x5000, base + 0x6000, base + 0x7000, n,
                                 n, n, n, int32_t{64}, n)
                         .ok();
                   }});

  // Tensor descriptors: the example pack's matmul_tma (three 2-D TMA descriptors and four
  // i32 arguments) by Kernel with the same descriptors every launch (three maps copied
  // from the parameters' memos), by Kernel with each operand cycling through five bases,
  // more than a memo holds (three checks and encodes per launch), and as a BoundLaunch
  // (maps encoded once). The fake's cuTensorMapEncodeTiled is the driver's part.
  const kpack::Kernel mm_tma = *example->Find("matmul_tma");
  const kpack::TensorDesc desc_a = kpack::TensorDesc::RowMajor(base, {64, 64});
  const kpack::TensorDesc desc_b = kpack::TensorDesc::RowMajor(base + 0x2000, {64, 64});
  const kpack::TensorDesc desc_c = kpack::TensorDesc::RowMajor(base + 0x4000, {64, 64});
  paths.push_back({"kpack_tma/by_kernel", [&] {
                     return mm_tma.Launch(s, desc_a, desc_b, desc_c, 64, 64, 64, 132).ok();
                   }});
  std::vector<kpack::TensorDesc> cycled;
  for (int i = 0; i < 15; ++i) {
    cycled.push_back(kpack::TensorDesc::RowMajor(base + 0x10000 + 0x2000 * i, {64, 64}));
  }
  size_t miss = 0;
  paths.push_back({"kpack_tma/miss", [&] {
                     const size_t k = 3 * (miss++ % 5);
                     return mm_tma.Launch(s, cycled[k], cycled[k + 1], cycled[k + 2], 64, 64, 64,
                                          132)
                         .ok();
                   }});
  auto tma_bound = mm_tma.BindArgs(s, desc_a, desc_b, desc_c, 64, 64, 64, 132);
  if (!tma_bound.ok()) {
    std::fprintf(stderr, "kpack_overhead_bench: matmul_tma bind failed: %s\n",
                 std::string(tma_bound.status().message()).c_str());
    return 1;
  }
  paths.push_back({"kpack_tma/bound", [&] { return tma_bound->Launch().ok(); }});

  // Scratch: the test pack's `scratch` kernel (128 bytes of global scratch per program)
  // from kpack's arenas on a stream of its own, the legacy stream and the per-thread
  // stream, each arena grown by a first launch: the capture-status query, the stream's
  // key and the lock-free arena lookup.
  auto test = kpack::Runtime::Open(KPACK_TEST_PACK_DIR, {.preload = true});
  if (!test.ok()) {
    std::fprintf(stderr, "kpack_overhead_bench: %s\n",
                 std::string(test.status().message()).c_str());
    return 1;
  }
  const kpack::Kernel scratch = *test->Find("scratch");
  for (auto [name, stream] : {std::pair{"kpack_scratch/stream", s},
                              std::pair{"kpack_scratch/legacy", CUstream{nullptr}},
                              std::pair{"kpack_scratch/per_thread", CU_STREAM_PER_THREAD}}) {
    auto launch = [&scratch, base, stream] {
      return scratch.Launch(kpack::Grid{4, 4}, stream, base, base + 0x10000, 128, 128, 128).ok();
    };
    if (!launch()) {
      std::fprintf(stderr, "kpack_overhead_bench: %s: the first launch failed\n", name);
      return 1;
    }
    paths.push_back({name, launch});
  }

  // --evict-kb: between launches, write K KiB of memory, as a real driver's launch does
  // (its work evicts the launcher's data from L1/L2); the time of the eviction is in
  // every path, raw included, so differences from raw show kpack's cost with cold data.
  std::vector<char> evict(static_cast<size_t>(evict_kb) * 1024);
  // --evict-code-kb: between launches, also run C KiB of code, as the driver's launch
  // runs its own (evicting the launcher's code from the L1 instruction cache): a chain
  // of 2-byte jumps, one at the start of each 64-byte line to the next, then a return.
  // The jumps are x86-64 machine code; elsewhere the option is refused.
  void (*evict_code)() = nullptr;
#if !defined(__x86_64__)
  if (evict_code_kb > 0) {
    std::fprintf(stderr, "kpack_overhead_bench: --evict-code-kb needs an x86-64 build\n");
    return 2;
  }
#else
  if (evict_code_kb > 0) {
    const size_t bytes = static_cast<size_t>(evict_code_kb) * 1024;
    void* mem = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED) {
      std::perror("kpack_overhead_bench: mmap");
      return 1;
    }
    auto* code = static_cast<unsigned char*>(mem);
    std::memset(code, 0xcc, bytes);  // int3 between the jumps: never reached
    for (size_t line = 0; line + 64 < bytes; line += 64) {
      code[line] = 0xeb;  // jmp rel8
      code[line + 1] = 62;
    }
    code[bytes - 64] = 0xc3;  // ret
    if (mprotect(mem, bytes, PROT_READ | PROT_EXEC) != 0) {
      std::perror("kpack_overhead_bench: mprotect");
      return 1;
    }
    evict_code = reinterpret_cast<void (*)()>(mem);
  }
#endif
  auto launch_and_evict = [&](const Path& p) {
    bool ok = p.launch();
    for (size_t i = 0; i < evict.size(); i += 64) evict[i] = static_cast<char>(i);
    if (evict_code != nullptr) evict_code();
    return ok;
  };
  bool found = only.empty();
  for (const Path& p : paths) {
    if (!only.empty() && p.name != only) continue;
    found = true;
    for (int i = 0; i < 1000; ++i) launch_and_evict(p);  // warm branch predictors
    double best = 1e300;
    for (int r = 0; r < rounds; ++r) {
      if (r == 0) CALLGRIND_ZERO_STATS;
      auto t0 = std::chrono::steady_clock::now();
      bool ok = true;
      for (long i = 0; i < launches; ++i) ok &= launch_and_evict(p);
      auto t1 = std::chrono::steady_clock::now();
      if (r == 0) CALLGRIND_DUMP_STATS_AT(p.name.c_str());
      if (!ok) {
        std::fprintf(stderr, "kpack_overhead_bench: %s: a launch failed\n", p.name.c_str());
        return 1;
      }
      best = std::min(best, std::chrono::duration<double, std::nano>(t1 - t0).count());
    }
    std::printf("%s %.2f\n", p.name.c_str(), best / launches);
  }
  if (!found) {
    std::fprintf(stderr, "kpack_overhead_bench: no path named %s\n", only.c_str());
    return 2;
  }
  return 0;
}
