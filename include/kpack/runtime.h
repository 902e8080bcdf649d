// kpack/runtime.h: open a kernel pack and launch its kernels.
//
// A pack is a directory holding `manifest.json` (format `kpack/1` or `kpack/2`, see
// docs/pack-format.md) and the cubins it names. `Runtime::Open` reads and validates all
// of it as `Pack::Read` does (kpack/pack.h: sha256, every cubin's ELF against the
// manifest, grid expressions, dispatch tables) and loads the CUDA driver (dlopen, never
// linked). Each kernel variant is loaded into the driver once with the
// context-independent library API (`cuLibraryLoadData`), and then into each CUDA context
// that launches it (`cuKernelGetFunction`, which also checks it against that context's
// device): lazily at the first launch in that context, or ahead by `Preload()` in that
// context.
//
//   absl::StatusOr<kpack::Runtime> rt = kpack::Runtime::Open(dir);
//   if (!rt.ok()) return rt.status();                     // UNAVAILABLE without a driver, ...
//   absl::StatusOr<kpack::Kernel> add = rt->Find("add");  // resolve the name once
//   ...
//   const kpack::Grid grid{static_cast<uint32_t>((n + 1023) / 1024)};
//   return add->Launch(grid, stream, x, y, out, n);
//
// (examples/add_vectors.cc has the whole function; CI compiles it.)
//
// Arguments are the kernel's non-constexpr parameters in declaration order (see
// kpack/arg.h for the accepted C++ types; a tuple parameter's elements in its flattened
// order, named `t.0`, `t.1`, ... in the manifest). Each is checked against the
// parameter's Triton type: a wrong count, type or out-of-range integer is an
// INVALID_ARGUMENT naming the parameter, and nothing is launched. A `tensordesc`
// parameter takes a kpack::TensorDesc, checked as Triton checks a TensorDescriptor and
// encoded at launch (a CUtensorMap, for a variant that uses TMA: one cuTensorMapEncodeTiled
// per descriptor that parameter did not encode among its last 4, else a copy of the map it
// encoded then; a BoundLaunch encodes at Bind and Set only). Triton's hidden scratch
// parameters are filled by kpack (see `ReserveScratch`).
//
// Cost: a launch through `Kernel` or `BoundLaunch` does no heap allocation, takes no lock,
// formats no string and logs nothing; error messages are built only on failure. It makes
// one driver call besides cuLaunchKernelEx (cuCtxGetId, a thread-local read), plus one
// cuTensorMapEncodeTiled per TMA descriptor argument through `Kernel` that its parameter
// has not encoded among its last 4 (arg.h); a kernel
// with Triton scratch memory from kpack's arenas one more (the stream's capture status)
// and, on a stream of your own, a third (its id). The
// first launch of a variant in a context (loading) and the growth of a stream's scratch
// arena are the only slow paths, and both can be done ahead (`Preload`, `ReserveScratch`).
//
// Driver errors: a driver call that fails makes the kpack call return the status of its
// CUresult, with a message naming the driver function, the error and what kpack was
// doing: RESOURCE_EXHAUSTED for CUDA_ERROR_OUT_OF_MEMORY; INVALID_ARGUMENT for an invalid
// value, handle or image; UNAVAILABLE for a driver not initialized or without devices;
// FAILED_PRECONDITION for no binary for the GPU, not supported, an invalid context and
// stream-capture errors; INTERNAL for any other.
//
// Thread safety: `Runtime` and `Kernel` are safe to use from any number of threads at
// once (launch state is immutable after load; loading and scratch growth are
// synchronized). A `BoundLaunch` belongs to one thread at a time.
//
// Contexts: a launch goes to the calling thread's current CUDA context (none current is
// FAILED_PRECONDITION; `UseDevice` makes a device's primary context current, as the CUDA
// runtime would), and `stream` must belong to it (or be NULL, CU_STREAM_LEGACY or
// CU_STREAM_PER_THREAD), as for any driver launch. One Runtime serves every device and
// context. Contexts are told apart by cuCtxGetId, so a context destroyed and replaced by
// one at the same address gets its own CUfunctions and scratch, never the old ones.
//
// Scratch memory. Kernels that Triton compiled with global (or profile) scratch get a
// device buffer of grid.x*grid.y*grid.z*num_ctas*scratch_size bytes per launch, from:
//  - a `ScratchAllocator` the caller passes to the launch (LaunchArgs, BoundLaunch), or
//    else the one in `Options`, asked for each launch as Triton asks its allocator;
//  - else, outside a stream capture, an arena kpack keeps per stream: per real stream,
//    per context for the legacy (NULL) stream, and per thread for CU_STREAM_PER_THREAD
//    (one handle, but a different stream on each thread). It grows on demand (to at
//    least twice its size; buffers already used stay allocated for work in flight) and
//    is freed by `ReleaseScratch(stream)` or the Runtime's destruction; a thread's
//    CU_STREAM_PER_THREAD arenas (and its reservation) also when the thread exits, on
//    that thread (cuMemFree, which waits for its launches still in flight: a thread
//    exiting with work queued waits for it; in relaxed capture mode, so that another
//    thread's capture in global mode is not invalidated by it);
//  - else, inside a capture, an arena owned by the captured graph (see below).
//
// CUDA graphs. kpack launches may be captured (cuStreamBeginCapture) and the graph
// replayed on any stream. A launch on a capturing stream never loads a kernel and never
// allocates: such a launch is FAILED_PRECONDITION naming what to call beforehand, and the
// capture stays valid. Loading that is not on a capturing stream (Preload(), or a lazy
// load by a launch on another stream) runs in RELAXED capture interaction mode, so that
// it neither fails nor invalidates a capture this thread or another runs meanwhile.
// Before each capture, in its context:
//  - `Preload()`, so every variant is loaded for the context;
//  - `ReserveScratch(stream, bytes)` for each captured stream that launches kernels with
//    scratch (without a ScratchAllocator), `bytes` at least what one launch needs.
// Scratch used inside a capture belongs to the graph, not the stream: the first such
// launch on a captured stream takes the arena reserved for that stream (or an idle one
// of sufficient size) and gives it to the capture's graph through a CUDA user object;
// later launches of the same capture on that stream share it (they are ordered in the
// graph as on the stream). When the graph and every executable instantiated from it are
// destroyed, the driver runs the user object's destructor (on its own thread, shortly
// after) and the arena returns to kpack's pool, from which later reservations and streams
// take before allocating (an arena not back yet is not waited for: they allocate). So a
// replay never races with eager launches on the capture stream or with other graphs.
// The destructor never blocks (it takes no lock and makes no CUDA call), and kpack holds
// no lock across a driver call: a driver call waiting for GPU work that waits for a host
// callback queued behind the destructor never waits for kpack.
// Executables instantiated from one graph share its arena: do not run two of them at
// once. Destroy such graphs before the Runtime: an arena returned after the Runtime is
// gone cannot be freed (no CUDA call is allowed in the destructor callback) and leaks.
//
// Ownership: `Kernel` handles are views into their `Runtime` and must not outlive it.
// Device memory passed as arguments stays the caller's.

