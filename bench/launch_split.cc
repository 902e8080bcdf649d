// Where a launch's host time goes, measured where it happens: every launch path of
// bench_setup.h through the pass-through driver of bench/timing_driver.cc, which stamps
// the real cuLaunchKernelEx's entry and return, so each launch splits into
//
//   before   from the call to the driver's entry: kpack's Select, PackArgs and Prepare
//            (or a raw caller's config and params), on caches the previous launch's
//            driver work has left
//   driver   cuLaunchKernelEx itself
//   after    from the driver's return to the caller (kpack's launch counters)
//
// Besides kpack's paths and the raw ones of kpack_launch_bench, raw_params_atomic/argsN is
// the raw launch followed by one relaxed atomic increment, as kpack counts a launch once
// the driver returns: a locked instruction waits for every store before it, the
// driver's included. raw_params_fence/args4 follows it with a full fence instead, and
// raw_params_stores64/args4 with 64 plain stores to the stack.
//
// Issue 25 asks why the by-Kernel path costs more over raw on the GPU machine than its
// instructions explain: whether kpack's own part runs slow there (its data evicted by the
// driver) or the driver runs slower after kpack's part (kpack's data evicting the
// driver's). `kpack_launch_bench` gives the totals; this gives the parts.
//
//   kpack_launch_split [--launches N] [--rounds R]
//
// Sets KPACK_CUDA_DRIVER to the timing driver itself; a KPACK_CUDA_DRIVER set before
// (e.g. the tests' fake, for CI) becomes the driver it passes calls to
// (KPACK_TIMING_REAL_DRIVER). Each round runs every path once, a batch of N launches with
// the stream synchronized before it, in an order rotated from round to round; the
// figures are each part's median over the rounds of its mean per launch, and each path's
// median over the rounds of its difference from its raw reference in the same round.
// Exits 1 when a launch fails or a batch's launches did not all pass through the timing
// driver. Built with kpack's profiling option (-DKPACK_LAUNCH_STAMPS=ON) it also prints
// kpack's part by step: the caller's Arg array, Select, PackArgs, Prepare, the rest.

#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "bench_setup.h"
#include "ticks.h"

#if KPACK_LAUNCH_STAMPS
extern "C" uint64_t kpack_launch_stamps[4];  // runtime/launch.h
#endif

