// Building a kernel's dispatch table at load (its buckets, the argument properties its
// variants assume, the candidates per bucket) and choosing a variant per call, with the
// error that says why no variant takes a call.

#include "dispatch/dispatch.h"

#include <algorithm>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "kpack/pack.h"

namespace kpack::internal {
namespace {

int Bits(ParamType t) { return static_cast<int>(SlotSize(t)) * 8; }

std::string ArgValue(const Arg& a) {
  switch (a.kind()) {
    case Arg::Kind::kSigned:
      return absl::StrCat(static_cast<int64_t>(a.bits()));
    case Arg::Kind::kUnsigned:
      return absl::StrCat(a.bits());
    case Arg::Kind::kHostTypedPointer:
    case Arg::Kind::kDevicePtr:
      return absl::StrFormat("0x%x", a.bits());
    default:
      return absl::StrCat("(", ArgKindName(a.kind()), ")");
  }
}

}  // namespace

DispatchTable::FitRange DispatchTable::FitRangeOf(const Property& p) {
  const int bits = p.fit_bits;
  if (p.fit_signed) {
    if (bits == 64) return {uint64_t{1} << 63, UINT64_MAX, uint64_t{INT64_MAX}};
    const uint64_t half = uint64_t{1} << (bits - 1);  // [-half, half)
    return {-half, 2 * half - 1, half - 1};
  }
  if (bits == 64) return {0, uint64_t{INT64_MAX}, UINT64_MAX};
  const uint64_t max = (uint64_t{1} << bits) - 1;
  return {0, max, max};
}

std::string DispatchTable::Describe(const Property& p, const KernelSpec& kernel) {
  const std::string& name = kernel.arg(p.arg).name;
  switch (p.kind) {
    case Property::kDiv16:
      return absl::StrCat(name, " divisible by 16");
    case Property::kEq1:
      return absl::StrCat(name, " == 1");
    case Property::kFits:
      return absl::StrCat(name, " fitting ", TypeName(p.type));
  }
  return "";
}

std::string DispatchTable::DescribeBucket(const KernelSpec& kernel, uint32_t bucket) const {
  // The flat index is the first dimension's index varying fastest.
  std::vector<BucketDimInfo> dims;
  std::vector<int> index;
  for (const Dim& d : dims_) {
    const uint32_t n = static_cast<uint32_t>(d.edges.size()) + 1;
    dims.push_back({kernel.arg(d.arg).name, d.edges, std::nullopt});
    index.push_back(static_cast<int>(bucket % n));
    bucket /= n;
  }
  return kpack::DescribeBucket(dims, index);
}

absl::StatusOr<DispatchTable> DispatchTable::Build(const KernelSpec& kernel) {
  DispatchTable t;
  for (const BucketSpec& b : kernel.buckets) {
    t.dims_.push_back({b.arg, b.edges});
    uint64_t n = uint64_t{t.num_buckets_} * (b.edges.size() + 1);
    if (n > kMaxBuckets) {
      return absl::InvalidArgumentError(absl::StrCat(
          "field 'buckets': ", n, " buckets in all, more than the ", kMaxBuckets, " supported"));
    }
    t.num_buckets_ = static_cast<uint32_t>(n);
  }
  const size_t nv = kernel.variants.size();

  // Property numbering; each variant's required properties as indices first, as masks
  // once their number (and so the mask width) is known.
  auto index_of = [&t](Property p) {
    for (size_t i = 0; i < t.properties_.size(); ++i) {
      const Property& q = t.properties_[i];
      if (q.kind == p.kind && q.arg == p.arg && q.type == p.type) return i;
    }
    if (p.kind == Property::kFits) {
      p.fit_bits = static_cast<uint8_t>(8 * SlotSize(p.type));
      p.fit_signed = p.type == ParamType::kI8 || p.type == ParamType::kI16 ||
                     p.type == ParamType::kI32 || p.type == ParamType::kI64;
    }
    t.properties_.push_back(p);
    return t.properties_.size() - 1;
  };
  std::vector<std::vector<size_t>> needs(nv);
  for (size_t v = 0; v < nv; ++v) {
    for (const Assumption& a : kernel.variants[v].assumptions) {
      needs[v].push_back(index_of(
          {a.kind == Assumption::kDiv16 ? Property::kDiv16 : Property::kEq1, a.arg,
           ParamType::kConstexpr}));
    }
  }
  // An integer parameter typed differently across variants: each variant requires the
  // value to fit its own type.
  for (size_t a = 0; a < kernel.args.size(); ++a) {
    bool varies = std::any_of(
        kernel.variants.begin(), kernel.variants.end(),
        [&](const VariantSpec& v) { return v.arg_types[a] != kernel.variants[0].arg_types[a]; });
    if (!varies) continue;
    for (size_t v = 0; v < nv; ++v) {
      needs[v].push_back(
          index_of({Property::kFits, static_cast<int>(a), kernel.variants[v].arg_types[a]}));
    }
  }
  if (t.properties_.size() > static_cast<size_t>(kMaxProperties)) {
    std::vector<std::string> names;
    for (const Property& p : t.properties_) names.push_back(Describe(p, kernel));
    return absl::InvalidArgumentError(absl::StrCat(
        "field 'variants': the variants depend on ", t.properties_.size(), " argument properties (",
        absl::StrJoin(names, ", "), "), more than the ", kMaxProperties, " supported"));
  }
  t.words_ = std::max<uint32_t>(1, static_cast<uint32_t>((t.properties_.size() + 63) / 64));
  const auto first_word = static_cast<uint32_t>(std::min<size_t>(t.properties_.size(), 64));
  for (Property::Kind kind : {Property::kDiv16, Property::kEq1, Property::kFits}) {
    for (uint32_t p = 0; p < first_word; ++p) {
      if (t.properties_[p].kind != kind) continue;
      t.tests_.push_back({static_cast<uint32_t>(t.properties_[p].arg * sizeof(Arg)), p});
      if (kind == Property::kFits) t.fit_ranges_.push_back(FitRangeOf(t.properties_[p]));
    }
    const auto tests = static_cast<uint32_t>(t.tests_.size());
    if (kind == Property::kDiv16) t.num_div16_tests_ = tests;
    if (kind == Property::kEq1) t.num_eq1_tests_ = tests - t.num_div16_tests_;
  }
  t.required_.assign(nv * t.words_, 0);
  for (size_t v = 0; v < nv; ++v) {
    for (size_t p : needs[v]) t.required_[v * t.words_ + p / 64] |= uint64_t{1} << (p % 64);
  }

  // Rank: more assumptions, then narrower integer types, then earlier in the manifest.
  std::vector<std::tuple<int, int, int>> rank(nv);
  t.bucket_of_.assign(nv, -1);
  for (size_t v = 0; v < nv; ++v) {
    const VariantSpec& spec = kernel.variants[v];
    int narrowness = 0;
    for (size_t a = 0; a < kernel.args.size(); ++a) {
      if (IsInteger(spec.arg_types[a])) narrowness += 64 - Bits(spec.arg_types[a]);
    }
    rank[v] = {static_cast<int>(spec.assumptions.size()), narrowness, -static_cast<int>(v)};
    if (!spec.bucket.empty()) {
      int64_t index = 0, stride = 1;
      for (size_t d = 0; d < spec.bucket.size(); ++d) {
        index += spec.bucket[d] * stride;
        stride *= static_cast<int64_t>(t.dims_[d].edges.size()) + 1;
      }
      t.bucket_of_[v] = index;
    }
  }
  std::vector<int> order(nv);
  for (size_t v = 0; v < nv; ++v) order[v] = static_cast<int>(v);
  std::sort(order.begin(), order.end(), [&](int a, int b) { return rank[a] > rank[b]; });

  uint64_t candidates = 0;
  for (size_t v = 0; v < nv; ++v) candidates += t.bucket_of_[v] < 0 ? t.num_buckets_ : 1;
  if (candidates > kMaxCandidates) {
    return absl::InvalidArgumentError(absl::StrCat(
        "field 'variants': ", nv, " variants over ", t.num_buckets_, " buckets make ", candidates,
        " (bucket, variant) pairs, more than the ", kMaxCandidates, " supported"));
  }
  t.bucket_begin_.reserve(t.num_buckets_);
  t.candidates_.reserve(candidates + t.num_buckets_);
  t.wide_required_.reserve((candidates + t.num_buckets_) * (t.words_ - 1));
  for (uint32_t b = 0; b < t.num_buckets_; ++b) {
    t.bucket_begin_.push_back(static_cast<uint32_t>(t.candidates_.size()));
    for (int v : order) {
      if (t.bucket_of_[v] >= 0 && t.bucket_of_[v] != b) continue;
      const uint64_t* required = &t.required_[static_cast<size_t>(v) * t.words_];
      const bool wide = std::any_of(required + 1, required + t.words_,
                                    [](uint64_t w) { return w != 0; });
      t.candidates_.push_back(
          {required[0], v, t.candidates_.size() != t.bucket_begin_.back(), wide});
      t.wide_required_.insert(t.wide_required_.end(), required + 1, required + t.words_);
    }
    if (t.bucket_begin_.back() == t.candidates_.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "field 'variants': no variant serves bucket ", b, " (",
          t.DescribeBucket(kernel, b),
          "); every bucket needs a variant (one without assumptions serves any arguments)"));
    }
    t.candidates_.push_back({0, kNoVariant, false, false});
    t.wide_required_.insert(t.wide_required_.end(), t.words_ - 1, 0);
  }
  return t;
}

