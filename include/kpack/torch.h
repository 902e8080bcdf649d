// kpack/torch.h: launch pack kernels on torch tensors from a libtorch C++ extension.
//
// Header-only and optional: include it only in code built against libtorch with its CUDA
// headers (a torch.utils.cpp_extension extension linking c10_cuda); the kpack library does
// not depend on torch. Needs C++20, like kpack.
//
//   #include <kpack/torch.h>
//
//   // out = x + y, with the grid from the manifest (cdiv(n, BLOCK)).
//   at::Tensor VectorAdd(const at::Tensor& x, const at::Tensor& y) {
//     TORCH_CHECK(x.sizes() == y.sizes(), "vector_add: shapes differ");
//     at::Tensor out = at::empty_like(x);
//     kpack::TorchCheck(kpack::TorchLaunch(Pack().vector_add, x, y, out,
//                                          static_cast<int32_t>(x.numel())));
//     return out;
//   }
//
// (examples/torch_extension/kpack_torch_example.cpp, where Pack() holds the opened
// Runtime's kernels; built and run on a GPU machine by ctest kpack_torch_extension_gpu.)
// The launch goes on torch's current stream of x's device; every tensor is checked
// against its parameter's Triton type.
//
// TorchLaunch(kernel, [grid,] args...) takes the kernel's call arguments in order:
// at::Tensor arguments go through TensorArg (below), everything else is a kpack::Arg
// (kpack/arg.h: integers, float/double, bool, raw pointers). It makes the first tensor's
// device current for the launch (a c10::cuda::CUDAGuard, as torch's own CUDA ops do) and
// launches on torch's current CUDA stream of that device, so the kernel is ordered with
// the torch work around it and is captured by torch.cuda.graph like any torch op.
// Errors are absl::Status values (INVALID_ARGUMENT naming the kernel and the parameter
// for a wrong tensor); TorchCheck turns one into a c10::Error (a RuntimeError in Python).

#ifndef KPACK_TORCH_H_
#define KPACK_TORCH_H_

#include <ATen/ATen.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>
#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kpack/kpack.h"

