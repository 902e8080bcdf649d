// The state behind kpack::Runtime, Kernel and BoundLaunch. Everything here is built at
// Open and immutable afterwards, except each variant's load state (its library, and its
// CUfunction per context, each published once through an atomic) and the scratch arenas
// (see launch/scratch.h).

#ifndef KPACK_SRC_RUNTIME_RUNTIME_IMPL_H_
#define KPACK_SRC_RUNTIME_RUNTIME_IMPL_H_

#include <cuda.h>

#include <array>
#include <atomic>
#include <cstddef>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "dispatch/dispatch.h"
#include "dispatch/grid_expr.h"
#include "driver/driver.h"
#include "kpack/runtime.h"
#include "launch/scratch.h"
#include "launch/tensordesc.h"
#include "manifest/manifest.h"
#include "pack/pack_state.h"
#include "runtime/devices.h"

namespace kpack::internal {

class RuntimeImpl;
struct KernelData;

// Where call argument i goes in a variant's parameter buffer.
struct ArgSlot {
  static constexpr uint16_t kDropped = UINT16_MAX;  // eq1: compiled away, not passed
  uint16_t offset;  // a tensor descriptor's: its first part's (its parts: desc_slots)
  ParamType type;
  // kTensorDesc: the index of its DescSlot in VariantData::desc_slots, the same in every
  // variant (the kernel's tensordesc parameters in declaration order).
  uint8_t desc = 0;
};
static_assert(sizeof(ArgSlot) == 4);

// One step of a variant's packing plan (VariantData::pack_ops, built at Open): the Arg at
// byte `arg_byte` of the call's Arg array (16 * its index) goes to the slot at `offset`.
// The op's group, fixed by the parameter's type, says how. The pointer group stores the
// Arg's 8 bytes when its kind is a pointer kind (T* or CUdeviceptr), the i32 group the low
// 4 bytes of a kSigned Arg whose value fits: both tests are constants of PackArgs (kind
// bytes folded with OR and AND across the group). The other 8-byte slots (i64, u64, fp64)
// store the 8 bytes when the kind passes (kind & mask) == want, with mask and want from
// the op's entry in pack_more (one kind, or two that differ in one bit: a u64 takes
// CUdeviceptr and the other unsigned integers); fp32 takes a float's bits or a double
// rounded to float. A launch runs one loop per group with no branch on types: every op
// stores, and the checks of all the ops fold into one word tested once (PackArgs).
// Anything else -- another kind, an i32 that does not fit, another parameter type -- is
// PackArg's, which decides. Four bytes: a 32-argument plan is two cache lines, which a
// launch after a real driver's (it evicts them) reads again.
struct PackOp {
  uint16_t offset;
  uint16_t arg_byte;
};
static_assert(sizeof(PackOp) == 4);

// The width of one of a packing plan's zero stores (VariantData::pack_more).
inline constexpr uint32_t kZeroStoreBytes = 16;

// Storage for one parameter buffer. A variant whose layout has CUtensorMap slots starts
// its buffer `buffer_shift` bytes in, so that those slots lie at 64-byte aligned addresses
// (cuTensorMapEncodeTiled writes only there, and kpack encodes in place).
struct ParamStorage {
  alignas(64) std::byte bytes[kMaxParamBytes + 64];
};

// Launch counters, sharded so that threads launching the same variant do not contend
// on one cache line. Relaxed atomics: they count, they order nothing.
struct alignas(64) CounterShard {
  std::atomic<uint64_t> launches{0};
  std::atomic<uint64_t> fallbacks{0};
};
inline constexpr size_t kCounterShards = 16;

// This thread's shard, assigned round-robin on first use.
inline size_t ThreadShard() {
  static std::atomic<size_t> next{0};
  thread_local const size_t shard = next.fetch_add(1, std::memory_order_relaxed) % kCounterShards;
  return shard;
}

// A variant's CUfunction in one CUDA context (cuKernelGetFunction there), in a list that
// only grows, newest first; nodes are immutable and live as long as their variant.
struct ContextFunction {
  uint64_t context = 0;  // cuCtxGetId: a context's handle may be reused, its id never
  CUfunction function = nullptr;
  const ContextFunction* next = nullptr;
};

// The launch-time view of a variant. The fields copied from VariantSpec are copied on
// purpose: a launch reads only this struct. A real driver's launch evicts the launcher's
// data from L1 between launches, so what every launch reads is packed into the first
// two cache lines; the grid expressions, counters and load state follow.
struct alignas(64) VariantData {
  // ---- read by every launch
  const KernelData* kernel = nullptr;
  // The variant's CUfunction in the first context that loaded it ("home"), published with
  // release order once every load-time check for that context has passed; home_context
  // (its cuCtxGetId) is written before and immutable after. Launches in other contexts
  // find theirs in `contexts`; each context gets its own through cuKernelGetFunction,
  // which loads the kernel there, so that no launch loads anything (see Load).
  mutable std::atomic<CUfunction> home_function{nullptr};
  mutable uint64_t home_context = 0;
  // The packing plan (PackOp): num_pointer ops of pointer slots, num_copy8 ops of the
  // other 8-byte slots (i64, u64, fp64), then num_i32 ops of i32 slots (a kSigned Arg that fits), then num_fp32 ops of
  // fp32 slots (a float or a double). `pack_more` lists the num_generic call arguments
  // packed through PackArg or PackDesc at every launch (the other types, tensor
  // descriptors), then the offsets of num_zero_stores zero stores (kZeroStoreBytes each)
  // covering the bytes no argument writes (alignment gaps, scratch slots), then the kind
  // test of each of the num_copy8 ops (mask | want << 8); zero_all: too many zero stores,
  // the buffer is cleared whole. Both point into plan_ops and plan_more.
  const PackOp* pack_ops = nullptr;
  const uint32_t* pack_more = nullptr;
  uint32_t num_args = 0;
  uint32_t num_generic = 0;
  uint16_t num_pointer = 0;
  uint16_t num_copy8 = 0;
  uint16_t num_i32 = 0;
  uint16_t num_fp32 = 0;
  uint16_t num_zero_stores = 0;
  bool zero_all = false;
  bool has_grid = false;  // the kernel has grid expressions (`grid` below)
  uint32_t param_bytes = 0;
  uint32_t buffer_shift = 0;  // where in a ParamStorage this variant's buffer starts
  uint32_t block_x = 0;
  uint32_t num_ctas = 1;
  uint32_t shared = 0;
  unsigned num_attrs = 0;
  int32_t global_scratch_offset = -1;  // slot offset, -1 if the layout has none
  int32_t profile_scratch_offset = -1;
  // Bytes per program of each scratch kind and their alignments (in an arena, profile
  // scratch starts at the first multiple of its alignment after global scratch).
  uint64_t global_scratch_size = 0;
  uint64_t profile_scratch_size = 0;
  uint64_t profile_scratch_align = 1;