#ifndef KPACK_RUNTIME_H_
#define KPACK_RUNTIME_H_

#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kpack/arg.h"
#include "kpack/pack.h"

namespace kpack {

class StepGraph;
struct BoundLaunchSnapshot;

namespace internal {
struct KernelData;
struct BoundState;
class RuntimeImpl;
}  // namespace internal

// Scratch memory from the caller, as Triton's triton.set_allocator provides it: `allocate`
// is called once per launch and scratch kind (global, then profile, each only when the
// kernel has it) with the bytes, the alignment the kernel needs, and the launch's stream;
// it returns a device pointer with that alignment in the current context, or 0 to fail
// the launch (RESOURCE_EXHAUSTED). kpack never frees it: the memory must stay valid until
// the launch's work on `stream` completes, as a stream-ordered allocator (PyTorch's
// caching allocator, cuMemAllocAsync pools) guarantees when freed right after the launch.
// Called on the launching thread, also inside a stream capture (where it must return
// memory the captured graph may use for as long as it lives). A plain function pointer
// and `user_data`, not std::function: copying it costs nothing and it never allocates.
struct ScratchAllocator {
  CUdeviceptr (*allocate)(size_t bytes, size_t align, CUstream stream, void* user_data) = nullptr;
  void* user_data = nullptr;
};

// A launch ready for the driver (BoundLaunch::Prepare): exactly what BoundLaunch::Launch
// would pass to cuLaunchKernelEx, i.e. `cuLaunchKernelEx(&p.config, p.function, nullptr,
// p.extra)`. `function` is the variant's CUfunction in the context current at Prepare; `config`
// holds the grid (x already multiplied by num_ctas), block, dynamic shared bytes, stream
// and launch attributes (cluster, PDL, cooperative); `params` is the packed parameter
// buffer with the scratch pointers filled in, and `extra` the CU_LAUNCH_PARAM_BUFFER_*
// array pointing at it (null for a kernel without parameters). `function` is null, and
// nothing is to be launched, when the grid has no programs.
//
// Lifetimes: `config.attrs` points into the Runtime (valid while it lives); `params` and
// `extra` point into the BoundLaunch, valid until it is destroyed or changed (Set,
// set_grid, set_stream, set_scratch_allocator) or prepared again; `function` is valid
// while the Runtime lives and its context exists. The scratch pointers in `params` are
// valid for work on `config.hStream` until ReleaseScratch on that stream or the Runtime's
// destruction (kpack's arenas), or as long as the caller's ScratchAllocator keeps them:
// to send the launch anywhere but in `config.hStream`'s order (say as a graph node you
// build yourself), give the BoundLaunch a ScratchAllocator so that you own its scratch.
struct PreparedLaunch {
  CUfunction function = nullptr;
  CUlaunchConfig config{};
  const void* params = nullptr;
  size_t param_bytes = 0;
  void** extra = nullptr;
};

struct Options {
  // The driver library to dlopen. Empty: the environment variable KPACK_CUDA_DRIVER if
  // set, else "libcuda.so.1".
  std::string driver_path;
  // Load every variant during Open (like calling Preload()), so that no launch in the
  // calling thread's current context (which must exist) ever loads.
  bool preload = false;
  // Where every launch of a kernel with scratch memory takes it from, unless the launch
  // brings its own; unset (allocate null): kpack's arenas. See ScratchAllocator.
  ScratchAllocator scratch_allocator;
  // Emit an NVTX range (domain "kpack", message = kernel name) around every launch.
  // The environment variable KPACK_NVTX=0 also turns it off; building with
  // -DKPACK_ENABLE_NVTX=OFF removes it entirely.
  bool nvtx = true;
};

// A launch whose arguments are already checked, dispatched and packed into the chosen
// variant's parameter buffer. `Set` rewrites one argument's bytes (type-checked like at
// Bind); when that argument decides the bucket or an assumption, Set selects the variant
// again and repacks if it changes, so a BoundLaunch never launches a variant whose
// assumptions do not hold. `Launch` sends the buffer. Tensor descriptors: the BoundLaunch
// keeps copies of those it was bound or Set with (the caller's may go away), encodes them
// at Bind, and re-encodes only the one a Set changes (all, when Set changes the variant;
// a map its parameter encoded lately is copied instead, arg.h); a Set refused leaves the
// previous value bound. A grid from the kernel's grid expressions is evaluated once after
// each Bind, Set or set_grid, not at every Launch. Not thread-safe: one thread at a
// time per BoundLaunch. Valid while its Runtime lives. Move-only.
class BoundLaunch {
 public:
  BoundLaunch(BoundLaunch&&) noexcept;
  BoundLaunch& operator=(BoundLaunch&&) noexcept;
  ~BoundLaunch();

