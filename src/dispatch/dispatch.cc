#include "dispatch/dispatch.h"

#include <algorithm>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

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
  if (nv > 32767) return absl::InvalidArgumentError("field 'variants': more than 32767");

  auto bit = [&t](Property p) {
    for (size_t i = 0; i < t.properties_.size(); ++i) {
      const Property& q = t.properties_[i];
      // Past 32 properties there is no bit; Build refuses such kernels below anyway.
      if (q.kind == p.kind && q.arg == p.arg && q.type == p.type) {
        return i < 32 ? uint32_t{1} << i : 0u;
      }
    }
    if (p.kind == Property::kFits) {
      p.fit_bits = static_cast<uint8_t>(8 * SlotSize(p.type));
      p.fit_signed = p.type == ParamType::kI8 || p.type == ParamType::kI16 ||
                     p.type == ParamType::kI32 || p.type == ParamType::kI64;
    }
    t.properties_.push_back(p);
    return t.properties_.size() <= 32 ? uint32_t{1} << (t.properties_.size() - 1) : 0u;
  };
  t.required_.assign(nv, 0);
  for (size_t v = 0; v < nv; ++v) {
    for (const Assumption& a : kernel.variants[v].assumptions) {
      t.required_[v] |= bit({a.kind == Assumption::kDiv16 ? Property::kDiv16 : Property::kEq1,
                             a.arg, ParamType::kConstexpr});
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
      t.required_[v] |=
          bit({Property::kFits, static_cast<int>(a), kernel.variants[v].arg_types[a]});
    }
  }
  if (t.properties_.size() > static_cast<size_t>(kMaxProperties)) {
    std::vector<std::string> names;
    for (const Property& p : t.properties_) names.push_back(Describe(p, kernel));
    return absl::InvalidArgumentError(absl::StrCat(
        "field 'variants': the variants depend on ", t.properties_.size(), " argument properties (",
        absl::StrJoin(names, ", "), "), more than the ", kMaxProperties, " supported"));
  }
  const uint32_t masks = uint32_t{1} << t.properties_.size();
  if (uint64_t{t.num_buckets_} * masks > kMaxEntries) {
    return absl::InvalidArgumentError(
        absl::StrCat("field 'variants': ", t.num_buckets_, " buckets x 2^", t.properties_.size(),
                     " property combinations exceed the ", kMaxEntries, "-entry dispatch table"));
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

  t.table_.resize(size_t{t.num_buckets_} * masks);
  for (uint32_t b = 0; b < t.num_buckets_; ++b) {
    for (uint32_t m = 0; m < masks; ++m) {
      int best = kNoVariant;
      for (size_t v = 0; v < nv; ++v) {
        if (t.bucket_of_[v] >= 0 && t.bucket_of_[v] != b) continue;
        if ((t.required_[v] & ~m) != 0) continue;
        if (best == kNoVariant || rank[v] > rank[best]) best = static_cast<int>(v);
      }
      bool fallback = false;
      for (size_t v = 0; v < nv && best != kNoVariant; ++v) {
        if (t.bucket_of_[v] >= 0 && t.bucket_of_[v] != b) continue;
        if ((t.required_[v] & ~m) != 0 && rank[v] > rank[best]) fallback = true;
      }
      t.table_[(size_t{b} << t.properties_.size()) | m] = {static_cast<int16_t>(best),
                                                           static_cast<uint8_t>(fallback)};
    }
  }
  return t;
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
      if ((required_[v] >> p & 1) && !Holds(properties_[p], args[properties_[p].arg])) {
        const Property& prop = properties_[p];
        reasons.push_back(absl::StrCat("variant '", kernel.variants[v].name, "' assumes ",
                                       Describe(prop, kernel), " but ", kernel.arg(prop.arg).name,
                                       "=", ArgValue(args[prop.arg])));
        break;
      }
    }
  }
  if (reasons.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("kernel '", kernel.name,
                                                   "' has no variant for this shape bucket", where,
                                                   "; nothing was launched"));
  }
  return absl::InvalidArgumentError(absl::StrCat("kernel '", kernel.name, "': no variant is valid",
                                                 where, ": ", absl::StrJoin(reasons, "; "),
                                                 "; nothing was launched"));
}

}  // namespace kpack::internal
