// Reading typed fields out of the manifest's JSON (parse.h): each getter checks the field's
// JSON type and range and names the field, and where it is, when it is wrong.

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <optional>
#include <string>

#include "absl/algorithm/container.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "manifest/parse.h"
#include "util/status_macros.h"

namespace kpack::internal {

Where Where::Kernel(absl::string_view name) const {
  return Where(absl::StrCat(prefix_, ": kernel '", name, "'"), version_);
}

Where Where::Variant(absl::string_view name) const {
  return Where(absl::StrCat(prefix_, ": variant '", name, "'"), version_);
}

Where Where::Within(absl::string_view field) const {
  Where w(prefix_, version_);
  w.field_prefix_ = absl::StrCat(field_prefix_, field, ".");
  return w;
}

absl::Status Where::RequireFormat(int version, absl::string_view field) const {
  if (version_ >= version) return absl::OkStatus();
  return Error(field, absl::StrCat("needs format 'kpack/", version,
                                   "' or later; the manifest says 'kpack/", version_, "'"));
}

absl::Status Where::Error(absl::string_view field, absl::string_view problem) const {
  return absl::InvalidArgumentError(
      absl::StrCat(prefix_, ": field '", field_prefix_, field, "': ", problem));
}

absl::Status Where::Unimplemented(absl::string_view field, absl::string_view problem) const {
  return absl::UnimplementedError(
      absl::StrCat(prefix_, ": field '", field_prefix_, field, "': ", problem));
}

std::string TypeOf(const json& j) { return j.type_name(); }

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
                                      bool required) {
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
                               int64_t min, int64_t max, bool required, int64_t fallback) {
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

std::optional<int64_t> AsInt64(const json& value) {
  if (!value.is_number_integer()) return std::nullopt;
  if (value.is_number_unsigned() &&
      value.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    return std::nullopt;
  }
  return value.get<int64_t>();
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

bool IsPowerOfTwo(int64_t v) { return v > 0 && (v & (v - 1)) == 0; }

bool IsSha256Hex(absl::string_view s) {
  return s.size() == 64 &&
         absl::c_all_of(s, [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

}  // namespace kpack::internal
