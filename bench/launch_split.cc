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
// raw_params_stores64/args4 with 64 plain stores to the stack. The raw_then_*32/args4
// paths follow it with a copy of PackArgs's loops on data of their own, for 32 arguments
// (PackLoops below): what a packing loop costs right after the driver, with and without
// the caller's Arg array, the kind bytes, or any Arg array at all; and, inlined into a
// frame with the buffer on its stack as LaunchArgs has it, copying with std::memcpy (a
// __memcpy_chk call per copy in a fortified build) or with util/bytes.h's CopyBytes.
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
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/attributes.h"
#include "bench_setup.h"
#include "kpack/arg.h"
#include "ticks.h"
#include "util/bytes.h"

#if KPACK_LAUNCH_STAMPS
extern "C" uint64_t kpack_launch_stamps[4];  // runtime/launch.h
#endif

namespace {

using kpack::bench::ArgsKernel;
using kpack::bench::BenchSetup;
using kpack::bench::Ticks;

std::atomic<uint64_t> counted{0};  // raw_params_atomic's counter

// Probes of the per-argument cost (issue 25): a packing loop like PackArgs's, on data of
// its own, run right after a raw launch (so timed in the "after" column). The arguments
// are those of args32's kernel: 16 pointers, then 16 i32 (a CUdeviceptr and an int32_t
// per Arg, as a caller's Launch builds them).
constexpr int kProbePointers = 16, kProbeArgs = 32;
struct ProbeOp {
  uint16_t offset, arg_byte;
};
struct ProbeData {
  ProbeOp plan[kProbeArgs];  // pointers at 0..127, i32 at 128..191
  CUdeviceptr pointers[kProbePointers];
  int32_t ints[kProbeArgs - kProbePointers];
  alignas(16) unsigned char prebuilt[kProbeArgs * sizeof(kpack::Arg)];  // Args, built once
  alignas(64) std::byte buf[256];
  uint32_t shift = 0;  // where ProbeStackPack's buffer starts in its storage (a variant's buffer_shift)
};
ProbeData* probe = nullptr;  // on the heap, as a variant's data
uint64_t probe_sink = 0;  // a plain add: a locked one would wait for the driver's stores

ProbeData* MakeProbe() {
  auto* d = new ProbeData();
  for (int i = 0; i < kProbeArgs; ++i) {
    d->plan[i] = {static_cast<uint16_t>(i < kProbePointers ? 8 * i : 128 + 4 * (i - kProbePointers)),
                  static_cast<uint16_t>(16 * i)};
  }
  for (int i = 0; i < kProbePointers; ++i) d->pointers[i] = 0x7f0000000000ull + 256 * i;
  for (int i = 0; i < kProbeArgs - kProbePointers; ++i) d->ints[i] = 1000 + i;
  for (int i = 0; i < kProbeArgs; ++i) {
    const kpack::Arg a = i < kProbePointers ? kpack::Arg(d->pointers[i])
                                            : kpack::Arg(d->ints[i - kProbePointers]);
    std::memcpy(d->prebuilt + sizeof(kpack::Arg) * i, &a, sizeof a);
  }
  return d;
}

// A copy of N bytes: std::memcpy, as the launch path copied until session 29, or
// CopyBytes (util/bytes.h), as it copies now. They differ only in a fortified build
// (_FORTIFY_SOURCE, the default of Ubuntu's GCC and of kpack's CMake): there a memcpy
// into an object of known size is a call to __memcpy_chk.
template <bool std_memcpy, size_t N>
ABSL_ATTRIBUTE_ALWAYS_INLINE inline void Copy(void* dst, const void* src) {
  if constexpr (std_memcpy) {
    std::memcpy(dst, src, N);
  } else {
    kpack::internal::CopyBytes<N>(dst, src);
  }
}

// PackArgs's pointer and i32 loops (runtime/launch.h) over `args`, into `buf`; with
// `kinds` false, the same copies without the kind bytes' loads and tests.
template <bool kinds, bool std_memcpy>
ABSL_ATTRIBUTE_ALWAYS_INLINE inline uint64_t PackLoops(const void* args, std::byte* buf) {
  const auto* a = static_cast<const unsigned char*>(args);
  const ProbeOp* op = probe->plan;
  unsigned char pointer_kinds = 0;
#pragma GCC unroll 2
  for (const ProbeOp* const end = op + kProbePointers; op != end; ++op) {
    uint64_t bits;
    Copy<std_memcpy, 8>(&bits, a + op->arg_byte);
    if constexpr (kinds) pointer_kinds |= a[op->arg_byte + 8];
    Copy<std_memcpy, 8>(buf + op->offset, &bits);
  }
  unsigned char i32_or = 2, i32_and = 2;
  uint64_t bad_value = 0;
#pragma GCC unroll 2
  for (const ProbeOp* const end = probe->plan + kProbeArgs; op != end; ++op) {
    uint64_t bits;
    Copy<std_memcpy, 8>(&bits, a + op->arg_byte);
    const auto low = static_cast<uint32_t>(bits);
    if constexpr (kinds) {
      i32_or |= a[op->arg_byte + 8];
      i32_and &= a[op->arg_byte + 8];
      bad_value |= bits ^ static_cast<uint64_t>(static_cast<int64_t>(static_cast<int32_t>(low)));
    }
    Copy<std_memcpy, 4>(buf + op->offset, &low);
  }
  return (pointer_kinds & ~1u) | (i32_or ^ 2) | (i32_and ^ 2) | bad_value;
}

// The loops into a buffer reached through a pointer (the compiler knows no object size).
template <bool kinds>
ABSL_ATTRIBUTE_NOINLINE uint64_t ProbePack(const void* args, std::byte* buf) {
  return PackLoops<kinds, true>(args, buf);
}

// The caller's Arg array, built on the stack as Kernel::Launch builds it, then `f(array)`.
template <size_t... P, size_t... I, typename F>
ABSL_ATTRIBUTE_ALWAYS_INLINE inline uint64_t WithProbeArgs(std::index_sequence<P...>,
                                                           std::index_sequence<I...>, F f) {
  const kpack::Arg packed[] = {kpack::Arg(probe->pointers[P])..., kpack::Arg(probe->ints[I])...};
  asm volatile("" : : "r"(packed) : "memory");
  return f(packed);
}
template <typename F>
ABSL_ATTRIBUTE_NOINLINE uint64_t BuildProbeArgs(F f) {
  return WithProbeArgs(std::make_index_sequence<kProbePointers>(),
                       std::make_index_sequence<kProbeArgs - kProbePointers>(), f);
}

// The loops inlined into a frame with the buffer on its stack, as RuntimeImpl::LaunchArgs
// packs into its ParamStorage: an object whose size the compiler knows, so that in a
// fortified build each std::memcpy into it is a __memcpy_chk call.
template <bool std_memcpy>
ABSL_ATTRIBUTE_NOINLINE uint64_t ProbeStackPack(const kpack::Arg* args) {
  alignas(64) std::byte storage[4096 + 64];
  const uint64_t r = PackLoops<true, std_memcpy>(args, storage + probe->shift);
  asm volatile("" : : "r"(storage) : "memory");
  return r;
}

// The 32 values stored straight into the buffer at the plan's offsets: no Arg array.
ABSL_ATTRIBUTE_NOINLINE uint64_t ProbeDirect() {
  std::byte* const buf = probe->buf;
  const ProbeOp* op = probe->plan;
  for (int i = 0; i < kProbePointers; ++i, ++op) {
    std::memcpy(buf + op->offset, &probe->pointers[i], 8);
  }
  for (int i = 0; i < kProbeArgs - kProbePointers; ++i, ++op) {
    std::memcpy(buf + op->offset, &probe->ints[i], 4);
  }
  return 0;
}

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
  probe = MakeProbe();
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
    if (k.arity == 4) {
      // The per-argument probes after a raw launch (ProbePack above): the 32-Arg array
      // alone, the array and the packing loop, the loop over an array built once, the
      // loop without the kind bytes, and the values stored without an Arg array.
      auto after_raw = [&g, &k, s](std::string name, std::function<uint64_t()> probe_fn) {
        return Path{name + "/" + k.name, -1, false,
                    [&g, &k, s, probe_fn] {
                      const bool ok = g.RawParams(k, k.raw_function, s);
                      probe_sink += probe_fn();
                      return ok;
                    },
                    {}};
      };
      const size_t first_probe = paths.size();
      paths.push_back(after_raw("raw_then_build32", [] {
        return BuildProbeArgs([](const kpack::Arg*) -> uint64_t { return 0; });
      }));
      paths.push_back(after_raw("raw_then_build_pack32", [] {
        return BuildProbeArgs([](const kpack::Arg* a) { return ProbePack<true>(a, probe->buf); });
      }));
      paths.push_back(after_raw("raw_then_build_copy32", [] {
        return BuildProbeArgs(
            [](const kpack::Arg* a) { return ProbePack<false>(a, probe->buf); });
      }));
      paths.push_back(after_raw("raw_then_pack32",
                                [] { return ProbePack<true>(probe->prebuilt, probe->buf); }));
      paths.push_back(after_raw("raw_then_build_stack_memcpy32", [] {
        return BuildProbeArgs([](const kpack::Arg* a) { return ProbeStackPack<true>(a); });
      }));
      paths.push_back(after_raw("raw_then_build_stack_copybytes32", [] {
        return BuildProbeArgs([](const kpack::Arg* a) { return ProbeStackPack<false>(a); });
      }));
      paths.push_back(after_raw("raw_then_direct32", [] { return ProbeDirect(); }));
      for (size_t i = first_probe; i < paths.size(); ++i) paths[i].reference = raw;
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
  std::printf("%-36s %8s %8s %8s %8s | %-22s %8s %8s %8s %8s\n", "path", "total", "before",
              "driver", "after", "over raw in its round", "total", "before", "driver", "after");
  for (const Path& p : paths) {
    auto part = [&](double Parts::*field, const Path* ref) {
      return MedianNs(p, field, ref, per_ns);
    };
    std::printf("%-36s %8.1f %8.1f %8.1f %8.1f", p.name.c_str(), part(&Parts::total, nullptr),
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
