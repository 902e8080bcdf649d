// Tensor descriptor arguments (tensordesc.h): the launch-time checks and the encode into
// the parameter buffer, and the error that names what the caller passed.

#include "launch/tensordesc.h"

#include <cstddef>
#include <limits>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "util/bytes.h"

namespace kpack::internal {

DescSlot MakeDescSlot(const VariantSpec& variant, const TensorDescSpec& desc) {
  DescSlot d;
  const int rank = static_cast<int>(desc.block.size());
  d.rank = static_cast<uint8_t>(rank);
  d.tma = desc.tma;
  d.fp4_padded = desc.fp4_padded;
  d.float_elements = IsFloatElement(desc.dtype);
  d.elem_size = static_cast<uint8_t>(desc.tma ? desc.elem_size : ElementBytes(desc.dtype));
  for (const SlotSpec& s : variant.layout) {
    if (s.kind != SlotKind::kArg || s.arg != desc.arg) continue;
    const auto offset = static_cast<uint16_t>(s.offset);
    switch (s.part) {
      case DescPart::kTma:
      case DescPart::kBase:
        d.first = offset;
        break;
      case DescPart::kBaseShape:
        d.base_shape[s.part_index] = offset;
        break;
      case DescPart::kBaseStrides:
        d.base_strides[s.part_index] = offset;
        break;
      case DescPart::kPadding:
        d.padding = offset;
        break;
      case DescPart::kShape:
        d.shape[s.part_index] = offset;
        break;
      case DescPart::kStrides:
        d.strides[s.part_index] = offset;
        break;
      case DescPart::kNone:
        break;
    }
  }
  if (desc.tma) {
    d.data_type = static_cast<CUtensorMapDataType>(desc.data_type);
    d.swizzle = static_cast<CUtensorMapSwizzle>(desc.swizzle);
    d.interleave = static_cast<CUtensorMapInterleave>(desc.interleave);
    d.l2_promotion = static_cast<CUtensorMapL2promotion>(desc.l2_promotion);
    // The manifest lists dimensions outer first, as Triton's metadata does; the driver
    // takes them innermost first.
    for (int i = 0; i < rank; ++i) {
      d.box[rank - 1 - i] = desc.box[i];
      d.element_strides[rank - 1 - i] = desc.element_strides[i];
    }
  }
  return d;
}

namespace {

// The caller's shape, with the last dimension doubled for an fp4-padded descriptor as
// Triton does (make_tensordesc_arg: the encode and the i32 shape slots both get it). The
// caller's value is checked before it is doubled, so the doubling cannot overflow.
bool EffectiveShape(const DescSlot& slot, const TensorDesc& d, int64_t* shape, int* bad) {
  constexpr int64_t kMax = std::numeric_limits<int32_t>::max();
  for (int i = 0; i < slot.rank; ++i) {
    shape[i] = d.shape[i];
    if (shape[i] >= 1 && shape[i] <= kMax && i == slot.rank - 1 && slot.fp4_padded) {
      shape[i] *= 2;
    }
    if (shape[i] < 1 || shape[i] > kMax) {
      *bad = i;
      return false;
    }
  }
  return true;
}

// The key of a descriptor: its TensorDesc's words, with the padding bytes after `rank`
// and after `padding` masked off (their contents are unspecified), so that equal fields
// are equal keys. Shape and stride entries past the rank take part as the caller left
// them (TensorDesc zero-initializes them): a difference there is a miss, never a wrong map.
static_assert(sizeof(TensorDesc) == 8 * DescMemo::kKeyWords && offsetof(TensorDesc, rank) == 8 &&
                  offsetof(TensorDesc, padding) == 8 * (DescMemo::kKeyWords - 1),
              "DescMemo's key is TensorDesc's layout");
ABSL_ATTRIBUTE_ALWAYS_INLINE inline void MemoKey(const TensorDesc& d, uint64_t* key) {
  CopyBytes<sizeof(TensorDesc)>(key, &d);
  key[1] &= 0xffffffffu;                  // rank (int)
  key[DescMemo::kKeyWords - 1] &= 0xffu;  // padding (uint8_t enum)
}

}  // namespace

// The seqlock after Boehm, "Can seqlocks get along with programming language memory
// models?" (2012), in its form without fences: every word of an entry is an atomic; a
// writer makes the sequence odd, stores the words with release order and publishes the
// next even value with release order; a reader loads the sequence and the words with
// acquire order and keeps its copy only if the sequence is still the same even value. A
// reader that loaded any word of a write in progress synchronizes with that store, so its
// second load of the sequence sees the odd value or a later one: a miss. On x86 each of
// these loads and stores is a plain move.
bool DescMemo::Find(const TensorDesc& d, std::byte* map) const {
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
      CopyBytes<8>(map + 8 * i, &word);
    }
    if (e.seq.load(std::memory_order_relaxed) != seq) continue;  // overwritten meanwhile
    return true;
  }
  return false;
}

