// kpack::Pack and the pack reader behind it and Runtime::Open (pack/pack_state.h).

#include "kpack/pack.h"

#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "pack/files.h"
#include "pack/pack_state.h"
#include "util/parallel.h"
#include "util/status_macros.h"

namespace kpack {
namespace internal {
namespace {

// Compiles the kernel's grid expressions against one variant (see VariantGridResolver).
absl::Status CompileGrid(const KernelSpec& k, const VariantSpec& v, absl::string_view where,
                         std::array<GridExpr, 3>& grid) {
  const GridExpr::Resolver resolve = VariantGridResolver(k, v);
  for (size_t axis = 0; axis < k.grid.size(); ++axis) {
    absl::StatusOr<GridExpr> expr = GridExpr::Compile(k.grid[axis], resolve);
    if (!expr.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": field 'grid[", axis, "]': ", expr.status().message()));
    }
    grid[axis] = *std::move(expr);
  }
  return absl::OkStatus();
}

// Everything about one variant that needs more than the manifest: its cubin, its grid.
absl::Status ReadVariant(const PackDir& dir, const KernelSpec& kernel, const VariantSpec& variant,
                         absl::string_view where, bool keep_cubin, VariantTables& tables) {
  KPACK_ASSIGN_OR_RETURN(std::vector<std::byte> cubin,
                         ReadVariantCubin(dir, kernel, variant, where));
  if (keep_cubin) tables.cubin = std::move(cubin);
  return CompileGrid(kernel, variant, where, tables.grid);
}

VariantInfo DescribeVariant(const KernelSpec& k, const VariantSpec& v) {
  VariantInfo info;
  info.name = v.name;
  info.cubin = v.cubin;
  info.entry = v.entry;
  info.sha256 = v.sha256;
  info.triton_version = v.triton_version;
  info.arch = v.arch;
  info.num_warps = v.num_warps;
  info.num_ctas = v.num_ctas;
  info.num_stages = v.num_stages;
  info.shared = v.shared;
  info.global_scratch_size = v.global_scratch_size;
  info.global_scratch_align = v.global_scratch_align;
  info.profile_scratch_size = v.profile_scratch_size;
  info.profile_scratch_align = v.profile_scratch_align;
  info.launch_pdl = v.launch_pdl;
  info.launch_cooperative_grid = v.launch_cooperative_grid;
  info.bucket = v.bucket;
  for (const Assumption& a : v.assumptions) {
    info.assumptions.push_back({k.arg(a.arg).name, a.kind == Assumption::kDiv16 ? "div16" : "eq1"});
  }
  info.constexprs_json = v.constexprs.dump();
  for (size_t a = 0; a < k.args.size(); ++a) {
    // The kernel's spelling ("*fp32") unless this variant overrides an integer's type.
    const ParamSpec& p = k.arg(static_cast<int>(a));
    info.arg_types.push_back(v.arg_types[a] == p.type ? p.type_name : TypeName(v.arg_types[a]));
  }
  for (const TensorDescSpec& d : v.descs) {
    info.arg_types[d.arg] = d.type_name;  // `types` may give the variant another block shape
    info.descs.push_back({k.arg(d.arg).name, d.dtype, d.block, d.tma, d.data_type, d.elem_size,
                          d.swizzle, d.fp4_padded, d.box, d.element_strides, d.interleave,
                          d.l2_promotion});
  }
  for (const SlotSpec& s : v.layout) {
    info.layout.push_back({s.kind == SlotKind::kArg ? k.arg(s.arg).name : SlotName(k, s),
                           s.offset, s.size, DescPartName(s.part, s.part_index)});
  }
  info.param_bytes = v.param_bytes;
  return info;
}

}  // namespace

KernelInfo DescribeKernel(const KernelSpec& k) {
  KernelInfo info;
  info.name = k.name;
  for (const ParamSpec& p : k.params) {
    info.params.push_back({p.name, p.type_name, p.type == ParamType::kConstexpr, p.readonly});
  }
  info.call_params.assign(k.args.begin(), k.args.end());
  for (const BucketSpec& b : k.buckets) {
    info.buckets.push_back({k.arg(b.arg).name, b.edges, b.grid_max});
  }
  info.grid = k.grid;
  info.grid_tolerant = k.grid_tolerant;
  info.grid_proven = k.grid_proven;
  for (const VariantSpec& v : k.variants) info.variants.push_back(DescribeVariant(k, v));
  info.source = {k.source_qualname, k.source_sha256};
  for (int p : k.autotune_key) info.autotune_key.push_back(k.params[p].name);
  return info;
}

