// kpack inspect PACK [KERNEL] [--json] [--driver PATH]: what a pack holds, from kpack::Pack
// (no driver needed).

#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "commands.h"
#include "driver/driver.h"
#include "kpack/pack.h"
#include "nlohmann/json.hpp"

namespace kpack::cli {
namespace {

using json = nlohmann::json;

json Assumptions(const VariantInfo& v) {
  json a = json::object();
  for (const AssumptionInfo& as : v.assumptions) a[as.param].push_back(as.kind);
  return a;
}

// The integer parameters whose type this variant overrides (the manifest's `types`).
json Types(const KernelInfo& k, const VariantInfo& v) {
  json t = json::object();
  for (size_t a = 0; a < k.call_params.size(); ++a) {
    const ParamInfo& p = k.params[k.call_params[a]];
    if (v.arg_types[a] != p.type) t[p.name] = v.arg_types[a];
  }
  return t;
}

json KernelJson(const KernelInfo& k) {
  json params = json::array();
  for (const ParamInfo& p : k.params) params.push_back({{"name", p.name}, {"type", p.type}});
  json buckets = json::array();
  json grid_max = json::object();
  for (const BucketDimInfo& b : k.buckets) {
    buckets.push_back({{"param", b.param}, {"edges", b.edges}});
    if (b.grid_max.has_value()) grid_max[b.param] = *b.grid_max;
  }
  json variants = json::array();
  for (const VariantInfo& v : k.variants) {
    json layout = json::array();
    for (const LayoutSlotInfo& s : v.layout) {
      json slot = {{"param", s.name}, {"offset", s.offset}, {"size", s.size}};
      if (!s.part.empty()) slot["part"] = s.part;
      layout.push_back(slot);
    }
    json descs = json::array();
    for (const TensorDescInfo& d : v.descs) {
      json desc = {{"param", d.param}, {"dtype", d.dtype}, {"block_shape", d.block_shape},
                   {"tma", d.tma}};
      if (d.tma) {
        desc.update({{"data_type", d.data_type},
                     {"elem_size", d.elem_size},
                     {"swizzle", d.swizzle},
                     {"block_size", d.box},
                     {"fp4_padded", d.fp4_padded},
                     {"element_strides", d.element_strides},
                     {"interleave", d.interleave},
                     {"l2_promotion", d.l2_promotion}});
      }
      descs.push_back(desc);
    }
    variants.push_back({{"name", v.name},
                        {"cubin", v.cubin},
                        {"sha256", v.sha256},
                        {"entry", v.entry},
                        {"arch", v.arch},
                        {"constexprs", json::parse(v.constexprs_json)},
                        {"num_warps", v.num_warps},
                        {"num_ctas", v.num_ctas},
                        {"num_stages", v.num_stages},
                        {"shared", v.shared},
                        {"global_scratch_size", v.global_scratch_size},
                        {"global_scratch_align", v.global_scratch_align},
                        {"profile_scratch_size", v.profile_scratch_size},
                        {"profile_scratch_align", v.profile_scratch_align},
                        {"launch_pdl", v.launch_pdl},
                        {"launch_cooperative_grid", v.launch_cooperative_grid},
                        {"bucket", v.bucket},
                        {"assumptions", Assumptions(v)},
                        {"types", Types(k, v)},
                        {"param_bytes", v.param_bytes},
                        {"tensordescs", descs},
                        {"layout", layout}});
  }
  json kernel = {{"name", k.name},
                 {"params", params},
                 {"buckets", buckets},
                 {"grid", k.grid},
                 {"variants", variants}};
  if (k.grid_tolerant) {  // as the manifest's kpack/2 field
    kernel["grid_tolerance"] = {{"proof", k.grid_proven ? "gpu" : "asserted"}};
    if (!grid_max.empty()) kernel["grid_tolerance"]["max"] = grid_max;
  }
  return kernel;
}

// "tensordesc a_desc: fp16, block [64, 128]; TMA: box [64, 64], ..." (the encode's
// arguments from the manifest), or the pointer form.
std::string DescText(const TensorDescInfo& d) {
  std::string text = absl::StrCat("tensordesc ", d.param, ": ", d.dtype, ", block [",
                                  absl::StrJoin(d.block_shape, ", "), "]");
  if (!d.tma) return absl::StrCat(text, "; no TMA: base pointer, shape, strides, padding flag");
  static constexpr const char* kSwizzle[] = {"none", "32B", "64B", "128B"};
  static constexpr const char* kL2[] = {"none", "64B", "128B", "256B"};
  return absl::StrCat(text, "; TMA: CUtensorMap data type ", d.data_type, " (", d.elem_size,
                      " B), box [", absl::StrJoin(d.box, ", "), "], swizzle ",
                      kSwizzle[d.swizzle & 3], d.fp4_padded ? ", fp4 padded" : "",
                      ", element strides [", absl::StrJoin(d.element_strides, ", "),
                      "], interleave ", d.interleave, ", L2 promotion ", kL2[d.l2_promotion & 3]);
}

void PrintKernel(const KernelInfo& k, std::ostream& out) {
  std::vector<std::string> params;
  for (const ParamInfo& p : k.params) params.push_back(absl::StrCat(p.name, ": ", p.type));
  out << "kernel " << k.name << "(" << absl::StrJoin(params, ", ") << ")\n";
  for (const BucketDimInfo& b : k.buckets) {
    out << "  buckets on " << b.param << ": edges " << absl::StrJoin(b.edges, ", ")
        << " (inclusive upper bounds)\n";
  }
  if (!k.grid.empty()) out << "  grid: (" << absl::StrJoin(k.grid, ", ") << ")\n";
  if (k.grid_tolerant) {
    out << "  grid tolerance: " << (k.grid_proven ? "proven on a GPU" : "asserted, unproven")
        << " (a CUDA graph pads the grid to the buckets' upper edges";
    for (const BucketDimInfo& b : k.buckets) {
      if (b.grid_max.has_value()) out << "; " << b.param << " up to " << *b.grid_max;
    }
    out << ")\n";
  }
  for (const VariantInfo& v : k.variants) {
    out << "  variant " << v.name << ": entry " << v.entry << ", sm_" << v.arch
        << (v.arch >= 90 ? "a" : "") << ", " << v.num_warps << " warps (" << 32 * v.num_warps
        << " threads), " << v.num_ctas << " cta" << (v.num_ctas > 1 ? "s" : "") << ", " << v.shared
        << " B shared";
    if (v.num_stages > 0) out << ", " << v.num_stages << " stages";
    out << "\n";
    std::vector<std::string> attrs;
    if (v.num_ctas > 1) attrs.push_back(absl::StrCat("cluster ", v.num_ctas, "x1x1"));
    if (v.launch_pdl) attrs.push_back("programmatic stream serialization (PDL)");
    if (v.launch_cooperative_grid) attrs.push_back("cooperative");
    out << "    launch attributes: " << (attrs.empty() ? "none" : absl::StrJoin(attrs, ", "))
        << "\n";
    out << "    scratch: global " << v.global_scratch_size << " B/program (align "
        << v.global_scratch_align << "), profile " << v.profile_scratch_size << " B/program (align "
        << v.profile_scratch_align << ")\n";
    if (!k.buckets.empty()) out << "    bucket: " << DescribeBucket(k.buckets, v.bucket) << "\n";
    json assumptions = Assumptions(v), types = Types(k, v);
    if (!assumptions.empty()) out << "    assumptions: " << assumptions.dump() << "\n";
    if (!types.empty()) out << "    types: " << types.dump() << "\n";
    out << "    constexprs: " << v.constexprs_json << "\n";
    for (const TensorDescInfo& d : v.descs) out << "    " << DescText(d) << "\n";
    std::vector<std::string> slots;
    for (const LayoutSlotInfo& s : v.layout) {
      slots.push_back(absl::StrCat(s.name, s.part.empty() ? "" : ".", s.part, "@", s.offset, ":",
                                   s.size));
    }
    out << "    layout (" << v.param_bytes << " B): " << absl::StrJoin(slots, " ") << "\n";
  }
}

}  // namespace

int Inspect(const InspectOptions& o, std::ostream& out, std::ostream& err) {
  absl::StatusOr<Pack> pack = Pack::Read(o.pack);
  if (!pack.ok()) {
    err << "kpack inspect: " << pack.status().message() << "\n";
    return kFailed;
  }
  std::string driver_line;  // inspecting reads the pack alone; a named driver must load
  if (!o.driver.empty()) {
    absl::StatusOr<std::shared_ptr<const internal::Driver>> d = internal::Driver::Load(o.driver);
    if (!d.ok()) {
      err << "kpack inspect: " << d.status().message() << "\n";
      return kFailed;
    }
    driver_line = absl::StrCat("driver: ", (*d)->path, " (loads; inspecting needs none)\n");
  }
  std::vector<const KernelInfo*> kernels;
  if (o.kernel.empty()) {
    for (const KernelInfo& k : pack->kernels()) kernels.push_back(&k);
  } else {
    absl::StatusOr<const KernelInfo*> k = pack->Find(o.kernel);  // lists the kernels there are
    if (!k.ok()) {
      err << "kpack inspect: " << k.status().message() << "\n";
      return kFailed;
    }
    kernels.push_back(*k);
  }
  if (o.json) {
    json list = json::array();
    for (const KernelInfo* k : kernels) list.push_back(KernelJson(*k));
    out << json{{"pack", pack->dir()}, {"generator", pack->generator()}, {"kernels", list}}.dump(2)
        << "\n";
    return kOk;
  }
  out << driver_line;
  out << "pack " << pack->dir() << " (" << pack->generator() << "): " << pack->kernels().size()
      << " kernel" << (pack->kernels().size() == 1 ? "" : "s") << "\n";
  for (const KernelInfo* k : kernels) PrintKernel(*k, out);
  return kOk;
}

}  // namespace kpack::cli
