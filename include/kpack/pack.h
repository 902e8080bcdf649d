// kpack/pack.h: read, validate and describe a kernel pack without a CUDA driver.
//
// `Pack::Read` makes every check `Runtime::Open` makes that needs no device: the manifest
// (schema, types, layouts in Triton's parameter order), the files (paths confined to the
// pack, sha256), each cubin's ELF (a complete image; the variant's `entry` is one of its
// kernels; its SM architecture is the manifest's `arch`; its KPARAM_INFO parameter layout
// is the manifest's `layout`), every grid expression compiled for every variant, and every
// kernel's dispatch table built. `Runtime::Open` is `Pack::Read` plus loading the driver
// and building the launch tables, one code path: a pack that `Read` accepts opens on any
// machine with a driver, and what remains for load time are the device's answers (arch
// against the GPU, shared memory and thread limits, the driver's own parameter info).
//
//   absl::StatusOr<kpack::Pack> pack = kpack::Pack::Read(dir);
//   if (!pack.ok()) return pack.status();         // names file, kernel, variant, field
//   for (const kpack::KernelInfo& k : pack->kernels())
//     printf("%s: %zu variants\n", k.name.c_str(), k.variants.size());
//
// `Pack::Verify` runs the same checks and reports every problem instead of the first.
//
// The descriptions are plain data, copied out of the manifest once; a `Pack` is an
// immutable, cheaply copyable handle to them (copies share them), safe to use from any
// number of threads. `Runtime::pack()` returns the Pack a Runtime opened, and
// `Kernel::info()` one kernel's description.

#ifndef KPACK_PACK_H_
#define KPACK_PACK_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace kpack {

namespace internal {
struct PackState;
struct PackAccess;  // the runtime builds a Pack from the state it opened
}  // namespace internal

// One Python parameter of a kernel, in declaration order.
struct ParamInfo {
  std::string name;
  // The Triton type string as in the manifest: "*fp32", "i32", "constexpr",
  // "tensordesc<fp16[64, 64]>"; a flattened tuple's elements are parameters named
  // "tuple.0", "tuple.1", ... (kpack/2).
  std::string type;
  bool is_constexpr = false;
  // kpack/2 `readonly`: the build spec declared that the kernel never writes through this
  // pointer. False when absent (the pointer may be written), always for non-pointers.
  bool readonly = false;
};

// One bucket dimension of a kernel.
struct BucketDimInfo {
  std::string param;           // the call parameter bucketed on
  std::vector<int64_t> edges;  // inclusive upper edges, strictly increasing
  // kpack/2 `grid_tolerance.max`: the value a CUDA graph pads the open-ended last bucket
  // to (> edges.back()); absent: launches in that bucket keep exact grids in a graph.
  std::optional<int64_t> grid_max;

  // The values of `param` that bucket `index` (0 .. edges.size()) holds, both bounds
  // inclusive: bucket 0 has no lower bound, bucket edges.size() no upper bound (nullopt),
  // bucket i in between is edges[i - 1] + 1 .. edges[i]. An index past the last bucket
  // has neither.
  struct Range {
    std::optional<int64_t> low, high;
  };
  Range RangeOf(size_t index) const;
  // That range in words, the one spelling kpack's messages, `kpack inspect` and the
  // Python tools use: "M <= 16", "17 <= M <= 64", "M >= 65".
  std::string DescribeRange(size_t index) const;
};

// A bucket of a kernel with bucket dimensions `dims`, one index per dimension, in words:
// each dimension's DescribeRange joined by ", " ("17 <= M <= 64, N >= 4097"); "every
// bucket" for an empty `index` (a variant without a bucket serves them all); "no buckets"
// when `dims` is empty. Extra indices (or dimensions) beyond the shorter list are ignored.
std::string DescribeBucket(std::span<const BucketDimInfo> dims, std::span<const int> index);

// A specialization a variant was compiled with.
struct AssumptionInfo {
  std::string param;  // call parameter name
  std::string kind;   // "div16" | "eq1"
};

// One slot of a variant's parameter buffer.
struct LayoutSlotInfo {
  std::string name;  // call parameter name, or "$global_scratch" / "$profile_scratch"
  uint32_t offset = 0, size = 0;
  // For the slots of a tensordesc parameter (kpack/2), which part of it the slot holds:
  // "tma" (the 128-byte CUtensorMap), "shape[i]", "strides[i]", or without TMA "base",
  // "base_shape[i]", "base_strides[i]", "padding" (docs/pack-format.md). Else empty.
  std::string part;
};

