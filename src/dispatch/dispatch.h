// Choosing a kernel's variant for one call: the shape bucket from the bucket parameters'
// values, then the most specialized variant whose assumptions hold (docs/pack-format.md,
// "Choosing a variant").
//
// `Build` precomputes, at load, the answer for every (bucket, property mask) pair, where
// the mask has one bit per argument property that some variant depends on (a div16 or
// eq1 assumption, or an integer type of a parameter whose type differs between
// variants). A launch computes the bucket and the mask from the arguments and reads one
// table entry: a few comparisons and one load, no allocation, no lock. The key space is
// small (at most 65536 entries), so the table is a flat array indexed by
// (bucket << properties) | mask rather than a hash map.
//
// Thread safety: immutable after Build.

#ifndef KPACK_SRC_DISPATCH_DISPATCH_H_
#define KPACK_SRC_DISPATCH_DISPATCH_H_

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kpack/arg.h"
#include "launch/args.h"
#include "manifest/manifest.h"

namespace kpack::internal {

class DispatchTable {
 public:
  static constexpr int kMaxProperties = 12;
  static constexpr uint32_t kMaxBuckets = 4096;
  static constexpr uint32_t kMaxEntries = 65536;

  // Selection results other than a variant index.
  static constexpr int kNoVariant = -1;     // no valid variant for these arguments
  static constexpr int kBadBucketArg = -2;  // a bucket parameter's argument is no integer

  struct Choice {
    int variant;    // index into KernelSpec::variants, or kNoVariant / kBadBucketArg
    bool fallback;  // a more specialized variant of the bucket was ruled out by its
                    // assumptions
  };

  // INVALID_ARGUMENT (without file prefix) when the kernel depends on too many
  // properties or buckets.
  static absl::StatusOr<DispatchTable> Build(const KernelSpec& kernel);

  Choice Select(std::span<const Arg> args) const {
    uint32_t bucket;
    if (!BucketOf(args, &bucket)) return {kBadBucketArg, false};
    uint32_t mask = 0;
    for (size_t p = 0; p < properties_.size(); ++p) {
      mask |= static_cast<uint32_t>(Holds(properties_[p], args[properties_[p].arg])) << p;
    }
    const Entry& e = table_[(bucket << properties_.size()) | mask];
    return {e.variant, e.fallback != 0};
  }

  // Why Select found nothing: names the kernel, each candidate's failed assumption with
  // the parameter and its value, or the bucket parameter that is not an integer.
  absl::Status NoVariantError(const KernelSpec& kernel, std::span<const Arg> args) const;

  // Whether argument `arg` decides the bucket or a property (a BoundLaunch must re-select
  // when it changes).
  bool DependsOn(int arg) const;

  size_t num_properties() const { return properties_.size(); }
  uint32_t num_buckets() const { return num_buckets_; }

 private:
  struct Dim {
    int arg;
    std::vector<int64_t> edges;
  };
  struct Property {
    enum Kind : uint8_t { kDiv16, kEq1, kFits } kind;
    int arg;
    ParamType type;  // kFits: the integer type the value must fit
    // kFits: that type's width and signedness (set by Build), so Holds needs no
    // conversion table.
    uint8_t fit_bits = 0;
    bool fit_signed = false;
  };
  struct Entry {
    int16_t variant = kNoVariant;
    uint8_t fallback = 0;
  };

  // A bucket parameter's value as int64 (unsigned values past INT64_MAX saturate, which
  // puts them in the last interval); false when the argument is no integer.
  static bool BucketValue(const Arg& a, int64_t* v) {
    if (!args_detail::IsInteger(a)) return false;
    if (!args_detail::ToInt64(a, v)) *v = INT64_MAX;
    return true;
  }
  // The combined bucket index of `args`; false when a bucket argument is no integer.
  bool BucketOf(std::span<const Arg> args, uint32_t* bucket) const {
    uint32_t index = 0, stride = 1;
    for (const Dim& d : dims_) {
      int64_t v;
      if (!BucketValue(args[d.arg], &v)) return false;
      uint32_t i = 0;
      while (i < d.edges.size() && v > d.edges[i]) ++i;
      index += i * stride;
      stride *= static_cast<uint32_t>(d.edges.size()) + 1;
    }
    *bucket = index;
    return true;
  }
  ABSL_ATTRIBUTE_ALWAYS_INLINE static bool Holds(const Property& p, const Arg& a) {
    bool integer = args_detail::IsInteger(a);
    switch (p.kind) {
      case Property::kDiv16:
        return (integer || a.kind() == Arg::Kind::kHostTypedPointer) && (a.bits() & 15) == 0;
      case Property::kEq1:
        return integer && a.bits() == 1;
      case Property::kFits:  // what PackArg accepts for an integer type
        return integer && args_detail::FitsInteger(a, p.fit_bits, p.fit_signed);
    }
    return false;
  }
  static std::string Describe(const Property& p, const KernelSpec& kernel);

  std::vector<Dim> dims_;
  std::vector<Property> properties_;
  std::vector<Entry> table_;
  uint32_t num_buckets_ = 1;
  // Per variant, for error messages: the property bits it requires, and its bucket
  // (-1: every bucket).
  std::vector<uint32_t> required_;
  std::vector<int64_t> bucket_of_;
};

}  // namespace kpack::internal

#endif  // KPACK_SRC_DISPATCH_DISPATCH_H_