DispatchTable::Choice DispatchTable::SelectWide(std::span<const Arg> args,
                                                const Candidate* c) const {
  uint64_t mask[kMaxWords] = {};
  for (size_t p = 0; p < properties_.size(); ++p) {
    mask[p / 64] |= uint64_t{Holds(properties_[p], args[properties_[p].arg])} << (p % 64);
  }
  for (;; ++c) {  // the bucket's sentinel requires nothing
    uint64_t missing = c->required & ~mask[0];
    if (c->wide) {
      const uint64_t* rest = &wide_required_[size_t(c - candidates_.data()) * (words_ - 1)];
      for (uint32_t w = 1; w < words_; ++w) missing |= rest[w - 1] & ~mask[w];
    }
    if (missing == 0) return {c->variant, c->fallback};
  }
}

DispatchTable::Choice DispatchTable::SelectReference(std::span<const Arg> args) const {
  uint32_t bucket;
  if (!BucketOf(args, &bucket)) return {kBadBucketArg, false};
  // SelectWide tests every property through Holds and every word of each candidate.
  return SelectWide(args, candidates_.data() + bucket_begin_[bucket]);
}

bool DispatchTable::DependsOn(int arg) const {
  return std::any_of(dims_.begin(), dims_.end(), [&](const Dim& d) { return d.arg == arg; }) ||
         std::any_of(properties_.begin(), properties_.end(),
                     [&](const Property& p) { return p.arg == arg; });
}