absl::StatusOr<ReadPackResult> ReadPack(absl::string_view dir, const ReadPackOptions& options) {
  auto state = std::make_shared<PackState>();
  KPACK_ASSIGN_OR_RETURN(state->manifest, ReadManifest(dir, &state->dir));
  const std::string manifest_path = absl::StrCat(state->dir, "/manifest.json");
  KPACK_ASSIGN_OR_RETURN(const PackDir pack_dir, PackDir::Open(state->dir));
  const std::vector<KernelSpec>& kernels = state->manifest.kernels;

  // One task per kernel (its dispatch table and description) followed by one per variant
  // of it: task order is the order in which problems are reported.
  struct Task {
    size_t kernel;
    size_t variant;  // kNone: the kernel's own task
  };
  constexpr size_t kNone = SIZE_MAX;
  std::vector<Task> tasks;
  size_t variants = 0;
  for (size_t k = 0; k < kernels.size(); ++k) {
    tasks.push_back({k, kNone});
    for (size_t v = 0; v < kernels[k].variants.size(); ++v) tasks.push_back({k, v});
    variants += kernels[k].variants.size();
  }
  ReadPackResult result;
  result.tables.resize(kernels.size());
  state->kernels.resize(kernels.size());
  for (size_t k = 0; k < kernels.size(); ++k) {
    result.tables[k].variants.resize(kernels[k].variants.size());
  }
  std::vector<absl::Status> statuses(tasks.size());
  auto where = [&](const KernelSpec& kernel) {
    return absl::StrCat(manifest_path, ": kernel '", kernel.name, "'");
  };
  // Files, sha256 and ELF checks, grids, dispatch tables and descriptions are independent
  // per variant and per kernel, and on a large pack they are most of Open.
  const unsigned threads =
      options.threads != 0 ? options.threads : ThreadsFor(variants, /*per_thread=*/64);
  ParallelFor(tasks.size(), threads, [&](size_t i) {
    const KernelSpec& kernel = kernels[tasks[i].kernel];
    KernelTables& tables = result.tables[tasks[i].kernel];
    if (tasks[i].variant == kNone) {
      state->kernels[tasks[i].kernel] = DescribeKernel(kernel);
      absl::StatusOr<DispatchTable> dispatch = DispatchTable::Build(kernel);
      if (dispatch.ok()) {
        tables.dispatch = *std::move(dispatch);
      } else {
        statuses[i] = absl::InvalidArgumentError(
            absl::StrCat(where(kernel), ": ", dispatch.status().message()));
      }
    } else {
      const VariantSpec& variant = kernel.variants[tasks[i].variant];
      statuses[i] = ReadVariant(pack_dir, kernel, variant,
                                absl::StrCat(where(kernel), ": variant '", variant.name, "'"),
                                options.keep_cubins, tables.variants[tasks[i].variant]);
    }
    return statuses[i].ok() || options.problems != nullptr;
  });
  for (absl::Status& status : statuses) {
    if (status.ok()) continue;
    if (options.problems == nullptr) return status;
    options.problems->push_back(std::move(status));
  }
  result.state = std::move(state);
  return result;
}

}  // namespace internal

BucketDimInfo::Range BucketDimInfo::RangeOf(size_t index) const {
  Range range;
  if (index > 0 && index <= edges.size()) {
    // An edge of INT64_MAX leaves the bucket above it empty; it is spelled from INT64_MAX.
    const int64_t below = edges[index - 1];
    range.low = below == std::numeric_limits<int64_t>::max() ? below : below + 1;
  }
  if (index < edges.size()) range.high = edges[index];
  return range;
}

std::string BucketDimInfo::DescribeRange(size_t index) const {
  const Range r = RangeOf(index);
  if (r.low.has_value() && r.high.has_value()) {
    return absl::StrCat(*r.low, " <= ", param, " <= ", *r.high);
  }
  if (r.high.has_value()) return absl::StrCat(param, " <= ", *r.high);
  if (r.low.has_value()) return absl::StrCat(param, " >= ", *r.low);
  return absl::StrCat(param, " in no bucket (index ", index, " of ", edges.size() + 1, ")");
}

std::string DescribeBucket(std::span<const BucketDimInfo> dims, std::span<const int> index) {
  if (dims.empty()) return "no buckets";
  if (index.empty()) return "every bucket";
  std::vector<std::string> ranges;
  for (size_t d = 0; d < dims.size() && d < index.size(); ++d) {
    ranges.push_back(dims[d].DescribeRange(static_cast<size_t>(index[d])));
  }
  return absl::StrJoin(ranges, ", ");
}

absl::StatusOr<Pack> Pack::Read(std::string_view dir) {
  KPACK_ASSIGN_OR_RETURN(internal::ReadPackResult read,
                         internal::ReadPack(absl::string_view(dir.data(), dir.size()), {}));
  return Pack(std::move(read.state));
}

std::vector<absl::Status> Pack::Verify(std::string_view dir) {
  std::vector<absl::Status> problems;
  absl::StatusOr<internal::ReadPackResult> read =
      internal::ReadPack(absl::string_view(dir.data(), dir.size()), {.problems = &problems});
  if (!read.ok()) problems.insert(problems.begin(), read.status());
  return problems;
}

const std::string& Pack::dir() const { return state_->dir; }
int Pack::format_version() const { return state_->manifest.format_version; }
const std::string& Pack::generator() const { return state_->manifest.generator; }
const std::vector<KernelInfo>& Pack::kernels() const { return state_->kernels; }

absl::StatusOr<const KernelInfo*> Pack::Find(std::string_view name) const {
  for (const KernelInfo& k : state_->kernels) {
    if (k.name == name) return &k;
  }
  // A long list helps no one: the first few, and how many more.
  constexpr size_t kListed = 20;
  std::vector<absl::string_view> names;
  for (size_t i = 0; i < state_->kernels.size() && i < kListed; ++i) {
    names.push_back(state_->kernels[i].name);
  }
  std::string more;
  if (state_->kernels.size() > kListed) {
    more = absl::StrCat(" and ", state_->kernels.size() - kListed, " more");
  }
  return absl::NotFoundError(
      absl::StrCat("no kernel named '", absl::string_view(name.data(), name.size()), "' in pack '",
                   state_->dir, "' (it has: ", absl::StrJoin(names, ", "), more, ")"));
}

}  // namespace kpack
