// What kpack's benchmarks launch, set up once: the bench pack's args4/args14/args32
// kernels (kernels/benchpack: the same tiny kernel with 4, 14 and 32 call arguments)
// through kpack and, on the same cubins, through the raw driver; and the dispatch pack's
// axpy with its shape changing every call. Every launch path is an inline function here,
// so the Google Benchmark suite (launch_bench.cc) and the CPU overhead benchmark
// (overhead_bench.cc) time exactly the same calls.
//
// All launches use one block of 128 threads on n = 128 elements: host cost, not GPU
// work, is what is measured.

#ifndef KPACK_BENCH_BENCH_SETUP_H_
#define KPACK_BENCH_BENCH_SETUP_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "driver/driver.h"
#include "kpack/kpack.h"

namespace kpack::bench {

// The bench pack's kernels: {name, input pointers}; 2 * inputs + 2 call arguments.
inline constexpr int kMaxInputs = 15;
inline constexpr std::array<std::pair<const char*, int>, 3> kArgsKernels = {
    {{"args4", 1}, {"args14", 6}, {"args32", 15}}};

// One bench-pack kernel, ready to launch every way.
struct ArgsKernel {
  std::string name;  // "args4", "args14", "args32"
  int inputs = 0;
  int arity = 0;  // call arguments
  Kernel kernel;
  Kernel kernel_no_nvtx;              // the same kernel from a Runtime opened with nvtx off
  CUfunction raw_function = nullptr;  // cuModuleGetFunction on the same cubin
  CUfunction raw_kernel = nullptr;    // cuLibraryGetKernel on it, as kpack uses
  unsigned block = 0;                 // 32 * num_warps from the manifest
  unsigned shared = 0;
  // Raw launch arguments: a params array (call arguments, then the two hidden scratch
  // pointers) and the same bytes as a packed `extra` buffer at the cubin's offsets.
  std::vector<void*> params;
  std::vector<unsigned char> extra_buffer;
  size_t extra_size = 0;
  std::array<void*, 5> extra = {};
};

class BenchSetup {
 public:
  // Loads the driver (KPACK_CUDA_DRIVER may name the tests' fake), makes device 0's
  // primary context current, creates `streams` non-blocking streams and opens the packs
  // with everything preloaded.
  static absl::StatusOr<std::unique_ptr<BenchSetup>> Create(int streams);
  ~BenchSetup();

  const internal::Driver& driver() const { return *driver_; }
  CUcontext context() const { return ctx_; }
  CUstream stream(int i) const { return streams_[i]; }
  const Runtime& runtime() const { return *runtime_; }
  const std::vector<ArgsKernel>& kernels() const { return kernels_; }
  const ArgsKernel& args_kernel(int arity) const;

  // ---- launch paths: each returns true when the launch was accepted.
  bool RawParams(const ArgsKernel& k, CUfunction f, CUstream stream) {
    CUlaunchConfig c = Config(k, stream);
    return driver_->LaunchKernelEx(&c, f, const_cast<void**>(k.params.data()), nullptr) ==
           CUDA_SUCCESS;
  }
  // Raw params as a caller with per-call arguments passes them: the pointer array built
  // at each call, pointing at the same argument values kpack's paths read (WithArgs),
  // plus the two hidden scratch pointers (null). RawParams' array is built once.
  bool RawParamsFresh(const ArgsKernel& k, CUstream stream) {
    CUlaunchConfig c = Config(k, stream);
    CUdeviceptr scratch = 0;
    return WithArgs<bool>(k.inputs, [&](const auto&... a) {
      void* params[] = {const_cast<void*>(static_cast<const void*>(&a))..., &scratch, &scratch};
      return driver_->LaunchKernelEx(&c, k.raw_function, params, nullptr) == CUDA_SUCCESS;
    });
  }
  bool RawExtra(const ArgsKernel& k, CUstream stream) {
    CUlaunchConfig c = Config(k, stream);
    return driver_->LaunchKernelEx(&c, k.raw_function, nullptr,
                                   const_cast<void**>(k.extra.data())) == CUDA_SUCCESS;
  }
  // Raw launch plus the cuCtxGetCurrent that kpack makes per launch.
  bool RawParamsWithCtxQuery(const ArgsKernel& k, CUstream stream) {
    CUcontext ctx;
    driver_->CtxGetCurrent(&ctx);
    return RawParams(k, k.raw_function, stream);
  }
  bool KpackByKernel(const Kernel& kernel, int inputs, CUstream stream) {
    return WithArgs<bool>(
        inputs, [&](const auto&... a) { return kernel.Launch(Grid{1}, stream, a...).ok(); });
  }
  bool KpackByName(const ArgsKernel& k, CUstream stream) {
    return WithArgs<bool>(k.inputs, [&](const auto&... a) {
      return runtime_->Launch(k.name, Grid{1}, stream, a...).ok();
    });
  }
  absl::StatusOr<BoundLaunch> Bind(const ArgsKernel& k, CUstream stream) {
    return WithArgs<absl::StatusOr<BoundLaunch>>(
        k.inputs, [&](const auto&... a) { return k.kernel.BindArgs(Grid{1}, stream, a...); });
  }