  // OUT_OF_RANGE for an index past the arguments; INVALID_ARGUMENT, naming the parameter,
  // for a value it does not take (the bound value stays).
  absl::Status Set(size_t index, Arg value);
  void set_grid(const Grid& grid);
  void set_stream(CUstream stream);
  // Scratch for this BoundLaunch's launches from `allocator` (unset: as Runtime-wide).
  void set_scratch_allocator(const ScratchAllocator& allocator);
  absl::Status Launch();
  // Everything Launch does but the cuLaunchKernelEx: loads the variant for the current
  // context if needed, takes its scratch, and returns the driver call's arguments (see
  // PreparedLaunch for what they are and how long they live). Counts no launch.
  absl::StatusOr<PreparedLaunch> Prepare();
  // What this BoundLaunch holds now (see BoundLaunchSnapshot): loads nothing, calls no
  // driver function, allocates nothing.
  BoundLaunchSnapshot snapshot() const;

 private:
  friend class Kernel;
  // StepGraph (kpack/graph.h) reads each BoundLaunch's variant, grid and packed bytes at
  // every replay, through the state behind it, which stays put when the BoundLaunch moves.
  friend class StepGraph;
  explicit BoundLaunch(std::unique_ptr<internal::BoundState> state);
  std::unique_ptr<internal::BoundState> state_;
};

// A resolved kernel. Cheap to copy (one pointer); valid while its Runtime lives.
class Kernel {
 public:
  Kernel() = default;  // An empty handle; launching it is FAILED_PRECONDITION.

