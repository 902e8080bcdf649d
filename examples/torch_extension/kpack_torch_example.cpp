// A torch C++ extension launching kpack pack kernels (kernels/examplepack) on torch
// tensors through kpack/torch.h. Built by setup.py with torch.utils.cpp_extension against
// the installed kpack Python package (kpack.build_flags()).
//
//   import torch, kpack_torch_example as ext
//   ext.open("kernels/examplepack")
//   out = ext.vector_add(x, y)            # x, y: CUDA float32 tensors of one shape

#include <torch/extension.h>

#include <kpack/torch.h>

#include <optional>
#include <string>

namespace {

struct Kernels {
  kpack::Runtime runtime;
  kpack::Kernel vector_add, softmax, layer_norm;
};
std::optional<Kernels> g_pack;

kpack::Kernel Find(const kpack::Runtime& rt, const char* name) {
  absl::StatusOr<kpack::Kernel> k = rt.Find(name);
  kpack::TorchCheck(k.status());
  return *k;
}

const Kernels& Pack() {
  TORCH_CHECK(g_pack.has_value(), "call open(pack_dir) first");
  return *g_pack;
}

void Open(const std::string& dir) {
  absl::StatusOr<kpack::Runtime> rt = kpack::Runtime::Open(dir);
  kpack::TorchCheck(rt.status());
  kpack::Kernel add = Find(*rt, "vector_add"), softmax = Find(*rt, "softmax"),
                norm = Find(*rt, "layer_norm");
  g_pack.emplace(Kernels{std::move(*rt), add, softmax, norm});
}

// out = x + y, with the grid from the manifest (cdiv(n, BLOCK)).
at::Tensor VectorAdd(const at::Tensor& x, const at::Tensor& y) {
  TORCH_CHECK(x.sizes() == y.sizes(), "vector_add: shapes differ");
  at::Tensor out = at::empty_like(x);
  kpack::TorchCheck(kpack::TorchLaunch(Pack().vector_add, x, y, out,
                                       static_cast<int32_t>(x.numel())));
  return out;
}

// The same with an explicit grid of `programs` programs (each covers BLOCK elements).
at::Tensor VectorAddGrid(const at::Tensor& x, const at::Tensor& y, int64_t programs) {
  at::Tensor out = at::empty_like(x);
  kpack::TorchCheck(kpack::TorchLaunch(Pack().vector_add,
                                       kpack::Grid{static_cast<uint32_t>(programs)}, x, y, out,
                                       static_cast<int32_t>(x.numel())));
  return out;
}

// Row softmax of a 2-D float32 tensor (one program per row).
at::Tensor Softmax(const at::Tensor& x) {
  TORCH_CHECK(x.dim() == 2 && x.stride(1) == 1, "softmax: a 2-D tensor with unit column stride");
  at::Tensor out = at::empty_like(x);
  kpack::TorchCheck(kpack::TorchLaunch(
      Pack().softmax, out, x, static_cast<int32_t>(x.stride(0)),
      static_cast<int32_t>(out.stride(0)), static_cast<int32_t>(x.size(0)),
      static_cast<int32_t>(x.size(1))));
  return out;
}

// Layer norm over the last dim of a 2-D float16 tensor with float16 weight and bias.
at::Tensor LayerNorm(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, double eps) {
  TORCH_CHECK(x.dim() == 2 && x.stride(1) == 1, "layer_norm: a 2-D tensor with unit column stride");
  at::Tensor y = at::empty_like(x);
  kpack::TorchCheck(kpack::TorchLaunch(Pack().layer_norm, x, y, w, b,
                                       static_cast<int32_t>(x.stride(0)),
                                       static_cast<int32_t>(x.size(0)),
                                       static_cast<int32_t>(x.size(1)), static_cast<float>(eps)));
  return y;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("open", &Open, "open(pack_dir): open the example pack");
  m.def("vector_add", &VectorAdd, "x + y (grid from the manifest)");
  m.def("vector_add_grid", &VectorAddGrid, "x + y with an explicit grid");
  m.def("softmax", &Softmax, "row softmax");
  m.def("layer_norm", &LayerNorm, "layer norm (fp16)");
}
