// What the Python kernel object says about itself: parameters, variants, grid
// expressions, and the `meta` dict a callable grid receives. Read once from the public
// introspection API (Kernel::info(), kpack/pack.h) when the kernel object is made;
// Python objects are built on demand.

#ifndef KPACK_SRC_PYTHON_META_H_
#define KPACK_SRC_PYTHON_META_H_

#include <Python.h>

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "kpack/kpack.h"

namespace kpack::python {

struct ParamMeta {
  std::string name, type;
  bool is_constexpr = false;
  bool readonly = false;
};

struct VariantMeta {
  std::string name;
  // One (param, low, high) per bucket dim, inclusive; nullopt: unbounded. Empty: the
  // variant serves every bucket.
  struct Range {
    std::string param;
    std::optional<int64_t> low, high;
  };
  std::vector<Range> bucket;
  std::vector<std::pair<std::string, std::string>> assumptions;  // (param, "div16"|"eq1")
  int num_warps = 0, num_ctas = 1, num_stages = 0, arch = 0;
  uint32_t shared = 0;
  uint32_t global_scratch_size = 0, profile_scratch_size = 0;
  bool launch_pdl = false, launch_cooperative_grid = false;
  std::string constexprs_json;
  std::vector<std::string> arg_types;
};

class KernelMeta {
 public:
  KernelMeta() = default;
  KernelMeta(const KernelMeta&) = delete;
  KernelMeta& operator=(const KernelMeta&) = delete;
  ~KernelMeta();  // needs the GIL (kernel objects die with it held)

  void Init(const Kernel& kernel);

  // "x, y, out, n": the call parameters, for messages.
  std::string signature;
  // Why a keyword is not a call parameter (" ('BLOCK' is a constexpr ...)"), for messages.
  std::string KeywordHint(const char* keyword) const;

  // New references, or null with a Python exception set.
  PyObject* Params() const;           // list of kpack.Param
  PyObject* Variants() const;         // list of kpack.Variant
  PyObject* GridExpressions() const;  // tuple of str
  PyObject* Source() const;           // (qualname, sha256), or None
  PyObject* AutotuneKey() const;      // tuple of str
  bool has_scratch() const { return has_scratch_; }
  // The dict a callable grid gets, as Triton builds it: every call argument by name (the
  // objects passed), the constexprs of the variant these arguments select, and its
  // num_warps, num_ctas and num_stages.
  PyObject* GridMeta(const Kernel& kernel, std::span<const Arg> args,
                     PyObject* const* objects) const;

 private:
  PyObject* Constexprs(size_t variant) const;  // borrowed, cached

  std::vector<ParamMeta> params_;  // all, constexprs included
  std::vector<std::string> call_names_;
  std::vector<std::string> grid_;
  std::vector<VariantMeta> variants_;
  std::string source_qualname_, source_sha256_;
  std::vector<std::string> autotune_key_;
  bool has_scratch_ = false;
  mutable std::vector<PyObject*> constexprs_;  // per variant, parsed on first use
};

// Registers kpack.Param and kpack.Variant in `module`.
bool InitMetaTypes(PyObject* module);

}  // namespace kpack::python

#endif  // KPACK_SRC_PYTHON_META_H_
