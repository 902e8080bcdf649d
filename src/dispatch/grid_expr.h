// Grid expressions: `cdiv(n, BLOCK)`, `min(a, 4) * 2`, ... (docs/pack-format.md).
//
// Compiled once at load into a short postfix program in which constexprs are already
// replaced by their values and constant subexpressions folded, so a launch only reads
// call arguments and does 64-bit integer arithmetic on a fixed-size stack: no allocation.

#ifndef KPACK_SRC_DISPATCH_GRID_EXPR_H_
#define KPACK_SRC_DISPATCH_GRID_EXPR_H_

#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kpack/arg.h"
#include "launch/args.h"

namespace kpack::internal {

struct KernelSpec;
struct VariantSpec;

class GridExpr {
 public:
  // What a name in an expression means: a call argument (by index) or a constant.
  struct Name {
    enum Kind { kArg, kConstant } kind;
    int64_t value;  // the argument index, or the constant
  };
  // Returns the meaning of `name`, or an error saying why it has none (unknown, not an
  // integer...). Called at compile time only.
  using Resolver = std::function<absl::StatusOr<Name>(absl::string_view name)>;

  static constexpr int kMaxOps = 64;
  static constexpr int kMaxStack = 16;

  // A constant expression `1`: what an axis without an expression is.
  GridExpr();

  // Parses and folds `text`. INVALID_ARGUMENT (without location prefix; the caller adds
  // kernel/variant/axis) for a syntax error, an unresolvable name, division by a literal
  // zero, overflow while folding, or an expression too long or deep.
  static absl::StatusOr<GridExpr> Compile(absl::string_view text, const Resolver& resolve);

  // Evaluates with the call arguments `args` (integer kinds where the expression reads
  // them, which the launch has already checked). False on overflow, division by zero, a
  // non-integer or out-of-range argument: the caller reports it. The shapes nearly every
  // axis has -- a constant, `cdiv(arg, C)` with C > 0 -- are computed here, inline;
  // anything else goes through the interpreter (Run), which they match exactly.
  bool Evaluate(std::span<const Arg> args, int64_t* result) const {
    switch (form_) {
      case Form::kConstant:  // most y and z axes
        *result = code_[0].operand;
        return true;
      case Form::kCdivArg: {  // most x axes: (a + C - 1) / C, as Run's kCdiv computes it
        int64_t a;
        if (!args_detail::ToInt64(args[code_[0].operand], &a)) return false;
        const int64_t c = code_[1].operand;
        int64_t t;
        if (__builtin_add_overflow(a, c - 1, &t)) return false;
        *result = t / c;
        return true;
      }
      case Form::kProgram:
        break;
    }
    return Run(args, result);
  }

  // The interpreter alone, whatever the form: the reference that Evaluate's inline forms
  // must match (tests compare the two).
  bool EvaluateProgram(std::span<const Arg> args, int64_t* result) const {
    return Run(args, result);
  }

  // The folded constant, if the expression does not read any argument.
  std::optional<int64_t> constant() const {
    if (form_ == Form::kConstant) return code_[0].operand;
    return std::nullopt;
  }

 private:
  // kArgCdiv: cdiv(argument `arg`, immediate operand > 0) in one step (Compile fuses an
  // argument and the cdiv by a positive constant that follows it).
  enum class Op : uint8_t {
    kConst, kArg, kAdd, kSub, kMul, kDiv, kNeg, kCdiv, kMin, kMax, kArgCdiv
  };
  // What Evaluate does: return the constant code_[0]; cdiv(argument code_[0], constant
  // code_[1] > 0); or run the program. Set by Compile from the folded program.
  enum class Form : uint8_t { kConstant, kCdivArg, kProgram };
  // A binary operator with `imm` takes its right operand from `operand` instead of the
  // stack: Compile turns a constant pushed right before a binary operator into that.
  struct Instr {
    Op op;
    bool imm = false;
    uint32_t arg = 0;  // kArgCdiv's argument index
    int64_t operand;
  };
  friend class GridExprParser;
  bool Run(std::span<const Arg> args, int64_t* result) const;
  // form_ and size_ first: Evaluate's inline forms then read one cache line.
  Form form_ = Form::kConstant;
  int size_ = 0;
  std::array<Instr, kMaxOps> code_{};
};

// The names a kernel's grid expressions may use for one of its variants, as Open resolves
// them: integer call parameters (read per launch) and the variant's integer constexprs
// (folded in). Anything else is an error naming why. Both specs must outlive the resolver.
GridExpr::Resolver VariantGridResolver(const KernelSpec& kernel, const VariantSpec& variant);

}  // namespace kpack::internal

#endif  // KPACK_SRC_DISPATCH_GRID_EXPR_H_