  bool valid() const { return data_ != nullptr; }
  std::string_view name() const;
  // The call parameters (non-constexpr), in the order Launch takes them.
  size_t num_args() const;
  // Empty for an index past num_args().
  std::string_view arg_name(size_t index) const;
  std::string_view arg_type(size_t index) const;  // Triton type string, e.g. "*fp32"
  // Index of the call parameter `name`, or NOT_FOUND.
  absl::StatusOr<size_t> ArgIndex(std::string_view name) const;
  // Everything the manifest says about this kernel: parameters, buckets, grid
  // expressions, and every variant's metadata and layout (kpack/pack.h). Precondition:
  // valid(). The reference lives as long as the Runtime.
  const KernelInfo& info() const;

  // A handle that launches only the variants named in `variants` (of this kernel),
  // choosing among them as a launch chooses among all: the bucket, then the most
  // specialized variant whose assumptions hold. With `ignore_buckets` the handle has no
  // buckets, and every call chooses among all the named variants by specialization
  // alone: for a caller that fixed the compile-time configuration itself, as a Triton
  // `kernel[grid](..., BLOCK=64, num_warps=4)` call does (kpack's Python drop-in for
  // such calls restricts a kernel to the variants of that configuration), whichever
  // bucket the configuration was tuned for. The handle's info() describes the named
  // variants only (and no buckets when ignored); its variant_stats() count the
  // variants' launches through any handle. INVALID_ARGUMENT for an empty list, a name
  // that is not a variant of this kernel (listing those there are) or one listed twice,
  // and, keeping buckets, a bucket that none of the named variants serves (naming it).
  // Views live as long as the Runtime and the same request returns the same view
  // (naming every variant without `ignore_buckets` returns this kernel); the first
  // request takes a lock and allocates, later ones take the lock. Thread-safe.
  absl::StatusOr<Kernel> Restrict(std::span<const std::string> variants,
                                  bool ignore_buckets = false) const;

  // Loads every variant of this kernel into the current CUDA context now and checks it
  // against its device, as Runtime::Preload does for all kernels.
  absl::Status Preload() const;

