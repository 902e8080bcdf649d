#include "bench_setup.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace kpack::bench {
namespace {

using json = nlohmann::json;

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  return std::string(std::istreambuf_iterator<char>(in), {});
}

absl::Status DriverError(const char* what, CUresult r) {
  return absl::InternalError(absl::StrCat(what, " failed: CUresult ", static_cast<int>(r)));
}

}  // namespace

absl::StatusOr<std::unique_ptr<BenchSetup>> BenchSetup::Create(int streams) {
  std::unique_ptr<BenchSetup> setup(new BenchSetup());
  if (absl::Status s = setup->Init(streams); !s.ok()) return s;
  return setup;
}

BenchSetup::~BenchSetup() {
  if (driver_ == nullptr) return;
  for (CUstream s : streams_) driver_->StreamDestroy(s);
}

const ArgsKernel& BenchSetup::args_kernel(int arity) const {
  for (const ArgsKernel& k : kernels_) {
    if (k.arity == arity) return k;
  }
  std::fprintf(stderr, "kpack bench: the bench pack has no %d-argument kernel\n", arity);
  std::abort();
}

absl::Status BenchSetup::Init(int streams) {
  auto d = internal::Driver::Load("");
  if (!d.ok()) return d.status();
  driver_ = *d;
  CUdevice dev;
  if (CUresult r = driver_->DeviceGet(&dev, 0); r != CUDA_SUCCESS) {
    return DriverError("cuDeviceGet", r);
  }
  if (CUresult r = driver_->DevicePrimaryCtxRetain(&ctx_, dev); r != CUDA_SUCCESS) {
    return DriverError("cuDevicePrimaryCtxRetain", r);
  }
  if (CUresult r = driver_->CtxSetCurrent(ctx_); r != CUDA_SUCCESS) {
    return DriverError("cuCtxSetCurrent", r);
  }
  for (int i = 0; i < streams; ++i) {
    CUstream s;
    if (CUresult r = driver_->StreamCreate(&s, CU_STREAM_NON_BLOCKING); r != CUDA_SUCCESS) {
      return DriverError("cuStreamCreate", r);
    }
    streams_.push_back(s);
  }
  // Big enough for the largest dynamic shape (n = 300000 floats).
  for (CUdeviceptr* p : {&inputs_[0], &inputs_[1], &out_}) {
    if (CUresult r = driver_->MemAlloc(p, 4 << 20); r != CUDA_SUCCESS) {
      return DriverError("cuMemAlloc", r);
    }
  }
  for (int i = 2; i < kMaxInputs; ++i) {
    if (CUresult r = driver_->MemAlloc(&inputs_[i], 4 * n_); r != CUDA_SUCCESS) {
      return DriverError("cuMemAlloc", r);
    }
  }
  for (int i = 0; i < kMaxInputs; ++i) scalars_[i] = i + 1;

  auto rt = Runtime::Open(KPACK_BENCH_PACK_DIR, {.preload = true});
  if (!rt.ok()) return rt.status();
  runtime_ = std::make_unique<Runtime>(std::move(*rt));
  auto quiet = Runtime::Open(KPACK_BENCH_PACK_DIR, {.preload = true, .nvtx = false});
  if (!quiet.ok()) return quiet.status();
  runtime_no_nvtx_ = std::make_unique<Runtime>(std::move(*quiet));
  auto manifest = ReadFile(std::string(KPACK_BENCH_PACK_DIR) + "/manifest.json");
  if (!manifest.ok()) return manifest.status();
  // Each kernel's `extra` array points into its own element: no reallocation after this.
  kernels_.reserve(kArgsKernels.size());
  for (const auto& [name, inputs] : kArgsKernels) {
    if (absl::Status s = InitArgsKernel(name, inputs, *manifest); !s.ok()) return s;
  }
  return InitShapes();
}