  // ---- read by launches with attributes or grid expressions; the driver reads attrs
  std::array<CUlaunchAttribute, 4> attrs{};
  // The kernel's grid expressions compiled with this variant's constexprs (x, y, z).
  std::array<GridExpr, 3> grid;
  mutable std::array<CounterShard, kCounterShards> counters;

  // ---- read by launches with tensor descriptors or packed through PackArg, and by Set
  std::vector<ArgSlot> arg_slots;    // indexed by call-argument index
  std::vector<DescSlot> desc_slots;  // indexed by ArgSlot::desc
  // The memos of the TMA slots (DescSlot::memo points here), one per desc_slots entry.
  std::unique_ptr<DescMemo[]> desc_memos;
  std::vector<PackOp> plan_ops;
  std::vector<uint32_t> plan_more;

  // ---- load time and errors
  // Other contexts' CUfunctions (published with release order, read with acquire).
  mutable std::atomic<const ContextFunction*> contexts{nullptr};
  const VariantSpec* spec = nullptr;
  mutable std::mutex load_mu;
  // Guarded by load_mu: the context-independent library and kernel (loaded once), the
  // cubin (freed once loaded), and the nodes of `contexts`.
  mutable CUlibrary library = nullptr;
  mutable CUkernel kernel_handle = nullptr;
  mutable std::vector<std::byte> cubin;
  mutable std::vector<std::unique_ptr<ContextFunction>> context_nodes;
};

struct alignas(64) KernelData {
  // ---- read by every launch: one cache line
  RuntimeImpl* runtime = nullptr;
  // The variant every call gets when the kernel has one variant and no dispatch (no
  // buckets, no assumptions): launches then skip the dispatch table. Else null.
  const VariantData* sole_variant = nullptr;
  size_t num_args = 0;
  // The runtime's NVTX domain and the registered string for this kernel's name (both
  // null when NVTX is off), here so that a launch's range reads no other line.
  void* nvtx_domain = nullptr;
  void* nvtx_message = nullptr;

  // ---- dispatch and the rest
  DispatchTable dispatch;
  // Indexed like spec->variants. A kernel of the pack owns its VariantData (`owned`); a
  // view (Kernel::Restrict) points at its kernel's, sharing their load state and counters.
  std::vector<const VariantData*> variants;
  std::vector<std::unique_ptr<VariantData>> owned;
  const KernelSpec* spec = nullptr;
  const KernelInfo* info = nullptr;  // the public description, in the runtime's Pack
};

// A kernel restricted to some of its variants (Kernel::Restrict): its own spec (those
// variants; no buckets when they are ignored), description and dispatch table, over the
// kernel's VariantData. Built on request, kept until the Runtime goes.
struct KernelView {
  KernelSpec spec;
  KernelInfo info;
  KernelData data;
};

class RuntimeImpl {
 public:
  static absl::StatusOr<std::unique_ptr<RuntimeImpl>> Create(absl::string_view dir,
                                                             const Options& options);
  ~RuntimeImpl();

