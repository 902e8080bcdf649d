// Fuzzes GridExpr::Compile and GridExpr::Evaluate, checked against a plain reference
// interpreter of the grammar in docs/pack-format.md.
//
// Input: byte 0 picks the C++ kind of the three call arguments (2 bits each, argument 0 in
// the low bits: 0 int64_t, 1 uint64_t, 2 CUdeviceptr, 3 double); bytes 1..24 are their
// values (three little-endian 64-bit words; a double takes the word's bits); the rest is
// the expression. Names: n, m, k are arguments 0, 1, 2; BLOCK = 1024 and ZERO = 0 are
// constexprs.
//
// Checked when an expression compiles:
//   - the reference parses it too, and the program reads an argument exactly when the
//     text names one (constant() is documented as "the folded constant, if the expression
//     does not read any argument");
//   - a constant() expression evaluates, whatever the arguments, to that constant;
//   - Evaluate succeeds exactly when the reference finds no overflow, division by zero or
//     non-integer / out-of-range argument, and then gives the reference's value.

#include <cctype>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "dispatch/grid_expr.h"
#include "fuzz_check.h"
#include "kpack/arg.h"

namespace {

using kpack::Arg;
using kpack::internal::GridExpr;

constexpr size_t kHeaderSize = 1 + 3 * 8;

absl::StatusOr<GridExpr::Name> Resolve(absl::string_view name) {
  if (name == "n") return GridExpr::Name{GridExpr::Name::kArg, 0};
  if (name == "m") return GridExpr::Name{GridExpr::Name::kArg, 1};
  if (name == "k") return GridExpr::Name{GridExpr::Name::kArg, 2};
  if (name == "BLOCK") return GridExpr::Name{GridExpr::Name::kConstant, 1024};
  if (name == "ZERO") return GridExpr::Name{GridExpr::Name::kConstant, 0};
  return absl::InvalidArgumentError("unknown name");
}

// The reference: evaluates while it parses, in 128-bit arithmetic, and records a
// failure rather than stopping, so that it sees the whole text.
class Reference {
 public:
  Reference(absl::string_view text, std::span<const Arg> args) : text_(text), args_(args) {}

  bool parsed() const { return parsed_; }
  bool reads_args() const { return reads_args_; }
  // The value, if evaluation neither overflowed nor divided by zero nor met a bad argument.
  std::optional<int64_t> value() const { return failed_ ? std::nullopt : std::optional(v_); }

  void Run() {
    v_ = Expr(0);
    Skip();
    if (pos_ != text_.size()) parsed_ = false;
  }

 private:
  static constexpr int kMaxDepth = 200;  // far beyond what Compile accepts

