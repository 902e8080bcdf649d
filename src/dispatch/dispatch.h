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
// 844.8, hence the per-candidate `wide` flag and the stored property count). The
// 13-property layer_norm_bwd of the example pack (kpack_many_properties, which the table
// refused) costs 1164.1 for 14 arguments. A hash map keyed by (bucket, mask) was not
// taken: hashing the mask costs more than scanning the few candidates a bucket has.
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
    // The first 64 properties' mask, in a register. Nearly every kernel has no more.
    uint64_t mask = 0;
    const Property* const props = properties_.data();
    for (uint32_t p = 0; p < first_word_properties_; ++p) {
      mask |= uint64_t{Holds(props[p], args[props[p].arg])} << p;
    }
    // Each bucket's list ends in a sentinel that requires nothing and names no variant.
    const Candidate* c = candidates_.data() + bucket_begin_[bucket];
    while ((c->required & ~mask) != 0) ++c;
    if (ABSL_PREDICT_FALSE(c->wide)) return SelectWide(args, c);
    return {c->variant, c->fallback};
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
  // "n <= 16, 17 <= m <= 64" for a combined bucket index.
  std::string DescribeBucket(const KernelSpec& kernel, uint32_t bucket) const;

  std::vector<Dim> dims_;
  std::vector<Property> properties_;
  uint32_t num_buckets_ = 1;
  uint32_t words_ = 1;  // mask words in use: ceil(properties / 64), at least 1
  uint32_t first_word_properties_ = 0;  // min(properties, 64)
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
