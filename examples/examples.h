// The README's and headers' examples, one function each (add_vectors.cc, matmul.cc,
// tma.cc, describe_pack.cc, step_graph.cc).

#ifndef KPACK_EXAMPLES_EXAMPLES_H_
#define KPACK_EXAMPLES_EXAMPLES_H_

#include <span>
#include <string_view>

#include <kpack/kpack.h>

absl::Status AddVectors(std::string_view dir, CUstream stream, CUdeviceptr x, CUdeviceptr y,
                        CUdeviceptr out, int n);
absl::Status Matmul(const kpack::Kernel& mm, CUstream stream, CUdeviceptr a, CUdeviceptr b,
                    CUdeviceptr c, int M, int N, int K);
void PrintVariantStats(const kpack::Kernel& mm);
absl::Status MatmulTma(const kpack::Kernel& mm, CUstream stream, CUdeviceptr a,
                       CUdeviceptr b, CUdeviceptr c, int M, int N, int K, int num_sms);
absl::Status DescribePack(std::string_view dir);
absl::Status RunSteps(const kpack::Runtime& rt, CUstream stream, CUdeviceptr a, CUdeviceptr w,
                      CUdeviceptr c, CUdeviceptr u, CUdeviceptr v, CUdeviceptr z,
                      std::span<const int> batches);

#endif  // KPACK_EXAMPLES_EXAMPLES_H_
