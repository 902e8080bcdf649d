#include "manifest/manifest.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/algorithm/container.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "nlohmann/json.hpp"
#include "util/parallel.h"
#include "util/status_macros.h"

namespace kpack::internal {
namespace {

using json = nlohmann::json;

// The formats this reader understands. kpack/2 is kpack/1 plus optional fields (each
// documented in docs/pack-format.md with the version that introduced it); a kpack/1
// manifest that uses a kpack/2 field is refused, so a pack written for this reader
// never half-works under an older one, which refuses "kpack/2" by name.
constexpr int kMinFormat = 1;
constexpr int kMaxFormat = 2;

// Where in the manifest we are, for messages: "manifest.json: kernel 'add': variant 'v'",
// and the manifest's format version, for fields that a later version introduced.
class Where {
 public:
  explicit Where(std::string prefix, int version = kMaxFormat)
      : prefix_(std::move(prefix)), version_(version) {}
  Where Kernel(absl::string_view name) const {
    return Where(absl::StrCat(prefix_, ": kernel '", name, "'"), version_);
  }
  Where Variant(absl::string_view name) const {
    return Where(absl::StrCat(prefix_, ": variant '", name, "'"), version_);
  }
  // Fields below `field` of an object: errors name "field.key".
  Where Within(absl::string_view field) const {
    Where w(prefix_, version_);
    w.field_prefix_ = absl::StrCat(field_prefix_, field, ".");
    return w;
  }
  int version() const { return version_; }
  // INVALID_ARGUMENT unless the manifest's format is at least kpack/`version`.
  absl::Status RequireFormat(int version, absl::string_view field) const {
    if (version_ >= version) return absl::OkStatus();
    return Error(field, absl::StrCat("needs format 'kpack/", version, "' or later; the manifest says 'kpack/",
                                     version_, "'"));
  }
  absl::Status Error(absl::string_view field, absl::string_view problem) const {
    return absl::InvalidArgumentError(
        absl::StrCat(prefix_, ": field '", field_prefix_, field, "': ", problem));
  }
  absl::Status Unimplemented(absl::string_view field, absl::string_view problem) const {
    return absl::UnimplementedError(
        absl::StrCat(prefix_, ": field '", field_prefix_, field, "': ", problem));
  }

