#include "launch/args.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kpack::internal {
namespace {

template <typename T>
T Read(const std::byte* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

TEST(ArgTest, KindsFromCppTypes) {
  float* fp = reinterpret_cast<float*>(0x1000);
  EXPECT_EQ(Arg(fp).kind(), Arg::Kind::kHostTypedPointer);
  EXPECT_EQ(Arg(fp).bits(), 0x1000u);
  EXPECT_EQ(Arg(static_cast<void*>(fp)).kind(), Arg::Kind::kHostTypedPointer);
  EXPECT_EQ(Arg(nullptr).kind(), Arg::Kind::kHostTypedPointer);
  EXPECT_EQ(Arg(CUdeviceptr{0x2000}).kind(), Arg::Kind::kDevicePtr);
  EXPECT_EQ(Arg(int32_t{-3}).kind(), Arg::Kind::kSigned);
  EXPECT_EQ(static_cast<int64_t>(Arg(int8_t{-3}).bits()), -3);
  EXPECT_EQ(Arg(uint32_t{3}).kind(), Arg::Kind::kUnsigned);
  EXPECT_EQ(Arg(uint64_t{3}).kind(), Arg::Kind::kUnsigned);
  EXPECT_EQ(Arg(true).kind(), Arg::Kind::kBool);
  EXPECT_EQ(Arg(1.5f).kind(), Arg::Kind::kFloat32);
  EXPECT_EQ(Arg(1.5).kind(), Arg::Kind::kFloat64);
  EXPECT_EQ(Arg(Half{0x3c00}).kind(), Arg::Kind::kHalf);
  EXPECT_EQ(Arg(BFloat16{0x3f80}).kind(), Arg::Kind::kBFloat16);
}

// The nearest half to |d| (ties to even), found by search over every finite half rather
// than by bit manipulation: an independent reference for DoubleToHalfBits. -1: overflow.
int ReferenceHalf(double d) {
  auto value = [](int bits) {  // positive finite halves, increasing with their bits
    const int e = bits >> 10, m = bits & 0x3ff;
    return e == 0 ? std::ldexp(m, -24) : std::ldexp(1024 + m, e - 25);
  };
  const double a = std::fabs(d);
  const int sign = std::signbit(d) ? 0x8000 : 0;
  if (a >= 65520.0) return -1;  // halfway to 65536 and above round past 65504
  int lo = 0, hi = 0x7bff;  // the largest half <= a, by bisection
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (value(mid) <= a) lo = mid; else hi = mid - 1;
  }
  if (lo == 0x7bff || value(lo) == a) return sign | lo;
  const double below = a - value(lo), above = value(lo + 1) - a;
  if (below < above || (below == above && lo % 2 == 0)) return sign | lo;
  return sign | (lo + 1);
}

uint16_t Half16(double d) {
  uint16_t h = 0xdead;
  EXPECT_TRUE(DoubleToHalfBits(d, &h)) << d;
  return h;
}

// Expected values from CPython's struct.pack('<e', x), which is PyFloat_Pack2, the
// function Triton 3.6's launcher packs fp16 scalars with.
TEST(ArgTest, HalfFromDoubleRoundsOnceAsTritonDoes) {
  EXPECT_EQ(Half16(1.0), 0x3c00);
  EXPECT_EQ(Half16(-2.0), 0xc000);
  EXPECT_EQ(Half16(0.0), 0x0000);
  EXPECT_EQ(Half16(-0.0), 0x8000);
  EXPECT_EQ(Half16(0.1), 0x2e66);
  EXPECT_EQ(Half16(3.14159), 0x4248);
  EXPECT_EQ(Half16(65504.0), 0x7bff);  // largest half
  EXPECT_EQ(Half16(65519.99), 0x7bff);
  EXPECT_EQ(Half16(6.1e-5), 0x03ff);                       // largest subnormal
  EXPECT_EQ(Half16(std::ldexp(1.0, -24)), 0x0001);         // smallest subnormal
  EXPECT_EQ(Half16(std::ldexp(1.0, -25)), 0x0000);         // its half: tie, to even
  EXPECT_EQ(Half16(std::ldexp(1.0000001, -25)), 0x0001);   // just above the tie
  EXPECT_EQ(Half16(1e-8), 0x0000);
  EXPECT_EQ(Half16(std::ldexp(1.0, -1074)), 0x0000);       // a double subnormal
  EXPECT_EQ(Half16(1.0 + std::ldexp(1.0, -11)), 0x3c00);   // tie, to even
  EXPECT_EQ(Half16(std::numeric_limits<double>::infinity()), 0x7c00);
  EXPECT_EQ(Half16(-std::numeric_limits<double>::infinity()), 0xfc00);
  EXPECT_EQ(Half16(std::numeric_limits<double>::quiet_NaN()), 0x7e00);
  EXPECT_EQ(Half16(-std::numeric_limits<double>::quiet_NaN()), 0xfe00);
  // Double rounding: through float these doubles land exactly on a tie between two
  // halves and round to the even one; rounded once, as PyFloat_Pack2 does, they are
  // above the tie and round up.
  EXPECT_EQ(Half16(1.0 + std::ldexp(1.0, -11) + std::ldexp(1.0, -40)), 0x3c01);
  EXPECT_EQ(Half16(2049.0000001), 0x6801);
  // Past the range: PyFloat_Pack2 raises OverflowError, so nothing is packed.
  uint16_t h = 0;
  EXPECT_FALSE(DoubleToHalfBits(65520.0, &h));
  EXPECT_FALSE(DoubleToHalfBits(-1e9, &h));
  EXPECT_FALSE(DoubleToHalfBits(std::numeric_limits<double>::max(), &h));
}

TEST(ArgTest, HalfFromDoubleMatchesANearestHalfSearch) {
  std::mt19937_64 gen(12);
  std::uniform_real_distribution<double> mantissa(1.0, 2.0);
  for (int i = 0; i < 20000; ++i) {
    const int exp = static_cast<int>(gen() % 46) - 28;  // 2^-28 .. 2^17: every regime
    double d = std::ldexp(mantissa(gen), exp);
    if (i % 2) d = -d;
    if (i % 5 == 0) {  // exactly on or next to a tie between two halves
      const int spacing = std::max(std::ilogb(d) - 10, -24);  // log2 of the half's ulp
      const double tie = std::copysign(
          std::ldexp(std::floor(std::ldexp(std::fabs(d), -spacing)) + 0.5, spacing), d);
      d = std::nextafter(tie, i % 3 == 0 ? 0.0 : (i % 3 == 1 ? 2 * tie : tie));
    }
    const int want = ReferenceHalf(d);
    uint16_t got = 0;
    ASSERT_EQ(DoubleToHalfBits(d, &got), want >= 0) << d;
    if (want >= 0) ASSERT_EQ(got, want) << std::hexfloat << d;
  }
}

// Expected values from numpy: float32(x).view(uint32) >> 16, Triton's pack_bf16.
TEST(ArgTest, Bf16TruncatesTheFloatAsTritonDoes) {
  EXPECT_EQ(TritonBf16Bits(1.0), 0x3f80);
  EXPECT_EQ(TritonBf16Bits(-1.5), 0xbfc0);
  EXPECT_EQ(TritonBf16Bits(0.1), 0x3dcc) << "truncated; rounding would give 0x3dcd";
  EXPECT_EQ(TritonBf16Bits(3.14159), 0x4049);
  EXPECT_EQ(TritonBf16Bits(1.0 / 3), 0x3eaa);
  EXPECT_EQ(TritonBf16Bits(-2.5e-3), 0xbb23);
  EXPECT_EQ(TritonBf16Bits(3.4e38), 0x7f7f);
  EXPECT_EQ(TritonBf16Bits(1e39), 0x7f80) << "beyond float: infinity";
  EXPECT_EQ(TritonBf16Bits(1.0 + std::ldexp(1.0, -7) + std::ldexp(1.0, -9)), 0x3f81);
  EXPECT_EQ(TritonBf16Bits(1.0 + std::ldexp(1.0, -8) * 1.5), 0x3f80) << "not rounded up";
  EXPECT_EQ(TritonBf16Bits(std::numeric_limits<double>::quiet_NaN()), 0x7fc0);
}

TEST(PackArgTest, EachTypeWritesItsBytes) {
  alignas(8) std::byte buf[16] = {};
  ASSERT_TRUE(PackArg(ParamType::kPointer, Arg(reinterpret_cast<void*>(0x1234)), buf));
  EXPECT_EQ(Read<uint64_t>(buf), 0x1234u);
  ASSERT_TRUE(PackArg(ParamType::kPointer, Arg(CUdeviceptr{0xabc0}), buf));
  EXPECT_EQ(Read<uint64_t>(buf), 0xabc0u);

  std::memset(buf, 0xff, sizeof(buf));
  ASSERT_TRUE(PackArg(ParamType::kFp32, Arg(0.1), buf));  // a double goes as a float
  EXPECT_EQ(Read<float>(buf), 0.1f);
  EXPECT_EQ(Read<uint32_t>(buf + 4), 0xffffffffu) << "wrote past a 4-byte slot";
  ASSERT_TRUE(PackArg(ParamType::kFp32, Arg(2.5f), buf));
  EXPECT_EQ(Read<float>(buf), 2.5f);
  ASSERT_TRUE(PackArg(ParamType::kFp64, Arg(2.5f), buf));
  EXPECT_EQ(Read<double>(buf), 2.5);

  std::memset(buf, 0xff, sizeof(buf));
  ASSERT_TRUE(PackArg(ParamType::kBf16, Arg(1.0), buf));
  EXPECT_EQ(Read<uint16_t>(buf), 0x3f80);
  EXPECT_EQ(Read<uint16_t>(buf + 2), 0xffff) << "wrote past a 2-byte slot";
  ASSERT_TRUE(PackArg(ParamType::kBf16, Arg(BFloat16{0x1234}), buf));
  EXPECT_EQ(Read<uint16_t>(buf), 0x1234);
  ASSERT_TRUE(PackArg(ParamType::kFp16, Arg(-2.0f), buf));
  EXPECT_EQ(Read<uint16_t>(buf), 0xc000);
  ASSERT_TRUE(PackArg(ParamType::kFp16, Arg(Half{0x3555}), buf));
  EXPECT_EQ(Read<uint16_t>(buf), 0x3555);
  // float and double scalars convert as Triton converts a Python float; Half and
  // BFloat16 pass their bits unchanged.
  ASSERT_TRUE(PackArg(ParamType::kBf16, Arg(0.1), buf));
  EXPECT_EQ(Read<uint16_t>(buf), 0x3dcc);
  ASSERT_TRUE(PackArg(ParamType::kBf16, Arg(0.1f), buf));
  EXPECT_EQ(Read<uint16_t>(buf), 0x3dcc);
  ASSERT_TRUE(PackArg(ParamType::kFp16, Arg(1.0 + std::ldexp(1.0, -11) + std::ldexp(1.0, -40)),
                      buf));
  EXPECT_EQ(Read<uint16_t>(buf), 0x3c01);
  ASSERT_TRUE(PackArg(ParamType::kFp16, Arg(0.1f), buf));  // the float's exact value, once
  EXPECT_EQ(Read<uint16_t>(buf), 0x2e66);

  std::memset(buf, 0xff, sizeof(buf));
  ASSERT_TRUE(PackArg(ParamType::kI1, Arg(true), buf));
  EXPECT_EQ(Read<uint8_t>(buf), 1);
  EXPECT_EQ(Read<uint8_t>(buf + 1), 0xff) << "u1 is one byte";
  ASSERT_TRUE(PackArg(ParamType::kU1, Arg(false), buf));
  EXPECT_EQ(Read<uint8_t>(buf), 0);

  ASSERT_TRUE(PackArg(ParamType::kI64, Arg((int64_t{1} << 40) + 7), buf));
  EXPECT_EQ(Read<int64_t>(buf), (int64_t{1} << 40) + 7);
  ASSERT_TRUE(PackArg(ParamType::kI32, Arg(-5), buf));
  EXPECT_EQ(Read<int32_t>(buf), -5);
  ASSERT_TRUE(PackArg(ParamType::kI16, Arg(int64_t{-300}), buf));
  EXPECT_EQ(Read<int16_t>(buf), -300);
  ASSERT_TRUE(PackArg(ParamType::kU8, Arg(255u), buf));
  EXPECT_EQ(Read<uint8_t>(buf), 255);
  ASSERT_TRUE(PackArg(ParamType::kU64, Arg(CUdeviceptr{~0ull}), buf));  // ull is a u64 too
  EXPECT_EQ(Read<uint64_t>(buf), ~0ull);
}

TEST(PackArgTest, RejectsWrongKinds) {
  alignas(8) std::byte buf[8] = {};
  EXPECT_FALSE(PackArg(ParamType::kPointer, Arg(3), buf));
  EXPECT_FALSE(PackArg(ParamType::kPointer, Arg(1.0f), buf));
  EXPECT_FALSE(PackArg(ParamType::kI32, Arg(1.0f), buf));
  EXPECT_FALSE(PackArg(ParamType::kI32, Arg(true), buf));
  EXPECT_FALSE(PackArg(ParamType::kI32, Arg(reinterpret_cast<void*>(8)), buf));
  EXPECT_FALSE(PackArg(ParamType::kI1, Arg(1), buf));
  EXPECT_FALSE(PackArg(ParamType::kFp32, Arg(1), buf));
  EXPECT_FALSE(PackArg(ParamType::kFp16, Arg(BFloat16{1}), buf));
  EXPECT_FALSE(PackArg(ParamType::kBf16, Arg(Half{1}), buf));
  EXPECT_FALSE(PackArg(ParamType::kFp16, Arg(70000.0f), buf)) << "Triton refuses it too";
  EXPECT_FALSE(PackArg(ParamType::kConstexpr, Arg(1), buf));
}

TEST(PackArgTest, IntegerRanges) {
  alignas(8) std::byte buf[8] = {};
  EXPECT_TRUE(PackArg(ParamType::kI32, Arg(int64_t{INT32_MAX}), buf));
  EXPECT_TRUE(PackArg(ParamType::kI32, Arg(int64_t{INT32_MIN}), buf));
  EXPECT_FALSE(PackArg(ParamType::kI32, Arg(int64_t{INT32_MAX} + 1), buf));
  EXPECT_FALSE(PackArg(ParamType::kI32, Arg(int64_t{INT32_MIN} - 1), buf));
  EXPECT_FALSE(PackArg(ParamType::kI32, Arg(uint32_t{3000000000u}), buf));
  EXPECT_TRUE(PackArg(ParamType::kU32, Arg(uint32_t{3000000000u}), buf));
  EXPECT_FALSE(PackArg(ParamType::kU32, Arg(-1), buf));
  EXPECT_FALSE(PackArg(ParamType::kU64, Arg(-1), buf));
  EXPECT_FALSE(PackArg(ParamType::kI64, Arg(uint64_t{1} << 63), buf));
  EXPECT_TRUE(PackArg(ParamType::kU64, Arg(uint64_t{1} << 63), buf));
  EXPECT_FALSE(PackArg(ParamType::kI8, Arg(128), buf));
  EXPECT_TRUE(PackArg(ParamType::kI8, Arg(-128), buf));
  EXPECT_FALSE(PackArg(ParamType::kU16, Arg(65536), buf));
}

TEST(PackArgTest, ErrorNamesParameterTypeAndValue) {
  absl::Status s = ArgError("add", 3, "n", "i32", Arg(int64_t{1} << 40));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()),
              ::testing::AllOf(::testing::HasSubstr("kernel 'add'"), ::testing::HasSubstr("'n'"),
                               ::testing::HasSubstr("i32"), ::testing::HasSubstr("1099511627776"),
                               ::testing::HasSubstr("does not fit")));
  s = ArgError("add", 0, "x_ptr", "*fp32", Arg(1.5f));
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("expects *fp32, got a float 1.5"));
  s = ArgError("k", 5, "gamma", "fp16", Arg(70000.0));
  EXPECT_THAT(std::string(s.message()),
              ::testing::HasSubstr("expects fp16, got a double 70000 beyond fp16's largest"));
}

}  // namespace
}  // namespace kpack::internal
