// The manifest reader's internals, shared by its files: reading typed fields out of the
// JSON with errors that say where they are (fields.cc), and the entry points of each part
// of a kernel's entry -- the kernel (kernel.cc), a variant (variant.cc), a variant's
// parameter layout (layout.cc), Triton type strings (types.cc). Every function here
// both reads and validates: the spec it fills is valid once it returns OK. The document
// level (format, kernels in parallel) is manifest.cc; the result is manifest/manifest.h.

#ifndef KPACK_SRC_MANIFEST_PARSE_H_
#define KPACK_SRC_MANIFEST_PARSE_H_

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "manifest/manifest.h"
#include "nlohmann/json.hpp"

namespace kpack::internal {

using json = nlohmann::json;

// The formats this reader understands. kpack/2 is kpack/1 plus optional fields (each
// documented in docs/pack-format.md with the version that introduced it); a kpack/1
// manifest that uses a kpack/2 field is refused, so a pack written for this reader
// never half-works under an older one, which refuses "kpack/2" by name.
inline constexpr int kMinFormat = 1;
inline constexpr int kMaxFormat = 2;

// Where in the manifest we are, for messages: "manifest.json: kernel 'add': variant 'v'",
// and the manifest's format version, for fields that a later version introduced.
class Where {
 public:
  explicit Where(std::string prefix, int version = kMaxFormat)
      : prefix_(std::move(prefix)), version_(version) {}
  Where Kernel(absl::string_view name) const;
  Where Variant(absl::string_view name) const;
  // Fields below `field` of an object: errors name "field.key".
  Where Within(absl::string_view field) const;
  int version() const { return version_; }
  // INVALID_ARGUMENT unless the manifest's format is at least kpack/`version`.
  absl::Status RequireFormat(int version, absl::string_view field) const;
  absl::Status Error(absl::string_view field, absl::string_view problem) const;
  absl::Status Unimplemented(absl::string_view field, absl::string_view problem) const;

 private:
  std::string prefix_;
  int version_;
  std::string field_prefix_;
};

// ---- Typed fields (fields.cc). Each names the field and what it found on failure.

std::string TypeOf(const json& j);
// Unknown fields are errors: a typo must not silently change what launches.
absl::Status CheckKeys(const json& obj, const Where& where, absl::string_view what,
                       std::initializer_list<absl::string_view> known);
absl::StatusOr<const json*> Field(const json& obj, absl::string_view key, const Where& where);
// Absent and not `required`: "".
absl::StatusOr<std::string> GetString(const json& obj, absl::string_view key, const Where& where,
                                      bool required = true);
// An integer in [min, max]; absent and not `required`: `fallback`.
absl::StatusOr<int64_t> GetInt(const json& obj, absl::string_view key, const Where& where,
                               int64_t min, int64_t max, bool required = true,
                               int64_t fallback = 0);
absl::StatusOr<bool> GetBool(const json& obj, absl::string_view key, const Where& where);
// A 64-bit integer value, or nullopt for anything else (a float, a string, 2^63 or more).
std::optional<int64_t> AsInt64(const json& value);

bool IsIdentifier(absl::string_view s, bool allow_dot);
bool IsPowerOfTwo(int64_t v);
// 64 lowercase hex digits (a sha256).
bool IsSha256Hex(absl::string_view s);

// ---- Types (types.cc).

// A parameter's Triton type string; a tensordesc's details come from ParseDescType.
absl::StatusOr<ParamType> ParseType(absl::string_view t, const Where& where,
                                    absl::string_view field);
// `tensordesc<DTYPE[B0, B1, ...]>`, Triton's spelling of a host tensor descriptor's type.
absl::StatusOr<TensorDescType> ParseDescType(absl::string_view t, const Where& where,
                                             absl::string_view field);

// ---- A kernel's entry and its parts.

// The call argument named `name`, or -1.
int FindArg(const KernelSpec& kernel, absl::string_view name);
bool HasAssumption(const VariantSpec& v, int arg, Assumption::Kind kind);
// The variant's TensorDescSpec for call argument `arg` (a tensordesc parameter).
TensorDescSpec* FindDesc(VariantSpec& variant, int arg);

// `kernels[index]` (kernel.cc), its variants included.
absl::StatusOr<KernelSpec> ParseKernel(const json& k, const Where& top, size_t index);
// `variants[index]` of `kernel`, whose parameters and buckets are parsed (variant.cc).
absl::Status ParseVariant(const json& v, const Where& kernel_where, const KernelSpec& kernel,
                          VariantSpec& variant, size_t index);
// The variant's `layout` (layout.cc), after its dispatch fields and tensordesc_meta.
absl::Status ParseLayout(const json& v, const Where& where, const KernelSpec& kernel,
                         VariantSpec& variant);

}  // namespace kpack::internal

#endif  // KPACK_SRC_MANIFEST_PARSE_H_
