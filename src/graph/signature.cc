#include "graph/signature.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace kpack::internal {

std::string ShapeText(const LaunchShape& shape) {
  return absl::StrCat(shape.variant->kernel->spec->name, "/", shape.variant->spec->name, "[",
                      shape.grid.x, ",", shape.grid.y, ",", shape.grid.z, "]");
}

std::string SignatureText(const Signature& signature) {
  return absl::StrJoin(signature, "; ", [](std::string* out, const LaunchShape& shape) {
    out->append(ShapeText(shape));
  });
}

std::string DescribeShape(const LaunchShape& shape) {
  const KernelSpec& k = *shape.variant->kernel->spec;
  const VariantSpec& v = *shape.variant->spec;
  std::vector<std::string> ranges;
  for (size_t d = 0; d < k.buckets.size() && d < v.bucket.size(); ++d) {
    const std::vector<int64_t>& edges = k.buckets[d].edges;
    const std::string& name = k.arg(k.buckets[d].arg).name;
    const size_t i = static_cast<size_t>(v.bucket[d]);
    if (i == 0) {
      ranges.push_back(absl::StrCat(name, " <= ", edges[0]));
    } else if (i < edges.size()) {
      ranges.push_back(absl::StrCat(edges[i - 1] + 1, " <= ", name, " <= ", edges[i]));
    } else {
      ranges.push_back(absl::StrCat(name, " >= ", edges.back() + 1));
    }
  }
  const std::string where = k.buckets.empty()  ? "no buckets"
                            : ranges.empty() ? "every bucket"
                                             : "bucket " + absl::StrJoin(ranges, ", ");
  return absl::StrCat("kernel '", k.name, "' variant '", v.name, "' (", where, ")");
}

}  // namespace kpack::internal
