// README.md, "CUDA graphs", and include/kpack/graph.h: kernels/graphpack's matmul_fp16 and
// vector_add in a step replayed from CUDA graphs.
#include <span>

#include "examples.h"

// A step of two launches whose sizes follow the batch m, sent as CUDA graphs: C = A·W
// (A: m×4096, W: 4096×4096, fp16) and z = u + v (m×4096 floats), kernels/graphpack's.
absl::Status RunSteps(const kpack::Runtime& rt, CUstream stream, CUdeviceptr a, CUdeviceptr w,
                      CUdeviceptr c, CUdeviceptr u, CUdeviceptr v, CUdeviceptr z,
                      std::span<const int> batches) {
  constexpr int kDim = 4096;
  absl::StatusOr<kpack::Kernel> mm = rt.Find("matmul_fp16");
  absl::StatusOr<kpack::Kernel> vadd = rt.Find("vector_add");
  if (!mm.ok()) return mm.status();
  if (!vadd.ok()) return vadd.status();
  // Bound once, with any valid sizes; the grids come from the manifest's grid expressions.
  absl::StatusOr<kpack::BoundLaunch> matmul =
      mm->BindArgs(stream, a, w, c, 1, kDim, kDim, kDim, 1, kDim, 1, kDim, 1);
  absl::StatusOr<kpack::BoundLaunch> add = vadd->BindArgs(stream, u, v, z, kDim);
  if (!matmul.ok()) return matmul.status();
  if (!add.ok()) return add.status();
  kpack::BoundLaunch* step[] = {&*matmul, &*add};  // in launch order
  absl::StatusOr<kpack::StepGraph> graph = kpack::StepGraph::Create(step);
  if (!graph.ok()) return graph.status();
  for (int m : batches) {
    // This step's sizes and pointers, through BoundLaunch::Set as for eager launches.
    if (absl::Status s = matmul->Set(3, m); !s.ok()) return s;  // M
    if (absl::Status s = add->Set(3, m * kDim); !s.ok()) return s;  // n
    // One graph per bucket signature (built when first seen); only changed nodes patched.
    if (absl::Status s = graph->Replay(stream); !s.ok()) return s;
  }
  return absl::OkStatus();
}
