// Fuzzes GridExpr::Compile and GridExpr::Evaluate (src/dispatch/grid_expr.h).
//
// Input: byte 0 picks the C++ kind of the three call arguments (2 bits each, argument 0 in
// the low bits: 0 int64_t, 1 uint64_t, 2 CUdeviceptr, 3 double) and, in its top 2 bits,
// the mode; bytes 1..24 are the arguments' values (three little-endian 64-bit words; a
// double takes the word's bits); the rest drives the mode. Names: n, m, k are arguments
// 0, 1, 2; BLOCK = 1024 and ZERO = 0 are constexprs.
//
// Mode 0 (top bits 00), text: the rest is an expression, any bytes. Compile must return
// a GridExpr or INVALID_ARGUMENT; a compiled expression must evaluate without undefined
// behaviour, and a constant() one to that constant whatever the arguments.
//
// Modes 1-3, oracle: the rest drives a generator of expression trees (up to depth 4, 31
// nodes, well inside Compile's limits) that prints each tree in the grammar of
// docs/pack-format.md, with parentheses where precedence needs them or a byte asks for
// them, and spaces where a byte asks. A reference evaluates the tree itself, in 128-bit
// arithmetic, and says what Compile and Evaluate must do:
//   - Compile fails (INVALID_ARGUMENT) exactly when a constant sub-expression (one naming
//     no argument) overflows or divides by zero, or a division's divisor is a constant 0:
//     folding at compile time;
//   - constant() has a value exactly when the tree names no argument;
//   - Evaluate succeeds exactly when the reference finds no overflow, division by zero or
//     non-integer / out-of-range argument, and then gives the reference's value.
// The oracle has no parser of its own: the text comes from a tree it built, so the only
// grammar reading under test is Compile's (an earlier version re-implemented the scanner
// and parser in the reference, a copy of the code it checked).

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <memory>
#include <optional>
#include <span>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "dispatch/grid_expr.h"
#include "fuzz_check.h"
#include "kpack/arg.h"

namespace {

using kpack::Arg;
using kpack::internal::GridExpr;

constexpr size_t kHeaderSize = 1 + 3 * 8;
constexpr int kMaxDepth = 4;  // edges from the root; Compile allows 16 levels of nesting

constexpr const char* kNames[] = {"n", "m", "k", "BLOCK", "ZERO"};

absl::StatusOr<GridExpr::Name> Resolve(absl::string_view name) {
  if (name == "n") return GridExpr::Name{GridExpr::Name::kArg, 0};
  if (name == "m") return GridExpr::Name{GridExpr::Name::kArg, 1};
  if (name == "k") return GridExpr::Name{GridExpr::Name::kArg, 2};
  if (name == "BLOCK") return GridExpr::Name{GridExpr::Name::kConstant, 1024};
  if (name == "ZERO") return GridExpr::Name{GridExpr::Name::kConstant, 0};
  return absl::InvalidArgumentError("unknown name");
}

// ---------------------------------------------------------------- the reference evaluator

// A value in 128-bit arithmetic, or none after overflow, division by zero or a bad
// argument: the grammar's semantics (64-bit results; cdiv(a, b) = (a + b - 1) / b,
// truncating).
using Value = std::optional<int64_t>;

Value Check(__int128 r) {
  if (r < INT64_MIN || r > INT64_MAX) return std::nullopt;
  return static_cast<int64_t>(r);
}

Value Div(__int128 a, __int128 b) {
  if (b == 0) return std::nullopt;
  return Check(a / b);  // truncating, as in C++
}

Value Apply(char op, int64_t a, int64_t b) {
  switch (op) {
    case '+': return Check(__int128{a} + b);
    case '-': return Check(__int128{a} - b);
    case '*': return Check(__int128{a} * b);
    case '/': return Div(a, b);
    case 'c': {  // cdiv(a, b) = (a + b - 1) / b
      const Value t = Check(__int128{a} + b - 1);
      return t ? Div(*t, b) : std::nullopt;
    }
    case '<': return a < b ? a : b;
    default: return a > b ? a : b;
  }
}

Value ArgValue(const Arg& arg) {
  switch (arg.kind()) {
    case Arg::Kind::kSigned:
      return static_cast<int64_t>(arg.bits());
    case Arg::Kind::kUnsigned:
    case Arg::Kind::kDevicePtr:
      return Check(arg.bits());
    default:
      return std::nullopt;
  }
}

// ---------------------------------------------------------------- trees and their text

struct Node {
  // 'i' literal, 'a' name, '~' unary minus, '+', '-', '*', '/', and the functions
  // 'c' cdiv, '<' min, '>' max.
  char op = 'i';
  int64_t value = 0;  // a literal (>= 0: the grammar has no negative literal)
  int name = 0;       // index into kNames
  bool parens = false, spaces = false;
  std::unique_ptr<Node> a, b;