absl::Status BenchSetup::InitArgsKernel(const char* name, int inputs,
                                        const std::string& manifest_text) {
  ArgsKernel k;
  k.name = name;
  k.inputs = inputs;
  k.arity = 2 * inputs + 2;
  auto kernel = runtime_->Find(name);
  if (!kernel.ok()) return kernel.status();
  k.kernel = *kernel;
  k.kernel_no_nvtx = *runtime_no_nvtx_->Find(name);

  const json manifest = json::parse(manifest_text);
  const json* variant = nullptr;
  for (const json& kj : manifest["kernels"]) {
    if (kj["name"] == name) variant = &kj["variants"][0];
  }
  if (variant == nullptr) return absl::NotFoundError(absl::StrCat("no kernel ", name));
  k.block = 32 * (*variant)["num_warps"].get<unsigned>();
  k.shared = (*variant)["shared"].get<unsigned>();
  auto cubin =
      ReadFile(std::string(KPACK_BENCH_PACK_DIR) + "/" + (*variant)["cubin"].get<std::string>());
  if (!cubin.ok()) return cubin.status();
  const std::string entry = (*variant)["entry"].get<std::string>();
  CUmodule module;
  CUlibrary library;
  CUkernel raw_kernel;
  if (CUresult r = driver_->ModuleLoadData(&module, cubin->data()); r != CUDA_SUCCESS) {
    return DriverError("cuModuleLoadData", r);
  }
  if (CUresult r = driver_->ModuleGetFunction(&k.raw_function, module, entry.c_str());
      r != CUDA_SUCCESS) {
    return DriverError("cuModuleGetFunction", r);
  }
  if (CUresult r = driver_->LibraryLoadData(&library, cubin->data(), nullptr, nullptr, 0, nullptr,
                                            nullptr, 0);
      r != CUDA_SUCCESS) {
    return DriverError("cuLibraryLoadData", r);
  }
  if (CUresult r = driver_->LibraryGetKernel(&raw_kernel, library, entry.c_str());
      r != CUDA_SUCCESS) {
    return DriverError("cuLibraryGetKernel", r);
  }
  k.raw_kernel = reinterpret_cast<CUfunction>(raw_kernel);

  // Call arguments in order: inputs, out, n, scalars; then the hidden scratch pointers.
  std::vector<const void*> values;
  for (int i = 0; i < inputs; ++i) values.push_back(&inputs_[i]);
  values.push_back(&out_);
  values.push_back(&n_);
  for (int i = 0; i < inputs; ++i) values.push_back(&scalars_[i]);
  values.push_back(&null_scratch_);
  values.push_back(&null_scratch_);
  const json& layout = (*variant)["layout"];
  if (layout.size() != values.size()) {
    return absl::FailedPreconditionError(
        absl::StrCat(name, ": layout has ", layout.size(), " slots, expected ", values.size()));
  }
  for (const void* v : values) k.params.push_back(const_cast<void*>(v));
  const json& last = layout.back();
  k.extra_size = last["offset"].get<size_t>() + last["size"].get<size_t>();
  k.extra_buffer.assign(k.extra_size, 0);
  for (size_t i = 0; i < layout.size(); ++i) {
    std::memcpy(k.extra_buffer.data() + layout[i]["offset"].get<size_t>(), values[i],
                layout[i]["size"].get<size_t>());
  }
  kernels_.push_back(std::move(k));
  // The extra array points into the element now owned by kernels_.
  ArgsKernel& owned = kernels_.back();
  owned.extra = {CU_LAUNCH_PARAM_BUFFER_POINTER, owned.extra_buffer.data(),
                 CU_LAUNCH_PARAM_BUFFER_SIZE, &owned.extra_size, CU_LAUNCH_PARAM_END};
  return absl::OkStatus();
}

absl::Status BenchSetup::InitShapes() {
  auto drt = Runtime::Open(KPACK_DISPATCH_PACK_DIR, {.preload = true});
  if (!drt.ok()) return drt.status();
  dispatch_runtime_ = std::make_unique<Runtime>(std::move(*drt));
  axpy_ = *dispatch_runtime_->Find("axpy");
  // One shape per bucket and one more: {n, variant kpack picks, BLOCK, num_warps}.
  struct {
    int32_t n;
    const char* variant;
    unsigned block_size, warps;
  } shapes[] = {{1024, "b0_div16_unit", 256, 2},
                {65536, "b1_div16_unit", 1024, 4},
                {300000, "b2_div16_unit", 4096, 8},
                {2048, "b0_div16_unit", 256, 2}};
  for (const auto& s : shapes) {
    const Arg args[] = {inputs_[0], inputs_[1], out_, s.n, 1, 2.0f};
    auto chosen = axpy_.SelectVariant(args);
    if (!chosen.ok()) return chosen.status();
    if (*chosen != s.variant) {
      return absl::InternalError(absl::StrCat("dispatch pack selects ", std::string(*chosen),
                                              " for n=", s.n, ", expected ", s.variant));
    }
    auto bin =
        ReadFile(std::string(KPACK_DISPATCH_PACK_DIR) + "/cubins/axpy/" + s.variant + ".cubin");
    if (!bin.ok()) return bin.status();
    CUmodule m;
    CUfunction f;
    if (CUresult r = driver_->ModuleLoadData(&m, bin->data()); r != CUDA_SUCCESS) {
      return DriverError("cuModuleLoadData", r);
    }
    if (CUresult r = driver_->ModuleGetFunction(&f, m, "axpy_kernel"); r != CUDA_SUCCESS) {
      return DriverError("cuModuleGetFunction", r);
    }
    shapes_.push_back({s.n, f, (s.n + s.block_size - 1) / s.block_size, 32 * s.warps});
  }
  return absl::OkStatus();
}

}  // namespace kpack::bench