 private:
  std::string prefix_;
  int version_;
  std::string field_prefix_;
};

std::string TypeOf(const json& j) { return j.type_name(); }

// Unknown fields are errors: a typo must not silently change what launches.
absl::Status CheckKeys(const json& obj, const Where& where, absl::string_view what,
                       std::initializer_list<absl::string_view> known) {
  for (const auto& [key, value] : obj.items()) {
    if (std::find(known.begin(), known.end(), key) != known.end()) continue;
    return where.Error(
        key, absl::StrCat("unknown field in ", what, " (known: ", absl::StrJoin(known, ", "), ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<const json*> Field(const json& obj, absl::string_view key, const Where& where) {
  auto it = obj.find(key);
  if (it == obj.end()) return where.Error(key, "missing");
  return &*it;
}

absl::StatusOr<std::string> GetString(const json& obj, absl::string_view key, const Where& where,
                                      bool required = true) {
  auto it = obj.find(key);
  if (it == obj.end()) {
    if (required) return where.Error(key, "missing");
    return std::string();
  }
  if (!it->is_string()) {
    return where.Error(key, absl::StrCat("expected a string, got ", TypeOf(*it)));
  }
  return it->get<std::string>();
}

absl::StatusOr<int64_t> GetInt(const json& obj, absl::string_view key, const Where& where,
                               int64_t min, int64_t max, bool required = true,
                               int64_t fallback = 0) {
  auto it = obj.find(key);
  if (it == obj.end()) {
    if (required) return where.Error(key, "missing");
    return fallback;
  }
  if (!it->is_number_integer()) {
    return where.Error(key, absl::StrCat("expected an integer in [", min, ", ", max, "], got ",
                                         it->is_number() ? it->dump() : TypeOf(*it)));
  }
  int64_t value;
  if (it->is_number_unsigned()) {
    uint64_t u = it->get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return where.Error(key, absl::StrCat(u, " is out of range [", min, ", ", max, "]"));
    }
    value = static_cast<int64_t>(u);
  } else {
    value = it->get<int64_t>();
  }
  if (value < min || value > max) {
    return where.Error(key, absl::StrCat(value, " is out of range [", min, ", ", max, "]"));
  }
  return value;
}

absl::StatusOr<bool> GetBool(const json& obj, absl::string_view key, const Where& where) {
  KPACK_ASSIGN_OR_RETURN(const json* v, Field(obj, key, where));
  if (!v->is_boolean()) {
    return where.Error(key, absl::StrCat("expected true or false, got ", TypeOf(*v)));
  }
  return v->get<bool>();
}

// Variant names become file names in packs: [A-Za-z0-9_][A-Za-z0-9_.-]*.
bool IsVariantName(absl::string_view s) {
  if (s.empty() || s[0] == '.' || s[0] == '-') return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '.' || c == '-';
  });
}

// The call argument named `name`, or -1.
int FindArg(const KernelSpec& kernel, absl::string_view name) {
  for (size_t a = 0; a < kernel.args.size(); ++a) {
    if (kernel.arg(static_cast<int>(a)).name == name) return static_cast<int>(a);
  }
  return -1;
}

bool IsIdentifier(absl::string_view s, bool allow_dot) {
  if (s.empty()) return false;
  auto head = [](char c) { return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || c == '_'; };
  if (!head(s[0])) return false;
  for (char c : s.substr(1)) {
    if (!(head(c) || (c >= '0' && c <= '9') || (allow_dot && c == '.'))) return false;
  }
  return true;
}

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

absl::StatusOr<ParamType> ParseType(absl::string_view t, const Where& where,
                                    absl::string_view field) {
  if (!t.empty() && t[0] == '*') {
    if (t.size() == 1) return where.Error(field, "pointer type '*' names no element type");
    return ParamType::kPointer;
  }
  static const auto* const kTypes = new absl::flat_hash_map<absl::string_view, ParamType>{
      {"i1", ParamType::kI1},     {"i8", ParamType::kI8},     {"i16", ParamType::kI16},
      {"i32", ParamType::kI32},   {"i64", ParamType::kI64},   {"u1", ParamType::kU1},
      {"u8", ParamType::kU8},     {"u16", ParamType::kU16},   {"u32", ParamType::kU32},
      {"u64", ParamType::kU64},   {"fp16", ParamType::kFp16}, {"bf16", ParamType::kBf16},
      {"fp32", ParamType::kFp32}, {"fp64", ParamType::kFp64}, {"constexpr", ParamType::kConstexpr}};
  auto it = kTypes->find(t);
  if (it != kTypes->end()) return it->second;
  if (absl::StartsWith(t, "tensordesc<")) return ParamType::kTensorDesc;  // ParseDescType
  if (t == "nvTmaDesc") {
    return where.Unimplemented(field, "type 'nvTmaDesc' (a CUtensorMap the caller encodes, "
                                      "from Triton's deprecated TmaDescKernelParam) is not "
                                      "supported; pass a host tensor descriptor "
                                      "(tensordesc<...>) instead");
  }
  return where.Error(field, absl::StrCat("unknown Triton type '", t, "'"));
}

// `tensordesc<DTYPE[B0, B1, ...]>`, Triton's spelling of a host tensor descriptor's type
// (its JIT's specialization key: the element type and the block shape).
absl::StatusOr<TensorDescType> ParseDescType(absl::string_view t, const Where& where,
                                             absl::string_view field) {
  auto bad = [&](absl::string_view why) {
    return where.Error(field, absl::StrCat("'", t, "' is not a tensordesc<DTYPE[B0, ...]> type: ",
                                           why));
  };
  absl::string_view rest = t;
  if (!absl::ConsumePrefix(&rest, "tensordesc<") || !absl::ConsumeSuffix(&rest, ">")) {
    return bad("expected tensordesc<...>");
  }
  const size_t open = rest.find('[');
  const size_t close = rest.find(']');
  if (open == absl::string_view::npos || close == absl::string_view::npos || close < open) {
    return bad("no [block shape]");
  }
  if (close + 1 != rest.size()) {
    // Gluon's descriptors add their shared-memory layout after the block shape.
    return where.Unimplemented(field, absl::StrCat("type '", t, "': a tensor descriptor with a "
                                                   "layout (Gluon's) is not supported"));
  }
  TensorDescType type;
  type.dtype = std::string(rest.substr(0, open));
  if (ElementBytes(type.dtype) == 0) {
    return bad(absl::StrCat("unknown element type '", type.dtype, "'"));
  }
  for (absl::string_view dim : absl::StrSplit(rest.substr(open + 1, close - open - 1), ',')) {
    int64_t value = 0;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(dim), &value) || value < 1 ||
        value > INT32_MAX) {
      return bad(absl::StrCat("block dimension '", dim, "' is not an integer in [1, 2^31)"));
    }
    type.block.push_back(value);
  }
  if (type.block.size() > static_cast<size_t>(kMaxDescRank)) {
    return bad(absl::StrCat("rank ", type.block.size(), " exceeds ", kMaxDescRank));
  }
  return type;
}

bool IsPowerOfTwo(int64_t v) { return v > 0 && (v & (v - 1)) == 0; }

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

// The parts a descriptor expands into, in order (DescPart).
std::vector<std::pair<DescPart, int>> DescParts(const TensorDescSpec& d) {
  const int rank = static_cast<int>(d.block.size());
  std::vector<std::pair<DescPart, int>> parts;
  if (d.tma) {
    parts.push_back({DescPart::kTma, 0});
  } else {
    parts.push_back({DescPart::kBase, 0});
    for (int i = 0; i < rank; ++i) parts.push_back({DescPart::kBaseShape, i});
    for (int i = 0; i < rank; ++i) parts.push_back({DescPart::kBaseStrides, i});
    parts.push_back({DescPart::kPadding, 0});
  }
  for (int i = 0; i < rank; ++i) parts.push_back({DescPart::kShape, i});
  for (int i = 0; i < rank; ++i) parts.push_back({DescPart::kStrides, i});
  return parts;
}

absl::Status ParseLayout(const json& v, const Where& where, const KernelSpec& kernel,
                         VariantSpec& variant) {
  KPACK_ASSIGN_OR_RETURN(const json* layout, Field(v, "layout", where));
  if (!layout->is_array()) {
    return where.Error("layout", absl::StrCat("expected an array, got ", TypeOf(*layout)));
  }
  absl::flat_hash_map<absl::string_view, int> arg_index;
  for (size_t a = 0; a < kernel.args.size(); ++a) {
    arg_index[kernel.params[kernel.args[a]].name] = static_cast<int>(a);
  }
  std::vector<bool> arg_seen(kernel.args.size(), false);
  bool global_seen = false, profile_seen = false;
  // Triton's ordinals are the call parameters in declaration order, then its hidden
  // pointers, global scratch first. Offsets and sizes alone cannot tell two same-size
  // parameters (or the two scratch pointers) apart, so the order is checked by name: a
  // swap would pass every other check and launch with the arguments exchanged.
  int last_arg_slot = -1;      // layout index of the latest call parameter's slot
  int first_hidden_slot = -1;  // layout index of the first hidden pointer's slot
  // A tensor descriptor's slots come together, its parts in DescParts order: the one being
  // read, and how many of its parts are read.
  const TensorDescSpec* desc = nullptr;
  std::vector<std::pair<DescPart, int>> desc_parts;
  size_t desc_read = 0;
  int first_tma_slot = -1;
  auto unfinished = [&](absl::string_view field) {
    const auto [part, index] = desc_parts[desc_read];
    return where.Error(field, absl::StrCat("tensordesc parameter '", kernel.arg(desc->arg).name,
                                           "' lacks its part '", DescPartName(part, index),
                                           "' (its slots are ", desc_parts.size(),
                                           " consecutive parts; docs/pack-format.md)"));
  };
  int64_t end = 0;
  for (size_t i = 0; i < layout->size(); ++i) {
    const json& s = (*layout)[i];
    std::string field = absl::StrCat("layout[", i, "]");
    if (!s.is_object()) {
      return where.Error(field, absl::StrCat("expected an object, got ", TypeOf(s)));
    }
    KPACK_RETURN_IF_ERROR(CheckKeys(s, where, field, {"param", "offset", "size", "part"}));
    SlotSpec slot;
    KPACK_ASSIGN_OR_RETURN(std::string param, GetString(s, "param", where));
    KPACK_ASSIGN_OR_RETURN(int64_t offset, GetInt(s, "offset", where, 0, kMaxParamBytes));
    KPACK_ASSIGN_OR_RETURN(int64_t size, GetInt(s, "size", where, 1, kMaxParamBytes));
    KPACK_ASSIGN_OR_RETURN(std::string part, GetString(s, "part", where, /*required=*/false));
    const bool continues = desc != nullptr && desc_read < desc_parts.size() &&
                           param == kernel.arg(desc->arg).name;
    if (desc != nullptr && desc_read < desc_parts.size() && !continues) {
      return unfinished(absl::StrCat(field, ".param"));
    }
    uint32_t expected_size = 8;
    uint32_t align = 0;  // 0: the slot's size
    std::string what;
    if (continues) {
      slot.kind = SlotKind::kArg;
      slot.arg = desc->arg;
    } else if (param == "$global_scratch" || param == "$profile_scratch") {
      bool& seen = param == "$global_scratch" ? global_seen : profile_seen;
      if (seen) {
        return where.Error(absl::StrCat(field, ".param"), absl::StrCat(param, " appears twice"));
      }
      seen = true;
      if (param == "$global_scratch" && profile_seen) {
        return where.Error(
            absl::StrCat(field, ".param"),
            absl::StrCat("$global_scratch comes after $profile_scratch (layout[", first_hidden_slot,
                         "]); Triton passes global scratch first, so the two would be exchanged"));
      }
      if (first_hidden_slot < 0) first_hidden_slot = static_cast<int>(i);
      slot.kind = param == "$global_scratch" ? SlotKind::kGlobalScratch : SlotKind::kProfileScratch;
      what = absl::StrCat("hidden pointer ", param);
    } else {
      auto it = arg_index.find(param);
      if (it == arg_index.end()) {
        return where.Error(absl::StrCat(field, ".param"),
                           absl::StrCat("'", param,
                                        "' is not a call parameter of the kernel "
                                        "(constexprs are not in the layout)"));
      }
      if (arg_seen[it->second]) {
        return where.Error(absl::StrCat(field, ".param"),
                           absl::StrCat("parameter '", param, "' appears twice"));
      }
      arg_seen[it->second] = true;
      if (first_hidden_slot >= 0) {
        return where.Error(
            absl::StrCat(field, ".param"),
            absl::StrCat("parameter '", param, "' comes after the hidden pointer ",
                         SlotName(kernel, variant.layout[first_hidden_slot]), " (layout[",
                         first_hidden_slot, "]); Triton passes its hidden pointers last"));
      }
      if (last_arg_slot >= 0 && variant.layout[last_arg_slot].arg > it->second) {
        const std::string& before = kernel.arg(variant.layout[last_arg_slot].arg).name;
        return where.Error(
            absl::StrCat(field, ".param"),
            absl::StrCat("parameter '", param, "' comes after '", before, "' (layout[",
                         last_arg_slot, "]), but the kernel declares '", param,
                         "' first; slots follow the declaration order of the call parameters"));
      }
      last_arg_slot = static_cast<int>(i);
      slot.kind = SlotKind::kArg;
      slot.arg = it->second;
      const ParamSpec& p = kernel.arg(it->second);
      if (HasAssumption(variant, it->second, Assumption::kEq1)) {
        return where.Error(absl::StrCat(field, ".param"),
                           absl::StrCat("parameter '", p.name,
                                        "' is assumed eq1, so Triton "
                                        "compiled it away and it can have no slot"));
      }
      if (p.type == ParamType::kTensorDesc) {
        desc = FindDesc(variant, it->second);
        desc_parts = DescParts(*desc);
        desc_read = 0;
      } else {
        ParamType type = variant.arg_types[it->second];
        expected_size = SlotSize(type);
        what = absl::StrCat("parameter '", p.name, "' of type ",
                            type == p.type ? p.type_name : std::string(TypeName(type)));
      }
    }
    if (slot.kind == SlotKind::kArg && kernel.arg(slot.arg).type == ParamType::kTensorDesc) {
      const auto [want, index] = desc_parts[desc_read++];
      const std::string want_name = DescPartName(want, index);
      if (part != want_name) {
        return where.Error(
            absl::StrCat(field, ".part"),
            absl::StrCat(part.empty() ? "missing" : absl::StrCat("'", part, "'"), ": expected '",
                         want_name, "', part ", desc_read, " of ", desc_parts.size(),
                         " of tensordesc parameter '", param, "' (",
                         desc->tma ? "lowered to TMA" : "no TMA metadata", ")"));
      }
      slot.part = want;
      slot.part_index = index;
      expected_size = DescPartSize(want);
      what = absl::StrCat("part '", want_name, "' of tensordesc parameter '", param, "'");
      // A CUtensorMap wants a 64-byte aligned constant-bank address; the buffer offset
      // that gives depends on where the bank's parameters start (ptxas puts the first one
      // at 48 on sm_90), so only a multiple of 16 is checked here, and the common offset
      // modulo 64 below.
      if (want == DescPart::kTma) align = 16;
    } else if (!part.empty()) {
      return where.Error(absl::StrCat(field, ".part"),
                         absl::StrCat("only the slots of a tensordesc parameter have a part; '",
                                      param, "' is not one"));
    }
    if (size != expected_size) {
      return where.Error(absl::StrCat(field, ".size"),
                         absl::StrCat("expected ", expected_size, " for ", what, ", got ", size));
    }
    if (align == 0) align = static_cast<uint32_t>(size);
    if (offset % align != 0) {
      return where.Error(absl::StrCat(field, ".offset"),
                         absl::StrCat(offset, " is not aligned to ", align == size ? "the slot size " : "", align));
    }
    if (offset < end) {
      return where.Error(absl::StrCat(field, ".offset"),
                         absl::StrCat(offset,
                                      " overlaps or precedes the previous slot, "
                                      "which ends at ",
                                      end));
    }
    end = offset + size;
    if (end > kMaxParamBytes) {
      return where.Error(absl::StrCat(field, ".offset"),
                         absl::StrCat("the slot ends at byte ", end, ", past the ", kMaxParamBytes,
                                      "-byte parameter limit"));
    }
    slot.offset = static_cast<uint32_t>(offset);
    slot.size = static_cast<uint32_t>(size);
    if (slot.part == DescPart::kTma) {
      if (first_tma_slot < 0) {
        first_tma_slot = static_cast<int>(i);
        variant.tma_offset_mod64 = slot.offset % 64;
      } else if (slot.offset % 64 != variant.tma_offset_mod64) {
        const SlotSpec& first = variant.layout[first_tma_slot];
        return where.Error(
            absl::StrCat(field, ".offset"),
            absl::StrCat(offset, " is ", offset % 64, " modulo 64, but the CUtensorMap slot of '",
                         kernel.arg(first.arg).name, "' (layout[", first_tma_slot, "]) is at ",
                         first.offset, ", ", variant.tma_offset_mod64,
                         " modulo 64: kpack encodes every CUtensorMap in place, 64-byte aligned, "
                         "so a variant's must share their offset modulo 64"));
      }
    }
    variant.layout.push_back(slot);
  }
  if (desc != nullptr && desc_read < desc_parts.size()) return unfinished("layout");
  for (size_t a = 0; a < arg_seen.size(); ++a) {
    if (!arg_seen[a] && !HasAssumption(variant, static_cast<int>(a), Assumption::kEq1)) {
      return where.Error("layout",
                         absl::StrCat("call parameter '", kernel.params[kernel.args[a]].name,
                                      "' has no slot (only an eq1 parameter may "
                                      "lack one)"));
    }
  }
  variant.param_bytes = static_cast<uint32_t>(end);
  return absl::OkStatus();
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
  if (variant.sha256.size() != 64 ||
      !std::all_of(variant.sha256.begin(), variant.sha256.end(),
                   [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); })) {
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
      const json& edge = (*edges)[e];
      if (!edge.is_number_integer() ||
          (edge.is_number_unsigned() && edge.get<uint64_t>() > uint64_t{INT64_MAX})) {
        return where.Error(absl::StrCat(field, ".edges[", e, "]"),
                           absl::StrCat("expected a 64-bit integer, got ", edge.dump()));
      }
      int64_t value = edge.get<int64_t>();
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
    if (kernel.source_sha256.size() != 64 ||
        !std::all_of(kernel.source_sha256.begin(), kernel.source_sha256.end(),
                     [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); })) {
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
    if (!value.is_number_integer() ||
        (value.is_number_unsigned() && value.get<uint64_t>() > uint64_t{INT64_MAX})) {
      return where.Error(field, absl::StrCat("expected a 64-bit integer, got ", value.dump()));
    }
    const int64_t v = value.get<int64_t>();
    if (v <= dim->edges.back()) {
      return where.Error(field, absl::StrCat(v, " does not exceed the last edge ",
                                             dim->edges.back(), " (it bounds the last bucket)"));
    }
    dim->grid_max = v;
  }
  return absl::OkStatus();
}