void DescMemo::Insert(const TensorDesc& d, const std::byte* map) {
  Entry& e = entries_[next_.fetch_add(1, std::memory_order_relaxed) % kWays];
  uint64_t seq = e.seq.load(std::memory_order_relaxed);
  // Another writer holds the entry (odd), or took it since the load: leave it to them.
  if ((seq & 1) != 0 ||
      !e.seq.compare_exchange_strong(seq, seq + 1, std::memory_order_relaxed)) {
    return;
  }
  uint64_t key[kKeyWords];
  MemoKey(d, key);
  for (int i = 0; i < kKeyWords; ++i) e.key[i].store(key[i], std::memory_order_release);
  for (int i = 0; i < kMapWords; ++i) {
    uint64_t word;
    CopyBytes<8>(&word, map + 8 * i);
    e.map[i].store(word, std::memory_order_release);
  }
  e.seq.store(seq + 2, std::memory_order_release);
}

DescResult PackDesc(const Driver& driver, const DescSlot& slot, const Arg& arg, std::byte* buf) {
  if (arg.kind() != Arg::Kind::kTensorDesc) return {DescProblem::kNotADesc};
  const TensorDesc& d = arg.tensor_desc();
  const int rank = slot.rank;
  if (d.rank != rank) return {DescProblem::kRank};
  if (slot.memo != nullptr && slot.memo->Find(d, buf + slot.first)) {
    // The very inputs of an earlier encode, which passed every check below.
    for (int i = 0; i < rank; ++i) {
      const int64_t n = d.shape[i] * (i == rank - 1 && slot.fp4_padded ? 2 : 1);
      StoreBytes(buf + slot.shape[i], static_cast<int32_t>(n));
      StoreBytes(buf + slot.strides[i], d.strides[i]);
    }
    return {};
  }
  int64_t shape[DescSlot::kMaxRank];
  int bad = 0;
  if (!EffectiveShape(slot, d, shape, &bad)) return {DescProblem::kShape, bad};
  if (d.strides[rank - 1] != 1) return {DescProblem::kLastStride, rank - 1};
  if (d.base % 16 != 0) return {DescProblem::kBaseAlign};
  int64_t stride_bytes[DescSlot::kMaxRank];
  for (int i = 0; i + 1 < rank; ++i) {
    if (d.strides[i] < 1 ||
        __builtin_mul_overflow(d.strides[i], int64_t{slot.elem_size}, &stride_bytes[i]) ||
        stride_bytes[i] % 16 != 0) {
      return {DescProblem::kStrideAlign, i};
    }
  }
  const bool nan = d.padding == TensorDescPadding::kNan;
  if ((nan && !slot.float_elements) || (!nan && d.padding != TensorDescPadding::kZero)) {
    return {DescProblem::kNanPadding};
  }
  if (slot.tma) {
    cuuint64_t dims[DescSlot::kMaxRank];
    cuuint64_t strides[DescSlot::kMaxRank];  // the driver reads rank - 1 of them
    for (int i = 0; i < rank; ++i) dims[rank - 1 - i] = static_cast<cuuint64_t>(shape[i]);
    for (int i = 0; i + 1 < rank; ++i) {
      strides[rank - 2 - i] = static_cast<cuuint64_t>(stride_bytes[i]);
    }
    const CUresult r = driver.TensorMapEncodeTiled(
        reinterpret_cast<CUtensorMap*>(buf + slot.first), slot.data_type,
        static_cast<cuuint32_t>(rank), reinterpret_cast<void*>(d.base), dims, strides, slot.box,
        slot.element_strides, slot.interleave, slot.swizzle, slot.l2_promotion,
        nan ? CU_TENSOR_MAP_FLOAT_OOB_FILL_NAN_REQUEST_ZERO_FMA : CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) return {DescProblem::kEncode, 0, r};
    if (slot.memo != nullptr) slot.memo->Insert(d, buf + slot.first);
  } else {
    StoreBytes(buf + slot.first, static_cast<uint64_t>(d.base));
    for (int i = 0; i < rank; ++i) {
      StoreBytes(buf + slot.base_shape[i], shape[i]);
      StoreBytes(buf + slot.base_strides[i], d.strides[i]);
    }
    StoreBytes(buf + slot.padding, static_cast<uint8_t>(nan ? 1 : 0));
  }
  for (int i = 0; i < rank; ++i) {
    StoreBytes(buf + slot.shape[i], static_cast<int32_t>(shape[i]));
    StoreBytes(buf + slot.strides[i], d.strides[i]);
  }
  return {};
}

