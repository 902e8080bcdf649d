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
  // non-integer or out-of-range argument: the caller reports it.
  bool Evaluate(std::span<const Arg> args, int64_t* result) const {
    if (std::optional<int64_t> c = constant()) {  // most y and z axes: no interpreter
      *result = *c;
      return true;
    }
    return Run(args, result);
  }

  // The folded constant, if the expression does not read any argument.
  std::optional<int64_t> constant() const {
    if (size_ == 1 && code_[0].op == Op::kConst) return code_[0].operand;
    return std::nullopt;
  }

 private:
  enum class Op : uint8_t { kConst, kArg, kAdd, kSub, kMul, kDiv, kNeg, kCdiv, kMin, kMax };
  struct Instr {
    Op op;
    int64_t operand;
  };
  friend class GridExprParser;
  bool Run(std::span<const Arg> args, int64_t* result) const;
  std::array<Instr, kMaxOps> code_{};
  int size_ = 0;
};

// The names a kernel's grid expressions may use for one of its variants, as Open resolves
// them: integer call parameters (read per launch) and the variant's integer constexprs
// (folded in). Anything else is an error naming why. Both specs must outlive the resolver.
GridExpr::Resolver VariantGridResolver(const KernelSpec& kernel, const VariantSpec& variant);

}  // namespace kpack::internal

#endif  // KPACK_SRC_DISPATCH_GRID_EXPR_H_
