// include/kpack/pack.h's example: describe a pack with no CUDA driver.
#include <cstdio>
#include <string_view>

#include <kpack/kpack.h>

#include "examples.h"

absl::Status DescribePack(std::string_view dir) {
  absl::StatusOr<kpack::Pack> pack = kpack::Pack::Read(dir);
  if (!pack.ok()) return pack.status();         // names file, kernel, variant, field
  for (const kpack::KernelInfo& k : pack->kernels())
    printf("%s: %zu variants\n", k.name.c_str(), k.variants.size());
  return absl::OkStatus();
}