absl::Status ParseKernel(const json& k, const Where& top, KernelSpec& kernel, size_t index) {
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
  return absl::OkStatus();
}

}  // namespace

std::string SlotName(const KernelSpec& kernel, const SlotSpec& slot) {
  switch (slot.kind) {
    case SlotKind::kArg:
      if (slot.part != DescPart::kNone) {
        return absl::StrCat(kernel.arg(slot.arg).name, ".", DescPartName(slot.part, slot.part_index));
      }
      return kernel.arg(slot.arg).name;
    case SlotKind::kGlobalScratch:
      return "$global_scratch";
    case SlotKind::kProfileScratch:
      return "$profile_scratch";
  }
  return "?";
}

uint32_t DescPartSize(DescPart part) {
  switch (part) {
    case DescPart::kTma:
      return 128;  // sizeof(CUtensorMap)
    case DescPart::kPadding:
      return 1;
    case DescPart::kShape:
      return 4;
    case DescPart::kNone:
    case DescPart::kBase:
    case DescPart::kBaseShape:
    case DescPart::kBaseStrides:
    case DescPart::kStrides:
      return 8;
  }
  return 0;
}

std::string DescPartName(DescPart part, int index) {
  switch (part) {
    case DescPart::kNone:
      return "";
    case DescPart::kTma:
      return "tma";
    case DescPart::kBase:
      return "base";
    case DescPart::kBaseShape:
      return absl::StrCat("base_shape[", index, "]");
    case DescPart::kBaseStrides:
      return absl::StrCat("base_strides[", index, "]");
    case DescPart::kPadding:
      return "padding";
    case DescPart::kShape:
      return absl::StrCat("shape[", index, "]");
    case DescPart::kStrides:
      return absl::StrCat("strides[", index, "]");
  }
  return "?";
}

