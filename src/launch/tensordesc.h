// Tensor descriptor arguments: a kpack::TensorDesc written into the parameter slots Triton
// 3.6 expands a `tensordesc<...>` parameter into (third_party/nvidia/backend/driver.py:
// make_launcher, make_tensordesc_arg; fill_tma_descriptor in driver.c). For a variant that
// lowered the descriptor to TMA: a CUtensorMap, encoded here with cuTensorMapEncodeTiled
// straight into its 128-byte slot, then the shape as i32 and the strides as i64; otherwise
// the base pointer, the shape and strides as i64, the padding flag, and the shape and
// strides again.
//
// The checks are Triton's, from its TensorDescriptor (tools/tensor_descriptor.py) and its
// launcher: the rank of the block shape, every dimension in [1, 2^31) (the shape travels as
// i32), the last stride 1, the base and the other strides multiples of 16 bytes, NaN
// padding only for floating-point elements; then whatever the driver refuses. Launch path:
// the success path allocates, locks, formats and logs nothing; a failure returns a code
// that DescError turns into a message, out of line.

#ifndef KPACK_SRC_LAUNCH_TENSORDESC_H_
#define KPACK_SRC_LAUNCH_TENSORDESC_H_

#include <cuda.h>

#include <cstddef>
#include <cstdint>

#include "absl/base/attributes.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "driver/driver.h"
#include "kpack/arg.h"
#include "manifest/manifest.h"

namespace kpack::internal {

// A tensordesc parameter of one variant, ready for the launch: where each part goes and
// the encode arguments that do not come from the caller, in the driver's order (innermost
// dimension first).
struct DescSlot {
  static constexpr int kMaxRank = kMaxDescRank;
  uint8_t rank = 0;
  bool tma = false;
  bool fp4_padded = false;
  bool float_elements = false;  // NaN padding allowed
  uint8_t elem_size = 0;        // bytes per element (the strides' unit)
  uint16_t first = 0;           // offset of the CUtensorMap (tma) or of the base pointer
  uint16_t padding = 0;         // offset of the padding flag (not tma)
  uint16_t shape[kMaxRank] = {};         // i32 shape slots
  uint16_t strides[kMaxRank] = {};       // i64 stride slots
  uint16_t base_shape[kMaxRank] = {};    // i64 shape slots (not tma)
  uint16_t base_strides[kMaxRank] = {};  // i64 stride slots (not tma)
  CUtensorMapDataType data_type{};
  CUtensorMapSwizzle swizzle{};
  CUtensorMapInterleave interleave{};
  CUtensorMapL2promotion l2_promotion{};
  cuuint32_t box[kMaxRank] = {};              // innermost first
  cuuint32_t element_strides[kMaxRank] = {};  // innermost first
};

// Builds a DescSlot from the variant's description and layout (the parser checked that
// the layout holds every part exactly once).
DescSlot MakeDescSlot(const VariantSpec& variant, const TensorDescSpec& desc);

// Why PackDesc refused a descriptor; kOk when it did not.
enum class DescProblem : uint8_t {
  kOk,
  kNotADesc,       // the Arg is no kpack::TensorDesc
  kRank,           // rank differs from the block's
  kShape,          // a dimension outside [1, 2^31)
  kLastStride,     // strides[rank-1] != 1
  kBaseAlign,      // base not 16-byte aligned
  kStrideAlign,    // another stride not a positive multiple of 16 bytes
  kNanPadding,     // NaN padding for integer elements
  kEncode,         // cuTensorMapEncodeTiled failed (with the CUresult)
};

struct DescResult {
  DescProblem problem = DescProblem::kOk;
  int dim = 0;             // the dimension at fault (kShape, kStrideAlign)
  CUresult result = CUDA_SUCCESS;  // kEncode
};

// Checks `arg` and writes it into `buf` (the variant's parameter buffer, placed so that a
// CUtensorMap slot lies at a 64-byte aligned address).
DescResult PackDesc(const Driver& driver, const DescSlot& slot, const Arg& arg, std::byte* buf);

// The INVALID_ARGUMENT for a refused descriptor, naming the kernel, the variant, the
// argument and what is wrong with the values it has.
ABSL_ATTRIBUTE_NOINLINE absl::Status DescError(const Driver& driver, absl::string_view what,
                                               size_t index, const ParamSpec& param,
                                               const TensorDescSpec& spec, const Arg& arg,
                                               const DescResult& result);

}  // namespace kpack::internal

#endif  // KPACK_SRC_LAUNCH_TENSORDESC_H_
