// kpack/runtime.h: open a kernel pack and launch its kernels.
//
// A pack is a directory holding `manifest.json` (format `kpack/1` or `kpack/2`, see
// docs/pack-format.md) and the cubins it names. `Runtime::Open` reads and validates all
// of it as `Pack::Read` does (kpack/pack.h: sha256, every cubin's ELF against the
// manifest, grid expressions, dispatch tables) and loads the CUDA driver (dlopen, never
// linked). Kernels are loaded into
// the driver with the context-independent library API (`cuLibraryLoadData`), once for
// every device and context: lazily at their first launch, or all at once by `Preload()`
// (required before CUDA graph capture, which forbids loading).
//
//   absl::StatusOr<kpack::Runtime> rt = kpack::Runtime::Open("/opt/packs/mypack");
//   if (!rt.ok()) return rt.status();
//   absl::StatusOr<kpack::Kernel> add = rt->Find("add");     // resolve the name once
//   ...
//   absl::Status s = add->Launch(kpack::Grid{blocks}, stream, x, y, out, n);
//
// Arguments are the kernel's non-constexpr parameters in declaration order (see
// kpack/arg.h for the accepted C++ types). Each is checked against the parameter's Triton
// type: a wrong count, type or out-of-range integer is an INVALID_ARGUMENT naming the
// parameter, and nothing is launched. Triton's hidden scratch parameters are filled by
// kpack (see `ReserveScratch`).
//
// Cost: a launch through `Kernel` or `BoundLaunch` does no heap allocation, takes no lock,
// formats no string and logs nothing; error messages are built only on failure. The first
// launch of a variant (lazy load) and the growth of a stream's scratch arena are the only
// slow paths, and both can be done ahead (`Preload`, `ReserveScratch`).
//
// Thread safety: `Runtime` and `Kernel` are safe to use from any number of threads at
// once (launch state is immutable after load; lazy loading is synchronized). A
// `BoundLaunch` belongs to one thread at a time.
//
// Contexts: a launch goes to the calling thread's current CUDA context, and `stream` must
// belong to it (or be a null/legacy/per-thread stream), as for any driver launch. One
// Runtime serves every device and context: kernels are loaded once, context-independently.
//
// Ownership: `Kernel` handles are views into their `Runtime` and must not outlive it.
// Device memory passed as arguments stays the caller's.

#ifndef KPACK_RUNTIME_H_
#define KPACK_RUNTIME_H_

#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kpack/arg.h"
#include "kpack/pack.h"

namespace kpack {

namespace internal {
struct KernelData;
struct BoundState;
class RuntimeImpl;
struct KernelAccess;  // `kpack bench` only, until BoundLaunch can prepare a raw launch
}  // namespace internal

struct Options {
  // The driver library to dlopen. Empty: the environment variable KPACK_CUDA_DRIVER if
  // set, else "libcuda.so.1".
  std::string driver_path;
  // Load every variant during Open (like calling Preload()), so that no launch ever loads.
  // Needs a current CUDA context on the calling thread.
  bool preload = false;
  // Emit an NVTX range (domain "kpack", message = kernel name) around every launch.
  // The environment variable KPACK_NVTX=0 also turns it off; building with
  // -DKPACK_ENABLE_NVTX=OFF removes it entirely.
  bool nvtx = true;
};

// A launch whose arguments are already checked, dispatched and packed into the chosen
// variant's parameter buffer. `Set` rewrites one argument's bytes (type-checked like at
// Bind); when that argument decides the bucket or an assumption, Set selects the variant
// again and repacks if it changes, so a BoundLaunch never launches a variant whose
// assumptions do not hold. `Launch` sends the buffer. Not thread-safe: one thread at a time per
// BoundLaunch. Valid while its Runtime lives. Move-only.
class BoundLaunch {
 public:
  BoundLaunch(BoundLaunch&&) noexcept;
  BoundLaunch& operator=(BoundLaunch&&) noexcept;
  ~BoundLaunch();

  absl::Status Set(size_t index, Arg value);
  void set_grid(const Grid& grid);
  void set_stream(CUstream stream);
  absl::Status Launch();

 private:
  friend class Kernel;
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

  // Loads every variant of this kernel now and checks it against the current device, as
  // Runtime::Preload does for all kernels. Needs a current CUDA context.
  absl::Status Preload() const;

  // Launches on `stream` (in the calling thread's current CUDA context) with `grid`
  // programs. The variant is chosen from the arguments (shape bucket, then the most
  // specialized variant whose assumptions hold; see docs/pack-format.md); an argument
  // list no variant is valid for is INVALID_ARGUMENT naming the parameter, its value and
  // the failed assumption, and launches nothing. A grid with zero programs launches
  // nothing and returns OK.
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
  // return. Launches nothing.
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
  friend struct internal::KernelAccess;
  explicit Kernel(const internal::KernelData* data) : data_(data) {}
  absl::StatusOr<BoundLaunch> BindImpl(const Grid* grid, CUstream stream,
                                       std::span<const Arg> args) const;
  const internal::KernelData* data_ = nullptr;
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
  // UNIMPLEMENTED for pack features this version lacks.
  static absl::StatusOr<Runtime> Open(std::string_view dir, const Options& options = {});

  Runtime(Runtime&&) noexcept;
  Runtime& operator=(Runtime&&) noexcept;
  // Frees the scratch arenas and unloads the libraries. No launch may be in flight on the
  // host side; kernels already enqueued on the GPU are unaffected by the host objects but
  // the scratch memory they use is freed, so synchronize their streams first.
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

  // Loads every variant of every kernel now and checks it against the current device.
  // Needs a current CUDA context on the calling thread. Idempotent.
  absl::Status Preload();

  // Makes `stream`'s scratch arena at least `bytes` large (in the current context), so
  // that launches of kernels with global/profile scratch never allocate, e.g. before
  // CUDA graph capture. A kernel needs grid.x*grid.y*grid.z*num_ctas*scratch_size bytes.
  absl::Status ReserveScratch(CUstream stream, size_t bytes);

  // Counters for tests and monitoring.
  struct Stats {
    size_t libraries_loaded = 0;  // cuLibraryLoadData calls that succeeded
    size_t scratch_arenas = 0;    // streams that own a scratch arena
    size_t scratch_bytes = 0;     // device bytes held by all arenas
  };
  Stats stats() const;

 private:
  explicit Runtime(std::unique_ptr<internal::RuntimeImpl> impl);
  std::unique_ptr<internal::RuntimeImpl> impl_;
};

}  // namespace kpack

#endif  // KPACK_RUNTIME_H_
