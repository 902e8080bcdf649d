// Grid expressions (grid_expr.h): the tokenizer and parser, constant folding with
// overflow checks, and the postfix evaluator a launch runs.

#include "dispatch/grid_expr.h"

#include <cctype>
#include <string>

#include "absl/strings/str_cat.h"
#include "launch/args.h"
#include "manifest/manifest.h"
#include "util/status_macros.h"

namespace kpack::internal {

// Recursive descent over
//   expr    := term (('+' | '-') term)*
//   term    := unary (('*' | '/') unary)*
//   unary   := '-' unary | primary
//   primary := INT | NAME | FUNC '(' expr ',' expr ')' | '(' expr ')'
// emitting postfix code; an operator whose operands are both constants is folded.
class GridExprParser {
 public:
  GridExprParser(absl::string_view text, const GridExpr::Resolver& resolve, GridExpr& out)
      : text_(text), resolve_(resolve), out_(out) {}

  absl::Status Parse() {
    out_.size_ = 0;
    KPACK_RETURN_IF_ERROR(Expr(0));
    Skip();
    if (pos_ != text_.size())
      return Error(absl::StrCat("unexpected '", text_.substr(pos_, 1), "'"));
    return absl::OkStatus();
  }

 private:
  using Op = GridExpr::Op;

  absl::Status Error(absl::string_view what) const {
    return absl::InvalidArgumentError(
        absl::StrCat("grid expression '", text_, "' at offset ", pos_, ": ", what));
  }
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
  absl::Status Emit(Op op, int64_t operand = 0) {
    if (out_.size_ == GridExpr::kMaxOps) return Error("expression too long");
    out_.code_[out_.size_++] = {op, false, 0, operand};
    return absl::OkStatus();
  }
  bool TopIsConst(int depth) const {
    return out_.size_ > depth && out_.code_[out_.size_ - 1 - depth].op == Op::kConst;
  }
  // Emits a binary operator, folding it when both operands are constants.
  absl::Status Binary(Op op) {
    if (TopIsConst(0) && out_.code_[out_.size_ - 1].operand == 0 &&
        (op == Op::kDiv || op == Op::kCdiv)) {
      return Error("division by zero");
    }
    if (TopIsConst(0) && TopIsConst(1)) {
      int64_t b = out_.code_[--out_.size_].operand;
      int64_t a = out_.code_[--out_.size_].operand;
      int64_t r;
      if (!Apply(op, a, b, &r)) return Error("overflow in constant arithmetic");
      return Emit(Op::kConst, r);
    }
    return Emit(op);
  }

