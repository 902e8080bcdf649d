#include "dispatch/grid_expr.h"

#include <cstdint>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kpack::internal {
namespace {

using ::testing::HasSubstr;

// Names: call arguments n (0), m (1), f (2, not an integer here but resolvable as an
// argument for the evaluation tests); constexprs BLOCK = 1024, ZERO = 0, BIG = 2^62.
absl::StatusOr<GridExpr::Name> Resolve(absl::string_view name) {
  if (name == "n") return GridExpr::Name{GridExpr::Name::kArg, 0};
  if (name == "m") return GridExpr::Name{GridExpr::Name::kArg, 1};
  if (name == "f") return GridExpr::Name{GridExpr::Name::kArg, 2};
  if (name == "BLOCK") return GridExpr::Name{GridExpr::Name::kConstant, 1024};
  if (name == "ZERO") return GridExpr::Name{GridExpr::Name::kConstant, 0};
  if (name == "BIG") return GridExpr::Name{GridExpr::Name::kConstant, int64_t{1} << 62};
  return absl::InvalidArgumentError(absl::StrCat("unknown name '", std::string(name), "'"));
}

absl::StatusOr<int64_t> Eval(const std::string& text, int64_t n, int64_t m = 1) {
  auto expr = GridExpr::Compile(text, Resolve);
  if (!expr.ok()) return expr.status();
  const Arg args[] = {Arg(n), Arg(m), Arg(1.5f)};
  int64_t r;
  if (!expr->Evaluate(args, &r)) return absl::OutOfRangeError("evaluation failed");
  return r;
}

TEST(GridExprTest, Evaluates) {
  EXPECT_EQ(*Eval("cdiv(n, BLOCK)", 0), 0);
  EXPECT_EQ(*Eval("cdiv(n, BLOCK)", 1), 1);
  EXPECT_EQ(*Eval("cdiv(n, BLOCK)", 1024), 1);
  EXPECT_EQ(*Eval("cdiv(n, BLOCK)", 1025), 2);
  EXPECT_EQ(*Eval("n / 3", 10), 3);
  EXPECT_EQ(*Eval("n - m * 2", 10, 3), 4);
  EXPECT_EQ(*Eval("(n - m) * 2", 10, 3), 14);
  EXPECT_EQ(*Eval("min(n, 4) + max(m, 7)", 10, 3), 11);
  EXPECT_EQ(*Eval("-n + 20", 5), 15);
  EXPECT_EQ(*Eval("cdiv(n, 128) * cdiv(m, 64)", 300, 100), 6);
  EXPECT_EQ(*Eval("  42 ", 0), 42);
}

// A constant right operand becomes its operator's immediate (Compile); a constant left
// operand stays on the stack. Both orders, every operator, and negative divisors (cdiv's
// general path) against the values the grammar defines.
TEST(GridExprTest, ConstantOperandsOnEitherSide) {
  EXPECT_EQ(*Eval("n - 64", 100), 36);
  EXPECT_EQ(*Eval("64 - n", 100), -36);
  EXPECT_EQ(*Eval("n / 7", 100), 14);
  EXPECT_EQ(*Eval("700 / n", 100), 7);
  EXPECT_EQ(*Eval("cdiv(n, 7)", 100), 15);
  EXPECT_EQ(*Eval("cdiv(700, n)", 99), 8);
  EXPECT_EQ(*Eval("cdiv(n, -3)", 10), -2) << "(10 - 3 - 1) / -3, truncating";
  EXPECT_EQ(*Eval("cdiv(n, -3) + 0 * m", -10, 5), 4);
  EXPECT_EQ(*Eval("min(n, 4) * max(3, m)", 10, 1), 12);
  EXPECT_EQ(*Eval("min(m, cdiv(n, 64) * cdiv(n, 128))", 1000, 132), 128);
  EXPECT_EQ(*Eval("min(m, cdiv(n, 64) * cdiv(n, 128))", 4000, 132), 132);
  EXPECT_EQ(*Eval("-(n * 2) + 1", 5), -9);
  EXPECT_FALSE(Eval("n * 4611686018427387904", 2).ok()) << "overflow with an immediate";
  EXPECT_FALSE(Eval("n + 9223372036854775807", 1).ok());
  EXPECT_FALSE(Eval("cdiv(n, 2)", INT64_MAX).ok()) << "n + 1 overflows";
}

TEST(GridExprTest, FoldsConstants) {
  auto expr = GridExpr::Compile("cdiv(4096, BLOCK) * 2 + 1", Resolve);
  ASSERT_TRUE(expr.ok());
  EXPECT_EQ(expr->constant(), 9);
  EXPECT_FALSE(GridExpr::Compile("n + 1", Resolve)->constant().has_value());
  EXPECT_EQ(GridExpr().constant(), 1);
}

TEST(GridExprTest, LoadTimeErrors) {
  struct Case {
    const char* text;
    const char* mentions;
  } cases[] = {
      {"cdiv(n, BLOK)", "unknown name 'BLOK'"},
      {"n / 0", "division by zero"},
      {"cdiv(n, 0)", "division by zero"},
      {"cdiv(n, ZERO)", "division by zero"},
      {"n / (BLOCK - 1024)", "division by zero"},
      {"BIG * 4", "overflow"},
      {"9223372036854775807 + 1", "overflow"},
      {"99999999999999999999", "out of 64-bit range"},
      {"cdiv(n", "two arguments"},
      {"cdiv(n, 4", "expected ')'"},
      {"n +", "expected a number"},
      {"pow(n, 2)", "unknown function 'pow'"},
      {"min(n)", "two arguments"},
      {"n $ 2", "unexpected '$'"},
      {"", "expected a number"},
      {"((((((((((((((((((n))))))))))))))))))", "too deeply"},
  };
  for (const Case& c : cases) {
    auto expr = GridExpr::Compile(c.text, Resolve);
    ASSERT_FALSE(expr.ok()) << c.text;
    EXPECT_EQ(expr.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(expr.status().message()), HasSubstr(c.mentions)) << c.text;
  }
}

TEST(GridExprTest, CdivByInt64MinIsExactNotUndefined) {
  // Found by the fuzzer: b - 1 overflowed for b = INT64_MIN.
  EXPECT_EQ(*Eval("cdiv(n, m)", 1, INT64_MIN), 1);
  // (a + b - 1) itself leaves int64 here: an overflow, reported, never undefined.
  EXPECT_FALSE(Eval("cdiv(n, m)", 0, INT64_MIN).ok());
  EXPECT_EQ(GridExpr::Compile("cdiv(1, -9223372036854775807 - 1)", Resolve)->constant(), 1);
}

TEST(GridExprTest, RunTimeFailuresAreReported) {
  EXPECT_FALSE(Eval("n / m", 10, 0).ok()) << "division by a zero argument";
  EXPECT_FALSE(Eval("cdiv(n, m)", 10, 0).ok());
  EXPECT_FALSE(Eval("n * BIG", 8).ok()) << "overflow";
  EXPECT_FALSE(Eval("f + 1", 0).ok()) << "a non-integer argument";
  auto expr = GridExpr::Compile("n", Resolve);
  const Arg huge[] = {Arg(~uint64_t{0}), Arg(1), Arg(1)};
  int64_t r;
  EXPECT_FALSE(expr->Evaluate(huge, &r)) << "an unsigned value past INT64_MAX";
}

// cdiv(argument, C > 0), which Evaluate computes inline, against the interpreter at the
// edges: int64's ends, negatives, unsigned values past INT64_MAX, non-integers.
TEST(GridExprTest, InlineCdivMatchesTheInterpreter) {
  for (const char* text : {"cdiv(n, BLOCK)", "cdiv(n, 1)", "cdiv(m, 7)", "cdiv(n, BIG)"}) {
    auto expr = GridExpr::Compile(text, Resolve);
    ASSERT_TRUE(expr.ok()) << text;
    for (Arg a : {Arg(int64_t{0}), Arg(int64_t{1}), Arg(int64_t{1023}), Arg(int64_t{1025}),
                  Arg(int64_t{-1}), Arg(int64_t{-1025}), Arg(INT64_MAX), Arg(INT64_MAX - 1022),
                  Arg(INT64_MAX - 1023), Arg(INT64_MIN), Arg(uint64_t{INT64_MAX}),
                  Arg(uint64_t{INT64_MAX} + 1), Arg(CUdeviceptr{1} << 40), Arg(2.5),
                  Arg(true)}) {
      const Arg args[] = {a, a, Arg(1.5f)};
      int64_t got = -7, want = -7;
      const bool got_ok = expr->Evaluate(args, &got);
      ASSERT_EQ(got_ok, expr->EvaluateProgram(args, &want)) << text << " " << a.bits();
      if (got_ok) EXPECT_EQ(got, want) << text << " " << a.bits();
    }
  }
  int64_t r;
  const Arg max[] = {Arg(INT64_MAX), Arg(1), Arg(1)};
  EXPECT_FALSE(GridExpr::Compile("cdiv(n, BLOCK)", Resolve)->Evaluate(max, &r))
      << "n + 1023 overflows";
  const Arg big[] = {Arg(INT64_MAX - 1023), Arg(1), Arg(1)};
  ASSERT_TRUE(GridExpr::Compile("cdiv(n, BLOCK)", Resolve)->Evaluate(big, &r));
  EXPECT_EQ(r, INT64_MAX / 1024);
}

}  // namespace
}  // namespace kpack::internal
