// Choosing a kernel's variant for one call: the shape bucket from the bucket parameters'
// values, then the most specialized variant whose assumptions hold (docs/pack-format.md,
// "Choosing a variant").
//
// Structure. `Build` numbers every argument property that some variant depends on (a
// div16 or eq1 assumption, or an integer type of a parameter whose type differs between
// variants) and gives each variant its required property set as a bitmask of up to
// kMaxProperties bits (kMaxWords 64-bit words). Per bucket it lists the variants serving
// it, most specialized first (the ranking of the format). A launch computes the bucket
// and the mask of properties that hold, then walks its bucket's list and takes the first
// variant whose required bits are all set: that is the most specialized valid one, and it
// is a fallback exactly when it is not the first of the list.
//
// Why a list and not the flat table this replaced (one entry per (bucket, mask), 2^P
// entries per bucket): the table is one load after the mask, but its size doubles with
// every property, which capped kernels at 12 properties, while Triton specializes every
// pointer and integer parameter (a layer-norm backward easily has 15). Per launch the
// list costs the mask (one test per property, as the table did) plus one AND-NOT per
// candidate until the first match; with the most specialized variant valid that is the
// first candidate. Measured with bench/overhead_check.py (callgrind, kpack's own
// instructions per launch, kpack_dynamic_shapes: the dispatch pack's axpy, 7 properties):
// the flat table 826.8; this list 824.8 once the first 64 properties' mask stays in a
// register (an array-indexed mask cost 926.8, a words_ test with an out-of-line call
// 844.8, hence the per-candidate `wide` flag). The 13-property layer_norm_bwd of the
// example pack (kpack_many_properties, which the table refused) costs 1164.1 for 14
// arguments. A hash map keyed by (bucket, mask) was not taken: hashing the mask costs
// more than scanning the few candidates a bucket has.
//
// The mask (FirstWordMask). Holds, one property at a time, branched on the property's
// kind and then on the Arg's: about 28 instructions per property. The properties are
// grouped by kind at Build instead (div16, eq1, fits; PropertyTest), and each group's
// loop computes its test on the Arg's bytes with no branch: 15 per div16 property.
// kpack_dynamic_shapes 656.7 -> 605.7, kpack_many_properties 885.1 -> 762.1 own
// instructions (RelWithDebInfo build; SelectReference keeps the per-property loop, and
// tests hold Select to it).
//
// Thread safety: immutable after Build.

#ifndef KPACK_SRC_DISPATCH_DISPATCH_H_
#define KPACK_SRC_DISPATCH_DISPATCH_H_