namespace kpack {

// Triton's name for the element type of a tensor of `type` (the `fp32` of `*fp32`), or
// null for a dtype Triton has no pointer type for. Bool tensors are Triton's `u1`.
inline const char* TritonElementType(at::ScalarType type) {
  switch (type) {
    case at::kFloat:
      return "fp32";
    case at::kHalf:
      return "fp16";
    case at::kBFloat16:
      return "bf16";
    case at::kDouble:
      return "fp64";
    case at::kChar:
      return "i8";
    case at::kShort:
      return "i16";
    case at::kInt:
      return "i32";
    case at::kLong:
      return "i64";
    case at::kByte:
      return "u8";
    case at::kUInt16:
      return "u16";
    case at::kUInt32:
      return "u32";
    case at::kUInt64:
      return "u64";
    case at::kBool:
      return "u1";
    case at::kFloat8_e4m3fn:
      return "fp8e4nv";
    case at::kFloat8_e5m2:
      return "fp8e5";
    case at::kFloat8_e4m3fnuz:
      return "fp8e4b8";
    case at::kFloat8_e5m2fnuz:
      return "fp8e5b16";
    default:
      return nullptr;
  }
}

// Whether a pointer parameter of Triton type `type` (`*fp32`, `*k fp16`...) takes tensors
// of dtype `dtype`: its element type is the dtype's (TritonElementType; `*i1` and `*u1`
// both take bool tensors). A pointer to a type Triton has but torch lacks takes none.
inline bool PointerTakes(std::string_view type, at::ScalarType dtype) {
  std::string_view element = type.substr(type.empty() ? 0 : 1);
  if (element.size() > 1 && element[0] == 'k') element.remove_prefix(1);  // `*k`: const
  const char* expected = TritonElementType(dtype);
  return expected != nullptr &&
         (element == expected || (dtype == at::kBool && element == "i1"));
}

// What is wrong with tensor `t` as the argument of a pointer parameter of Triton type
// `type` for a launch on CUDA device `device` (current for the launch), or "" if nothing:
// not a CUDA tensor, on another device, or of a dtype the parameter does not take. `wrong_dtype` (optional) is
// set when the dtype is the problem. The text follows "kernel 'k': argument 2 ('out',
// *fp32): ". Shared by TensorArg and kpack.torch's C++ ops (src/python/torch_ops.cc).
inline std::string TensorMismatch(std::string_view type, const at::Tensor& t, int device,
                                  bool* wrong_dtype = nullptr) {
  if (wrong_dtype != nullptr) *wrong_dtype = false;
  if (!t.is_cuda()) {
    return "the tensor is on " + t.device().str() + "; kpack launches on CUDA devices";
  }
  if (t.device().index() != device) {
    return "the tensor is on " + t.device().str() + " but the current device is cuda:" +
           std::to_string(device);
  }
  if (!PointerTakes(type, t.scalar_type())) {
    if (wrong_dtype != nullptr) *wrong_dtype = true;
    return "the tensor's dtype is " + std::string(c10::toString(t.scalar_type())) +
           " but the kernel was compiled for " + std::string(type);
  }
  return "";
}

// The Arg for call parameter `index` of `kernel` from tensor `t`: the parameter must be a
// pointer whose element type is t's dtype (PointerTakes), and t must be a CUDA tensor on
// the current CUDA device. INVALID_ARGUMENT naming the kernel, the parameter and what is
// wrong otherwise. The pointer is t.data_ptr() (storage offset included); t must outlive
// the launch's use of it.
inline absl::StatusOr<Arg> TensorArg(const Kernel& kernel, size_t index, const at::Tensor& t) {
  // Built only for a message: the success path formats nothing.
  auto label = [&] {
    return "kernel '" + std::string(kernel.name()) + "': argument " + std::to_string(index) +
           " ('" + std::string(kernel.arg_name(index)) + "', " +
           std::string(kernel.arg_type(index)) + ")";
  };
  if (index >= kernel.num_args()) {
    return absl::InvalidArgumentError("kernel '" + std::string(kernel.name()) + "' takes " +
                                      std::to_string(kernel.num_args()) +
                                      " arguments; a tensor was given as argument " +
                                      std::to_string(index));
  }
  std::string_view type = kernel.arg_type(index);
  if (type.empty() || type[0] != '*') {
    return absl::InvalidArgumentError(label() + ": got a tensor for a scalar parameter");
  }
  if (std::string problem = TensorMismatch(type, t, c10::cuda::current_device());
      !problem.empty()) {
    return absl::InvalidArgumentError(label() + ": " + problem);
  }
  return Arg(static_cast<CUdeviceptr>(reinterpret_cast<uintptr_t>(t.data_ptr())));
}

// torch's current CUDA stream of `t`'s device, as a driver stream handle.
inline CUstream TorchStream(const at::Tensor& t) {
  return c10::cuda::getCurrentCUDAStream(t.device().index()).stream();
}

// Throws c10::Error (RuntimeError in Python) carrying the status message unless it is OK.
inline void TorchCheck(const absl::Status& status) {
  TORCH_CHECK(status.ok(), std::string(status.message()));
}

namespace torch_detail {

template <typename T>
inline constexpr bool kIsTensor = std::is_base_of_v<at::TensorBase, std::remove_cvref_t<T>>;

template <typename... A>
const at::Tensor* FirstTensor(const A&... args) {
  const at::Tensor* first = nullptr;
  auto visit = [&first](const auto& a) {
    if constexpr (kIsTensor<decltype(a)>) {
      if (first == nullptr) first = &a;
    }
  };
  (visit(args), ...);
  return first;
}

template <typename... A>
absl::Status Launch(const Kernel& kernel, const Grid* grid, const A&... args) {
  const at::Tensor* first = FirstTensor(args...);
  std::optional<c10::cuda::CUDAGuard> guard;
  if (first != nullptr && first->is_cuda()) guard.emplace(first->device().index());
  Arg packed[sizeof...(A) + 1] = {(static_cast<void>(args), Arg(0))..., Arg(0)};
  absl::Status status;
  size_t index = 0;
  auto convert = [&](const auto& a) {
    if (status.ok()) {
      if constexpr (kIsTensor<decltype(a)>) {
        absl::StatusOr<Arg> arg = TensorArg(kernel, index, a);
        if (arg.ok()) {
          packed[index] = *arg;
        } else {
          status = arg.status();
        }
      } else {
        packed[index] = Arg(a);
      }
    }
    ++index;
  };
  (convert(args), ...);
  if (!status.ok()) return status;
  const CUstream stream = first != nullptr && first->is_cuda()
                              ? TorchStream(*first)
                              : c10::cuda::getCurrentCUDAStream().stream();
  const std::span<const Arg> span(packed, sizeof...(A));
  return grid != nullptr ? kernel.LaunchArgs(*grid, stream, span)
                         : kernel.LaunchArgs(stream, span);
}

}  // namespace torch_detail

// Launches with the grid from the manifest's grid expressions (see the top of the file).
template <typename... A>
absl::Status TorchLaunch(const Kernel& kernel, const A&... args) {
  return torch_detail::Launch(kernel, nullptr, args...);
}

// Launches with an explicit grid (in programs, like Triton's grid).
template <typename... A>
absl::Status TorchLaunch(const Kernel& kernel, const Grid& grid, const A&... args) {
  return torch_detail::Launch(kernel, &grid, args...);
}

}  // namespace kpack

#endif  // KPACK_TORCH_H_