  bool is_function() const { return op == 'c' || op == '<' || op == '>'; }
  bool reads_args() const {
    return (op == 'a' && name < 3) || (a && a->reads_args()) || (b && b->reads_args());
  }
  // 1 additive, 2 multiplicative, 3 unary, 4 primary.
  int precedence() const {
    if (op == '+' || op == '-') return 1;
    if (op == '*' || op == '/') return 2;
    return op == '~' ? 3 : 4;
  }
};

// Reads the generator's bytes; 0 once they run out, so every input makes a tree.
class Bytes {
 public:
  explicit Bytes(std::span<const uint8_t> data) : data_(data) {}
  uint8_t Next() { return pos_ < data_.size() ? data_[pos_++] : 0; }
  uint64_t Word() {
    uint64_t w = 0;
    for (int i = 0; i < 8; ++i) w = w << 8 | Next();
    return w;
  }

 private:
  std::span<const uint8_t> data_;
  size_t pos_ = 0;
};

constexpr int64_t kLiterals[] = {0,         1,          2,          3,          16,
                                 1024,      4096,       1LL << 31,  1LL << 32,  1LL << 62,
                                 INT64_MAX, INT64_MAX - 1};

std::unique_ptr<Node> Build(Bytes& in, int depth) {
  auto node = std::make_unique<Node>();
  const uint8_t b = in.Next();
  node->parens = (b & 0x80) != 0;
  node->spaces = (b & 0x40) != 0;
  const int pick = (depth >= kMaxDepth ? 0 : b & 0x3f) % 12;
  if (pick <= 2) {  // a literal: an interesting one, or any 63-bit value
    const uint8_t l = in.Next();
    node->value = (l & 1) ? kLiterals[(l >> 1) % std::size(kLiterals)]
                          : static_cast<int64_t>(in.Word() & INT64_MAX);
  } else if (pick <= 4) {
    node->op = 'a';
    node->name = in.Next() % std::size(kNames);
  } else {
    node->op = "~+-*/c<>"[(pick - 5) % 8];
    node->a = Build(in, depth + 1);
    if (node->op != '~') node->b = Build(in, depth + 1);
  }
  return node;
}

// The tree's text. A child gets parentheses when its precedence is below what its place
// needs (a right operand of + - * / needs one more: they are left-associative), or when
// its byte asks for them.
void Print(const Node& n, int needs, std::string& out) {
  const bool parens = n.precedence() < needs || (n.parens && n.precedence() >= needs);
  if (parens) out += "(";
  const char* gap = n.spaces ? " " : "";
  switch (n.op) {
    case 'i': absl::StrAppend(&out, n.value); break;
    case 'a': out += kNames[n.name]; break;
    case '~':
      out += "-";
      Print(*n.a, 3, out);
      break;
    case 'c':
    case '<':
    case '>':
      out += n.op == 'c' ? "cdiv(" : n.op == '<' ? "min(" : "max(";
      Print(*n.a, 1, out);
      absl::StrAppend(&out, ",", gap);
      Print(*n.b, 1, out);
      out += ")";
      break;
    default:
      Print(*n.a, n.precedence(), out);
      absl::StrAppend(&out, gap, std::string(1, n.op), gap);
      Print(*n.b, n.precedence() + 1, out);
  }
  if (parens) out += ")";
}

// The tree's value with these arguments.
Value Evaluate(const Node& n, std::span<const Arg> args) {
  if (n.op == 'i') return n.value;
  if (n.op == 'a') return n.name < 3 ? ArgValue(args[n.name]) : n.name == 3 ? 1024 : 0;
  const Value a = Evaluate(*n.a, args);
  if (n.op == '~') return a ? Check(-__int128{*a}) : std::nullopt;
  const Value b = Evaluate(*n.b, args);
  if (!a || !b) return std::nullopt;
  return Apply(n.op, *a, *b);
}

// Whether Compile must refuse the tree: constant folding meets an overflow or a division
// by zero, or a division's divisor is a constant 0 (refused even when the dividend reads
// an argument).
bool FoldingFails(const Node& n) {
  if (n.op == 'i' || n.op == 'a') return false;
  if (FoldingFails(*n.a) || (n.b && FoldingFails(*n.b))) return true;
  if ((n.op == '/' || n.op == 'c') && !n.b->reads_args() && Evaluate(*n.b, {}) == 0) {
    return true;
  }
  return !n.reads_args() && !Evaluate(n, {}).has_value();
}

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

// Any text: no crash, no undefined behaviour, only INVALID_ARGUMENT, and a constant is
// what Evaluate gives.
void CheckText(absl::string_view text, std::span<const Arg> args) {
  absl::StatusOr<GridExpr> expr = GridExpr::Compile(text, Resolve);
  if (!expr.ok()) {
    KPACK_FUZZ_CHECK(expr.status().code() == absl::StatusCode::kInvalidArgument);
    return;
  }
  int64_t result = 0;
  const bool ok = expr->Evaluate(args, &result);
  if (expr->constant().has_value()) KPACK_FUZZ_CHECK(ok && result == *expr->constant());
}

// A generated tree: Compile and Evaluate against the reference.
void CheckTree(const Node& tree, std::span<const Arg> args) {
  std::string text;
  Print(tree, 1, text);
  absl::StatusOr<GridExpr> expr = GridExpr::Compile(text, Resolve);
  const bool refuse = FoldingFails(tree);
  if (!expr.ok()) {
    if (!refuse) {
      std::fprintf(stderr, "'%s' refused: %s\n", text.c_str(), expr.status().ToString().c_str());
    }
    KPACK_FUZZ_CHECK(refuse);
    KPACK_FUZZ_CHECK(expr.status().code() == absl::StatusCode::kInvalidArgument);
    return;
  }
  if (refuse) std::fprintf(stderr, "'%s' compiled, though folding fails\n", text.c_str());
  KPACK_FUZZ_CHECK(!refuse);
  KPACK_FUZZ_CHECK(expr->constant().has_value() == !tree.reads_args());
  int64_t result = 0;
  const bool ok = expr->Evaluate(args, &result);
  const Value want = Evaluate(tree, args);
  KPACK_FUZZ_CHECK(ok == want.has_value());
  if (ok) KPACK_FUZZ_CHECK(result == *want);
  if (expr->constant().has_value()) KPACK_FUZZ_CHECK(ok && result == *expr->constant());
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
  const std::span<const uint8_t> rest(data + kHeaderSize, size - kHeaderSize);
  if ((data[0] >> 6) == 0) {
    CheckText(absl::string_view(reinterpret_cast<const char*>(rest.data()), rest.size()), args);
  } else {
    Bytes in(rest);
    CheckTree(*Build(in, 0), args);
  }
  return 0;
}
