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

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "absl/base/attributes.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "driver/driver.h"
#include "kpack/arg.h"
#include "manifest/manifest.h"

namespace kpack::internal {

// The maps a TMA descriptor parameter of one variant encoded last, so that a launch whose
// descriptor did not change copies 128 bytes instead of checking it and calling
// cuTensorMapEncodeTiled (about 0.1 µs each on the H200).
//
// Key: the caller's TensorDesc as given -- base, rank, shape, strides, padding -- compared
// in full, word by word. Everything else the encode reads (element type, box, element
// strides, swizzle, interleave, L2 promotion) is the parameter's own and the same for
// every entry. Only descriptors that passed every check and encoded are stored, so a hit
// stands for those checks too. A CUtensorMap is a function of the encode's inputs alone:
// the driver takes no context or device for it and the map holds the address, not the
// memory's contents. So nothing is ever invalidated: memory freed and allocated again at
// the same address with the same geometry encodes the same map (the copy is still right),
// and any other geometry or padding is another key.
//
// Capacity: the last kWays distinct descriptors of the parameter (double or quadruple
// buffering, a few layers' weights). A miss encodes and then replaces the entries in turn,
// so a parameter cycling through more than kWays descriptors encodes at every launch, as
// without the memo, plus the cost of the look-up and the store (tensordesc.cc).
//
// Thread safety: any number of threads may Find and Insert at once. Each entry is a
// seqlock over atomic words (acquire loads, release stores, no fences: no data race):
// a reader never blocks or writes, and a writer that finds its entry being written by
// another thread leaves it to that thread. No allocation, lock, formatting or logging.
class DescMemo {
 public:
  static constexpr int kWays = 4;
  static constexpr int kKeyWords = 13;  // a TensorDesc's 104 bytes (tensordesc.cc)

  DescMemo() = default;
  DescMemo(const DescMemo&) = delete;
  DescMemo& operator=(const DescMemo&) = delete;

  // Copies the map encoded from `d` to `map` and returns true when held; false may leave
  // `map` partly written (the caller encodes over it).
  bool Find(const TensorDesc& d, std::byte* map) const;
  // Stores `map`, which the driver encoded from `d` after every check passed.
  void Insert(const TensorDesc& d, const std::byte* map);

 private:
  static constexpr int kMapWords = 128 / 8;
  struct alignas(64) Entry {
    // 0: never written; odd: being written; otherwise even and counting writes.
    std::atomic<uint64_t> seq{0};
    std::atomic<uint64_t> key[kKeyWords] = {};
    std::atomic<uint64_t> map[kMapWords] = {};
  };
  Entry entries_[kWays];
  std::atomic<uint32_t> next_{0};  // the entry the next Insert replaces (mod kWays)
};

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
  // The parameter's maps (tma only; owned by the VariantData, which outlives the slot's
  // launches). Null: every launch checks and encodes.
  DescMemo* memo = nullptr;
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
// CUtensorMap slot lies at a 64-byte aligned address). A TMA slot with a memo copies the
// map of a descriptor it encoded before (DescMemo) and stores what it encodes.
DescResult PackDesc(const Driver& driver, const DescSlot& slot, const Arg& arg, std::byte* buf);

// The INVALID_ARGUMENT for a refused descriptor, naming the kernel, the variant, the
// argument and what is wrong with the values it has.
ABSL_ATTRIBUTE_NOINLINE absl::Status DescError(const Driver& driver, absl::string_view what,
                                               size_t index, const ParamSpec& param,
                                               const TensorDescSpec& spec, const Arg& arg,
                                               const DescResult& result);

}  // namespace kpack::internal

#endif  // KPACK_SRC_LAUNCH_TENSORDESC_H_
