// libkpack_torch_ops.so: the CUDA implementations of kpack.torch's ops in C++, so that
// torch's dispatcher calls kpack's launch without entering Python (torch's call into a
// Python implementation costs more than into a C++ one: bench/python_launch_bench.py).
//
// Built against the installed torch (src/python/CMakeLists.txt, when torch imports in the
// build's Python) and loaded by kpack.torch with ctypes; it links torch (c10, c10_cuda,
// torch_cpu) but not kpack: it launches through kpack._kpack's native entry
// (native_api.h), i.e. the very kernel object and runtime the Python kpack.Kernel holds.
//
// The C entries (below) register one op's CUDA kernel: a boxed functor holding the
// kernel's parameter plan, made once. Per call it reads the op's arguments off torch's
// stack in schema order (kpack.torch.op_schema: one per call parameter, then `grid`):
//   pointer     a CUDA tensor on the first tensor's device whose dtype the parameter's
//               Triton type takes (kpack/torch.h: PointerTakes); its data_ptr()
//   tensordesc  a CUDA tensor, described whole (TensorDescriptor.from_tensor: its shape and
//               strides, zero padding) for a block of as many dimensions
//   integer     SymInt (concrete in eager), float, bool: their values
//   grid        None (the manifest's grid expressions) or 1 to 3 axes in [0, 2**32)
// makes the first tensor's device current (c10::cuda::CUDAGuard), and launches on torch's
// current stream of that device, with Triton scratch from torch's caching allocator on
// that stream (freed right after the launch, stream-ordered; inside a capture it comes
// from the capture's pool). Errors are c10 errors naming the kernel and the argument:
// TypeError for a wrong dtype, ValueError for a wrong device, rank, grid or a value kpack
// refuses (INVALID_ARGUMENT, OUT_OF_RANGE), RuntimeError otherwise. The call allocates
// nothing of its own (kernels with more than kInlineArgs arguments or kInlineDescs
// descriptors excepted).

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <exception>
#include <limits>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kpack/torch.h"
#include "native_api.h"

#ifndef KPACK_TORCH_VERSION
#error "KPACK_TORCH_VERSION (torch.__version__ of the torch built against) must be defined"
#endif

namespace kpack::torch_ops {
namespace {

enum class Kind : uint8_t { kPointer, kInt, kFloat, kBool, kTensorDesc };

struct Param {
  Kind kind = Kind::kPointer;
  // Pointers and descriptors: the dtype the parameter takes, checked when `check_dtype`
  // (an element type torch has no dtype for is not checked, as kpack's Python launch
  // does not check what DLPack cannot name).
  bool check_dtype = false;
  at::ScalarType dtype = at::ScalarType::Undefined;
  std::string pointer_type;  // "*fp16" (a descriptor's: of its element type)
  int desc_index = -1;       // descriptors: its number among the kernel's
  int desc_rank = 0;         // descriptors: the block's rank
  std::string name;
  std::string type;
};

constexpr size_t kInlineArgs = 40;
constexpr size_t kInlineDescs = 8;

// The dtypes a Triton pointer type may take (kpack/torch.h: TritonElementType's).
constexpr at::ScalarType kDTypes[] = {
    at::kFloat,  at::kHalf,   at::kBFloat16, at::kDouble, at::kChar,         at::kShort,
    at::kInt,    at::kLong,   at::kByte,     at::kUInt16, at::kUInt32,       at::kUInt64,
    at::kBool,   at::kFloat8_e4m3fn, at::kFloat8_e5m2, at::kFloat8_e4m3fnuz,
    at::kFloat8_e5m2fnuz,
};

// The plan of one call parameter of Triton type `type`; throws std::invalid_argument for a
// type no op schema takes.
Param MakeParam(std::string name, std::string type, int* num_descs) {
  Param p;
  p.name = std::move(name);
  p.type = std::move(type);
  const std::string_view t = p.type;
  if (!t.empty() && t[0] == '*') {
    p.kind = Kind::kPointer;
    p.pointer_type = p.type;
  } else if (t.starts_with("tensordesc<")) {
    // tensordesc<fp16[64, 128]>: its tensor is checked like a `*fp16`'s.
    p.kind = Kind::kTensorDesc;
    const size_t open = t.find('[');
    if (open == std::string_view::npos) {
      throw std::invalid_argument("parameter '" + p.name + "' has type " + p.type +
                                  ", which names no block shape");
    }
    p.pointer_type = "*" + std::string(t.substr(11, open - 11));
    p.desc_rank = static_cast<int>(std::count(t.begin(), t.end(), ',')) + 1;
    if (p.desc_rank > TensorDesc::kMaxRank) {
      throw std::invalid_argument("parameter '" + p.name + "' has type " + p.type +
                                  ", of more dimensions than a TMA descriptor has");
    }
    p.desc_index = (*num_descs)++;
  } else if (t == "i1" || t == "u1") {
    p.kind = Kind::kBool;
  } else if (t == "fp16" || t == "bf16" || t == "fp32" || t == "fp64") {
    p.kind = Kind::kFloat;
  } else if (t == "i8" || t == "i16" || t == "i32" || t == "i64" || t == "u8" || t == "u16" ||
             t == "u32" || t == "u64") {
    p.kind = Kind::kInt;
  } else {
    throw std::invalid_argument("parameter '" + p.name + "' has type " + p.type +
                                ", which a torch op schema cannot take");
  }
  if (!p.pointer_type.empty()) {
    for (at::ScalarType d : kDTypes) {
      // `*i1` and `*u1` take the same (bool): the first found is the one.
      if (PointerTakes(p.pointer_type, d)) {
        p.check_dtype = true;
        p.dtype = d;
        break;
      }
    }
  }
  return p;
}

// Triton scratch from torch's CUDA caching allocator, on the launch's stream; the blocks
// go back when this dies, right after the launch: stream-ordered, so only work ordered
// after the launch on that stream reuses them (as kpack.torch.caching_allocator_scratch).
class CachingScratch {
 public:
  CachingScratch() = default;
  CachingScratch(const CachingScratch&) = delete;
  CachingScratch& operator=(const CachingScratch&) = delete;
  ~CachingScratch() {
    for (int i = 0; i < n_; ++i) c10::cuda::CUDACachingAllocator::raw_delete(blocks_[i]);
  }