  // Launches on `stream` (in the calling thread's current CUDA context) with `grid`
  // programs. The variant is chosen from the arguments (shape bucket, then the most
  // specialized variant whose assumptions hold; see docs/pack-format.md); an argument
  // list no variant is valid for is INVALID_ARGUMENT naming the parameter, its value and
  // the failed assumption, and launches nothing. A grid with zero programs launches
  // nothing and returns OK; one past the driver's limits (2^31-1 blocks along x, the grid
  // times num_ctas; 65535 along y and z) is INVALID_ARGUMENT and launches nothing.
  template <typename... Args>
  absl::Status Launch(const Grid& grid, CUstream stream, const Args&... args) const {
    const Arg packed[] = {Arg(args)..., Arg(0)};  // trailing element: no zero-size array
    return LaunchArgs(grid, stream, std::span<const Arg>(packed, sizeof...(Args)));
  }
  // The same with the grid computed from the manifest's grid expressions for the chosen
  // variant (FAILED_PRECONDITION if the kernel has none).
  template <typename... Args>
  absl::Status Launch(CUstream stream, const Args&... args) const {
    const Arg packed[] = {Arg(args)..., Arg(0)};
    return LaunchArgs(stream, std::span<const Arg>(packed, sizeof...(Args)));
  }
  // The same two, for argument lists built at run time.
  absl::Status LaunchArgs(const Grid& grid, CUstream stream, std::span<const Arg> args) const;
  absl::Status LaunchArgs(CUstream stream, std::span<const Arg> args) const;
  // And with scratch memory (for kernels that have it) from `scratch` for this launch.
  absl::Status LaunchArgs(const Grid& grid, CUstream stream, std::span<const Arg> args,
                          const ScratchAllocator& scratch) const;
  absl::Status LaunchArgs(CUstream stream, std::span<const Arg> args,
                          const ScratchAllocator& scratch) const;

  // Checks, dispatches and packs the arguments once; the returned BoundLaunch relaunches
  // them with only the changed bytes rewritten. Without a grid, the grid expressions are
  // evaluated at each Launch.
  absl::StatusOr<BoundLaunch> Bind(const Grid& grid, CUstream stream,
                                   std::span<const Arg> args) const;
  absl::StatusOr<BoundLaunch> Bind(CUstream stream, std::span<const Arg> args) const;
  template <typename... Args>
  absl::StatusOr<BoundLaunch> BindArgs(const Grid& grid, CUstream stream,
                                       const Args&... args) const {
    const Arg packed[] = {Arg(args)..., Arg(0)};
    return Bind(grid, stream, std::span<const Arg>(packed, sizeof...(Args)));
  }
  template <typename... Args>
  absl::StatusOr<BoundLaunch> BindArgs(CUstream stream, const Args&... args) const {
    const Arg packed[] = {Arg(args)..., Arg(0)};
    return Bind(stream, std::span<const Arg>(packed, sizeof...(Args)));
  }

  // The name of the variant these arguments would launch, or the error a launch would
  // return for a wrong argument count or arguments no variant takes: the dispatch alone
  // (buckets and assumptions), without packing. The other arguments' types and ranges
  // are checked by Launch and Bind only. Launches nothing.
  absl::StatusOr<std::string_view> SelectVariant(std::span<const Arg> args) const;
  // The grid a launch without an explicit grid would get: the manifest's grid expressions
  // evaluated for these arguments and the variant they select. FAILED_PRECONDITION if
  // the kernel has no grid expressions; the error a launch would return for arguments no
  // variant takes or a grid that does not evaluate. Launches nothing.
  absl::StatusOr<Grid> GridFor(std::span<const Arg> args) const;

  // Launches per variant since Open, and how many of them were fallbacks: launches for
  // which a more specialized variant of the same bucket existed but one of its
  // assumptions failed (e.g. a misaligned pointer sending every call to the generic
  // variant). Counted with relaxed atomics; a snapshot, not synchronized with launches in
  // flight on other threads.
  struct VariantStats {
    std::string_view variant;
    uint64_t launches = 0;
    uint64_t fallback_launches = 0;
  };
  std::vector<VariantStats> variant_stats() const;

