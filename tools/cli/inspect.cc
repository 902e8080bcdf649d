// kpack inspect PACK [KERNEL] [--json]

#include <ostream>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "commands.h"
#include "manifest/manifest.h"
#include "manifest/pack.h"
#include "nlohmann/json.hpp"

namespace kpack::cli {
namespace {

using internal::Assumption;
using internal::KernelSpec;
using internal::SlotSpec;
using internal::VariantSpec;
using json = nlohmann::json;

json Assumptions(const KernelSpec& k, const VariantSpec& v) {
  json a = json::object();
  for (const Assumption& as : v.assumptions) {
    a[k.arg(as.arg).name].push_back(as.kind == Assumption::kDiv16 ? "div16" : "eq1");
  }
  return a;
}

json Types(const KernelSpec& k, const VariantSpec& v) {
  json t = json::object();
  for (size_t a = 0; a < k.args.size(); ++a) {
    if (v.arg_types[a] != k.arg(static_cast<int>(a)).type) {
      t[k.arg(static_cast<int>(a)).name] = internal::TypeName(v.arg_types[a]);
    }
  }
  return t;
}

json KernelJson(const KernelSpec& k) {
  json params = json::array();
  for (const auto& p : k.params) params.push_back({{"name", p.name}, {"type", p.type_name}});
  json buckets = json::array();
  for (const auto& b : k.buckets) {
    buckets.push_back({{"param", k.arg(b.arg).name}, {"edges", b.edges}});
  }
  json variants = json::array();
  for (const VariantSpec& v : k.variants) {
    json layout = json::array();
    for (const SlotSpec& s : v.layout) {
      layout.push_back(
          {{"param", internal::SlotName(k, s)}, {"offset", s.offset}, {"size", s.size}});
    }
    variants.push_back({{"name", v.name},
                        {"cubin", v.cubin},
                        {"sha256", v.sha256},
                        {"entry", v.entry},
                        {"arch", v.arch},
                        {"constexprs", v.constexprs},
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
                        {"assumptions", Assumptions(k, v)},
                        {"types", Types(k, v)},
                        {"param_bytes", v.param_bytes},
                        {"layout", layout}});
  }
  return {{"name", k.name},
          {"params", params},
          {"buckets", buckets},
          {"grid", k.grid},
          {"variants", variants}};
}

std::string BucketText(const KernelSpec& k, const VariantSpec& v) {
  if (k.buckets.empty()) return "";
  if (v.bucket.empty()) return "all buckets";
  std::vector<std::string> parts;
  for (size_t d = 0; d < v.bucket.size(); ++d) {
    const auto& edges = k.buckets[d].edges;
    const std::string& name = k.arg(k.buckets[d].arg).name;
    size_t i = static_cast<size_t>(v.bucket[d]);
    if (i == 0) {
      parts.push_back(absl::StrCat(name, " <= ", edges[0]));
    } else if (i == edges.size()) {
      parts.push_back(absl::StrCat(name, " > ", edges.back()));
    } else {
      parts.push_back(absl::StrCat(edges[i - 1], " < ", name, " <= ", edges[i]));
    }
  }
  return absl::StrJoin(parts, ", ");
}

void PrintKernel(const KernelSpec& k, std::ostream& out) {
  std::vector<std::string> params;
  for (const auto& p : k.params) params.push_back(absl::StrCat(p.name, ": ", p.type_name));
  out << "kernel " << k.name << "(" << absl::StrJoin(params, ", ") << ")\n";
  for (const auto& b : k.buckets) {
    out << "  buckets on " << k.arg(b.arg).name << ": edges " << absl::StrJoin(b.edges, ", ")
        << " (inclusive upper bounds)\n";
  }
  if (!k.grid.empty()) out << "  grid: (" << absl::StrJoin(k.grid, ", ") << ")\n";
  for (const VariantSpec& v : k.variants) {
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
    std::string bucket = BucketText(k, v);
    if (!bucket.empty()) out << "    bucket: " << bucket << "\n";
    json assumptions = Assumptions(k, v), types = Types(k, v);
    if (!assumptions.empty()) out << "    assumptions: " << assumptions.dump() << "\n";
    if (!types.empty()) out << "    types: " << types.dump() << "\n";
    out << "    constexprs: " << v.constexprs.dump() << "\n";
    std::vector<std::string> slots;
    for (const SlotSpec& s : v.layout) {
      slots.push_back(absl::StrCat(internal::SlotName(k, s), "@", s.offset, ":", s.size));
    }
    out << "    layout (" << v.param_bytes << " B): " << absl::StrJoin(slots, " ") << "\n";
  }
}

}  // namespace

int Inspect(const InspectOptions& o, std::ostream& out, std::ostream& err) {
  std::string root;
  auto manifest = internal::ReadManifest(o.pack, &root);
  if (!manifest.ok()) {
    err << "kpack inspect: " << manifest.status().message() << "\n";
    return kFailed;
  }
  bool found = o.kernel.empty();
  json kernels = json::array();
  if (!o.json) {
    out << "pack " << root << " (" << manifest->generator << "): " << manifest->kernels.size()
        << " kernel" << (manifest->kernels.size() == 1 ? "" : "s") << "\n";
  }
  for (const KernelSpec& k : manifest->kernels) {
    if (!o.kernel.empty() && k.name != o.kernel) continue;
    found = true;
    if (o.json) {
      kernels.push_back(KernelJson(k));
    } else {
      PrintKernel(k, out);
    }
  }
  if (!found) {
    err << "kpack inspect: no kernel named '" << o.kernel << "' in " << root << "\n";
    return kFailed;
  }
  if (o.json) {
    out << json{{"pack", root}, {"generator", manifest->generator}, {"kernels", kernels}}.dump(2)
        << "\n";
  }
  return kOk;
}

}  // namespace kpack::cli
