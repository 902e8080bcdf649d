// README.md, "Dynamic shapes": kernels/examplepack's matmul_fp16.
#include <cstdio>

#include "examples.h"

// C = A·B for row-major fp16 matrices (A: M×K, B: K×N, C: M×N) with the example pack's
// `matmul_fp16` kernel, whose variants are bucketed on M.
absl::Status Matmul(const kpack::Kernel& mm, CUstream stream, CUdeviceptr a, CUdeviceptr b,
                    CUdeviceptr c, int M, int N, int K) {
  // a, b, c, M, N, K, then the strides (in elements) am, ak, bk, bn, cm, cn
  const kpack::Arg args[] = {a, b, c, M, N, K, K, 1, N, 1, N, 1};
  absl::StatusOr<std::string_view> v = mm.SelectVariant(args);  // the variant, not launched
  if (!v.ok()) return v.status();
  std::printf("M=%d: %.*s\n", M, static_cast<int>(v->size()), v->data());
  return mm.LaunchArgs(stream, args);  // the grid from the manifest's grid expressions
}

void PrintVariantStats(const kpack::Kernel& mm) {
  for (const kpack::Kernel::VariantStats& s : mm.variant_stats())  // launches, fallbacks
    std::printf("%.*s: %llu launches, %llu fallbacks\n", static_cast<int>(s.variant.size()),
                s.variant.data(), static_cast<unsigned long long>(s.launches),
                static_cast<unsigned long long>(s.fallback_launches));
}