int ElementBytes(absl::string_view dtype) {
  static const auto* const kBytes = new absl::flat_hash_map<absl::string_view, int>{
      {"i1", 1},       {"u1", 1},       {"i8", 1},       {"u8", 1},         {"fp8e4nv", 1},
      {"fp8e5", 1},    {"fp8e4b15", 1}, {"fp8e4b8", 1},  {"fp8e5b16", 1},   {"i16", 2},
      {"u16", 2},      {"fp16", 2},     {"bf16", 2},     {"i32", 4},        {"u32", 4},
      {"fp32", 4},     {"i64", 8},      {"u64", 8},      {"fp64", 8}};
  auto it = kBytes->find(dtype);
  return it == kBytes->end() ? 0 : it->second;
}

bool IsFloatElement(absl::string_view dtype) {
  return absl::StartsWith(dtype, "fp") || dtype == "bf16";
}

bool IsInteger(ParamType type) {
  switch (type) {
    case ParamType::kI8:
    case ParamType::kI16:
    case ParamType::kI32:
    case ParamType::kI64:
    case ParamType::kU8:
    case ParamType::kU16:
    case ParamType::kU32:
    case ParamType::kU64:
      return true;
    default:
      return false;
  }
}

const char* TypeName(ParamType type) {
  switch (type) {
    case ParamType::kPointer:
      return "pointer";
    case ParamType::kI1:
      return "i1";
    case ParamType::kI8:
      return "i8";
    case ParamType::kI16:
      return "i16";
    case ParamType::kI32:
      return "i32";
    case ParamType::kI64:
      return "i64";
    case ParamType::kU1:
      return "u1";
    case ParamType::kU8:
      return "u8";
    case ParamType::kU16:
      return "u16";
    case ParamType::kU32:
      return "u32";
    case ParamType::kU64:
      return "u64";
    case ParamType::kFp16:
      return "fp16";
    case ParamType::kBf16:
      return "bf16";
    case ParamType::kFp32:
      return "fp32";
    case ParamType::kFp64:
      return "fp64";
    case ParamType::kConstexpr:
      return "constexpr";
    case ParamType::kTensorDesc:
      return "tensordesc";
  }
  return "?";
}