  ScratchAllocator allocator() { return ScratchAllocator{&Allocate, this}; }
  // Why an allocation failed ("" if none did): the allocator's exception cannot cross
  // kpack's frames, so it is kept and the launch fails.
  const std::string& error() const { return error_; }

 private:
  static CUdeviceptr Allocate(size_t bytes, size_t align, CUstream stream, void* self) {
    auto* s = static_cast<CachingScratch*>(self);
    if (s->n_ == kMaxBlocks) {  // kpack asks once per scratch kind: global and profile
      s->error_ = "more scratch allocations for one launch than kpack makes";
      return 0;
    }
    try {
      // The allocator's blocks are 512-byte aligned; a larger alignment takes slack.
      const size_t slack = align > 512 ? align : 0;
      void* base = c10::cuda::CUDACachingAllocator::raw_alloc_with_stream(
          bytes + slack, reinterpret_cast<cudaStream_t>(stream));
      s->blocks_[s->n_++] = base;
      const uintptr_t a = align == 0 ? 1 : align;
      return static_cast<CUdeviceptr>((reinterpret_cast<uintptr_t>(base) + a - 1) / a * a);
    } catch (const c10::Error& e) {
      s->error_ = e.what_without_backtrace();
      return 0;
    } catch (const std::exception& e) {
      s->error_ = e.what();
      return 0;
    }
  }

  // Two per attempt (a launch retried once, native.cc, asks again).
  static constexpr int kMaxBlocks = 4;
  void* blocks_[kMaxBlocks] = {};
  int n_ = 0;
  std::string error_;
};

// Raw storage for `n` objects of trivially copyable T without a default constructor:
// inline up to kInline, on the heap beyond.
template <typename T, size_t kInline>
class Slots {
 public:
  explicit Slots(size_t n) {
    if (n > kInline) heap_ = std::make_unique<Slot[]>(n);
  }
  T* data() { return reinterpret_cast<T*>(heap_ ? heap_.get() : inline_); }

 private:
  struct alignas(T) Slot {
    unsigned char bytes[sizeof(T)];
  };
  Slot inline_[kInline];
  std::unique_ptr<Slot[]> heap_;
};

class KernelOp final : public c10::OperatorKernel {
 public:
  KernelOp(const KpackNativeApi* api, const void* kernel, std::string name,
           std::vector<Param> params, int num_descs)
      : api_(api),
        kernel_(kernel),
        name_(std::move(name)),
        params_(std::move(params)),
        num_descs_(num_descs) {}

  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet keys,
                  torch::jit::Stack* stack) {
    const size_t n = params_.size();
    const c10::ArrayRef<c10::IValue> in = torch::jit::last(*stack, n + 1);

    const at::Tensor* first = nullptr;
    size_t first_index = 0;
    for (size_t i = 0; i < n && first == nullptr; ++i) {
      if (params_[i].kind == Kind::kPointer || params_[i].kind == Kind::kTensorDesc) {
        first = &in[i].toTensor();
        first_index = i;
      }
    }
    int device;
    if (first != nullptr) {
      if (!first->is_cuda()) TensorError(first_index, *first, -1);
      device = first->device().index();
    } else {
      device = c10::cuda::current_device();
    }
    const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));

