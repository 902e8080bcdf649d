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
#include <cstring>

#include "absl/base/attributes.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "driver/driver.h"
#include "kpack/arg.h"
#include "manifest/manifest.h"

namespace kpack::internal {

// The maps a TMA descriptor parameter of one variant encoded last, so that a launch whose
// descriptor did not change copies 128 bytes instead of checking it and calling
// cuTensorMapEncodeTiled (each ~0.1 µs on the H200).
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
// map of a descriptor it encoded before (DescMemo, unless `look_up` is false: the caller
// has just looked) and stores what it encodes.
DescResult PackDesc(const Driver& driver, const DescSlot& slot, const Arg& arg, std::byte* buf,
                    bool look_up = true);

// The key of a descriptor: its TensorDesc's words, with the padding bytes after `rank`
// and after `padding` masked off (their contents are unspecified), so that equal fields
// are equal keys. Shape and stride entries past the rank take part as the caller left
// them (TensorDesc zero-initializes them): a difference there is a miss, never a wrong map.
static_assert(sizeof(TensorDesc) == 8 * DescMemo::kKeyWords && offsetof(TensorDesc, rank) == 8 &&
                  offsetof(TensorDesc, padding) == 8 * (DescMemo::kKeyWords - 1),
              "DescMemo's key is TensorDesc's layout");
ABSL_ATTRIBUTE_ALWAYS_INLINE inline void MemoKey(const TensorDesc& d, uint64_t* key) {
  std::memcpy(key, &d, sizeof(TensorDesc));
  key[1] &= 0xffffffffu;                  // rank (int)
  key[DescMemo::kKeyWords - 1] &= 0xffu;  // padding (uint8_t enum)
}

// The seqlock after Boehm, "Can seqlocks get along with programming language memory
// models?" (2012), in its form without fences: every word of an entry is an atomic; a
// writer (Insert, tensordesc.cc) makes the sequence odd, stores the words with release
// order and publishes the next even value with release order; this reader loads the
// sequence and the words with acquire order and keeps its copy only if the sequence is
// still the same even value. A reader that loaded any word of a write in progress
// synchronizes with that store, so its second load of the sequence sees the odd value or
// a later one: a miss. On x86 each of these loads and stores is a plain move.
ABSL_ATTRIBUTE_ALWAYS_INLINE inline bool DescMemo::Find(const TensorDesc& d,
                                                        std::byte* map) const {
  uint64_t want[kKeyWords];
  MemoKey(d, want);
  for (const Entry& e : entries_) {
    const uint64_t seq = e.seq.load(std::memory_order_acquire);
    // Word 0 is the address: it tells most entries apart at once. An entry never written
    // (sequence 0) is skipped.
    if (seq == 0 || (seq & 1) != 0 || e.key[0].load(std::memory_order_acquire) != want[0]) {
      continue;
    }
    uint64_t diff = 0;
#pragma GCC unroll 16
    for (int i = 1; i < kKeyWords; ++i) diff |= e.key[i].load(std::memory_order_acquire) ^ want[i];
    if (diff != 0) continue;
#pragma GCC unroll 16
    for (int i = 0; i < kMapWords; ++i) {
      const uint64_t word = e.map[i].load(std::memory_order_acquire);
      std::memcpy(map + 8 * i, &word, 8);
    }
    if (e.seq.load(std::memory_order_relaxed) != seq) continue;  // overwritten meanwhile
    return true;
  }
  return false;
}

// The launch path's first try at a descriptor argument, inline: when `slot` has a memo
// that holds `arg` (a TensorDesc of the slot's rank), copies its map and writes its shape
// and stride slots -- the very inputs of an earlier encode, which passed every check --
// and returns true. Otherwise writes nothing that PackDesc does not write over (at most
// part of the map) and returns false: PackDesc then checks and encodes.
ABSL_ATTRIBUTE_ALWAYS_INLINE inline bool PackKnownDesc(const DescSlot& slot, const Arg& arg,
                                                       std::byte* buf) {
  if (slot.memo == nullptr || arg.kind() != Arg::Kind::kTensorDesc) return false;
  const TensorDesc& d = arg.tensor_desc();
  const int rank = slot.rank;
  if (d.rank != rank || !slot.memo->Find(d, buf + slot.first)) return false;
  for (int i = 0; i < rank; ++i) {
    const int32_t n = static_cast<int32_t>(d.shape[i] << (i == rank - 1 && slot.fp4_padded));
    std::memcpy(buf + slot.shape[i], &n, 4);
    std::memcpy(buf + slot.strides[i], &d.strides[i], 8);
  }
  return true;
}

// The INVALID_ARGUMENT for a refused descriptor, naming the kernel, the variant, the
// argument and what is wrong with the values it has.
ABSL_ATTRIBUTE_NOINLINE absl::Status DescError(const Driver& driver, absl::string_view what,
                                               size_t index, const ParamSpec& param,
                                               const TensorDescSpec& spec, const Arg& arg,
                                               const DescResult& result);

}  // namespace kpack::internal

#endif  // KPACK_SRC_LAUNCH_TENSORDESC_H_