absl::Status DispatchTable::NoVariantError(const KernelSpec& kernel,
                                           std::span<const Arg> args) const {
  uint32_t bucket = 0;  // BucketOf fails only for a non-integer, reported below
  if (!BucketOf(args, &bucket)) {
    for (const Dim& d : dims_) {
      if (args_detail::IsInteger(args[d.arg])) continue;
      return absl::InvalidArgumentError(absl::StrCat(
          "kernel '", kernel.name, "': argument ", d.arg, " ('", kernel.arg(d.arg).name,
          "') decides the shape bucket and must be an integer, got ",
          ArgKindName(args[d.arg].kind())));
    }
  }
  std::vector<std::string> shape;
  for (const Dim& d : dims_) {
    shape.push_back(absl::StrCat(kernel.arg(d.arg).name, "=", ArgValue(args[d.arg])));
  }
  std::string where =
      shape.empty() ? std::string() : absl::StrCat(" for ", absl::StrJoin(shape, ", "));
  std::vector<std::string> reasons;
  for (size_t v = 0; v < kernel.variants.size(); ++v) {
    if (bucket_of_[v] >= 0 && bucket_of_[v] != bucket) continue;
    for (size_t p = 0; p < properties_.size(); ++p) {
      if (Requires(v, p) && !Holds(properties_[p], args[properties_[p].arg])) {
        const Property& prop = properties_[p];
        reasons.push_back(absl::StrCat("variant '", kernel.variants[v].name, "' assumes ",
                                       Describe(prop, kernel), " but ", kernel.arg(prop.arg).name,
                                       "=", ArgValue(args[prop.arg])));
        break;
      }
    }
  }
  // Build gave every bucket a variant, so a failed Select had a candidate whose
  // assumption failed: `reasons` is not empty.
  return absl::InvalidArgumentError(absl::StrCat("kernel '", kernel.name, "': no variant is valid",
                                                 where, ": ", absl::StrJoin(reasons, "; "),
                                                 "; nothing was launched"));
}

}  // namespace kpack::internal
