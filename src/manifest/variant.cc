// A variant's entry in the manifest: its cubin, entry, arch and launch metadata, what it
// is chosen by (bucket, assumptions, types), its tensor descriptors' TMA metadata, and its
// parameter layout (layout.cc), each checked against its kernel's parameters and buckets.

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/algorithm/container.h"
#include "absl/strings/str_cat.h"
#include "manifest/parse.h"
#include "util/status_macros.h"

namespace kpack::internal {
namespace {

// Variant names become file names in packs: [A-Za-z0-9_][A-Za-z0-9_.-]*.
bool IsVariantName(absl::string_view s) {
  if (s.empty() || s[0] == '.' || s[0] == '-') return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '.' || c == '-';
  });
}

// A `types` entry for a tensordesc parameter: another block shape of the same element type
// and rank. Triton specializes a descriptor on its type only, so an autotuned kernel's
// configs differ in it (the tutorials' pre_hook sets the block shape per config), but it
// decides nothing at launch: the caller's descriptor carries no block shape, the variant's
// is used.
absl::Status RetypeDesc(const KernelSpec& kernel, int arg, const std::string& text,
                        const Where& where, absl::string_view field, VariantSpec& variant) {
  const ParamSpec& p = kernel.arg(arg);
  KPACK_ASSIGN_OR_RETURN(ParamType t, ParseType(text, where, field));
  if (t != ParamType::kTensorDesc) {
    return where.Error(field, absl::StrCat("'", p.name, "' is ", p.type_name,
                                           "; its type can only be another tensordesc type"));
  }
  KPACK_ASSIGN_OR_RETURN(TensorDescType type, ParseDescType(text, where, field));
  if (type.dtype != p.desc.dtype || type.block.size() != p.desc.block.size()) {
    return where.Error(field, absl::StrCat("'", text, "' must keep the element type and rank of ",
                                           p.type_name, " (only the block shape may differ)"));
  }
  TensorDescSpec* d = FindDesc(variant, arg);
  d->type_name = text;
  d->block = std::move(type.block);
  return absl::OkStatus();
}

// `key` of a tensordesc_meta entry: `rank` integers in [1, `max`], one per dimension.
absl::Status ParseDims(const json& m, absl::string_view key, const Where& w, size_t rank,
                       int64_t max, absl::string_view type, std::vector<uint32_t>* out) {
  auto list = m.find(key);
  auto in_range = [max](const json& x) {
    return x.is_number_integer() && x.get<int64_t>() >= 1 && x.get<int64_t>() <= max;
  };
  if (list == m.end() || !list->is_array() || list->size() != rank ||
      !absl::c_all_of(*list, in_range)) {
    return w.Error(key, absl::StrCat("expected ", rank, " integers in [1, ", max,
                                     "] (one per dimension of ", type, ")"));
  }
  for (const json& x : *list) out->push_back(static_cast<uint32_t>(x.get<int64_t>()));
  return absl::OkStatus();
}

