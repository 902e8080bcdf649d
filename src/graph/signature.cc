// Bucket signatures in words, for StepGraph's errors and its graphs() report.

#include "graph/signature.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kpack/pack.h"

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
  const KernelData& k = *shape.variant->kernel;
  const VariantSpec& v = *shape.variant->spec;
  return absl::StrCat("kernel '", k.spec->name, "' variant '", v.name, "' (",
                      k.spec->buckets.empty() || v.bucket.empty() ? "" : "bucket ",
                      DescribeBucket(k.info->buckets, v.bucket), ")");
}

}  // namespace kpack::internal
