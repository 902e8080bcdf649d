// README.md, "Hopper TMA descriptors": kernels/examplepack's matmul_tma.
#include "examples.h"

// C = A·B with the example pack's persistent TMA matmul (fp16, row-major A: M×K, B: K×N,
// C: M×N; N and K multiples of 8, for 16-byte aligned rows). Each matrix goes as a
// tensor descriptor; the tile (block shape) is the chosen variant's.
absl::Status MatmulTma(const kpack::Kernel& mm, CUstream stream, CUdeviceptr a,
                       CUdeviceptr b, CUdeviceptr c, int M, int N, int K, int num_sms) {
  const kpack::TensorDesc da = kpack::TensorDesc::RowMajor(a, {M, K});
  const kpack::TensorDesc db = kpack::TensorDesc::RowMajor(b, {K, N});
  const kpack::TensorDesc dc = kpack::TensorDesc::RowMajor(c, {M, N});
  // Grid: min(num_sms, tiles), from the manifest. Three CUtensorMaps are encoded, or
  // copied when these descriptors were launched lately.
  return mm.Launch(stream, da, db, dc, M, N, K, num_sms);
}
