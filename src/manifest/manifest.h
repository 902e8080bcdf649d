// The parsed and validated form of a pack's manifest.json (formats "kpack/1" and
// "kpack/2"; the schema is docs/pack-format.md), the Triton type tables the rest of kpack
// reads it with, and ParseManifest. Parsing is pure: no I/O, no driver. It lives in
// manifest.cc (the document, its kernels in parallel), kernel.cc, variant.cc, layout.cc
// (a kernel's entry and its parts), types.cc (type strings and tables) and fields.cc
// (typed JSON fields), which share manifest/parse.h.

#ifndef KPACK_SRC_MANIFEST_MANIFEST_H_
#define KPACK_SRC_MANIFEST_MANIFEST_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace kpack::internal {

// Triton signature types that kpack can pass, plus constexpr.
enum class ParamType : uint8_t {
  kPointer,
  kI1,
  kI8,
  kI16,
  kI32,
  kI64,
  kU1,
  kU8,
  kU16,
  kU32,
  kU64,
  kFp16,
  kBf16,
  kFp32,
  kFp64,
  kConstexpr,
  // kpack/2: a host tensor descriptor, `tensordesc<DTYPE[B0, ...]>`. Triton expands it into
  // several kernel parameters (a by-value CUtensorMap and the shape and strides, or a
  // pointer-based form); see TensorDescSpec and the layout's `part`s.
  kTensorDesc,
};

// The highest rank a tensor descriptor may have (cuTensorMapEncodeTiled's limit, and
// Triton's TensorDescriptor's).
inline constexpr int kMaxDescRank = 5;

// The type of a `tensordesc` parameter: its element type (a Triton scalar type name such
// as "fp16") and block shape, outer dimension first.
struct TensorDescType {
  std::string dtype;
  std::vector<int64_t> block;
};

// Bytes a parameter of this type occupies in the parameter buffer (0 for constexpr, and
// for a tensor descriptor, whose slots are its parts'; see DescPartSize).
uint32_t SlotSize(ParamType type);
// Bytes per element of a Triton scalar type used as a descriptor's element type ("fp16":
// 2, "fp8e4nv": 1, ...); 0 for a name kpack does not know.
int ElementBytes(absl::string_view dtype);
// Bytes per element of a CUtensorMapDataType (the driver's numbering: UINT8 0 .. TFLOAT32_FTZ
// 12); 0 for the sub-byte types (13..15) and anything else.
int TensorMapDataTypeBytes(int data_type);
// Whether a descriptor of this element type may pad with NaN (Triton: a floating-point
// base tensor).
bool IsFloatElement(absl::string_view dtype);
// i8..i64 and u8..u64: the types a bucket, grid, `eq1` or `types` entry may use.
bool IsInteger(ParamType type);
// The Triton spelling of a non-pointer type ("i32", "fp16", ...).
const char* TypeName(ParamType type);

struct ParamSpec {
  std::string name;
  std::string type_name;  // as written in the manifest, e.g. "*fp32"
  ParamType type;
  bool readonly = false;  // kpack/2 `readonly`: a pointer the kernel never writes through
  TensorDescType desc;    // kTensorDesc: the declared element type and block shape
};

// The kernel parameters a tensor descriptor expands into, in Triton 3.6's order
// (third_party/nvidia/backend/driver.py, make_launcher): with TMA metadata, the by-value
// CUtensorMap (`tma`), then the shape as i32 (`shape[i]`) and the strides as i64
// (`strides[i]`); without, the base pointer (`base`), the shape and strides as i64
// (`base_shape[i]`, `base_strides[i]`), the padding flag as i1 (`padding`), then
// `shape[i]` and `strides[i]` as with TMA.
enum class DescPart : uint8_t {
  kNone,  // not a descriptor slot
  kTma,
  kBase,
  kBaseShape,
  kBaseStrides,
  kPadding,
  kShape,
  kStrides,
};
// The slot size of a part: 128, 8, 8, 8, 1, 4, 8.
uint32_t DescPartSize(DescPart part);
// "tma", "base", "base_shape[1]", ...: the manifest's spelling of a part.
std::string DescPartName(DescPart part, int index);

enum class SlotKind : uint8_t { kArg, kGlobalScratch, kProfileScratch };

struct SlotSpec {
  SlotKind kind = SlotKind::kArg;
  int arg = -1;  // index into KernelSpec::args when kind == kArg
  uint32_t offset = 0;
  uint32_t size = 0;
  // kpack/2: a tensor descriptor's slot says which part of it it holds (`part`).
  DescPart part = DescPart::kNone;
  int part_index = 0;  // the dimension, for the shape and stride parts
};

// A tensor descriptor call parameter as one variant was compiled for it: its block shape
// (the parameter's type, or the variant's `types` override) and, when the variant lowered
// it to TMA, the kpack/2 `tensordesc_meta` entry: what cuTensorMapEncodeTiled needs besides
// the caller's base, shape and strides.
struct TensorDescSpec {
  int arg = -1;                // index into KernelSpec::args
  std::string type_name;       // this variant's type, e.g. "tensordesc<fp16[64, 128]>"
  std::string dtype;           // the element type, e.g. "fp16"
  std::vector<int64_t> block;  // this variant's block shape
  bool tma = false;            // a non-null tensordesc_meta entry: a CUtensorMap slot
  // The tensordesc_meta entry (tma only). Enumerations are the driver's values
  // (CUtensorMapDataType, CUtensorMapSwizzle, CUtensorMapInterleave,
  // CUtensorMapL2promotion); shapes are outer dimension first, as Triton writes them.
  int data_type = 0;
  int elem_size = 0;
  int swizzle = 0;
  bool fp4_padded = false;
  std::vector<uint32_t> box;              // `block_size`: the TMA box per dimension
  std::vector<uint32_t> element_strides;  // default all 1
  int interleave = 0;                     // default CU_TENSOR_MAP_INTERLEAVE_NONE
  int l2_promotion = 2;                   // default CU_TENSOR_MAP_L2_PROMOTION_L2_128B
};