    Slots<Arg, kInlineArgs> arg_slots(n);
    Slots<TensorDesc, kInlineDescs> desc_slots(static_cast<size_t>(num_descs_));
    Arg* args = arg_slots.data();
    for (size_t i = 0; i < n; ++i) {
      const Param& p = params_[i];
      const c10::IValue& v = in[i];
      switch (p.kind) {
        case Kind::kPointer: {
          args[i] = Arg(TensorPointer(i, v.toTensor(), device));
          break;
        }
        case Kind::kTensorDesc: {
          const at::Tensor& t = v.toTensor();
          const CUdeviceptr base = TensorPointer(i, t, device);
          if (t.dim() != p.desc_rank) {
            TORCH_CHECK_VALUE(false, Label(i), ": the tensor has ", t.dim(),
                              " dimensions but the descriptor's block has ", p.desc_rank);
          }
          TensorDesc* d = new (desc_slots.data() + p.desc_index) TensorDesc();
          d->base = base;
          d->rank = p.desc_rank;
          for (int k = 0; k < p.desc_rank; ++k) {
            d->shape[k] = t.size(k);
            d->strides[k] = t.stride(k);
          }
          d->padding = TensorDescPadding::kZero;
          args[i] = Arg(*d);
          break;
        }
        case Kind::kInt:
          args[i] = Arg(v.isInt() ? v.toInt() : v.toSymInt().guard_int(__FILE__, __LINE__));
          break;
        case Kind::kFloat:
          args[i] = Arg(v.isDouble() ? v.toDouble() : v.toScalar().toDouble());
          break;
        case Kind::kBool:
          args[i] = Arg(v.toBool());
          break;
      }
    }

    Grid grid;
    const Grid* grid_ptr = nullptr;
    if (const c10::IValue& g = in[n]; !g.isNone()) {
      const c10::ArrayRef<c10::IValue> axes = g.toListRef();
      TORCH_CHECK_VALUE(!axes.empty() && axes.size() <= 3, "kernel '", name_,
                        "': grid must have 1 to 3 axes, got ", axes.size());
      uint32_t dims[3] = {1, 1, 1};
      for (size_t a = 0; a < axes.size(); ++a) {
        const int64_t x = axes[a].isInt() ? axes[a].toInt()
                                          : axes[a].toSymInt().guard_int(__FILE__, __LINE__);
        TORCH_CHECK_VALUE(x >= 0 && x <= std::numeric_limits<uint32_t>::max(), "kernel '",
                          name_, "': grid: axis ", a, " is ", x, ", outside [0, 2**32)");
        dims[a] = static_cast<uint32_t>(x);
      }
      grid = Grid{dims[0], dims[1], dims[2]};
      grid_ptr = &grid;
    }

    const CUstream stream = reinterpret_cast<CUstream>(
        c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device)).stream());
    CachingScratch scratch;
    const ScratchAllocator allocator = scratch.allocator();
    char error[1024];
    const int code = api_->launch(kernel_, args, n, grid_ptr, stream, device, &allocator, error,
                                  sizeof(error));
    if (code != 0) {
      TORCH_CHECK(scratch.error().empty(), "kernel '", name_,
                  "': scratch memory from torch's caching allocator: ", scratch.error());
      if (code == static_cast<int>(absl::StatusCode::kInvalidArgument) ||
          code == static_cast<int>(absl::StatusCode::kOutOfRange)) {
        TORCH_CHECK_VALUE(false, error);
      }
      TORCH_CHECK(false, error);
    }
    torch::jit::drop(*stack, n + 1);
  }

 private:
  // "kernel 'k': argument 2 ('out', *fp32)", as kpack's Python launch labels an argument.
  std::string Label(size_t i) const {
    return "kernel '" + name_ + "': argument " + std::to_string(i) + " ('" + params_[i].name +
           "', " + params_[i].type + ")";
  }

  CUdeviceptr TensorPointer(size_t i, const at::Tensor& t, int device) const {
    const Param& p = params_[i];
    if (C10_UNLIKELY(!t.is_cuda() || t.device().index() != device ||
                     (p.check_dtype && t.scalar_type() != p.dtype))) {
      TensorError(i, t, device);
    }
    return static_cast<CUdeviceptr>(reinterpret_cast<uintptr_t>(t.data_ptr()));
  }

  [[noreturn]] void TensorError(size_t i, const at::Tensor& t, int device) const {
    bool wrong_dtype = false;
    const std::string problem = TensorMismatch(params_[i].pointer_type, t, device, &wrong_dtype);
    TORCH_CHECK_TYPE(!wrong_dtype, Label(i), ": ", problem);
    TORCH_CHECK_VALUE(false, Label(i), ": ", problem);
  }

  const KpackNativeApi* api_;
  const void* kernel_;  // kept alive by kpack.torch (the kernel object it registered)
  std::string name_;
  std::vector<Param> params_;
  int num_descs_;
};