 private:
  friend class internal::RuntimeImpl;
  explicit Kernel(const internal::KernelData* data) : data_(data) {}
  absl::StatusOr<BoundLaunch> BindImpl(const Grid* grid, CUstream stream,
                                       std::span<const Arg> args) const;
  const internal::KernelData* data_ = nullptr;
};

// A BoundLaunch as it stands (BoundLaunch::snapshot()): what its next Launch sends, for
// tools, tests and callers that inspect launches or send them themselves (Prepare gives
// the driver call itself). `args` and `params` point into the BoundLaunch: they stay valid
// when it moves, and until it is destroyed or changed (Set, set_grid, set_stream,
// set_scratch_allocator); Launch and Prepare rewrite the scratch slots of `params` in
// place. `variant` lives as long as the Runtime.
struct BoundLaunchSnapshot {
  Kernel kernel;  // the kernel (or Kernel::Restrict view) it was bound from
  // The variant the arguments select now, one of kernel.info().variants (Set selects it
  // again when an argument that decides the bucket or an assumption changes).
  const VariantInfo* variant = nullptr;
  // The choice was a fallback: a more specialized variant of the same bucket exists, but
  // an assumption of it fails for these arguments (counted in variant_stats()).
  bool fallback = false;
  // The explicit grid (Bind with a grid, set_grid); nullopt: the grid expressions,
  // evaluated at each Launch for the arguments (Kernel::GridFor(args) gives it).
  std::optional<Grid> grid;
  CUstream stream = nullptr;
  ScratchAllocator scratch;   // set_scratch_allocator's; unset: the Runtime's (Options)
  std::span<const Arg> args;  // the call arguments bound now; a tensordesc's points at the
                              // BoundLaunch's own copy of the descriptor
  // The packed parameter buffer, laid out as variant->layout says (param_bytes long), every
  // argument's bytes as they go to the kernel; the scratch slots hold what the last
  // Launch or Prepare wrote there (0 before either).
  std::span<const std::byte> params;
};

class Runtime {
 public:
  // Opens the pack in `dir`: Pack::Read (every check that needs no device, with the same
  // errors), then the driver, then the launch tables. A pack that Pack::Read accepts
  // opens wherever a driver loads. Kernels load into the driver lazily (or here, with
  // Options::preload), and only loading checks them against the devices. Errors:
  // UNAVAILABLE when no CUDA driver can be loaded or initialized (the message says what
  // was tried); INVALID_ARGUMENT for anything wrong in the pack (the message names the
  // file, kernel, variant and field); NOT_FOUND when the directory or a cubin is missing;
  // UNIMPLEMENTED for pack features this version lacks; INVALID_ARGUMENT too when
  // KPACK_LOG_LEVEL is set to something other than trace, debug, info, warn, error,
  // critical or off (the level of kpack's spdlog logger "kpack").
  static absl::StatusOr<Runtime> Open(std::string_view dir, const Options& options = {});

  Runtime(Runtime&&) noexcept;
  Runtime& operator=(Runtime&&) noexcept;
  // Frees the scratch arenas (cuMemFree waits for the GPU work that used them) and
  // unloads the libraries. No launch may be in flight on the host side. Destroy captured
  // graphs that own kpack scratch first (see "CUDA graphs").
  ~Runtime();

  // Resolves a kernel by name: NOT_FOUND naming the pack and listing its kernels if
  // there is none.
  absl::StatusOr<Kernel> Find(std::string_view name) const;
  std::vector<std::string> kernel_names() const;
  // The pack this Runtime opened, described (kpack/pack.h); lives as long as the Runtime.
  const Pack& pack() const;

  // Launch by name: one hash lookup, then the same as Kernel::Launch.
  template <typename... Args>
  absl::Status Launch(std::string_view name, const Grid& grid, CUstream stream,
                      const Args&... args) const {
    const Arg packed[] = {Arg(args)..., Arg(0)};
    return LaunchArgs(name, grid, stream, std::span<const Arg>(packed, sizeof...(Args)));
  }
  absl::Status LaunchArgs(std::string_view name, const Grid& grid, CUstream stream,
                          std::span<const Arg> args) const;
  // By name with the grid from the manifest's grid expressions.
  template <typename... Args>
  absl::Status Launch(std::string_view name, CUstream stream, const Args&... args) const {
    const Arg packed[] = {Arg(args)..., Arg(0)};
    return LaunchArgs(name, stream, std::span<const Arg>(packed, sizeof...(Args)));
  }
  absl::Status LaunchArgs(std::string_view name, CUstream stream, std::span<const Arg> args) const;