#include <cstdint>
#include <cstring>
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
  static constexpr int kMaxWords = 4;
  static constexpr int kMaxProperties = 64 * kMaxWords;
  static constexpr uint32_t kMaxBuckets = 4096;
  // (bucket, variant) pairs in all: a variant without `bucket` is listed in every bucket.
  static constexpr uint32_t kMaxCandidates = 1u << 20;

  // Selection results other than a variant index.
  static constexpr int kNoVariant = -1;     // no valid variant for these arguments
  static constexpr int kBadBucketArg = -2;  // a bucket parameter's argument is no integer

  struct Choice {
    int variant;    // index into KernelSpec::variants, or kNoVariant / kBadBucketArg
    bool fallback;  // a more specialized variant of the bucket was ruled out by its
                    // assumptions
  };

  // INVALID_ARGUMENT (without file prefix) when the kernel depends on too many
  // properties or buckets, or when a bucket has no variant (every call landing there
  // would fail, so the pack is refused at Open rather than at that call).
  static absl::StatusOr<DispatchTable> Build(const KernelSpec& kernel);

  Choice Select(std::span<const Arg> args) const {
    uint32_t bucket;
    if (!BucketOf(args, &bucket)) return {kBadBucketArg, false};
    const uint64_t mask = FirstWordMask(args);
    // Each bucket's list ends in a sentinel that requires nothing and names no variant.
    const Candidate* c = candidates_.data() + bucket_begin_[bucket];
    while ((c->required & ~mask) != 0) ++c;
    if (ABSL_PREDICT_FALSE(c->wide)) return SelectWide(args, c);
    return {c->variant, c->fallback};
  }

  // Select as it was before its property tests were grouped by kind: every property
  // through Holds, one at a time. The reference that Select must match (tests compare
  // the two); not for the launch path.
  Choice SelectReference(std::span<const Arg> args) const;

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
  // Property `bit` (< 64) on the Arg at byte `arg_byte` of the call's Arg array.
  struct PropertyTest {
    uint32_t arg_byte;
    uint32_t bit;
  };
  // What a kFits property accepts (FitsInteger's ranges for its type): a kSigned value
  // v with v - lo <= span as uint64, an unsigned one (kUnsigned, kDevicePtr) up to
  // unsigned_max.
  struct FitRange {
    uint64_t lo;
    uint64_t span;
    uint64_t unsigned_max;
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
  // The first 64 properties' mask, in a register (nearly every kernel has no more): bit p
  // set when property p holds, as Holds says. The div16 and eq1 properties, nearly all of
  // them, are tested in a loop of their own each, with no branch: Holds's tests for that
  // kind, on an Arg read as 16 bytes (payload, then kind; kpack/arg.h).
  ABSL_ATTRIBUTE_ALWAYS_INLINE uint64_t FirstWordMask(std::span<const Arg> args) const {
    static_assert(static_cast<unsigned>(Arg::Kind::kHostTypedPointer) == 0 &&
                  static_cast<unsigned>(Arg::Kind::kDevicePtr) == 1 &&
                  static_cast<unsigned>(Arg::Kind::kSigned) == 2 &&
                  static_cast<unsigned>(Arg::Kind::kUnsigned) == 3);
    const auto* const a = reinterpret_cast<const unsigned char*>(args.data());
    uint64_t mask = 0;
    const PropertyTest* t = tests_.data();
    // div16: an integer or a pointer (kinds 0..3) whose value is a multiple of 16.
    for (const PropertyTest* const end = t + num_div16_tests_; t != end; ++t) {
      uint64_t bits;
      std::memcpy(&bits, a + t->arg_byte, 8);
      const uint64_t failed = (bits & 15) | (a[t->arg_byte + 8] & ~3u);
      mask |= uint64_t{failed == 0} << t->bit;
    }
    // eq1: an integer (kinds 1..3) equal to 1.
    for (const PropertyTest* const end = t + num_eq1_tests_; t != end; ++t) {
      uint64_t bits;
      std::memcpy(&bits, a + t->arg_byte, 8);
      const unsigned kind = a[t->arg_byte + 8];
      mask |= static_cast<uint64_t>((bits == 1) & (kind - 1u <= 2u)) << t->bit;
    }
    // kFits (where an integer parameter's type differs between variants): a kSigned value
    // within [lo, lo + span] (unsigned arithmetic), an unsigned one (kinds 1, 3) at most
    // unsigned_max.
    const FitRange* r = fit_ranges_.data();
    for (const PropertyTest* const end = tests_.data() + tests_.size(); t != end; ++t, ++r) {
      uint64_t bits;
      std::memcpy(&bits, a + t->arg_byte, 8);
      const unsigned kind = a[t->arg_byte + 8];
      const bool fits = ((kind == 2) & (bits - r->lo <= r->span)) |
                        (((kind | 2) == 3) & (bits <= r->unsigned_max));
      mask |= uint64_t{fits} << t->bit;
    }
    return mask;
  }
  struct Candidate;
  // Select's continuation for a kernel of more than 64 properties, from the first
  // candidate of the bucket whose first 64 required properties hold (out of line: rare,
  // and it keeps Select small).
  Choice SelectWide(std::span<const Arg> args, const Candidate* c) const;
  // Whether variant v requires property p.
  bool Requires(size_t v, size_t p) const {
    return (required_[v * words_ + p / 64] >> (p % 64) & 1) != 0;
  }
  static std::string Describe(const Property& p, const KernelSpec& kernel);
  static FitRange FitRangeOf(const Property& p);
  // "n <= 16, 17 <= m <= 64" for a combined bucket index.
  std::string DescribeBucket(const KernelSpec& kernel, uint32_t bucket) const;

  std::vector<Dim> dims_;
  std::vector<Property> properties_;
  // The first 64 properties, by kind: num_div16_tests_ div16, then num_eq1_tests_ eq1,
  // then the kFits ones, each with its range in fit_ranges_ (FirstWordMask).
  std::vector<PropertyTest> tests_;
  std::vector<FitRange> fit_ranges_;
  uint32_t num_div16_tests_ = 0;
  uint32_t num_eq1_tests_ = 0;
  uint32_t num_buckets_ = 1;
  uint32_t words_ = 1;  // mask words in use: ceil(properties / 64), at least 1
  // One (bucket, variant) pair: the variant and the first word of its required property
  // bits; with more than 64 properties its other words are in wide_required_
  // (words_ - 1 per candidate, same order).
  struct Candidate {
    uint64_t required;
    int variant;
    bool fallback;  // not the first of its bucket: better ranked variants were ruled out
    bool wide;      // requires properties past the first 64 (see wide_required_)
  };
  // Bucket b's candidates start at bucket_begin_[b], best ranked first, and end with a
  // sentinel {0, kNoVariant, false, false} (it requires nothing, so a scan always stops).
  std::vector<uint32_t> bucket_begin_;
  std::vector<Candidate> candidates_;
  std::vector<uint64_t> wide_required_;
  // Per variant, for error messages: its required bits (words_ words) and its bucket
  // (-1: every bucket).
  std::vector<uint64_t> required_;
  std::vector<int64_t> bucket_of_;
};

}  // namespace kpack::internal

#endif  // KPACK_SRC_DISPATCH_DISPATCH_H_