// kpack/2 `tensordesc_meta`: Triton's compiled metadata of the same name, one entry per
// tensordesc parameter in declaration order; null for a descriptor the variant did not
// lower to TMA. Absent: none was (Triton's metadata is then empty).
absl::Status ParseTensorDescMeta(const json& v, const Where& where, VariantSpec& variant) {
  auto it = v.find("tensordesc_meta");
  if (it == v.end()) return absl::OkStatus();
  KPACK_RETURN_IF_ERROR(where.RequireFormat(2, "tensordesc_meta"));
  if (!it->is_array() || it->size() != variant.descs.size()) {
    return where.Error("tensordesc_meta",
                       absl::StrCat("expected an array of ", variant.descs.size(),
                                    " entries (one per tensordesc parameter, null or an "
                                    "object), got ", it->dump().substr(0, 80)));
  }
  for (size_t i = 0; i < it->size(); ++i) {
    const json& m = (*it)[i];
    TensorDescSpec& d = variant.descs[i];
    const std::string field = absl::StrCat("tensordesc_meta[", i, "]");
    if (m.is_null()) continue;
    if (!m.is_object()) {
      return where.Error(field, absl::StrCat("expected null or an object, got ", TypeOf(m)));
    }
    KPACK_RETURN_IF_ERROR(CheckKeys(m, where, field,
                                    {"data_type", "elem_size", "swizzle", "block_size",
                                     "fp4_padded", "element_strides", "interleave",
                                     "l2_promotion"}));
    const Where w = where.Within(field);
    d.tma = true;
    KPACK_ASSIGN_OR_RETURN(int64_t data_type, GetInt(m, "data_type", w, 0, 15));
    KPACK_ASSIGN_OR_RETURN(int64_t elem_size, GetInt(m, "elem_size", w, 1, 8));
    KPACK_ASSIGN_OR_RETURN(int64_t swizzle, GetInt(m, "swizzle", w, 0, 3));
    KPACK_ASSIGN_OR_RETURN(d.fp4_padded, GetBool(m, "fp4_padded", w));
    KPACK_ASSIGN_OR_RETURN(int64_t interleave, GetInt(m, "interleave", w, 0, 2, false, 0));
    KPACK_ASSIGN_OR_RETURN(int64_t l2, GetInt(m, "l2_promotion", w, 0, 3, false, 2));
    d.data_type = static_cast<int>(data_type);
    d.elem_size = static_cast<int>(elem_size);
    d.swizzle = static_cast<int>(swizzle);
    d.interleave = static_cast<int>(interleave);
    d.l2_promotion = static_cast<int>(l2);
    if (!IsPowerOfTwo(elem_size)) {
      return w.Error("elem_size", absl::StrCat(elem_size, " is not 1, 2, 4 or 8"));
    }
    const int declared = ElementBytes(d.dtype);
    if (!d.fp4_padded && declared != d.elem_size) {
      return w.Error("elem_size", absl::StrCat(d.elem_size, " differs from the ", declared,
                                               " bytes of the element type of ", d.type_name));
    }
    // The encode's element type decides how many bytes each element of the tensor covers:
    // a wider one than the parameter's would have TMA reach past the end of the tensor.
    if (const int encoded = TensorMapDataTypeBytes(d.data_type);
        !d.fp4_padded && encoded != declared) {
      return w.Error(
          "data_type",
          absl::StrCat(d.data_type, " (a CUtensorMapDataType of ",
                       encoded == 0 ? "sub-byte" : absl::StrCat(encoded, "-byte"),
                       " elements) does not match the ", declared,
                       "-byte elements of ", d.type_name));
    }
    const size_t rank = d.block.size();
    KPACK_RETURN_IF_ERROR(ParseDims(m, "block_size", w, rank, 256, d.type_name, &d.box));
    if (m.contains("element_strides")) {
      KPACK_RETURN_IF_ERROR(ParseDims(m, "element_strides", w, rank, 8, d.type_name,
                                      &d.element_strides));
    } else {
      d.element_strides.assign(rank, 1);  // Triton's
    }
  }
  return absl::OkStatus();
}

// `bucket`, `assumptions` and `types`: what the variant is chosen by.
absl::Status ParseVariantDispatch(const json& v, const Where& where, const KernelSpec& kernel,
                                  VariantSpec& variant) {
  variant.arg_types.clear();
  for (int a : kernel.args) variant.arg_types.push_back(kernel.params[a].type);
  variant.descs.clear();
  for (size_t a = 0; a < kernel.args.size(); ++a) {
    const ParamSpec& p = kernel.arg(static_cast<int>(a));
    if (p.type != ParamType::kTensorDesc) continue;
    TensorDescSpec d;
    d.arg = static_cast<int>(a);
    d.type_name = p.type_name;
    d.dtype = p.desc.dtype;
    d.block = p.desc.block;
    variant.descs.push_back(std::move(d));
  }

  if (auto it = v.find("bucket"); it != v.end()) {
    if (!it->is_array() || it->size() != kernel.buckets.size()) {
      return where.Error("bucket", absl::StrCat("expected an array of ", kernel.buckets.size(),
                                                " bucket indices (one per bucket dim)"));
    }
    for (size_t d = 0; d < it->size(); ++d) {
      const json& index = (*it)[d];
      int64_t limit = static_cast<int64_t>(kernel.buckets[d].edges.size());
      if (!index.is_number_integer() || index.get<int64_t>() < 0 || index.get<int64_t>() > limit) {
        return where.Error(
            absl::StrCat("bucket[", d, "]"),
            absl::StrCat(index.dump(), " is not a bucket index in [0, ", limit, "]"));
      }
      variant.bucket.push_back(index.get<int>());
    }
  }

  if (auto it = v.find("assumptions"); it != v.end()) {
    if (!it->is_object()) {
      return where.Error("assumptions", absl::StrCat("expected an object, got ", TypeOf(*it)));
    }
    for (const auto& [name, kinds] : it->items()) {
      std::string field = absl::StrCat("assumptions.", name);
      int arg = FindArg(kernel, name);
      if (arg < 0) return where.Error(field, "not a call parameter of the kernel");
      if (!kinds.is_array() || kinds.empty()) {
        return where.Error(field, "expected a non-empty array of \"div16\" / \"eq1\"");
      }
      ParamType type = kernel.arg(arg).type;
      for (const json& k : kinds) {
        Assumption as{arg, Assumption::kDiv16};
        if (k == "div16") {
          if (type != ParamType::kPointer && !IsInteger(type)) {
            return where.Error(field, "div16 applies to pointers and integers only");
          }
        } else if (k == "eq1") {
          if (!IsInteger(type)) return where.Error(field, "eq1 applies to integers only");
          as.kind = Assumption::kEq1;
        } else {
          return where.Error(field,
                             absl::StrCat("unknown assumption ", k.dump(), " (known: div16, eq1)"));
        }
        if (HasAssumption(variant, arg, as.kind)) {
          return where.Error(field, absl::StrCat(k.dump(), " listed twice"));
        }
        variant.assumptions.push_back(as);
      }
    }
  }

  if (auto it = v.find("types"); it != v.end()) {
    if (!it->is_object()) {
      return where.Error("types", absl::StrCat("expected an object, got ", TypeOf(*it)));
    }
    for (const auto& [name, type] : it->items()) {
      std::string field = absl::StrCat("types.", name);
      int arg = FindArg(kernel, name);
      if (arg < 0) return where.Error(field, "not a call parameter of the kernel");
      if (!type.is_string()) {
        return where.Error(field, absl::StrCat("expected a type string, got ", TypeOf(type)));
      }
      if (kernel.arg(arg).type == ParamType::kTensorDesc) {
        KPACK_RETURN_IF_ERROR(RetypeDesc(kernel, arg, type.get<std::string>(), where, field,
                                         variant));
        continue;
      }
      if (!IsInteger(kernel.arg(arg).type)) {
        return where.Error(field, "only integer and tensordesc parameters can change type "
                                  "between variants");
      }
      KPACK_ASSIGN_OR_RETURN(ParamType t, ParseType(type.get<std::string>(), where, field));
      if (!IsInteger(t)) return where.Error(field, "must be an integer type (i8..i64, u8..u64)");
      variant.arg_types[arg] = t;
    }
  }
  return absl::OkStatus();
}

}  // namespace

