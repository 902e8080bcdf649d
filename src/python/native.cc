// kpack._kpack's launch entry for native callers (native_api.h): the capsule
// `_kpack._native_api()` and the table behind it. kpack.Kernel._native_handle is in
// kernel.cc.

#include "native.h"

#include <algorithm>
#include <cstring>
#include <span>
#include <string>
#include <string_view>

#include "absl/base/optimization.h"
#include "kernel.h"
#include "native_api.h"
#include "runtime_state.h"

namespace nb = nanobind;

namespace kpack::python {
namespace {

const KernelObj& Obj(const void* kernel) { return *static_cast<const KernelObj*>(kernel); }

const char* KernelName(const void* kernel) { return Obj(kernel).plan->name.c_str(); }

size_t NumParams(const void* kernel) { return Obj(kernel).plan->params.size(); }

const char* ParamName(const void* kernel, size_t i) {
  const KernelPlan& p = *Obj(kernel).plan;
  return i < p.params.size() ? p.params[i].name.c_str() : nullptr;
}

const char* ParamType(const void* kernel, size_t i) {
  const KernelPlan& p = *Obj(kernel).plan;
  return i < p.params.size() ? p.params[i].type.c_str() : nullptr;
}

int Failed(const absl::Status& s, char* error, size_t error_size) {
  if (error != nullptr && error_size > 0) {
    const auto m = s.message();  // absl::string_view (not std:: in every abseil build)
    const size_t n = std::min(m.size(), error_size - 1);
    std::memcpy(error, m.data(), n);
    error[n] = '\0';
  }
  return static_cast<int>(s.code());
}

int Launch(const void* kernel, const Arg* args, size_t num_args, const Grid* grid,
           CUstream stream, int device, const ScratchAllocator* scratch, char* error,
           size_t error_size) {
  const KernelObj& k = Obj(kernel);
  const KernelPlan& p = *k.plan;
  if (ABSL_PREDICT_FALSE(num_args != p.params.size())) {
    return Failed(absl::InvalidArgumentError("kernel '" + p.name + "' takes " +
                                             std::to_string(p.params.size()) +
                                             " arguments, got " + std::to_string(num_args)),
                  error, error_size);
  }
  const std::span<const Arg> span(args, num_args);
  const ScratchAllocator allocator = scratch != nullptr ? *scratch : ScratchAllocator{};
  auto attempt = [&] {
    if (absl::Status s = PreloadOnFirstUse(k.rt, device); ABSL_PREDICT_FALSE(!s.ok())) return s;
    return grid != nullptr ? p.kernel.LaunchArgs(*grid, stream, span, allocator)
                           : p.kernel.LaunchArgs(stream, span, allocator);
  };
  absl::Status s = attempt();
  if (ABSL_PREDICT_TRUE(s.ok())) return 0;
  // No context current on this thread (a thread where torch made no CUDA runtime call
  // yet): the device's primary context, as the Python launch makes it current, and again.
  if (s.code() == absl::StatusCode::kFailedPrecondition &&
      k.rt->runtime.CurrentDevice().status().code() == absl::StatusCode::kFailedPrecondition &&
      k.rt->runtime.UseDevice(device).ok()) {
    s = attempt();
    if (s.ok()) return 0;
  }
  return Failed(s, error, error_size);
}

const KpackNativeApi kApi = {
    kKpackNativeApiVersion, sizeof(KpackNativeApi), KernelName, NumParams, ParamName,
    ParamType,              Launch,
};

}  // namespace

void InitNative(nb::module_& m) {
  m.def(
      "_native_api",
      [] {
        PyObject* c = PyCapsule_New(const_cast<KpackNativeApi*>(&kApi), KPACK_NATIVE_API_CAPSULE,
                                    nullptr);
        if (c == nullptr) throw nb::python_error();
        return nb::steal(c);
      },
      "_native_api() -> PyCapsule (src/python/native_api.h): the launch entry for native "
      "code in this process, kpack.torch's C++ ops.");
}

}  // namespace kpack::python