  // ---- dynamic shapes: the dispatch pack's axpy, n cycling through its three buckets.
  struct Shape {
    int32_t n;
    CUfunction raw;  // the variant kpack picks for n, loaded by hand for the raw path
    unsigned grid;
    unsigned block;
  };
  const std::vector<Shape>& shapes() const { return shapes_; }
  const Kernel& axpy() const { return axpy_; }
  CUdeviceptr input(int i) const { return inputs_[i]; }
  CUdeviceptr output() const { return out_; }
  // The raw floor: the caller's own bucket logic reduced to a precomputed table.
  bool RawDynamic(size_t i, CUstream stream) {
    const Shape& s = shapes_[i % shapes_.size()];
    int32_t n = s.n, stride = 1;
    float alpha = 2.0f;
    CUdeviceptr scratch = 0;
    void* params[] = {&inputs_[0], &inputs_[1], &out_, &n, &stride, &alpha, &scratch, &scratch};
    CUlaunchConfig c = {};
    c.gridDimX = s.grid;
    c.gridDimY = c.gridDimZ = 1;
    c.blockDimX = s.block;
    c.blockDimY = c.blockDimZ = 1;
    c.hStream = stream;
    return driver_->LaunchKernelEx(&c, s.raw, params, nullptr) == CUDA_SUCCESS;
  }
  // kpack choosing the variant per call and computing the grid from the manifest.
  bool KpackDynamic(size_t i, CUstream stream) {
    int32_t n = shapes_[i % shapes_.size()].n;
    return axpy_.Launch(stream, inputs_[0], inputs_[1], out_, n, 1, 2.0f).ok();
  }

 private:
  BenchSetup() = default;
  absl::Status Init(int streams);
  absl::Status InitArgsKernel(const char* name, int inputs, const std::string& manifest);
  absl::Status InitShapes();

  CUlaunchConfig Config(const ArgsKernel& k, CUstream stream) const {
    CUlaunchConfig c = {};
    c.gridDimX = c.gridDimY = c.gridDimZ = 1;
    c.blockDimX = k.block;
    c.blockDimY = c.blockDimZ = 1;
    c.sharedMemBytes = k.shared;
    c.hStream = stream;
    return c;
  }
  // Calls f(in_0, ..., in_{inputs-1}, out, n, s_0, ..., s_{inputs-1}) with the typed
  // values a caller would pass: CUdeviceptr pointers, int32_t scalars.
  template <typename R, typename F>
  R WithArgs(int inputs, F&& f) {
    switch (inputs) {
      case 1:
        return Expand(std::make_index_sequence<1>(), f);
      case 6:
        return Expand(std::make_index_sequence<6>(), f);
      default:
        return Expand(std::make_index_sequence<15>(), f);
    }
  }
  template <size_t... I, typename F>
  decltype(auto) Expand(std::index_sequence<I...>, F& f) {
    return f(inputs_[I]..., out_, n_, scalars_[I]...);
  }

  std::shared_ptr<const internal::Driver> driver_;
  CUcontext ctx_ = nullptr;
  std::vector<CUstream> streams_;
  std::unique_ptr<Runtime> runtime_;
  std::unique_ptr<Runtime> runtime_no_nvtx_;
  std::unique_ptr<Runtime> dispatch_runtime_;
  std::vector<ArgsKernel> kernels_;
  std::array<CUdeviceptr, kMaxInputs> inputs_ = {};
  CUdeviceptr out_ = 0;
  CUdeviceptr null_scratch_ = 0;
  int32_t n_ = 128;
  std::array<int32_t, kMaxInputs> scalars_ = {};
  Kernel axpy_;
  std::vector<Shape> shapes_;
};

}  // namespace kpack::bench

#endif  // KPACK_BENCH_BENCH_SETUP_H_