// A tensordesc parameter as one variant was compiled for it (kpack/2). The launch takes a
// kpack::TensorDesc for it (kpack/arg.h) and encodes it with this.
struct TensorDescInfo {
  std::string param;                 // the call parameter
  std::string dtype;                 // element type, e.g. "fp16"
  std::vector<int64_t> block_shape;  // this variant's block shape, outer dimension first
  // Lowered to TMA (the manifest's tensordesc_meta entry is not null): the launch encodes
  // a CUtensorMap with cuTensorMapEncodeTiled from these, in the driver's enumerations.
  // Otherwise the descriptor is passed as base pointer, shape, strides and padding flag.
  bool tma = false;
  int data_type = 0;  // CUtensorMapDataType
  int elem_size = 0;  // bytes per element
  int swizzle = 0;    // CUtensorMapSwizzle
  bool fp4_padded = false;
  std::vector<uint32_t> box;              // the TMA box, outer dimension first
  std::vector<uint32_t> element_strides;  // outer dimension first
  int interleave = 0;                     // CUtensorMapInterleave
  int l2_promotion = 2;                   // CUtensorMapL2promotion
};

// One compiled variant of a kernel; the fields are the manifest's (docs/pack-format.md).
struct VariantInfo {
  std::string name, cubin, entry, sha256, triton_version;
  int arch = 0, num_warps = 0, num_ctas = 1, num_stages = 0;
  uint32_t shared = 0;
  uint32_t global_scratch_size = 0, global_scratch_align = 1;
  uint32_t profile_scratch_size = 0, profile_scratch_align = 1;
  bool launch_pdl = false, launch_cooperative_grid = false;
  std::vector<int> bucket;  // one index per bucket dim; empty: every bucket
  std::vector<AssumptionInfo> assumptions;
  std::string constexprs_json;         // the variant's constexprs object, as JSON text
  std::vector<std::string> arg_types;  // per call parameter: its Triton type in this variant
  std::vector<LayoutSlotInfo> layout;  // ordinal order, hidden slots included
  uint32_t param_bytes = 0;            // the end of the last slot
  std::vector<TensorDescInfo> descs;   // the tensordesc parameters, in declaration order
};

// kpack/2 `source`: the `@triton.jit` function a kernel was compiled from, as the pack
// tools recorded it (docs/pack-format.md). Both empty when the manifest has none.
struct SourceInfo {
  std::string qualname;  // "module.qualname"
  std::string sha256;    // of the function's source text (Triton's JITFunction.src), hex
};

struct KernelInfo {
  std::string name;
  std::vector<ParamInfo> params;    // all, constexprs included, declaration order
  std::vector<size_t> call_params;  // indices into params of the Launch arguments, in order
  std::vector<BucketDimInfo> buckets;
  std::vector<std::string> grid;  // 0-3 grid expressions (x, y, z)
  std::vector<VariantInfo> variants;
  SourceInfo source;
  // kpack/2 `autotune_key`: the parameter names of the `triton.autotune` key a recorded
  // autotuned function was tuned on, in the program's order; empty when absent.
  std::vector<std::string> autotune_key;
  // kpack/2 `grid_tolerance`: the kernel's programs tolerate a larger grid than its grid
  // expressions give (extra programs mask themselves out), so a kpack::StepGraph
  // (kpack/graph.h) launches it with the grid at its bucket's upper edge and patches only
  // its arguments while sizes stay inside the bucket. `grid_proven`: the pack builder
  // checked it on a GPU (padded and exact grids computed the same bits, docs/build-spec.md);
  // false with grid_tolerant: asserted by the spec or recording, never checked.
  bool grid_tolerant = false;
  bool grid_proven = false;
};

class Pack {
 public:
  // Reads and validates the pack in `dir` (see the top of this file); needs no driver.
  // Errors: NOT_FOUND when the directory, the manifest or a cubin is missing;
  // INVALID_ARGUMENT for anything wrong in the pack, the message naming the file, kernel,
  // variant and field; UNIMPLEMENTED for pack features this version lacks. The first
  // problem found is returned.
  static absl::StatusOr<Pack> Read(std::string_view dir);

  // The same checks, continuing past each variant's and each kernel's problem: one status
  // per problem, the same statuses Read would return; empty exactly when Read succeeds.
  // (A manifest that does not parse is one problem: nothing after it can be checked.)
  static std::vector<absl::Status> Verify(std::string_view dir);

  Pack(const Pack&) = default;
  Pack& operator=(const Pack&) = default;
  Pack(Pack&&) noexcept = default;
  Pack& operator=(Pack&&) noexcept = default;
  ~Pack() = default;

  const std::string& dir() const;  // the pack's canonical absolute path
  int format_version() const;      // N of the manifest's "kpack/N"
  const std::string& generator() const;
  const std::vector<KernelInfo>& kernels() const;  // in manifest order
  // The kernel named `name`, or NOT_FOUND naming the pack and listing the kernels it has.
  absl::StatusOr<const KernelInfo*> Find(std::string_view name) const;

 private:
  friend struct internal::PackAccess;
  explicit Pack(std::shared_ptr<const internal::PackState> state) : state_(std::move(state)) {}
  std::shared_ptr<const internal::PackState> state_;
};

}  // namespace kpack

#endif  // KPACK_PACK_H_