uint32_t SlotSize(ParamType type) {
  switch (type) {
    case ParamType::kPointer:
    case ParamType::kI64:
    case ParamType::kU64:
    case ParamType::kFp64:
      return 8;
    case ParamType::kI32:
    case ParamType::kU32:
    case ParamType::kFp32:
      return 4;
    case ParamType::kI16:
    case ParamType::kU16:
    case ParamType::kFp16:
    case ParamType::kBf16:
      return 2;
    case ParamType::kI1:
    case ParamType::kU1:
    case ParamType::kI8:
    case ParamType::kU8:
      return 1;
    case ParamType::kConstexpr:
    case ParamType::kTensorDesc:
      return 0;
  }
  return 0;
}

namespace {

// The top level: format, known keys, generator, and a "kernels" array (whose elements the
// caller parses). Returns the Where the kernels are named under.
absl::StatusOr<Where> ParseTop(const json& doc, absl::string_view file, ManifestSpec& manifest) {
  if (!doc.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(file, ": expected a JSON object at the top level, got ", TypeOf(doc)));
  }
  Where top{std::string(file)};
  KPACK_ASSIGN_OR_RETURN(std::string format, GetString(doc, "format", top));
  int version = 0;
  for (int v = kMinFormat; v <= kMaxFormat; ++v) {
    if (format == absl::StrCat("kpack/", v)) version = v;
  }
  if (version == 0) {
    return top.Error("format", absl::StrCat("unsupported pack format '", format,
                                            "'; this runtime reads 'kpack/", kMinFormat,
                                            "' to 'kpack/", kMaxFormat, "'"));
  }
  top = Where(std::string(file), version);
  KPACK_RETURN_IF_ERROR(CheckKeys(doc, top, "the manifest", {"format", "generator", "kernels"}));
  manifest.format_version = version;
  KPACK_ASSIGN_OR_RETURN(manifest.generator, GetString(doc, "generator", top, /*required=*/false));
  KPACK_ASSIGN_OR_RETURN(const json* kernels, Field(doc, "kernels", top));
  if (!kernels->is_array()) {
    return top.Error("kernels", absl::StrCat("expected an array, got ", TypeOf(*kernels)));
  }
  return top;
}