bool HasAssumption(const VariantSpec& v, int arg, Assumption::Kind kind) {
  return std::any_of(v.assumptions.begin(), v.assumptions.end(),
                     [&](const Assumption& a) { return a.arg == arg && a.kind == kind; });
}

TensorDescSpec* FindDesc(VariantSpec& variant, int arg) {
  for (TensorDescSpec& d : variant.descs) {
    if (d.arg == arg) return &d;
  }
  return nullptr;
}

absl::Status ParseVariant(const json& v, const Where& kernel_where, const KernelSpec& kernel,
                          VariantSpec& variant, size_t index) {
  if (!v.is_object()) {
    return kernel_where.Error(absl::StrCat("variants[", index, "]"),
                              absl::StrCat("expected an object, got ", TypeOf(v)));
  }
  KPACK_ASSIGN_OR_RETURN(variant.name, GetString(v, "name", kernel_where));
  if (!IsVariantName(variant.name)) {
    return kernel_where.Error(absl::StrCat("variants[", index, "].name"),
                              absl::StrCat("'", variant.name, "' is not a valid name"));
  }
  Where where = kernel_where.Variant(variant.name);
  KPACK_RETURN_IF_ERROR(CheckKeys(v, where, "a variant",
                                  {"name",
                                   "cubin",
                                   "sha256",
                                   "entry",
                                   "arch",
                                   "constexprs",
                                   "num_warps",
                                   "num_ctas",
                                   "num_stages",
                                   "shared",
                                   "global_scratch_size",
                                   "global_scratch_align",
                                   "profile_scratch_size",
                                   "profile_scratch_align",
                                   "launch_pdl",
                                   "launch_cooperative_grid",
                                   "layout",
                                   "triton_version",
                                   "bucket",
                                   "assumptions",
                                   "types",
                                   "tensordesc_meta"}));

  KPACK_ASSIGN_OR_RETURN(variant.cubin, GetString(v, "cubin", where));
  if (variant.cubin.empty()) return where.Error("cubin", "empty path");
  KPACK_ASSIGN_OR_RETURN(variant.sha256, GetString(v, "sha256", where));
  if (!IsSha256Hex(variant.sha256)) {
    return where.Error("sha256", "expected 64 lowercase hex digits");
  }
  KPACK_ASSIGN_OR_RETURN(variant.entry, GetString(v, "entry", where));
  if (variant.entry.empty()) return where.Error("entry", "empty symbol name");
  KPACK_ASSIGN_OR_RETURN(int64_t arch, GetInt(v, "arch", where, 10, 1000));
  variant.arch = static_cast<int>(arch);

  KPACK_ASSIGN_OR_RETURN(const json* constexprs, Field(v, "constexprs", where));
  if (!constexprs->is_object()) {
    return where.Error("constexprs", absl::StrCat("expected an object, got ", TypeOf(*constexprs)));
  }
  for (const ParamSpec& p : kernel.params) {
    if (p.type == ParamType::kConstexpr && !constexprs->contains(p.name)) {
      return where.Error("constexprs", absl::StrCat("no value for constexpr '", p.name, "'"));
    }
  }
  for (const auto& item : constexprs->items()) {
    const std::string& key = item.key();
    auto it = std::find_if(kernel.params.begin(), kernel.params.end(),
                           [&](const ParamSpec& p) { return p.name == key; });
    if (it == kernel.params.end() || it->type != ParamType::kConstexpr) {
      return where.Error(absl::StrCat("constexprs.", key),
                         "not a constexpr parameter of the kernel");
    }
  }
  variant.constexprs = *constexprs;

  KPACK_ASSIGN_OR_RETURN(int64_t num_warps, GetInt(v, "num_warps", where, 1, 32));
  KPACK_ASSIGN_OR_RETURN(int64_t num_ctas, GetInt(v, "num_ctas", where, 1, 16));
  KPACK_ASSIGN_OR_RETURN(int64_t num_stages,
                         GetInt(v, "num_stages", where, 0, 64, /*required=*/false));
  KPACK_ASSIGN_OR_RETURN(int64_t shared, GetInt(v, "shared", where, 0, 1 << 20));
  KPACK_ASSIGN_OR_RETURN(int64_t gs_size, GetInt(v, "global_scratch_size", where, 0, 1 << 30));
  KPACK_ASSIGN_OR_RETURN(int64_t gs_align, GetInt(v, "global_scratch_align", where, 1, 4096));
  KPACK_ASSIGN_OR_RETURN(int64_t ps_size, GetInt(v, "profile_scratch_size", where, 0, 1 << 30));
  KPACK_ASSIGN_OR_RETURN(int64_t ps_align, GetInt(v, "profile_scratch_align", where, 1, 4096));
  if (!IsPowerOfTwo(gs_align)) {
    return where.Error("global_scratch_align", absl::StrCat(gs_align, " is not a power of two"));
  }
  if (!IsPowerOfTwo(ps_align)) {
    return where.Error("profile_scratch_align", absl::StrCat(ps_align, " is not a power of two"));
  }
  variant.num_warps = static_cast<int>(num_warps);
  variant.num_ctas = static_cast<int>(num_ctas);
  variant.num_stages = static_cast<int>(num_stages);
  variant.shared = static_cast<uint32_t>(shared);
  variant.global_scratch_size = static_cast<uint32_t>(gs_size);
  variant.global_scratch_align = static_cast<uint32_t>(gs_align);
  variant.profile_scratch_size = static_cast<uint32_t>(ps_size);
  variant.profile_scratch_align = static_cast<uint32_t>(ps_align);
  KPACK_ASSIGN_OR_RETURN(variant.launch_pdl, GetBool(v, "launch_pdl", where));
  KPACK_ASSIGN_OR_RETURN(variant.launch_cooperative_grid,
                         GetBool(v, "launch_cooperative_grid", where));
  KPACK_ASSIGN_OR_RETURN(variant.triton_version,
                         GetString(v, "triton_version", where, /*required=*/false));
  KPACK_RETURN_IF_ERROR(ParseVariantDispatch(v, where, kernel, variant));
  KPACK_RETURN_IF_ERROR(ParseTensorDescMeta(v, where, variant));
  KPACK_RETURN_IF_ERROR(ParseLayout(v, where, kernel, variant));
  bool has_global =
      std::any_of(variant.layout.begin(), variant.layout.end(),
                  [](const SlotSpec& s) { return s.kind == SlotKind::kGlobalScratch; });
  bool has_profile =
      std::any_of(variant.layout.begin(), variant.layout.end(),
                  [](const SlotSpec& s) { return s.kind == SlotKind::kProfileScratch; });
  if (variant.global_scratch_size > 0 && !has_global) {
    return where.Error("layout", "global_scratch_size > 0 but no $global_scratch slot");
  }
  if (variant.profile_scratch_size > 0 && !has_profile) {
    return where.Error("layout", "profile_scratch_size > 0 but no $profile_scratch slot");
  }
  return absl::OkStatus();
}

}  // namespace kpack::internal