  const KernelData* FindKernel(std::string_view name) const {
    auto it = by_name_.find(absl::string_view(name.data(), name.size()));
    return it == by_name_.end() ? nullptr : it->second;
  }
  const std::vector<std::unique_ptr<KernelData>>& kernels() const { return kernels_; }
  const Driver& driver() const { return *driver_; }
  const Pack& pack() const { return *pack_; }
  const std::string& dir() const { return pack_->dir(); }
  ScratchArenas& scratch() const { return *scratch_; }
  const DeviceOrdinals& device_ordinals() const { return device_ordinals_; }
  size_t libraries_loaded() const { return libraries_loaded_.load(std::memory_order_relaxed); }
  // Options::scratch_allocator; set by Runtime::Open before the runtime is shared.
  void set_scratch_allocator(const ScratchAllocator& allocator) { scratch_allocator_ = allocator; }

  // `v`'s CUfunction in the current context, whose cuCtxGetId is `context`: the list
  // lookup, then Load. A launch on a `stream` that is being captured refuses to load
  // (FAILED_PRECONDITION naming Preload): loading during a capture is not allowed.
  absl::StatusOr<CUfunction> FunctionFor(const VariantData& v, uint64_t context,
                                         CUstream stream) const;
  // Loads `v` for the current context unless it is already (slow path; takes the
  // variant's mutex): the library once, then cuKernelGetFunction and the checks against
  // the context's device. Preload and the first launch in each context call it.
  absl::StatusOr<CUfunction> Load(const VariantData& v) const;
  // `grid` null: the grid from the kernel's grid expressions. `scratch`: the caller's
  // allocator for this launch, or null.
  absl::Status LaunchArgs(const KernelData& k, const Grid* grid, CUstream stream,
                          std::span<const Arg> args, const ScratchAllocator* scratch) const;
  // The launch path's steps, defined inline in runtime/launch.h (include it to call
  // them). Select: the variant these arguments select; checks the count. Errors name
  // the kernel, the argument and the assumption that failed.
  absl::Status Select(const KernelData& k, std::span<const Arg> args,
                      DispatchTable::Choice* choice) const;
  // Packs `args` into `buf` by the variant's plan (VariantData::pack_ops): every one of its
  // param_bytes bytes is written, whatever `buf` held before -- zeros where no argument
  // goes, the scratch pointers included (Prepare fills those at a launch with scratch).
  // The bytes and the error are PackEach's; an error names the first bad argument in call
  // order, and leaves `buf` partly written.
  absl::Status PackArgs(const VariantData& v, std::span<const Arg> args, std::byte* buf) const;
  // PackArgs's reference path (out of line, launch.cc): every argument in call order
  // through PackOne. PackArgs takes it when a check of its plan fails, so that the
  // conversions PackArg makes and the first error are exactly this loop's.
  absl::Status PackEach(const VariantData& v, std::span<const Arg> args, std::byte* buf) const;
  // Argument `i` through PackArg (or PackDesc for a tensor descriptor), or nothing for a
  // dropped (eq1) one; the error names it.
  absl::Status PackOne(const VariantData& v, size_t i, const Arg& a, std::byte* buf) const;
  // Tensor descriptor argument `i` through PackDesc; the error names it. Inline (launch.h):
  // PackOne and PackArgs' loop over the other arguments share it.
  absl::Status PackDescArg(const VariantData& v, size_t i, const Arg& a, std::byte* buf) const;
  // The grid from the variant's grid expressions (the launch path computes it inline,
  // GridOf in launch.h, and calls this for the error).
  absl::StatusOr<Grid> EvalGrid(const VariantData& v, std::span<const Arg> args) const;
  // Everything a launch of `v` needs but the driver call: the CUfunction for the current
  // context (loading it there on first use), the scratch pointers in `buf` (from
  // `scratch`, else the Options' allocator, else kpack's arenas), the config. An empty
  // grid leaves p->function null. `p->extra` points into `p` and at `buf`.
  struct DriverLaunch {
    CUlaunchConfig config;
    CUfunction function;
    size_t param_bytes;
    void* extra[5];
  };
  absl::Status Prepare(const VariantData& v, const Grid& grid, CUstream stream,
                       const ScratchAllocator* scratch, std::byte* buf, DriverLaunch* p) const;
  // Sends a prepared launch (nothing for an empty grid): an NVTX range around
  // cuLaunchKernelEx, and the counters (launches, and whether it was a fallback). `p`'s
  // extra array must point at its own param_bytes (Prepare's does, as long as `p` stays
  // where Prepare wrote it).
  absl::Status Send(const VariantData& v, const DriverLaunch& p, bool fallback) const;
  // Sends a packed buffer: Prepare, then Send.
  absl::Status LaunchPacked(const VariantData& v, const Grid& grid, CUstream stream,
                            const ScratchAllocator* scratch, std::byte* buf, bool fallback) const;