// Appends the kernels parsed in manifest order, stopping at the first error or duplicate.
absl::Status AddKernels(std::vector<absl::StatusOr<KernelSpec>>& kernels, const Where& top,
                        ManifestSpec& manifest) {
  if (kernels.empty()) return top.Error("kernels", "the pack has no kernels");
  absl::flat_hash_set<absl::string_view> names;
  manifest.kernels.reserve(kernels.size());
  for (size_t i = 0; i < kernels.size(); ++i) {
    if (!kernels[i].ok()) return kernels[i].status();
    manifest.kernels.push_back(*std::move(kernels[i]));
    if (!names.insert(manifest.kernels.back().name).second) {
      return top.Error(absl::StrCat("kernels[", i, "].name"),
                       absl::StrCat("duplicate kernel '", manifest.kernels.back().name, "'"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<KernelSpec> ParseOneKernel(const json& k, const Where& top, size_t index) {
  KernelSpec kernel;
  KPACK_RETURN_IF_ERROR(ParseKernel(k, top, kernel, index));
  return kernel;
}

// ---- Parsing the kernels on several threads.
//
// JSON parsing and validation are most of what reading a large manifest costs, and both
// are independent per kernel. So the text is first scanned (not parsed) for the byte
// ranges of the top-level "kernels" array's elements; then the rest of the document, with
// that array emptied, and each kernel are parsed apart, the kernels in parallel. The
// result must be exactly what parsing the whole text gives (ParseManifestWhole, which the
// manifest fuzzer compares against), so anything the scan is not sure of -- a syntax
// error anywhere, an escaped or repeated top-level key, an odd shape -- falls back to
// parsing the whole text, which also gives nlohmann's own error message.

bool IsJsonSpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

void SkipSpace(absl::string_view text, size_t& pos) {
  while (pos < text.size() && IsJsonSpace(text[pos])) ++pos;
}

// Moves `pos` from an opening quote past the closing one; false at the end of the text.
bool SkipString(absl::string_view text, size_t& pos) {
  for (++pos; pos < text.size(); ++pos) {
    if (text[pos] == '\\') {
      ++pos;
    } else if (text[pos] == '"') {
      ++pos;
      return true;
    }
  }
  return false;
}

// Moves `pos` past one value (its extent only; the value is checked when parsed).
bool SkipValue(absl::string_view text, size_t& pos) {
  if (pos >= text.size()) return false;
  if (text[pos] == '"') return SkipString(text, pos);
  if (text[pos] == '{' || text[pos] == '[') {
    size_t depth = 0;
    while (pos < text.size()) {
      const char c = text[pos];
      if (c == '"') {
        if (!SkipString(text, pos)) return false;
        continue;
      }
      ++pos;
      if (c == '{' || c == '[') {
        ++depth;
      } else if ((c == '}' || c == ']') && --depth == 0) {
        return true;
      }
    }
    return false;
  }
  const size_t start = pos;  // a number or a literal
  while (pos < text.size() && !IsJsonSpace(text[pos]) && text[pos] != ',' && text[pos] != ']' &&
         text[pos] != '}') {
    ++pos;
  }
  return pos > start;
}

struct KernelSpans {
  size_t array_begin = 0, array_end = 0;  // the "kernels" array, brackets included
  std::vector<absl::string_view> kernels;
};

std::optional<KernelSpans> FindKernelSpans(absl::string_view text) {
  size_t pos = 0;
  if (absl::StartsWith(text, "\xEF\xBB\xBF")) pos = 3;  // a UTF-8 byte order mark
  SkipSpace(text, pos);
  if (pos >= text.size() || text[pos] != '{') return std::nullopt;
  ++pos;
  std::optional<KernelSpans> spans;
  SkipSpace(text, pos);
  if (pos < text.size() && text[pos] == '}') return std::nullopt;
  while (true) {
    SkipSpace(text, pos);
    const size_t key = pos;
    if (pos >= text.size() || text[pos] != '"' || !SkipString(text, pos)) return std::nullopt;
    const absl::string_view name = text.substr(key + 1, pos - key - 2);
    if (absl::StrContains(name, '\\')) return std::nullopt;  // nlohmann decodes, we do not
    SkipSpace(text, pos);
    if (pos >= text.size() || text[pos] != ':') return std::nullopt;
    ++pos;
    SkipSpace(text, pos);
    if (name == "kernels") {
      if (spans.has_value() || pos >= text.size() || text[pos] != '[') return std::nullopt;
      spans.emplace();
      spans->array_begin = pos++;
      SkipSpace(text, pos);
      if (pos < text.size() && text[pos] == ']') {
        ++pos;
      } else {
        while (true) {
          const size_t begin = pos;
          if (!SkipValue(text, pos)) return std::nullopt;
          spans->kernels.push_back(text.substr(begin, pos - begin));
          SkipSpace(text, pos);
          if (pos >= text.size()) return std::nullopt;
          if (text[pos++] == ']') break;
          if (text[pos - 1] != ',') return std::nullopt;
          SkipSpace(text, pos);
        }
      }
      spans->array_end = pos;
    } else if (!SkipValue(text, pos)) {
      return std::nullopt;
    }
    SkipSpace(text, pos);
    if (pos >= text.size()) return std::nullopt;
    if (text[pos] == '}') return spans;
    if (text[pos++] != ',') return std::nullopt;
  }
}

}  // namespace

std::optional<absl::StatusOr<ManifestSpec>> ParseManifestInParts(absl::string_view text,
                                                                 absl::string_view file) {
  std::optional<KernelSpans> spans = FindKernelSpans(text);
  if (!spans.has_value()) return std::nullopt;
  std::string rest =
      absl::StrCat(text.substr(0, spans->array_begin), "[]", text.substr(spans->array_end));
  const json doc = json::parse(rest, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return std::nullopt;
  ManifestSpec manifest;
  absl::StatusOr<Where> top = ParseTop(doc, file, manifest);
  if (!top.ok()) {
    // The whole text's parse reports a syntax error anywhere before any field's problem.
    for (absl::string_view kernel : spans->kernels) {
      if (!json::accept(kernel)) return std::nullopt;
    }
    return top.status();
  }
  std::vector<absl::StatusOr<KernelSpec>> kernels(spans->kernels.size());
  std::atomic<bool> syntax_error{false};
  constexpr size_t kBytesPerThread = 256 << 10;
  ParallelFor(kernels.size(), ThreadsFor(text.size(), kBytesPerThread), [&](size_t i) {
    const json k = json::parse(spans->kernels[i], nullptr, /*allow_exceptions=*/false);
    if (k.is_discarded()) {
      syntax_error = true;  // the whole text's parse reports it, wherever it is
      return false;
    }
    kernels[i] = ParseOneKernel(k, *top, i);
    return true;
  });
  if (syntax_error) return std::nullopt;
  KPACK_RETURN_IF_ERROR(AddKernels(kernels, *top, manifest));
  return manifest;
}

absl::StatusOr<ManifestSpec> ParseManifestWhole(absl::string_view text, absl::string_view file) {
  json doc;
  try {
    doc = json::parse(text.begin(), text.end());
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(file, ": not valid JSON: ", e.what()));
  }
  ManifestSpec manifest;
  KPACK_ASSIGN_OR_RETURN(Where top, ParseTop(doc, file, manifest));
  const json& array = doc["kernels"];
  std::vector<absl::StatusOr<KernelSpec>> kernels;
  for (size_t i = 0; i < array.size(); ++i) {
    kernels.push_back(ParseOneKernel(array[i], top, i));
    if (!kernels.back().ok()) break;  // the first error is the one reported
  }
  KPACK_RETURN_IF_ERROR(AddKernels(kernels, top, manifest));
  return manifest;
}

absl::StatusOr<ManifestSpec> ParseManifest(absl::string_view text, absl::string_view file) {
  if (std::optional<absl::StatusOr<ManifestSpec>> split = ParseManifestInParts(text, file)) {
    return *std::move(split);
  }
  return ParseManifestWhole(text, file);
}

}  // namespace kpack::internal