  void Skip() {
    while (pos_ < text_.size() && std::isspace(static_cast<unsigned char>(text_[pos_]))) ++pos_;
  }
  bool Eat(char c) {
    Skip();
    if (pos_ < text_.size() && text_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  int64_t Check(__int128 r) {
    if (r < INT64_MIN || r > INT64_MAX) {
      failed_ = true;
      return 0;
    }
    return static_cast<int64_t>(r);
  }
  int64_t Div(__int128 a, __int128 b) {
    if (b == 0) {
      failed_ = true;
      return 0;
    }
    return Check(a / b);  // truncating, as in C++
  }
  int64_t Apply(char op, int64_t a, int64_t b) {
    switch (op) {
      case '+': return Check(__int128{a} + b);
      case '-': return Check(__int128{a} - b);
      case '*': return Check(__int128{a} * b);
      case '/': return Div(a, b);
      case 'c': return Div(Check(__int128{a} + b - 1), b);  // cdiv(a, b) = (a + b - 1) / b
      case '<': return a < b ? a : b;
      default: return a > b ? a : b;
    }
  }

  int64_t Expr(int depth) {
    if (depth > kMaxDepth) return Fail();
    int64_t v = Term(depth + 1);
    while (parsed_) {
      if (Eat('+')) {
        v = Apply('+', v, Term(depth + 1));
      } else if (Eat('-')) {
        v = Apply('-', v, Term(depth + 1));
      } else {
        break;
      }
    }
    return v;
  }
  int64_t Term(int depth) {
    int64_t v = Unary(depth + 1);
    while (parsed_) {
      if (Eat('*')) {
        v = Apply('*', v, Unary(depth + 1));
      } else if (Eat('/')) {
        v = Apply('/', v, Unary(depth + 1));
      } else {
        break;
      }
    }
    return v;
  }
  int64_t Unary(int depth) {
    if (depth > kMaxDepth) return Fail();
    if (Eat('-')) return Check(-__int128{Unary(depth + 1)});
    return Primary(depth + 1);
  }
  int64_t Primary(int depth) {
    Skip();
    if (pos_ >= text_.size()) return Fail();
    const char c = text_[pos_];
    if (std::isdigit(static_cast<unsigned char>(c))) {
      __int128 v = 0;
      while (pos_ < text_.size() && std::isdigit(static_cast<unsigned char>(text_[pos_]))) {
        v = v * 10 + (text_[pos_++] - '0');
        if (v > INT64_MAX) return Fail();
      }
      return static_cast<int64_t>(v);
    }
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      const size_t start = pos_;
      while (pos_ < text_.size() &&
             (std::isalnum(static_cast<unsigned char>(text_[pos_])) || text_[pos_] == '_')) {
        ++pos_;
      }
      const absl::string_view name = text_.substr(start, pos_ - start);
      Skip();
      if (pos_ < text_.size() && text_[pos_] == '(') {
        ++pos_;
        const char op = name == "cdiv" ? 'c' : name == "min" ? '<' : name == "max" ? '>' : 0;
        if (op == 0) return Fail();
        const int64_t a = Expr(depth + 1);
        if (!Eat(',')) return Fail();
        const int64_t b = Expr(depth + 1);
        if (!Eat(')')) return Fail();
        return Apply(op, a, b);
      }
      absl::StatusOr<GridExpr::Name> meaning = Resolve(name);
      if (!meaning.ok()) return Fail();
      if (meaning->kind == GridExpr::Name::kConstant) return meaning->value;
      reads_args_ = true;
      const Arg& arg = args_[meaning->value];
      switch (arg.kind()) {
        case Arg::Kind::kSigned:
          return static_cast<int64_t>(arg.bits());
        case Arg::Kind::kUnsigned:
        case Arg::Kind::kDevicePtr:
          return Check(arg.bits());
        default:
          failed_ = true;
          return 0;
      }
    }
    if (Eat('(')) {
      const int64_t v = Expr(depth + 1);
      if (!Eat(')')) return Fail();
      return v;
    }
    return Fail();
  }
  int64_t Fail() {
    parsed_ = false;
    return 0;
  }

  absl::string_view text_;
  std::span<const Arg> args_;
  size_t pos_ = 0;
  int64_t v_ = 0;
  bool parsed_ = true;
  bool failed_ = false;
  bool reads_args_ = false;
};

Arg MakeArg(int kind, uint64_t bits) {
  switch (kind) {
    case 0: return Arg(static_cast<int64_t>(bits));
    case 1: return Arg(static_cast<uint64_t>(bits));
    case 2: return Arg(static_cast<CUdeviceptr>(bits));
    default: {
      double d;
      std::memcpy(&d, &bits, sizeof(d));
      return Arg(d);
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < kHeaderSize) return 0;
  Arg args[3] = {Arg(0), Arg(0), Arg(0)};
  for (int i = 0; i < 3; ++i) {
    uint64_t bits = 0;
    for (int b = 7; b >= 0; --b) bits = bits << 8 | data[1 + 8 * i + b];
    args[i] = MakeArg((data[0] >> (2 * i)) & 3, bits);
  }
  const absl::string_view text(reinterpret_cast<const char*>(data) + kHeaderSize,
                               size - kHeaderSize);

  absl::StatusOr<GridExpr> expr = GridExpr::Compile(text, Resolve);
  if (!expr.ok()) {
    KPACK_FUZZ_CHECK(expr.status().code() == absl::StatusCode::kInvalidArgument);
    return 0;
  }
  Reference ref(text, args);
  ref.Run();
  KPACK_FUZZ_CHECK(ref.parsed());
  KPACK_FUZZ_CHECK(expr->constant().has_value() == !ref.reads_args());

  int64_t result = 0;
  const bool ok = expr->Evaluate(args, &result);
  if (expr->constant().has_value()) {
    KPACK_FUZZ_CHECK(ok && result == *expr->constant());
  }
  KPACK_FUZZ_CHECK(ok == ref.value().has_value());
  if (ok) KPACK_FUZZ_CHECK(result == *ref.value());
  return 0;
}