namespace {

using kpack::bench::ArgsKernel;
using kpack::bench::BenchSetup;
using kpack::bench::Ticks;

std::atomic<uint64_t> counted{0};  // raw_params_atomic's counter

struct Parts {
  double total = 0, before = 0, driver = 0, after = 0;
  // kpack's part, split further in a profiling build (KPACK_LAUNCH_STAMPS): to the
  // launch path's entry (the caller's Arg array), Select, PackArgs, Prepare, and from
  // Prepare to the driver's entry.
  double caller = 0, select = 0, pack = 0, prepare = 0, send = 0;
};

#if KPACK_LAUNCH_STAMPS
constexpr bool kStamps = true;
#else
constexpr bool kStamps = false;
uint64_t kpack_launch_stamps[4];  // never written: the columns are not printed
#endif

struct Path {
  std::string name;
  int reference;  // index of its raw reference path; -1 for a reference itself
  bool kpack;     // through kpack's launch path (stamped in a profiling build)
  std::function<bool()> launch;
  std::vector<Parts> rounds;  // ticks per launch, one entry per round
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// Nanoseconds: the median over `p`'s rounds of its part `field`, less `ref`'s in the same
// round when `ref` is given.
double MedianNs(const Path& p, double Parts::*field, const Path* ref, double ticks_per_ns) {
  std::vector<double> v;
  for (size_t r = 0; r < p.rounds.size(); ++r) {
    v.push_back((p.rounds[r].*field - (ref != nullptr ? ref->rounds[r].*field : 0)) / ticks_per_ns);
  }
  return Median(v);
}

// Ticks per nanosecond, against steady_clock over 50 ms.
double TicksPerNs() {
  const auto c0 = std::chrono::steady_clock::now();
  const uint64_t t0 = Ticks();
  while (std::chrono::steady_clock::now() - c0 < std::chrono::milliseconds(50)) {
  }
  const uint64_t t1 = Ticks();
  const double ns =
      std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - c0).count();
  return static_cast<double>(t1 - t0) / ns;
}

// One batch of `launches` launches of `path`; false when a launch failed or did not pass
// through the timing driver.
bool RunBatch(BenchSetup& g, CUstream stream, KpackTimingStamps* stamps, long launches,
              Path& path) {
  g.driver().StreamSynchronize(stream);
  const uint64_t passed = stamps->launches;
  Parts sum;
  for (long i = 0; i < launches; ++i) {
    const uint64_t t0 = Ticks();
    if (!path.launch()) return false;
    const uint64_t t1 = Ticks();
    sum.total += static_cast<double>(t1 - t0);
    sum.before += static_cast<double>(stamps->entry - t0);
    sum.driver += static_cast<double>(stamps->exit - stamps->entry);
    sum.after += static_cast<double>(t1 - stamps->exit);
    if (kStamps && path.kpack) {
      const uint64_t* k = kpack_launch_stamps;
      sum.caller += static_cast<double>(k[0] - t0);
      sum.select += static_cast<double>(k[1] - k[0]);
      sum.pack += static_cast<double>(k[2] - k[1]);
      sum.prepare += static_cast<double>(k[3] - k[2]);
      sum.send += static_cast<double>(stamps->entry - k[3]);
    }
  }
  if (stamps->launches - passed != static_cast<uint64_t>(launches)) return false;
  const double n = static_cast<double>(launches);
  path.rounds.push_back({sum.total / n, sum.before / n, sum.driver / n, sum.after / n,
                         sum.caller / n, sum.select / n, sum.pack / n, sum.prepare / n,
                         sum.send / n});
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  long launches = 256;
  int rounds = 200;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--launches" && i + 1 < argc) {
      launches = std::atol(argv[++i]);
    } else if (a == "--rounds" && i + 1 < argc) {
      rounds = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: %s [--launches N] [--rounds R]\n", argv[0]);
      return 2;
    }
  }
  if (launches <= 0 || rounds <= 0) {
    std::fprintf(stderr, "kpack_launch_split: --launches and --rounds must be positive\n");
    return 2;
  }
  const char* chosen = std::getenv("KPACK_CUDA_DRIVER");
  if (chosen != nullptr && chosen[0] != '\0' &&
      std::getenv("KPACK_TIMING_REAL_DRIVER") == nullptr) {
    setenv("KPACK_TIMING_REAL_DRIVER", chosen, 1);
  }
  setenv("KPACK_CUDA_DRIVER", KPACK_TIMING_DRIVER_PATH, 1);
  const char* real = std::getenv("KPACK_TIMING_REAL_DRIVER");
  const std::string real_path = real != nullptr && real[0] != '\0' ? real : "libcuda.so.1";
  if (dlopen(real_path.c_str(), RTLD_NOW | RTLD_LOCAL) == nullptr) {
    const char* why = dlerror();
    std::fprintf(stderr, "kpack_launch_split: cannot load the driver to time, %s: %s\n",
                 real_path.c_str(), why != nullptr ? why : "unknown error");
    return 1;
  }

  auto setup = BenchSetup::Create(1);
  if (!setup.ok()) {
    std::fprintf(stderr, "kpack_launch_split: cannot run: %s\n",
                 std::string(setup.status().message()).c_str());
    return 1;
  }
  void* timing = dlopen(KPACK_TIMING_DRIVER_PATH, RTLD_NOW | RTLD_NOLOAD);
  auto* stamps_fn =
      timing != nullptr
          ? reinterpret_cast<KpackTimingStamps* (*)()>(dlsym(timing, "kpack_timing_stamps"))
          : nullptr;
  if (stamps_fn == nullptr) {
    std::fprintf(stderr, "kpack_launch_split: the timing driver %s is not loaded\n",
                 KPACK_TIMING_DRIVER_PATH);
    return 1;
  }
  KpackTimingStamps* stamps = stamps_fn();
  BenchSetup& g = **setup;
  const CUstream s = g.stream(0);

  std::vector<Path> paths;
  std::vector<kpack::BoundLaunch> bound;
  bound.reserve(g.kernels().size());
  for (const ArgsKernel& k : g.kernels()) {
    const int raw = static_cast<int>(paths.size());
    paths.push_back({"raw_params/" + k.name,
                     -1,
                     false,
                     [&g, &k, s] { return g.RawParams(k, k.raw_function, s); },
                     {}});
    paths.push_back({"raw_params_fresh/" + k.name,
                     raw,
                     false,
                     [&g, &k, s] { return g.RawParamsFresh(k, s); },
                     {}});
    // Raw, then one relaxed atomic increment, as kpack counts its launches after the
    // driver returns: what a locked instruction costs right after the driver's work.
    paths.push_back({"raw_params_atomic/" + k.name,
                     raw,
                     false,
                     [&g, &k, s] {
                       const bool ok = g.RawParams(k, k.raw_function, s);
                       counted.fetch_add(1, std::memory_order_relaxed);
                       return ok;
                     },
                     {}});
    if (k.arity == 4) {
      // Two more probes after a raw launch: a full fence (waits for every store before
      // it, the driver's included), and 64 plain 8-byte stores to the stack (what
      // building 32 Args costs once the driver returns).
      paths.push_back({"raw_params_fence/" + k.name,
                       raw,
                       false,
                       [&g, &k, s] {
                         const bool ok = g.RawParams(k, k.raw_function, s);
                         std::atomic_thread_fence(std::memory_order_seq_cst);
                         return ok;
                       },
                       {}});
      paths.push_back({"raw_params_stores64/" + k.name,
                       raw,
                       false,
                       [&g, &k, s] {
                         const bool ok = g.RawParams(k, k.raw_function, s);
                         volatile uint64_t words[64];
                         for (int i = 0; i < 64; ++i) words[i] = static_cast<uint64_t>(i);
                         return ok;
                       },
                       {}});
    }
    auto b = g.Bind(k, s);
    if (!b.ok()) {
      std::fprintf(stderr, "kpack_launch_split: bind failed: %s\n",
                   std::string(b.status().message()).c_str());
      return 1;
    }
    bound.push_back(*std::move(b));
    kpack::BoundLaunch* launch = &bound.back();
    paths.push_back(
        {"kpack_bound/" + k.name, raw, true, [launch] { return launch->Launch().ok(); }, {}});
    paths.push_back({"kpack_by_kernel/" + k.name,
                     raw,
                     true,
                     [&g, &k, s] { return g.KpackByKernel(k.kernel, k.inputs, s); },
                     {}});
    paths.push_back(
        {"kpack_by_name/" + k.name, raw, true, [&g, &k, s] { return g.KpackByName(k, s); }, {}});
  }
  const int raw_dynamic = static_cast<int>(paths.size());
  size_t raw_shape = 0, kpack_shape = 0;
  paths.push_back(
      {"raw_dynamic_shapes", -1, false, [&] { return g.RawDynamic(raw_shape++, s); }, {}});
  paths.push_back({"kpack_dynamic_shapes",
                   raw_dynamic,
                   true,
                   [&] { return g.KpackDynamic(kpack_shape++, s); },
                   {}});

  // Round -1 warms up and is not kept.
  for (int r = -1; r < rounds; ++r) {
    for (size_t i = 0; i < paths.size(); ++i) {
      Path& p = paths[(i + paths.size() + r) % paths.size()];
      if (!RunBatch(g, s, stamps, launches, p)) {
        std::fprintf(stderr,
                     "kpack_launch_split: %s: a launch failed or bypassed the timing "
                     "driver\n",
                     p.name.c_str());
        return 1;
      }
    }
    if (r < 0) {
      for (Path& p : paths) p.rounds.clear();
    }
  }
  g.driver().StreamSynchronize(s);

  const double per_ns = TicksPerNs();
  std::printf(
      "# ns per launch: the median over %d rounds of each round's mean of %ld launches "
      "(%.3f ticks per ns)\n",
      rounds, launches, per_ns);
  std::printf("%-28s %8s %8s %8s %8s | %-22s %8s %8s %8s %8s\n", "path", "total", "before",
              "driver", "after", "over raw in its round", "total", "before", "driver", "after");
  for (const Path& p : paths) {
    auto part = [&](double Parts::*field, const Path* ref) {
      return MedianNs(p, field, ref, per_ns);
    };
    std::printf("%-28s %8.1f %8.1f %8.1f %8.1f", p.name.c_str(), part(&Parts::total, nullptr),
                part(&Parts::before, nullptr), part(&Parts::driver, nullptr),
                part(&Parts::after, nullptr));
    if (p.reference >= 0) {
      const Path* ref = &paths[p.reference];
      std::printf(" | %-22s %+8.1f %+8.1f %+8.1f %+8.1f", ref->name.c_str(),
                  part(&Parts::total, ref), part(&Parts::before, ref), part(&Parts::driver, ref),
                  part(&Parts::after, ref));
    }
    std::printf("\n");
  }
  if (kStamps) {
    std::printf(
        "\n# kpack's part before the driver, by step (profiling build): ns per launch, "
        "medians as above\n%-28s %8s %8s %8s %8s %8s\n",
        "path", "caller", "select", "pack", "prepare", "send");
    for (const Path& p : paths) {
      if (!p.kpack) continue;
      auto part = [&](double Parts::*field) { return MedianNs(p, field, nullptr, per_ns); };
      std::printf("%-28s %8.1f %8.1f %8.1f %8.1f %8.1f\n", p.name.c_str(), part(&Parts::caller),
                  part(&Parts::select), part(&Parts::pack), part(&Parts::prepare),
                  part(&Parts::send));
    }
  }
  return 0;
}