  static Kernel MakeKernel(const KernelData* k) { return Kernel(k); }

  // The view of `k` restricted to the variants named `variants` (see Kernel::Restrict);
  // the same request gets the same view. Takes views_mu_.
  absl::StatusOr<const KernelData*> Restrict(const KernelData& k,
                                             std::span<const std::string> variants,
                                             bool ignore_buckets) const;

 private:
  RuntimeImpl() = default;
  // Send's body, defined in launch.cc and used only there.
  absl::Status SendInline(const VariantData& v, const DriverLaunch& p, bool fallback) const;
  // Prepare's scratch step, for variants with scratch (out of line: they pay driver calls).
  absl::Status FillScratch(const VariantData& v, const Grid& grid, uint64_t context,
                           CUstream stream, const ScratchAllocator* scratch, std::byte* buf) const;
  // Load's checks: the library's parameter layout (once), and the current device's limits
  // and attributes (per context).
  absl::Status CheckLayout(const VariantData& v, CUkernel kernel) const;
  absl::Status CheckDevice(const VariantData& v, CUkernel kernel, CUdevice device) const;

  std::shared_ptr<const Driver> driver_;
  ScratchAllocator scratch_allocator_;  // Options::scratch_allocator
  // The pack as read (always set once Create returns); the specs and descriptions that
  // KernelData and VariantData point to live in it.
  std::optional<Pack> pack_;
  std::vector<std::unique_ptr<KernelData>> kernels_;
  absl::flat_hash_map<std::string, const KernelData*> by_name_;
  std::unique_ptr<ScratchArenas> scratch_;
  DeviceOrdinals device_ordinals_;  // Runtime::CurrentDevice
  void* nvtx_domain_ = nullptr;
  mutable std::atomic<size_t> libraries_loaded_{0};
  // Kernel::Restrict's views, by (kernel, variants, ignore_buckets).
  mutable std::mutex views_mu_;
  mutable absl::flat_hash_map<std::string, std::unique_ptr<KernelView>> views_;
};

// "kernel 'K' variant 'V'", the prefix of every per-variant error message.
std::string Describe(const VariantData& v);

// The status for cuCtxGetId(NULL) failing with `r` while `doing` something:
// FAILED_PRECONDITION when no context is current on the thread, else the driver's error.
absl::Status ContextError(const Driver& d, CUresult r, absl::string_view doing);

// The public API speaks std::string_view; Debian's abseil has its own string_view type.
inline absl::string_view AbslView(std::string_view s) {
  return absl::string_view(s.data(), s.size());
}

// A BoundLaunch's packed call. `args` keeps the values so that a Set that changes the
// dispatch re-selects the variant and repacks. `prepared` is what BoundLaunch::Prepare
// last handed out (its extra array points into it and at `buf`).
struct BoundState {
  const KernelData* kernel = nullptr;
  const VariantData* variant = nullptr;
  // Moves on at every change of what a graph node of this launch launches -- its variant,
  // its grid or arguments, its packed bytes -- so that a StepGraph skips, at a replay,
  // every launch whose version is the one it last resolved and patched (kpack/graph.h).
  // Every writer of those fields bumps it: BoundLaunch::Set (whatever its outcome) and
  // set_grid. Not bumped: set_stream and set_scratch_allocator (a graph uses neither), and
  // the scratch pointers Prepare writes into `buf` at Launch and BoundLaunch::Prepare
  // (each graph node has its own, written over the launch's). Starts at 1; 0 is "never".
  uint64_t version = 1;
  bool fallback = false;
  bool grid_from_expressions = false;
  Grid grid;
  // With grid_from_expressions: the grid the expressions gave at `evaluated_version` (0:
  // none yet), so that launches between two changes evaluate nothing.
  uint64_t evaluated_version = 0;
  Grid evaluated;
  CUstream stream = nullptr;
  ScratchAllocator scratch;
  std::vector<Arg> args;
  // Copies of the tensor descriptors the arguments were bound with (indexed by
  // ArgSlot::desc); `args` points at them, so that a repack after Set can read them.
  std::vector<TensorDesc> descs;
  RuntimeImpl::DriverLaunch prepared{};
  std::byte* buf = nullptr;  // the variant's buffer in `storage`
  ParamStorage storage;
};

}  // namespace kpack::internal

#endif  // KPACK_SRC_RUNTIME_RUNTIME_IMPL_H_
