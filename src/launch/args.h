// Converting kpack::Arg values into parameter-buffer bytes, checked against the Triton
// type of the slot. Inline: this runs once per argument per launch. The error message is
// built out of line, only on failure.

#ifndef KPACK_SRC_LAUNCH_ARGS_H_
#define KPACK_SRC_LAUNCH_ARGS_H_

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "absl/base/attributes.h"
#include "absl/base/optimization.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "kpack/arg.h"
#include "manifest/manifest.h"

namespace kpack::internal {

// IEEE binary32 -> binary16, round to nearest even; NaN stays NaN, overflow gives inf.
inline uint16_t FloatToHalfBits(float f) {
  uint32_t x = std::bit_cast<uint32_t>(f);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t exp = (x >> 23) & 0xffu;
  uint32_t mant = x & 0x7fffffu;
  if (exp == 0xff) return static_cast<uint16_t>(sign | 0x7c00u | (mant != 0 ? 0x200u : 0u));
  int e = static_cast<int>(exp) - 127 + 15;
  if (e >= 31) return static_cast<uint16_t>(sign | 0x7c00u);
  if (e <= 0) {  // a half subnormal, or zero
    if (e < -10) return static_cast<uint16_t>(sign);
    uint32_t sig = mant | 0x800000u;
    int shift = 14 - e;
    uint32_t h = sig >> shift;
    uint32_t rem = sig & ((1u << shift) - 1);
    uint32_t halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (h & 1u))) ++h;
    return static_cast<uint16_t>(sign | h);
  }
  uint32_t h = sign | (static_cast<uint32_t>(e) << 10) | (mant >> 13);
  uint32_t rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;  // a carry rounds up to inf
  return static_cast<uint16_t>(h);
}

// IEEE binary32 -> bfloat16, round to nearest even; NaN stays a quiet NaN.
inline uint16_t FloatToBf16Bits(float f) {
  uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);
  x += 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(x >> 16);
}

// The failure half of PackArg: which parameter, what it wanted, what it got.
ABSL_ATTRIBUTE_NOINLINE absl::Status ArgError(absl::string_view kernel, size_t index,
                                              absl::string_view param, absl::string_view type_name,
                                              const Arg& arg);

namespace args_detail {

template <typename T>
inline void Store(std::byte* dst, T value) {
  std::memcpy(dst, &value, sizeof(T));
}

// Whether an integer Arg fits a parameter of `bits` bits, signed or not.
ABSL_ATTRIBUTE_ALWAYS_INLINE inline bool FitsInteger(const Arg& a, int bits, bool is_signed) {
  if (a.kind() == Arg::Kind::kSigned) {
    int64_t v = static_cast<int64_t>(a.bits());
    if (!is_signed) return v >= 0 && (bits == 64 || static_cast<uint64_t>(v) >> bits == 0);
    if (bits == 64) return true;
    int64_t lim = int64_t{1} << (bits - 1);
    return v >= -lim && v < lim;
  }
  uint64_t v = a.bits();  // kUnsigned or kDevicePtr
  if (is_signed) return bits == 64 ? v <= uint64_t{INT64_MAX} : v < (uint64_t{1} << (bits - 1));
  return bits == 64 || v >> bits == 0;
}

inline bool IsInteger(const Arg& a) {
  return a.kind() == Arg::Kind::kSigned || a.kind() == Arg::Kind::kUnsigned ||
         a.kind() == Arg::Kind::kDevicePtr;
}

// The signed 64-bit value of an integer Arg; false for other kinds and for unsigned
// values past INT64_MAX.
inline bool ToInt64(const Arg& a, int64_t* out) {
  if (!IsInteger(a)) return false;
  if (a.kind() != Arg::Kind::kSigned && a.bits() > uint64_t{INT64_MAX}) return false;
  *out = static_cast<int64_t>(a.bits());
  return true;
}

ABSL_ATTRIBUTE_ALWAYS_INLINE inline bool StoreInteger(const Arg& a, std::byte* dst, int bits,
                                                      bool is_signed) {
  if (!IsInteger(a) || !FitsInteger(a, bits, is_signed)) return false;
  uint64_t v = a.bits();
  switch (bits) {
    case 8:
      Store(dst, static_cast<uint8_t>(v));
      break;
    case 16:
      Store(dst, static_cast<uint16_t>(v));
      break;
    case 32:
      Store(dst, static_cast<uint32_t>(v));
      break;
    default:
      Store(dst, v);
      break;
  }
  return true;
}

inline bool IsFloat(const Arg& a, double* out) {
  if (a.kind() == Arg::Kind::kFloat32) {
    *out = std::bit_cast<float>(static_cast<uint32_t>(a.bits()));
    return true;
  }
  if (a.kind() == Arg::Kind::kFloat64) {
    *out = std::bit_cast<double>(a.bits());
    return true;
  }
  return false;
}

}  // namespace args_detail

// Writes `arg` into `dst` as a value of `type`. Returns false, writing nothing useful,
// when the Arg's kind cannot go to that type or an integer does not fit.
ABSL_ATTRIBUTE_ALWAYS_INLINE inline bool PackArg(ParamType type, const Arg& a, std::byte* dst) {
  using args_detail::Store;
  using args_detail::StoreInteger;
  double d;
  switch (type) {
    case ParamType::kPointer:
      if (a.kind() != Arg::Kind::kHostTypedPointer && a.kind() != Arg::Kind::kDevicePtr) {
        return false;
      }
      Store(dst, a.bits());
      return true;
    case ParamType::kI1:
    case ParamType::kU1:
      if (a.kind() != Arg::Kind::kBool) return false;
      Store(dst, static_cast<uint8_t>(a.bits()));
      return true;
    case ParamType::kI8:
      return StoreInteger(a, dst, 8, true);
    case ParamType::kI16:
      return StoreInteger(a, dst, 16, true);
    case ParamType::kI32:
      return StoreInteger(a, dst, 32, true);
    case ParamType::kI64:
      return StoreInteger(a, dst, 64, true);
    case ParamType::kU8:
      return StoreInteger(a, dst, 8, false);
    case ParamType::kU16:
      return StoreInteger(a, dst, 16, false);
    case ParamType::kU32:
      return StoreInteger(a, dst, 32, false);
    case ParamType::kU64:
      return StoreInteger(a, dst, 64, false);
    case ParamType::kFp32:
      if (a.kind() == Arg::Kind::kFloat32) {
        Store(dst, static_cast<uint32_t>(a.bits()));
        return true;
      }
      if (!args_detail::IsFloat(a, &d)) return false;
      Store(dst, static_cast<float>(d));  // 4 bytes, never a double (Triton AOT's bug)
      return true;
    case ParamType::kFp64:
      if (!args_detail::IsFloat(a, &d)) return false;
      Store(dst, d);
      return true;
    case ParamType::kFp16:
      if (a.kind() == Arg::Kind::kHalf) {
        Store(dst, static_cast<uint16_t>(a.bits()));
        return true;
      }
      if (!args_detail::IsFloat(a, &d)) return false;
      Store(dst, FloatToHalfBits(static_cast<float>(d)));
      return true;
    case ParamType::kBf16:
      if (a.kind() == Arg::Kind::kBFloat16) {
        Store(dst, static_cast<uint16_t>(a.bits()));
        return true;
      }
      if (!args_detail::IsFloat(a, &d)) return false;
      Store(dst, FloatToBf16Bits(static_cast<float>(d)));
      return true;
    case ParamType::kConstexpr:
      return false;
  }
  return false;
}

}  // namespace kpack::internal

#endif  // KPACK_SRC_LAUNCH_ARGS_H_