  absl::Status Expr(int depth) {
    if (depth > GridExpr::kMaxStack) return Error("expression nested too deeply");
    KPACK_RETURN_IF_ERROR(Term(depth));
    while (true) {
      if (Eat('+')) {
        KPACK_RETURN_IF_ERROR(Term(depth + 1));
        KPACK_RETURN_IF_ERROR(Binary(Op::kAdd));
      } else if (Eat('-')) {
        KPACK_RETURN_IF_ERROR(Term(depth + 1));
        KPACK_RETURN_IF_ERROR(Binary(Op::kSub));
      } else {
        return absl::OkStatus();
      }
    }
  }
  absl::Status Term(int depth) {
    KPACK_RETURN_IF_ERROR(Unary(depth));
    while (true) {
      if (Eat('*')) {
        KPACK_RETURN_IF_ERROR(Unary(depth + 1));
        KPACK_RETURN_IF_ERROR(Binary(Op::kMul));
      } else if (Eat('/')) {
        KPACK_RETURN_IF_ERROR(Unary(depth + 1));
        KPACK_RETURN_IF_ERROR(Binary(Op::kDiv));
      } else {
        return absl::OkStatus();
      }
    }
  }
  absl::Status Unary(int depth) {
    if (depth > GridExpr::kMaxStack) return Error("expression nested too deeply");
    if (Eat('-')) {
      KPACK_RETURN_IF_ERROR(Unary(depth + 1));
      if (TopIsConst(0)) {
        int64_t& v = out_.code_[out_.size_ - 1].operand;
        if (v == INT64_MIN) return Error("overflow in constant arithmetic");
        v = -v;
        return absl::OkStatus();
      }
      return Emit(Op::kNeg);
    }
    return Primary(depth);
  }
  absl::Status Primary(int depth) {
    Skip();
    if (pos_ >= text_.size()) return Error("expected a number, name or '('");
    char c = text_[pos_];
    if (std::isdigit(static_cast<unsigned char>(c))) {
      int64_t v = 0;
      while (pos_ < text_.size() && std::isdigit(static_cast<unsigned char>(text_[pos_]))) {
        if (__builtin_mul_overflow(v, 10, &v) || __builtin_add_overflow(v, text_[pos_] - '0', &v)) {
          return Error("integer literal out of 64-bit range");
        }
        ++pos_;
      }
      return Emit(Op::kConst, v);
    }
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t start = pos_;
      while (pos_ < text_.size() &&
             (std::isalnum(static_cast<unsigned char>(text_[pos_])) || text_[pos_] == '_')) {
        ++pos_;
      }
      absl::string_view name = text_.substr(start, pos_ - start);
      Skip();
      if (pos_ < text_.size() && text_[pos_] == '(') {
        Op op;
        if (name == "cdiv") {
          op = Op::kCdiv;
        } else if (name == "min") {
          op = Op::kMin;
        } else if (name == "max") {
          op = Op::kMax;
        } else {
          return Error(absl::StrCat("unknown function '", name, "' (known: cdiv, min, max)"));
        }
        ++pos_;
        KPACK_RETURN_IF_ERROR(Expr(depth + 1));
        if (!Eat(',')) return Error(absl::StrCat(name, " takes two arguments"));
        KPACK_RETURN_IF_ERROR(Expr(depth + 1));
        if (!Eat(')')) return Error("expected ')'");
        return Binary(op);
      }
      absl::StatusOr<GridExpr::Name> meaning = resolve_(name);
      if (!meaning.ok()) return Error(meaning.status().message());
      return meaning->kind == GridExpr::Name::kArg ? Emit(Op::kArg, meaning->value)
                                                   : Emit(Op::kConst, meaning->value);
    }
    if (Eat('(')) {
      KPACK_RETURN_IF_ERROR(Expr(depth + 1));
      if (!Eat(')')) return Error("expected ')'");
      return absl::OkStatus();
    }
    return Error(absl::StrCat("unexpected '", absl::string_view(&c, 1), "'"));
  }

 public:
  static bool Apply(Op op, int64_t a, int64_t b, int64_t* r) {
    switch (op) {
      case Op::kAdd:
        return !__builtin_add_overflow(a, b, r);
      case Op::kSub:
        return !__builtin_sub_overflow(a, b, r);
      case Op::kMul:
        return !__builtin_mul_overflow(a, b, r);
      case Op::kDiv:
        if (b == 0 || (a == INT64_MIN && b == -1)) return false;
        *r = a / b;
        return true;
      case Op::kCdiv: {
        // a + b - 1 in 128 bits: b - 1 alone overflows for b = INT64_MIN (found by the
        // grid expression fuzzer).
        if (b > 0) {  // the usual case (a block size): b - 1 cannot overflow
          int64_t t;
          if (__builtin_add_overflow(a, b - 1, &t)) return false;
          *r = t / b;
          return true;
        }
        if (b == 0) return false;
        const __int128 t = static_cast<__int128>(a) + b - 1;
        if (t < INT64_MIN || t > INT64_MAX || (t == INT64_MIN && b == -1)) return false;
        *r = static_cast<int64_t>(t) / b;
        return true;
      }
      case Op::kMin:
        *r = a < b ? a : b;
        return true;
      case Op::kMax:
        *r = a > b ? a : b;
        return true;
      default:
        return false;
    }
  }

 private:
  absl::string_view text_;
  const GridExpr::Resolver& resolve_;
  GridExpr& out_;
  size_t pos_ = 0;
};

GridExpr::GridExpr() {
  code_[0] = {Op::kConst, false, 0, 1};
  size_ = 1;
}