absl::Status DescError(const Driver& driver, absl::string_view what, size_t index,
                       const ParamSpec& param, const TensorDescSpec& spec, const Arg& arg,
                       const DescResult& result) {
  const std::string head = absl::StrCat(what, ": argument ", index, " ('", param.name, "', ",
                                        spec.type_name, ")");
  if (result.problem == DescProblem::kNotADesc) {
    return absl::InvalidArgumentError(
        absl::StrCat(head, " expects a kpack::TensorDesc, got ", ArgKindName(arg.kind())));
  }
  const TensorDesc& d = arg.tensor_desc();
  const int rank = d.rank < 0 ? 0 : (d.rank > TensorDesc::kMaxRank ? TensorDesc::kMaxRank : d.rank);
  const std::string values = absl::StrCat(
      "base 0x", absl::Hex(d.base), ", shape [", absl::StrJoin(d.shape, d.shape + rank, ", "),
      "], strides [", absl::StrJoin(d.strides, d.strides + rank, ", "), "], padding ",
      d.padding == TensorDescPadding::kNan ? "nan" : "zero");
  const int i = result.dim;
  std::string why;
  switch (result.problem) {
    case DescProblem::kOk:
    case DescProblem::kNotADesc:
      break;
    case DescProblem::kRank:
      why = absl::StrCat("has rank ", d.rank, ", but the parameter's block shape [",
                         absl::StrJoin(spec.block, ", "), "] has rank ", spec.block.size());
      break;
    case DescProblem::kShape:
      why = absl::StrCat("shape[", i, "] = ", d.shape[i], " is outside [1, 2^31)",
                         spec.fp4_padded && i == rank - 1
                             ? " (the last dimension is doubled for fp4 padding)"
                             : " (the kernel takes the shape as i32)");
      break;
    case DescProblem::kLastStride:
      why = absl::StrCat("strides[", i, "] = ", d.strides[i],
                         ": the last dimension must be contiguous (stride 1)");
      break;
    case DescProblem::kBaseAlign:
      why = absl::StrCat("base 0x", absl::Hex(d.base), " is not 16-byte aligned");
      break;
    case DescProblem::kStrideAlign:
      why = d.strides[i] < 1
                ? absl::StrCat("strides[", i, "] = ", d.strides[i],
                               " is not positive (every stride but the last is a positive "
                               "multiple of 16 bytes)")
                : absl::StrCat("strides[", i, "] = ", d.strides[i], " elements of ",
                               spec.tma ? spec.elem_size : ElementBytes(spec.dtype),
                               " bytes is not a multiple of 16 bytes");
      break;
    case DescProblem::kNanPadding:
      why = d.padding == TensorDescPadding::kNan
                ? absl::StrCat("NaN padding needs floating-point elements, not ", spec.dtype)
                : absl::StrCat("padding ", static_cast<int>(d.padding),
                               " is neither TensorDescPadding::kZero nor kNan");
      break;
    case DescProblem::kEncode:
      return driver.Error(
          result.result,
          absl::StrCat("cuTensorMapEncodeTiled for ", head, " (", values, "; box [",
                       absl::StrJoin(spec.box, ", "), "], swizzle ", spec.swizzle,
                       ", data type ", spec.data_type, ")"));
  }
  return absl::InvalidArgumentError(absl::StrCat(head, ": the descriptor (", values, ") ", why));
}

}  // namespace kpack::internal