// An op implementation that only drops its `n` arguments: torch's own cost of calling a
// C++ op from Python, for bench/python_launch_bench.py to set kpack's ops against.
class NoOp final : public c10::OperatorKernel {
 public:
  explicit NoOp(size_t n) : n_(n) {}
  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet keys,
                  torch::jit::Stack* stack) {
    torch::jit::drop(*stack, n_);
  }

 private:
  size_t n_;
};

void CopyError(std::string_view message, char* error, size_t error_size) {
  if (error == nullptr || error_size == 0) return;
  const size_t n = std::min(message.size(), error_size - 1);
  std::memcpy(error, message.data(), n);
  error[n] = '\0';
}

}  // namespace
}  // namespace kpack::torch_ops

// ---------------------------------------------------------------- the C entries (ctypes)

extern "C" {

// The torch.__version__ this library was built against: kpack.torch loads it only under
// the same torch (its C++ ABI is not stable across versions).
__attribute__((visibility("default"))) const char* kpack_torch_ops_torch_version() {
  return KPACK_TORCH_VERSION;
}

// Registers kernel `kernel` (a kpack.Kernel's _native_handle(), launched through `api`,
// the pointer of _kpack._native_api()'s capsule) as the `dispatch_key` ("CUDA")
// implementation of op `ns`::`op_name`, whose schema kpack.torch defined. Returns the
// registration (kpack_torch_ops_release undoes it), or null with the reason in `error`.
// The caller keeps the kernel object alive while the registration lives.
__attribute__((visibility("default"))) void* kpack_torch_ops_register(
    const char* ns, const char* op_name, const char* dispatch_key, const void* api_ptr,
    const void* kernel, char* error, size_t error_size) {
  using kpack::torch_ops::CopyError;
  const auto* api = static_cast<const KpackNativeApi*>(api_ptr);
  if (api == nullptr || api->version != kKpackNativeApiVersion ||
      api->size != sizeof(KpackNativeApi)) {
    CopyError("kpack._kpack's native launch entry is of another build than "
              "libkpack_torch_ops.so (reinstall kpack)",
              error, error_size);
    return nullptr;
  }
  const std::string name = api->kernel_name(kernel);
  try {
    std::vector<kpack::torch_ops::Param> params;
    int num_descs = 0;
    for (size_t i = 0; i < api->num_params(kernel); ++i) {
      params.push_back(kpack::torch_ops::MakeParam(api->param_name(kernel, i),
                                                   api->param_type(kernel, i), &num_descs));
    }
    auto library = std::make_unique<torch::Library>(
        torch::Library::IMPL, ns, c10::parseDispatchKey(dispatch_key), __FILE__, __LINE__);
    library->impl(op_name, torch::CppFunction::makeFromBoxedFunctor(
                               std::make_unique<kpack::torch_ops::KernelOp>(
                                   api, kernel, name, std::move(params), num_descs)));
    return library.release();
  } catch (const c10::Error& e) {
    CopyError("kernel '" + name + "': " + e.what_without_backtrace(), error, error_size);
    return nullptr;
  } catch (const std::exception& e) {
    CopyError("kernel '" + name + "': " + e.what(), error, error_size);
    return nullptr;
  }
}

// Registers an implementation doing nothing (NoOp) for op `ns`::`op_name` of `num_args`
// arguments (the benchmark's floor). Returns the registration, or null with the reason.
__attribute__((visibility("default"))) void* kpack_torch_ops_register_noop(
    const char* ns, const char* op_name, const char* dispatch_key, size_t num_args,
    char* error, size_t error_size) {
  try {
    auto library = std::make_unique<torch::Library>(
        torch::Library::IMPL, ns, c10::parseDispatchKey(dispatch_key), __FILE__, __LINE__);
    library->impl(op_name, torch::CppFunction::makeFromBoxedFunctor(
                               std::make_unique<kpack::torch_ops::NoOp>(num_args)));
    return library.release();
  } catch (const c10::Error& e) {
    kpack::torch_ops::CopyError(e.what_without_backtrace(), error, error_size);
    return nullptr;
  }
}

__attribute__((visibility("default"))) void kpack_torch_ops_release(void* registration) {
  delete static_cast<torch::Library*>(registration);
}

}  // extern "C"
