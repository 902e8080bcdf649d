#include "launch/args.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

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

TEST(ArgTest, HalfConversionRoundsToNearestEven) {
  EXPECT_EQ(FloatToHalfBits(1.0f), 0x3c00);
  EXPECT_EQ(FloatToHalfBits(-2.0f), 0xc000);
  EXPECT_EQ(FloatToHalfBits(0.0f), 0x0000);
  EXPECT_EQ(FloatToHalfBits(-0.0f), 0x8000);
  EXPECT_EQ(FloatToHalfBits(65504.0f), 0x7bff);  // largest half
  EXPECT_EQ(FloatToHalfBits(65520.0f), 0x7c00);  // rounds up to inf
  EXPECT_EQ(FloatToHalfBits(1e9f), 0x7c00);
  EXPECT_EQ(FloatToHalfBits(std::ldexp(1.0f, -24)), 0x0001);  // smallest subnormal
  EXPECT_EQ(FloatToHalfBits(std::ldexp(1.0f, -14)), 0x0400);  // smallest normal
  EXPECT_EQ(FloatToHalfBits(std::ldexp(1.0f, -26)), 0x0000);  // underflows
  EXPECT_EQ(FloatToHalfBits(std::ldexp(1.5f, -25)), 0x0001);  // above half the subnormal
  // 1 + 2^-11 is exactly halfway between 1 and the next half: ties to even (1.0).
  EXPECT_EQ(FloatToHalfBits(1.0f + std::ldexp(1.0f, -11)), 0x3c00);
  // 1 + 3*2^-11 is halfway between 1+2^-10 (odd) and 1+2^-9: ties to even (up).
  EXPECT_EQ(FloatToHalfBits(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);
  EXPECT_EQ(FloatToHalfBits(std::numeric_limits<float>::infinity()), 0x7c00);
  uint16_t nan = FloatToHalfBits(std::numeric_limits<float>::quiet_NaN());
  EXPECT_EQ(nan & 0x7c00, 0x7c00);
  EXPECT_NE(nan & 0x03ff, 0);
}

TEST(ArgTest, Bf16ConversionRoundsToNearestEven) {
  EXPECT_EQ(FloatToBf16Bits(1.0f), 0x3f80);
  EXPECT_EQ(FloatToBf16Bits(-1.5f), 0xbfc0);
  EXPECT_EQ(FloatToBf16Bits(1.0f + std::ldexp(1.0f, -8)), 0x3f80);      // tie, to even
  EXPECT_EQ(FloatToBf16Bits(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);  // tie, to even
  EXPECT_EQ(FloatToBf16Bits(1.0f + std::ldexp(1.0f, -7) + std::ldexp(1.0f, -9)), 0x3f81);
  uint16_t nan = FloatToBf16Bits(std::numeric_limits<float>::quiet_NaN());
  EXPECT_EQ(nan & 0x7f80, 0x7f80);
  EXPECT_NE(nan & 0x7f, 0);
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
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("expects *fp32, got a float"));
}

}  // namespace
}  // namespace kpack::internal
