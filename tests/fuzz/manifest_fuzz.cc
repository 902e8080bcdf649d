// Fuzzes ParseManifest (the manifest.json parser and validator), holding its two ways of
// parsing (the kernels apart, the whole text) to each other, and, for a manifest it
// accepts, what Open builds from each kernel next: the dispatch table and the grid
// expressions of every variant (mirroring CompileGrid in src/pack/pack.cc).

#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "dispatch/dispatch.h"
#include "dispatch/grid_expr.h"
#include "fuzz_check.h"
#include "kpack/arg.h"
#include "manifest/manifest.h"

namespace {

using kpack::Arg;
using kpack::internal::DispatchTable;
using kpack::internal::GridExpr;
using kpack::internal::KernelSpec;
using kpack::internal::VariantSpec;

// The structural promises ParseManifest makes about a manifest it accepts.
void CheckKernel(const KernelSpec& k) {
  KPACK_FUZZ_CHECK(!k.variants.empty());
  KPACK_FUZZ_CHECK(k.grid.size() <= 3);
  for (int p : k.args) {
    KPACK_FUZZ_CHECK(p >= 0 && static_cast<size_t>(p) < k.params.size());
  }
  for (const auto& b : k.buckets) {
    KPACK_FUZZ_CHECK(b.arg >= 0 && static_cast<size_t>(b.arg) < k.args.size());
    KPACK_FUZZ_CHECK(!b.edges.empty());
  }
  for (const VariantSpec& v : k.variants) {
    KPACK_FUZZ_CHECK(v.arg_types.size() == k.args.size());
    KPACK_FUZZ_CHECK(v.bucket.empty() || v.bucket.size() == k.buckets.size());
    KPACK_FUZZ_CHECK(v.param_bytes <= kpack::internal::kMaxParamBytes);
    uint32_t end = 0;
    for (const auto& s : v.layout) {
      // A CUtensorMap part (128 bytes) is 16-aligned, at the variant's offset modulo 64.
      const bool tma = s.part == kpack::internal::DescPart::kTma;
      KPACK_FUZZ_CHECK(s.offset >= end && s.size > 0 && s.offset % (tma ? 16 : s.size) == 0);
      KPACK_FUZZ_CHECK(!tma || (s.size == 128 && s.offset % 64 == v.tma_offset_mod64));
      end = s.offset + s.size;
      if (s.kind == kpack::internal::SlotKind::kArg) {
        KPACK_FUZZ_CHECK(s.arg >= 0 && static_cast<size_t>(s.arg) < k.args.size());
        KPACK_FUZZ_CHECK((s.part != kpack::internal::DescPart::kNone) ==
                         (k.arg(s.arg).type == kpack::internal::ParamType::kTensorDesc));
      }
    }
    KPACK_FUZZ_CHECK(end == v.param_bytes);
    for (const auto& d : v.descs) {
      KPACK_FUZZ_CHECK(d.arg >= 0 && static_cast<size_t>(d.arg) < k.args.size());
      KPACK_FUZZ_CHECK(!d.block.empty() && d.block.size() <= 5);
      KPACK_FUZZ_CHECK(!d.tma || (d.box.size() == d.block.size() &&
                                  d.element_strides.size() == d.block.size()));
    }
  }
}

// Compiles the kernel's grid for variant `v` with Open's resolver; what compiles is evaluated
// on each argument list in `calls` (one Arg per call argument).
void CompileAndEvaluateGrid(const KernelSpec& k, const VariantSpec& v,
                            const std::vector<std::vector<Arg>>& calls) {
  const GridExpr::Resolver resolve = kpack::internal::VariantGridResolver(k, v);
  for (const std::string& text : k.grid) {
    absl::StatusOr<GridExpr> expr = GridExpr::Compile(text, resolve);
    if (!expr.ok()) continue;
    for (const std::vector<Arg>& args : calls) {
      int64_t result;
      bool ok = expr->Evaluate(args, &result);
      if (expr->constant().has_value()) KPACK_FUZZ_CHECK(ok && result == *expr->constant());
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<kpack::internal::ManifestSpec> manifest =
      kpack::internal::ParseManifest(text, "fuzz.json");
  // ParseManifest parses the kernels apart, as its SAX pass finds them: it must give what
  // parsing the whole text gives, the same status and the same kernels.
  absl::StatusOr<kpack::internal::ManifestSpec> whole =
      kpack::internal::ParseManifestWhole(text, "fuzz.json");
  KPACK_FUZZ_CHECK(manifest.status() == whole.status());
  if (whole.ok()) {
    KPACK_FUZZ_CHECK(manifest->kernels.size() == whole->kernels.size() &&
                     manifest->format_version == whole->format_version &&
                     manifest->generator == whole->generator);
    for (size_t k = 0; k < whole->kernels.size(); ++k) {
      const KernelSpec& a = manifest->kernels[k];
      const KernelSpec& b = whole->kernels[k];
      KPACK_FUZZ_CHECK(a.name == b.name && a.params.size() == b.params.size() &&
                       a.grid == b.grid && a.variants.size() == b.variants.size());
      for (size_t v = 0; v < b.variants.size(); ++v) {
        KPACK_FUZZ_CHECK(a.variants[v].name == b.variants[v].name &&
                         a.variants[v].constexprs == b.variants[v].constexprs &&
                         a.variants[v].layout.size() == b.variants[v].layout.size());
      }
    }
  }
  if (!manifest.ok()) {
    KPACK_FUZZ_CHECK(manifest.status().code() == absl::StatusCode::kInvalidArgument ||
                     manifest.status().code() == absl::StatusCode::kUnimplemented);
    return 0;
  }
  KPACK_FUZZ_CHECK(!manifest->kernels.empty());
  // Calls a launch might make: every call argument set to one of these values.
  const int64_t kValues[] = {0, 1, 16, 17, 4097, -5, std::numeric_limits<int64_t>::max()};
  for (const KernelSpec& k : manifest->kernels) {
    CheckKernel(k);
    std::vector<std::vector<Arg>> calls;
    for (int64_t value : kValues) calls.emplace_back(k.args.size(), Arg(value));
    calls.emplace_back(k.args.size(), Arg(std::numeric_limits<uint64_t>::max()));
    calls.emplace_back(k.args.size(), Arg(1.5));  // no integer: a bucket cannot be chosen
    for (const VariantSpec& v : k.variants) CompileAndEvaluateGrid(k, v, calls);

    absl::StatusOr<DispatchTable> table = DispatchTable::Build(k);
    if (!table.ok()) {
      KPACK_FUZZ_CHECK(table.status().code() == absl::StatusCode::kInvalidArgument);
      continue;
    }
    for (const std::vector<Arg>& args : calls) {
      DispatchTable::Choice choice = table->Select(args);
      KPACK_FUZZ_CHECK(choice.variant == DispatchTable::kNoVariant ||
                       choice.variant == DispatchTable::kBadBucketArg ||
                       static_cast<size_t>(choice.variant) < k.variants.size());
      // As RuntimeImpl::Select: no variant is an error that says why.
      if (choice.variant < 0) KPACK_FUZZ_CHECK(!table->NoVariantError(k, args).ok());
    }
  }
  return 0;
}