// A specialization a variant was compiled with (Triton's `tt.divisibility = 16`, or an
// integer equal to 1 compiled away).
struct Assumption {
  enum Kind : uint8_t { kDiv16, kEq1 };
  int arg = -1;  // index into KernelSpec::args
  Kind kind = kDiv16;
};

struct VariantSpec {
  std::string name;
  std::string cubin;   // relative to the pack directory
  std::string sha256;  // lowercase hex
  std::string entry;
  int arch = 0;               // major*10+minor
  nlohmann::json constexprs;  // the object from the manifest: {name: value}
  int num_warps = 0;
  int num_ctas = 1;
  int num_stages = 0;
  uint32_t shared = 0;
  uint32_t global_scratch_size = 0;
  uint32_t global_scratch_align = 1;
  uint32_t profile_scratch_size = 0;
  uint32_t profile_scratch_align = 1;
  bool launch_pdl = false;
  bool launch_cooperative_grid = false;
  std::vector<int> bucket;  // one index per KernelSpec::buckets dim; empty: all
  std::vector<Assumption> assumptions;
  std::vector<ParamType> arg_types;  // per call argument (the kernel's, or `types`)
  std::vector<SlotSpec> layout;      // in ordinal order; eq1 arguments have no slot
  uint32_t param_bytes = 0;          // end of the last slot
  // One per tensor descriptor call parameter, in declaration order (kpack/2).
  std::vector<TensorDescSpec> descs;
  // The offset of the variant's CUtensorMap slots modulo 64, all the same (0 without one):
  // the launch places its parameter buffer so that they lie at 64-byte aligned host
  // addresses, which cuTensorMapEncodeTiled requires of the map it writes.
  uint32_t tma_offset_mod64 = 0;
  std::string triton_version;
};

struct KernelSpec;
// A slot's name: the call parameter's, "$global_scratch" / "$profile_scratch", or for a
// tensor descriptor's slot the parameter's and its part's ("q_desc.shape[1]").
std::string SlotName(const KernelSpec& kernel, const SlotSpec& slot);

// One bucket dimension: an integer call argument and inclusive upper edges.
struct BucketSpec {
  int arg = -1;  // index into KernelSpec::args
  std::vector<int64_t> edges;
  // kpack/2 `grid_tolerance.max` for this dim: the value the open-ended last bucket is
  // padded to (greater than the last edge); absent: that bucket keeps exact grids.
  std::optional<int64_t> grid_max;
};

struct KernelSpec {
  std::string name;
  std::vector<ParamSpec> params;  // all, constexprs included, declaration order
  std::vector<int> args;          // indices into params of the call parameters
  std::vector<BucketSpec> buckets;
  std::vector<std::string> grid;  // 0-3 expressions (x, y, z)
  std::vector<VariantSpec> variants;
  // kpack/2 `source`: the @triton.jit function the kernel was compiled from (both empty
  // when absent): "module.qualname" and the sha256 (lowercase hex) of its source text.
  std::string source_qualname;
  std::string source_sha256;
  // kpack/2 `autotune_key`: indices into params of the triton.autotune key (empty: none).
  std::vector<int> autotune_key;
  // kpack/2 `grid_tolerance`: the kernel's programs tolerate a grid larger than its grid
  // expressions give (the extra programs mask themselves out), so a CUDA graph may launch
  // it with the grid of its bucket's upper edge (include/kpack/graph.h). `grid_proven`:
  // the builder checked it on a GPU ("proof": "gpu"); else it is only asserted.
  bool grid_tolerant = false;
  bool grid_proven = false;

  const ParamSpec& arg(int a) const { return params[args[a]]; }
};

struct ManifestSpec {
  int format_version = 1;  // N of "kpack/N"
  std::string generator;
  std::vector<KernelSpec> kernels;
};

// The largest parameter buffer kpack accepts (the classic CUDA limit; larger buffers
// need CUDA 12.1's 32 KiB mode, which Triton kernels never use).
inline constexpr uint32_t kMaxParamBytes = 4096;

// Parses and validates `text`. Every error is INVALID_ARGUMENT (UNIMPLEMENTED for a
// feature this version lacks), prefixed with `file` and naming kernel, variant and field;
// a syntax error anywhere is reported before any field's problem. A large manifest's
// kernels are parsed on several threads (manifest.cc says how); the result is always that
// of ParseManifestWhole.
absl::StatusOr<ManifestSpec> ParseManifest(absl::string_view text, absl::string_view file);

// The reference ParseManifest is held to by the tests and the manifest fuzzer: the text
// parsed as one JSON document, on this thread.
absl::StatusOr<ManifestSpec> ParseManifestWhole(absl::string_view text, absl::string_view file);

}  // namespace kpack::internal

#endif  // KPACK_SRC_MANIFEST_MANIFEST_H_
