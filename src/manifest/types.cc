// Triton's type strings in a manifest: parsing a parameter's type (`*fp32`, `i64`,
// `tensordesc<fp16[64, 64]>`, ...), and the tables every other part of kpack reads them
// by -- slot sizes, element sizes, names, and the names of a tensor descriptor's slots.

#include <cuda.h>

#include <cstdint>
#include <iterator>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "manifest/manifest.h"
#include "manifest/parse.h"

namespace kpack::internal {

absl::StatusOr<ParamType> ParseType(absl::string_view t, const Where& where,
                                    absl::string_view field) {
  if (!t.empty() && t[0] == '*') {
    if (t.size() == 1) return where.Error(field, "pointer type '*' names no element type");
    return ParamType::kPointer;
  }
  static const auto* const kTypes = new absl::flat_hash_map<absl::string_view, ParamType>{
      {"i1", ParamType::kI1},     {"i8", ParamType::kI8},     {"i16", ParamType::kI16},
      {"i32", ParamType::kI32},   {"i64", ParamType::kI64},   {"u1", ParamType::kU1},
      {"u8", ParamType::kU8},     {"u16", ParamType::kU16},   {"u32", ParamType::kU32},
      {"u64", ParamType::kU64},   {"fp16", ParamType::kFp16}, {"bf16", ParamType::kBf16},
      {"fp32", ParamType::kFp32}, {"fp64", ParamType::kFp64}, {"constexpr", ParamType::kConstexpr}};
  auto it = kTypes->find(t);
  if (it != kTypes->end()) return it->second;
  if (absl::StartsWith(t, "tensordesc<")) return ParamType::kTensorDesc;  // ParseDescType
  if (t == "nvTmaDesc") {
    return where.Unimplemented(field, "type 'nvTmaDesc' (a CUtensorMap the caller encodes, "
                                      "from Triton's deprecated TmaDescKernelParam) is not "
                                      "supported; pass a host tensor descriptor "
                                      "(tensordesc<...>) instead");
  }
  return where.Error(field, absl::StrCat("unknown Triton type '", t, "'"));
}

// `tensordesc<DTYPE[B0, B1, ...]>`, Triton's spelling of a host tensor descriptor's type
// (its JIT's specialization key: the element type and the block shape).
absl::StatusOr<TensorDescType> ParseDescType(absl::string_view t, const Where& where,
                                             absl::string_view field) {
  auto bad = [&](absl::string_view why) {
    return where.Error(field, absl::StrCat("'", t, "' is not a tensordesc<DTYPE[B0, ...]> type: ",
                                           why));
  };
  absl::string_view rest = t;
  if (!absl::ConsumePrefix(&rest, "tensordesc<") || !absl::ConsumeSuffix(&rest, ">")) {
    return bad("expected tensordesc<...>");
  }
  const size_t open = rest.find('[');
  const size_t close = rest.find(']');
  if (open == absl::string_view::npos || close == absl::string_view::npos || close < open) {
    return bad("no [block shape]");
  }
  if (close + 1 != rest.size()) {
    // Gluon's descriptors add their shared-memory layout after the block shape.
    return where.Unimplemented(field, absl::StrCat("type '", t, "': a tensor descriptor with a "
                                                   "layout (Gluon's) is not supported"));
  }
  TensorDescType type;
  type.dtype = std::string(rest.substr(0, open));
  if (ElementBytes(type.dtype) == 0) {
    return bad(absl::StrCat("unknown element type '", type.dtype, "'"));
  }
  for (absl::string_view dim : absl::StrSplit(rest.substr(open + 1, close - open - 1), ',')) {
    int64_t value = 0;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(dim), &value) || value < 1 ||
        value > INT32_MAX) {
      return bad(absl::StrCat("block dimension '", dim, "' is not an integer in [1, 2^31)"));
    }
    type.block.push_back(value);
  }
  if (type.block.size() > static_cast<size_t>(kMaxDescRank)) {
    return bad(absl::StrCat("rank ", type.block.size(), " exceeds ", kMaxDescRank));
  }
  return type;
}

std::string SlotName(const KernelSpec& kernel, const SlotSpec& slot) {
  switch (slot.kind) {
    case SlotKind::kArg:
      if (slot.part != DescPart::kNone) {
        return absl::StrCat(kernel.arg(slot.arg).name, ".", DescPartName(slot.part, slot.part_index));
      }
      return kernel.arg(slot.arg).name;
    case SlotKind::kGlobalScratch:
      return "$global_scratch";
    case SlotKind::kProfileScratch:
      return "$profile_scratch";
  }
  return "?";
}

