// A kernel's entry in the manifest: its parameters, buckets, grid expressions, kpack/2
// source, autotune key and grid tolerance, and its variants (variant.cc), read and checked
// against each other.

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/algorithm/container.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "manifest/parse.h"
#include "util/status_macros.h"

namespace kpack::internal {
namespace {

// A parameter name: an identifier, or (kpack/2) an element of a tuple parameter that
// Triton flattened, the tuple's name and the element's index path ("pair.0", "t.1.0").
bool IsParamName(absl::string_view s, bool* tuple_element) {
  const size_t dot = s.find('.');
  *tuple_element = dot != absl::string_view::npos;
  if (!IsIdentifier(s.substr(0, dot), false)) return false;
  if (!*tuple_element) return true;
  for (absl::string_view index : absl::StrSplit(s.substr(dot + 1), '.')) {
    if (index.empty() || index.size() > 4 || !absl::c_all_of(index, absl::ascii_isdigit)) {
      return false;
    }
  }
  return true;
}

// kpack/2 `readonly` (optional, pointers only): the kernel never writes through it.
absl::Status ParseReadonly(const json& p, const Where& where, const std::string& field,
                           ParamSpec& spec) {
  auto it = p.find("readonly");
  if (it == p.end()) return absl::OkStatus();
  const std::string key = absl::StrCat(field, ".readonly");
  KPACK_RETURN_IF_ERROR(where.RequireFormat(2, key));
  if (!it->is_boolean()) {
    return where.Error(key, absl::StrCat("expected true or false, got ", TypeOf(*it)));
  }
  spec.readonly = it->get<bool>();
  if (spec.readonly && spec.type != ParamType::kPointer) {
    return where.Error(key, absl::StrCat("'", spec.name, "' is ", spec.type_name,
                                         "; only a pointer parameter can be readonly"));
  }
  return absl::OkStatus();
}

absl::Status ParseParams(const json& k, const Where& where, KernelSpec& kernel) {
  KPACK_ASSIGN_OR_RETURN(const json* params, Field(k, "params", where));
  if (!params->is_array()) {
    return where.Error("params", absl::StrCat("expected an array, got ", TypeOf(*params)));
  }
  absl::flat_hash_set<std::string> seen;
  for (size_t i = 0; i < params->size(); ++i) {
    const json& p = (*params)[i];
    std::string field = absl::StrCat("params[", i, "]");
    if (!p.is_object()) {
      return where.Error(field, absl::StrCat("expected an object, got ", TypeOf(p)));
    }
    KPACK_RETURN_IF_ERROR(CheckKeys(p, where, field, {"name", "type", "readonly"}));
    ParamSpec spec;
    KPACK_ASSIGN_OR_RETURN(spec.name, GetString(p, "name", where));
    bool tuple_element = false;
    if (!IsParamName(spec.name, &tuple_element)) {
      return where.Error(absl::StrCat(field, ".name"),
                         absl::StrCat("'", spec.name,
                                      "' is not an identifier (or, for an element of a "
                                      "tuple parameter, identifier.index[.index...])"));
    }
    if (!seen.insert(spec.name).second) {
      return where.Error(absl::StrCat(field, ".name"),
                         absl::StrCat("duplicate parameter '", spec.name, "'"));
    }
    KPACK_ASSIGN_OR_RETURN(spec.type_name, GetString(p, "type", where));
    KPACK_ASSIGN_OR_RETURN(spec.type,
                           ParseType(spec.type_name, where, absl::StrCat(field, ".type")));
    if (spec.type == ParamType::kTensorDesc) {
      KPACK_RETURN_IF_ERROR(where.RequireFormat(2, absl::StrCat(field, ".type")));
      KPACK_ASSIGN_OR_RETURN(spec.desc,
                             ParseDescType(spec.type_name, where, absl::StrCat(field, ".type")));
    }
    if (tuple_element) KPACK_RETURN_IF_ERROR(where.RequireFormat(2, absl::StrCat(field, ".name")));
    KPACK_RETURN_IF_ERROR(ParseReadonly(p, where, field, spec));
    if (spec.type != ParamType::kConstexpr) kernel.args.push_back(static_cast<int>(i));
    kernel.params.push_back(std::move(spec));
  }
  return absl::OkStatus();
}

absl::Status ParseBuckets(const json& k, const Where& where, KernelSpec& kernel) {
  auto it = k.find("buckets");
  if (it == k.end()) return absl::OkStatus();
  if (!it->is_array() || it->empty()) {
    return where.Error("buckets", "expected a non-empty array of {param, edges}");
  }
  for (size_t d = 0; d < it->size(); ++d) {
    const json& dim = (*it)[d];
    std::string field = absl::StrCat("buckets[", d, "]");
    if (!dim.is_object()) {
      return where.Error(field, absl::StrCat("expected an object, got ", TypeOf(dim)));
    }
    KPACK_RETURN_IF_ERROR(CheckKeys(dim, where, field, {"param", "edges"}));
    KPACK_ASSIGN_OR_RETURN(std::string name, GetString(dim, "param", where));
    BucketSpec bucket;
    bucket.arg = FindArg(kernel, name);
    if (bucket.arg < 0 || !IsInteger(kernel.arg(bucket.arg).type)) {
      return where.Error(absl::StrCat(field, ".param"),
                         absl::StrCat("'", name, "' is not an integer call parameter"));
    }
    for (const BucketSpec& other : kernel.buckets) {
      if (other.arg == bucket.arg) {
        return where.Error(absl::StrCat(field, ".param"),
                           absl::StrCat("'", name, "' is bucketed twice"));
      }
    }
    KPACK_ASSIGN_OR_RETURN(const json* edges, Field(dim, "edges", where));
    if (!edges->is_array() || edges->empty() || edges->size() > 4095) {
      return where.Error(absl::StrCat(field, ".edges"), "expected an array of 1 to 4095 integers");
    }
    for (size_t e = 0; e < edges->size(); ++e) {
      const std::optional<int64_t> edge = AsInt64((*edges)[e]);
      if (!edge.has_value()) {
        return where.Error(absl::StrCat(field, ".edges[", e, "]"),
                           absl::StrCat("expected a 64-bit integer, got ", (*edges)[e].dump()));
      }
      const int64_t value = *edge;
      if (!bucket.edges.empty() && value <= bucket.edges.back()) {
        return where.Error(absl::StrCat(field, ".edges[", e, "]"),
                           absl::StrCat(value, " does not increase on ", bucket.edges.back()));
      }
      bucket.edges.push_back(value);
    }
    kernel.buckets.push_back(std::move(bucket));
  }
  return absl::OkStatus();
}

// kpack/2 `source` {"qualname", "sha256"} and `autotune_key` [param names], both optional.
absl::Status ParseSourceAndAutotuneKey(const json& k, const Where& where, KernelSpec& kernel) {
  if (auto it = k.find("source"); it != k.end()) {
    KPACK_RETURN_IF_ERROR(where.RequireFormat(2, "source"));
    if (!it->is_object()) {
      return where.Error("source", absl::StrCat("expected an object, got ", TypeOf(*it)));
    }
    KPACK_RETURN_IF_ERROR(CheckKeys(*it, where, "source", {"qualname", "sha256"}));
    KPACK_ASSIGN_OR_RETURN(kernel.source_qualname, GetString(*it, "qualname", where));
    KPACK_ASSIGN_OR_RETURN(kernel.source_sha256, GetString(*it, "sha256", where));
    if (kernel.source_qualname.empty()) return where.Error("source.qualname", "empty");
    if (!IsSha256Hex(kernel.source_sha256)) {
      return where.Error("source.sha256", "expected 64 lowercase hex digits");
    }
  }
  if (auto it = k.find("autotune_key"); it != k.end()) {
    KPACK_RETURN_IF_ERROR(where.RequireFormat(2, "autotune_key"));
    if (!it->is_array() || it->empty()) {
      return where.Error("autotune_key", "expected a non-empty array of parameter names");
    }
    for (size_t i = 0; i < it->size(); ++i) {
      const std::string field = absl::StrCat("autotune_key[", i, "]");
      const json& name = (*it)[i];
      int param = -1;
      for (size_t p = 0; name.is_string() && p < kernel.params.size(); ++p) {
        if (kernel.params[p].name == name.get<std::string>()) param = static_cast<int>(p);
      }
      if (param < 0) return where.Error(field, absl::StrCat(name.dump(), " is not a parameter"));
      if (std::find(kernel.autotune_key.begin(), kernel.autotune_key.end(), param) !=
          kernel.autotune_key.end()) {
        return where.Error(field, absl::StrCat(name.dump(), " is listed twice"));
      }
      kernel.autotune_key.push_back(param);
    }
  }
  return absl::OkStatus();
}

// kpack/2 `grid_tolerance` {"proof": "gpu" | "asserted", "max": {bucket param: value}},
// optional; parsed after the buckets, which `max` refers to.
absl::Status ParseGridTolerance(const json& k, const Where& where, KernelSpec& kernel) {
  auto it = k.find("grid_tolerance");
  if (it == k.end()) return absl::OkStatus();
  KPACK_RETURN_IF_ERROR(where.RequireFormat(2, "grid_tolerance"));
  if (!it->is_object()) {
    return where.Error("grid_tolerance", absl::StrCat("expected an object, got ", TypeOf(*it)));
  }
  KPACK_RETURN_IF_ERROR(CheckKeys(*it, where, "grid_tolerance", {"proof", "max"}));
  KPACK_ASSIGN_OR_RETURN(std::string proof, GetString(*it, "proof", where));
  if (proof != "gpu" && proof != "asserted") {
    return where.Error("grid_tolerance.proof",
                       absl::StrCat("expected \"gpu\" or \"asserted\", got \"", proof, "\""));
  }
  kernel.grid_tolerant = true;
  kernel.grid_proven = proof == "gpu";
  auto max = it->find("max");
  if (max == it->end()) return absl::OkStatus();
  if (!max->is_object()) {
    return where.Error("grid_tolerance.max",
                       absl::StrCat("expected an object {bucket parameter: value}, got ",
                                    TypeOf(*max)));
  }
  for (const auto& [name, value] : max->items()) {
    const std::string field = absl::StrCat("grid_tolerance.max.", name);
    BucketSpec* dim = nullptr;
    for (BucketSpec& b : kernel.buckets) {
      if (kernel.arg(b.arg).name == name) dim = &b;
    }
    if (dim == nullptr) {
      return where.Error(field, absl::StrCat("'", name, "' is not a bucket parameter"));
    }
    const std::optional<int64_t> max_value = AsInt64(value);
    if (!max_value.has_value()) {
      return where.Error(field, absl::StrCat("expected a 64-bit integer, got ", value.dump()));
    }
    const int64_t v = *max_value;
    if (v <= dim->edges.back()) {
      return where.Error(field, absl::StrCat(v, " does not exceed the last edge ",
                                             dim->edges.back(), " (it bounds the last bucket)"));
    }
    dim->grid_max = v;
  }
  return absl::OkStatus();
}

}  // namespace

int FindArg(const KernelSpec& kernel, absl::string_view name) {
  for (size_t a = 0; a < kernel.args.size(); ++a) {
    if (kernel.arg(static_cast<int>(a)).name == name) return static_cast<int>(a);
  }
  return -1;
}

absl::StatusOr<KernelSpec> ParseKernel(const json& k, const Where& top, size_t index) {
  KernelSpec kernel;
  if (!k.is_object()) {
    return top.Error(absl::StrCat("kernels[", index, "]"),
                     absl::StrCat("expected an object, got ", TypeOf(k)));
  }
  KPACK_ASSIGN_OR_RETURN(kernel.name, GetString(k, "name", top));
  if (!IsIdentifier(kernel.name, true)) {
    return top.Error(absl::StrCat("kernels[", index, "].name"),
                     absl::StrCat("'", kernel.name, "' is not a valid kernel name"));
  }
  Where where = top.Kernel(kernel.name);
  KPACK_RETURN_IF_ERROR(CheckKeys(k, where, "a kernel",
                                  {"name", "params", "buckets", "grid", "variants", "source",
                                   "autotune_key", "grid_tolerance"}));
  KPACK_RETURN_IF_ERROR(ParseParams(k, where, kernel));
  KPACK_RETURN_IF_ERROR(ParseSourceAndAutotuneKey(k, where, kernel));
  KPACK_RETURN_IF_ERROR(ParseBuckets(k, where, kernel));
  KPACK_RETURN_IF_ERROR(ParseGridTolerance(k, where, kernel));
  if (auto it = k.find("grid"); it != k.end()) {
    if (!it->is_array() || it->empty() || it->size() > 3) {
      return where.Error("grid", "expected an array of 1 to 3 expression strings (x, y, z)");
    }
    for (size_t axis = 0; axis < it->size(); ++axis) {
      if (!(*it)[axis].is_string()) {
        return where.Error(absl::StrCat("grid[", axis, "]"),
                           absl::StrCat("expected a string, got ", TypeOf((*it)[axis])));
      }
      kernel.grid.push_back((*it)[axis].get<std::string>());
    }
  }
  KPACK_ASSIGN_OR_RETURN(const json* variants, Field(k, "variants", where));
  if (!variants->is_array()) {
    return where.Error("variants", absl::StrCat("expected an array, got ", TypeOf(*variants)));
  }
  if (variants->empty()) return where.Error("variants", "a kernel needs at least one variant");
  absl::flat_hash_set<std::string> names;
  for (size_t i = 0; i < variants->size(); ++i) {
    VariantSpec variant;
    KPACK_RETURN_IF_ERROR(ParseVariant((*variants)[i], where, kernel, variant, i));
    if (!names.insert(variant.name).second) {
      return where.Error(absl::StrCat("variants[", i, "].name"),
                         absl::StrCat("duplicate variant '", variant.name, "'"));
    }
    kernel.variants.push_back(std::move(variant));
  }
  return kernel;
}

}  // namespace kpack::internal
