// Converting kpack::Arg values into parameter-buffer bytes, checked against the Triton
// type of the slot. Inline: this runs once per argument per launch. The error message is
// built out of line, only on failure.

#ifndef KPACK_SRC_LAUNCH_ARGS_H_
#define KPACK_SRC_LAUNCH_ARGS_H_

#include <bit>
#include <cstddef>
#include <cstdint>

#include "absl/base/attributes.h"
#include "absl/base/optimization.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "kpack/arg.h"
#include "manifest/manifest.h"
#include "util/bytes.h"

namespace kpack::internal {

// Scalars are converted exactly as Triton 3.6's launcher converts a Python float
// (third_party/nvidia/backend/driver.py), so that a value gives the kernel the same bits
// from kpack as from Triton's JIT. A C++ float or double is the Python float of the same
// value (a float widens to double exactly).

// fp16: Triton packs with CPython's PyFloat_Pack2, one rounding from the double to the
// nearest half (ties to even). Rounding through float first would round twice and differ
// for some doubles (1 + 2^-11 + 2^-40: 0x3c01 here, 0x3c00 through float). A NaN becomes
// the quiet NaN 0x7e00 with its sign, an infinity stays one. A finite value that rounds
// past 65504 does not fit: PyFloat_Pack2 raises OverflowError (Triton's launch raises it,
// after sending the kernel undefined bits); kpack refuses it and launches nothing (false).
inline bool DoubleToHalfBits(double d, uint16_t* out) {
  const uint64_t x = std::bit_cast<uint64_t>(d);
  const auto sign = static_cast<uint16_t>((x >> 48) & 0x8000u);
  const int exp = static_cast<int>((x >> 52) & 0x7ffu);
  const uint64_t mant = x & ((uint64_t{1} << 52) - 1);
  if (exp == 0x7ff) {  // infinity or NaN
    *out = static_cast<uint16_t>(sign | (mant != 0 ? 0x7e00u : 0x7c00u));
    return true;
  }
  const int e = exp - 1023;  // |d| = 1.mant * 2^e for a normal double
  if (exp == 0 || e < -25) {  // below half the smallest half subnormal (2^-25): zero
    *out = sign;
    return true;
  }
  const uint64_t sig = mant | (uint64_t{1} << 52);  // |d| = sig * 2^(e-52)
  // Keep the bits from the half's last place up: 2^(e-10) for a normal half (e >= -14),
  // the fixed 2^-24 of a subnormal one. Round the rest to nearest, ties to even; a carry
  // out of the mantissa bumps the exponent, which the encoding does by itself.
  const int shift = e >= -14 ? 42 : 28 - e;  // 42 for normals, 43..53 for subnormals
  uint64_t h = sig >> shift;
  if (e >= -14) h = (uint64_t(e + 15) << 10) | (h & 0x3ffu);
  const uint64_t rem = sig & ((uint64_t{1} << shift) - 1);
  const uint64_t halfway = uint64_t{1} << (shift - 1);
  if (rem > halfway || (rem == halfway && (h & 1u))) ++h;
  if (h >= 0x7c00u) return false;  // overflow: 65520 and above
  *out = sign | static_cast<uint16_t>(h);
  return true;
}

// bf16: Triton converts the double to float (rounding to nearest) and keeps the float's
// upper 16 bits: truncation, not rounding, so 0.1 gives 0x3dcc (0.0996...), not the
// nearest bf16 0x3dcd. A float NaN whose payload lies in the low 16 bits becomes
// infinity, as in Triton.
inline uint16_t TritonBf16Bits(double d) {
  return static_cast<uint16_t>(std::bit_cast<uint32_t>(static_cast<float>(d)) >> 16);
}

// The failure half of PackArg: which parameter, what it wanted, what it got.
ABSL_ATTRIBUTE_NOINLINE absl::Status ArgError(absl::string_view kernel, size_t index,
                                              absl::string_view param, absl::string_view type_name,
                                              const Arg& arg);

namespace args_detail {

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
      StoreBytes(dst, static_cast<uint8_t>(v));
      break;
    case 16:
      StoreBytes(dst, static_cast<uint16_t>(v));
      break;
    case 32:
      StoreBytes(dst, static_cast<uint32_t>(v));
      break;
    default:
      StoreBytes(dst, v);
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
  using args_detail::StoreInteger;
  double d;
  switch (type) {
    case ParamType::kPointer:
      if (a.kind() != Arg::Kind::kHostTypedPointer && a.kind() != Arg::Kind::kDevicePtr) {
        return false;
      }
      StoreBytes(dst, a.bits());
      return true;
    case ParamType::kI1:
    case ParamType::kU1:
      if (a.kind() != Arg::Kind::kBool) return false;
      StoreBytes(dst, static_cast<uint8_t>(a.bits()));
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
        StoreBytes(dst, static_cast<uint32_t>(a.bits()));
        return true;
      }
      if (!args_detail::IsFloat(a, &d)) return false;
      StoreBytes(dst, static_cast<float>(d));  // 4 bytes, never a double (Triton AOT's bug)
      return true;
    case ParamType::kFp64:
      if (!args_detail::IsFloat(a, &d)) return false;
      StoreBytes(dst, d);
      return true;
    case ParamType::kFp16:
      if (a.kind() == Arg::Kind::kHalf) {
        StoreBytes(dst, static_cast<uint16_t>(a.bits()));
        return true;
      }
      if (!args_detail::IsFloat(a, &d)) return false;
      {
        uint16_t h;
        if (!DoubleToHalfBits(d, &h)) return false;  // past fp16's range, as Triton refuses
        StoreBytes(dst, h);
      }
      return true;
    case ParamType::kBf16:
      if (a.kind() == Arg::Kind::kBFloat16) {
        StoreBytes(dst, static_cast<uint16_t>(a.bits()));
        return true;
      }
      if (!args_detail::IsFloat(a, &d)) return false;
      StoreBytes(dst, TritonBf16Bits(d));
      return true;
    case ParamType::kConstexpr:
    case ParamType::kTensorDesc:  // PackDesc (launch/tensordesc.h)
      return false;
  }
  return false;
}

}  // namespace kpack::internal

#endif  // KPACK_SRC_LAUNCH_ARGS_H_