  // Loads every variant of every kernel into the calling thread's current CUDA context
  // (FAILED_PRECONDITION if there is none) and checks it against the context's device,
  // so that no launch in this context loads. Call it in each context that launches, and
  // before capturing a CUDA graph there. Idempotent per context.
  absl::Status Preload();

  // Makes launches on `stream` that need at most `bytes` of scratch memory allocate
  // nothing: sizes `stream`'s arena, and sets aside an arena of `bytes` for the next
  // capture on `stream` (which the capture's graph then owns; see "CUDA graphs" above:
  // call it before each capture). A launch needs grid.x*grid.y*grid.z*num_ctas*
  // (global_scratch_size, plus profile_scratch_size at its alignment) bytes.
  // FAILED_PRECONDITION while `stream` is being captured (0 bytes: nothing to do, OK on
  // any stream). Works in `stream`'s context.
  absl::Status ReserveScratch(CUstream stream, size_t bytes);
  // Frees `stream`'s arena and capture reservation (cuMemFree, which waits for the work
  // that used them). For CU_STREAM_PER_THREAD, the calling thread's (freed anyway when the
  // thread exits). Call it before destroying a stream whose launches had scratch;
  // otherwise the arena is kept until the Runtime is destroyed, or freed when a new
  // stream comes with the same handle.
  // FAILED_PRECONDITION while `stream` is being captured. No launch may be in flight on
  // the host side on `stream` meanwhile.
  absl::Status ReleaseScratch(CUstream stream);

  // Devices, for callers with no CUDA runtime of their own (a launch needs a current
  // context; see "Contexts" above). Both go through the driver this Runtime loaded and are
  // thread-safe.
  //
  // The ordinal (what cuDeviceGet takes; torch's device index and DLPack's device_id) of
  // the device of the calling thread's current CUDA context. FAILED_PRECONDITION when no
  // context is current. Costs one cuCtxGetId (a thread-local read) and a short lock-free
  // lookup once this Runtime has seen the context; the first call in a context asks the
  // driver (cuCtxGetDevice, then cuDeviceGet over the devices, whose CUdevice handles need
  // not be their ordinals) and allocates.
  absl::StatusOr<int> CurrentDevice() const;
  // Makes device `ordinal`'s primary context current on the calling thread, as the CUDA
  // runtime does at a thread's first call on a device (and so torch, once it has put a
  // tensor there): cuDevicePrimaryCtxRetain, then cuCtxSetCurrent. The retain is never
  // released (each call adds one), so the primary context lives until the process exits,
  // like the CUDA runtime's. INVALID_ARGUMENT, giving the number of devices, for an
  // ordinal that is not a device.
  absl::Status UseDevice(int ordinal) const;

  // Counters for tests and monitoring.
  struct Stats {
    size_t libraries_loaded = 0;      // cuLibraryLoadData calls that succeeded
    size_t scratch_arenas = 0;        // streams (per thread: live threads' per-thread
                                      // streams) with an arena
    size_t scratch_reserved = 0;      // arenas ReserveScratch set aside for a capture
    size_t scratch_in_graphs = 0;     // arenas owned by captured graphs
    size_t scratch_idle = 0;          // arenas graphs gave back, not yet reused
    size_t scratch_bytes = 0;         // device bytes held by all of the above
  };
  Stats stats() const;

 private:
  explicit Runtime(std::unique_ptr<internal::RuntimeImpl> impl);
  std::unique_ptr<internal::RuntimeImpl> impl_;
};

}  // namespace kpack

#endif  // KPACK_RUNTIME_H_