absl::StatusOr<GridExpr> GridExpr::Compile(absl::string_view text, const Resolver& resolve) {
  GridExpr expr;
  GridExprParser parser(text, resolve, expr);
  KPACK_RETURN_IF_ERROR(parser.Parse());
  const Instr* code = expr.code_.data();
  if (expr.size_ == 1 && code[0].op == Op::kConst) {
    expr.form_ = Form::kConstant;
  } else if (expr.size_ == 3 && code[0].op == Op::kArg && code[1].op == Op::kConst &&
             code[1].operand > 0 && code[2].op == Op::kCdiv) {
    expr.form_ = Form::kCdivArg;
  } else {
    expr.form_ = Form::kProgram;
  }
  // Evaluate's stack is fixed; refuse here what would overflow it at every launch.
  int depth = 0;
  for (int i = 0; i < expr.size_; ++i) {
    Op op = expr.code_[i].op;
    depth += (op == Op::kConst || op == Op::kArg) ? 1 : op == Op::kNeg ? 0 : -1;
    if (depth > kMaxStack) {
      return absl::InvalidArgumentError(
          absl::StrCat("grid expression '", text, "' is nested too deeply"));
    }
  }
  // One pass of two rewrites. A constant right operand becomes its operator's immediate
  // (one instruction less to dispatch, no stack traffic; kept when it is the whole program
  // or a left operand). Then an argument followed by a cdiv by a positive immediate becomes
  // one kArgCdiv.
  if (expr.form_ == Form::kProgram) {
    int n = 0;
    for (int i = 0; i < expr.size_; ++i) {
      Instr in = expr.code_[i];
      const bool binary = in.op != Op::kConst && in.op != Op::kArg && in.op != Op::kNeg;
      if (binary && n > 0 && expr.code_[n - 1].op == Op::kConst) {
        in = {in.op, true, 0, expr.code_[--n].operand};
      }
      if (in.op == Op::kCdiv && in.imm && in.operand > 0 && n > 0 &&
          expr.code_[n - 1].op == Op::kArg) {
        in = {Op::kArgCdiv, false, static_cast<uint32_t>(expr.code_[--n].operand), in.operand};
      }
      expr.code_[n++] = in;
    }
    expr.size_ = n;
  }
  return expr;
}

bool GridExpr::Run(std::span<const Arg> args, int64_t* result) const {
  int64_t stack[kMaxStack];
  int top = 0;
  for (int i = 0; i < size_; ++i) {
    const Instr& in = code_[i];
    switch (in.op) {
      case Op::kConst:
        stack[top++] = in.operand;
        break;
      case Op::kArg:
        if (!args_detail::ToInt64(args[in.operand], &stack[top])) return false;
        ++top;
        break;
      case Op::kArgCdiv: {  // as kArg, then Apply's kCdiv with b > 0
        int64_t a, t;
        if (!args_detail::ToInt64(args[in.arg], &a) ||
            __builtin_add_overflow(a, in.operand - 1, &t)) {
          return false;
        }
        stack[top++] = t / in.operand;
        break;
      }
      case Op::kNeg:
        if (stack[top - 1] == INT64_MIN) return false;
        stack[top - 1] = -stack[top - 1];
        break;
      default: {
        const int64_t b = in.imm ? in.operand : stack[--top];
        if (!GridExprParser::Apply(in.op, stack[top - 1], b, &stack[top - 1])) return false;
        break;
      }
    }
  }
  *result = stack[0];
  return top == 1;
}

GridExpr::Resolver VariantGridResolver(const KernelSpec& kernel, const VariantSpec& variant) {
  return [&kernel, &variant](absl::string_view name) -> absl::StatusOr<GridExpr::Name> {
    for (size_t a = 0; a < kernel.args.size(); ++a) {
      const ParamSpec& p = kernel.arg(static_cast<int>(a));
      if (p.name != name) continue;
      if (!IsInteger(variant.arg_types[a])) {
        return absl::InvalidArgumentError(
            absl::StrCat("'", name, "' is a ", p.type_name, " parameter, not an integer"));
      }
      return GridExpr::Name{GridExpr::Name::kArg, static_cast<int64_t>(a)};
    }
    auto it = variant.constexprs.find(std::string(name));
    if (it != variant.constexprs.end()) {
      if (!it->is_number_integer() ||
          (it->is_number_unsigned() && it->get<uint64_t>() > uint64_t{INT64_MAX})) {
        return absl::InvalidArgumentError(
            absl::StrCat("constexpr '", name, "' is ", it->dump(), ", not an integer"));
      }
      return GridExpr::Name{GridExpr::Name::kConstant, it->get<int64_t>()};
    }
    return absl::InvalidArgumentError(
        absl::StrCat("unknown name '", name, "' (neither a call parameter nor a constexpr)"));
  };
}

}  // namespace kpack::internal