uint32_t DescPartSize(DescPart part) {
  switch (part) {
    case DescPart::kTma:
      return 128;  // sizeof(CUtensorMap)
    case DescPart::kPadding:
      return 1;
    case DescPart::kShape:
      return 4;
    case DescPart::kNone:
    case DescPart::kBase:
    case DescPart::kBaseShape:
    case DescPart::kBaseStrides:
    case DescPart::kStrides:
      return 8;
  }
  return 0;
}

std::string DescPartName(DescPart part, int index) {
  switch (part) {
    case DescPart::kNone:
      return "";
    case DescPart::kTma:
      return "tma";
    case DescPart::kBase:
      return "base";
    case DescPart::kBaseShape:
      return absl::StrCat("base_shape[", index, "]");
    case DescPart::kBaseStrides:
      return absl::StrCat("base_strides[", index, "]");
    case DescPart::kPadding:
      return "padding";
    case DescPart::kShape:
      return absl::StrCat("shape[", index, "]");
    case DescPart::kStrides:
      return absl::StrCat("strides[", index, "]");
  }
  return "?";
}

int ElementBytes(absl::string_view dtype) {
  static const auto* const kBytes = new absl::flat_hash_map<absl::string_view, int>{
      {"i1", 1},       {"u1", 1},       {"i8", 1},       {"u8", 1},         {"fp8e4nv", 1},
      {"fp8e5", 1},    {"fp8e4b15", 1}, {"fp8e4b8", 1},  {"fp8e5b16", 1},   {"i16", 2},
      {"u16", 2},      {"fp16", 2},     {"bf16", 2},     {"i32", 4},        {"u32", 4},
      {"fp32", 4},     {"i64", 8},      {"u64", 8},      {"fp64", 8}};
  auto it = kBytes->find(dtype);
  return it == kBytes->end() ? 0 : it->second;
}

int TensorMapDataTypeBytes(int data_type) {
  // UINT8, UINT16, UINT32, INT32, UINT64, INT64, FLOAT16, FLOAT32, FLOAT64, BFLOAT16,
  // FLOAT32_FTZ, TFLOAT32, TFLOAT32_FTZ (cuda.h's CUtensorMapDataType, 0..12).
  static constexpr int kBytes[] = {1, 2, 4, 4, 8, 8, 2, 4, 8, 2, 4, 4, 4};
  static_assert(CU_TENSOR_MAP_DATA_TYPE_FLOAT16 == 6 && CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 == 9 &&
                CU_TENSOR_MAP_DATA_TYPE_TFLOAT32_FTZ == 12);
  if (data_type < 0 || data_type >= static_cast<int>(std::size(kBytes))) return 0;
  return kBytes[data_type];
}

bool IsFloatElement(absl::string_view dtype) {
  return absl::StartsWith(dtype, "fp") || dtype == "bf16";
}

bool IsInteger(ParamType type) {
  switch (type) {
    case ParamType::kI8:
    case ParamType::kI16:
    case ParamType::kI32:
    case ParamType::kI64:
    case ParamType::kU8:
    case ParamType::kU16:
    case ParamType::kU32:
    case ParamType::kU64:
      return true;
    default:
      return false;
  }
}

const char* TypeName(ParamType type) {
  switch (type) {
    case ParamType::kPointer:
      return "pointer";
    case ParamType::kI1:
      return "i1";
    case ParamType::kI8:
      return "i8";
    case ParamType::kI16:
      return "i16";
    case ParamType::kI32:
      return "i32";
    case ParamType::kI64:
      return "i64";
    case ParamType::kU1:
      return "u1";
    case ParamType::kU8:
      return "u8";
    case ParamType::kU16:
      return "u16";
    case ParamType::kU32:
      return "u32";
    case ParamType::kU64:
      return "u64";
    case ParamType::kFp16:
      return "fp16";
    case ParamType::kBf16:
      return "bf16";
    case ParamType::kFp32:
      return "fp32";
    case ParamType::kFp64:
      return "fp64";
    case ParamType::kConstexpr:
      return "constexpr";
    case ParamType::kTensorDesc:
      return "tensordesc";
  }
  return "?";
}

uint32_t SlotSize(ParamType type) {
  switch (type) {
    case ParamType::kPointer:
    case ParamType::kI64:
    case ParamType::kU64:
    case ParamType::kFp64:
      return 8;
    case ParamType::kI32:
    case ParamType::kU32:
    case ParamType::kFp32:
      return 4;
    case ParamType::kI16:
    case ParamType::kU16:
    case ParamType::kFp16:
    case ParamType::kBf16:
      return 2;
    case ParamType::kI1:
    case ParamType::kU1:
    case ParamType::kI8:
    case ParamType::kU8:
      return 1;
    case ParamType::kConstexpr:
    case ParamType::kTensorDesc:
      return 0;
  }
  return 0;
}

}  // namespace kpack::internal
