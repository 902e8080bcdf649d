// Loading a variant into the driver (lazily at its first launch, or by Preload) and the
// checks against the devices that only a loaded kernel can answer.

#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "driver/capture_mode.h"
#include "runtime/runtime_impl.h"
#include "util/log.h"
#include "util/status_macros.h"

namespace kpack::internal {
namespace {

constexpr uint32_t kDefaultSharedLimit = 48 * 1024;

// Triton's arch-specific targets (90 -> sm_90a, 100 -> sm_100a) run only on exactly that
// compute capability; older targets run on any later minor version of the same major.
bool ArchRunsOn(int arch, int cc) {
  if (arch >= 90) return arch == cc;
  return arch / 10 == cc / 10 && arch % 10 <= cc % 10;
}

// major*10+minor of `device`.
absl::StatusOr<int> ComputeCapability(const Driver& d, CUdevice device) {
  int major = 0, minor = 0;
  KPACK_RETURN_IF_ERROR(
      d.Check(d.DeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, device),
              "cuDeviceGetAttribute(COMPUTE_CAPABILITY_MAJOR)"));
  KPACK_RETURN_IF_ERROR(
      d.Check(d.DeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, device),
              "cuDeviceGetAttribute(COMPUTE_CAPABILITY_MINOR)"));
  return major * 10 + minor;
}

}  // namespace

absl::Status ContextError(const Driver& d, CUresult r, absl::string_view doing) {
  CUcontext current = nullptr;
  if (r == CUDA_ERROR_INVALID_CONTEXT ||
      (d.CtxGetCurrent(&current) == CUDA_SUCCESS && current == nullptr)) {
    return absl::FailedPreconditionError(absl::StrCat(
        doing, ": no CUDA context is current on this thread; make one current "
        "(Runtime::UseDevice, or any CUDA runtime call) first"));
  }
  return d.Error(r, absl::StrCat("cuCtxGetId (", doing, ")"));
}

std::string Describe(const VariantData& v) {
  return absl::StrCat("kernel '", v.kernel->spec->name, "' variant '", v.spec->name, "'");
}

absl::Status RuntimeImpl::CheckLayout(const VariantData& v, CUkernel kernel) const {
  const Driver& d = *driver_;
  const VariantSpec& s = *v.spec;
  const std::string what = Describe(v);
  // The manifest's parameter layout must be the cubin's, slot for slot: packing by a
  // wrong layout would launch with garbage arguments.
  for (size_t i = 0; i < s.layout.size(); ++i) {
    size_t offset = 0, size = 0;
    KPACK_RETURN_IF_ERROR(d.Check(d.KernelGetParamInfo(kernel, i, &offset, &size),
                                  absl::StrCat("cuKernelGetParamInfo(", i, ") for ", what)));
    const SlotSpec& slot = s.layout[i];
    if (offset != slot.offset || size != slot.size) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": parameter ", i, " ('", SlotName(*v.kernel->spec, slot),
                       "') is at offset ", slot.offset, " size ", slot.size,
                       " in the manifest but at offset ", offset, " size ", size, " in the cubin"));
    }
  }
  size_t extra_offset = 0, extra_size = 0;
  if (d.KernelGetParamInfo(kernel, s.layout.size(), &extra_offset, &extra_size) == CUDA_SUCCESS) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": the cubin's entry '", s.entry,
                                                   "' has more than the ", s.layout.size(),
                                                   " parameters the manifest's layout lists"));
  }
  return absl::OkStatus();
}

// `device` is the current context's (cuCtxGetDevice): a handle, never an ordinal.
absl::Status RuntimeImpl::CheckDevice(const VariantData& v, CUkernel kernel,
                                      CUdevice device) const {
  const Driver& d = *driver_;
  const VariantSpec& s = *v.spec;
  const std::string what = Describe(v);
  int optin = 0;
  KPACK_RETURN_IF_ERROR(d.Check(
      d.DeviceGetAttribute(&optin, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, device),
      "cuDeviceGetAttribute(MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)"));
  int static_shared = 0, max_threads = 0;
  KPACK_RETURN_IF_ERROR(d.Check(
      d.KernelGetAttribute(&static_shared, CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, kernel, device),
      absl::StrCat("cuKernelGetAttribute(SHARED_SIZE_BYTES) for ", what)));
  KPACK_RETURN_IF_ERROR(d.Check(
      d.KernelGetAttribute(&max_threads, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, kernel, device),
      absl::StrCat("cuKernelGetAttribute(MAX_THREADS_PER_BLOCK) for ", what)));
  if (static_cast<int64_t>(s.shared) + static_shared > optin) {
    return absl::ResourceExhaustedError(absl::StrCat(
        what, ": needs ", s.shared, " bytes of dynamic shared memory (plus ", static_shared,
        " static), but the current device allows at most ", optin, " per block"));
  }
  if (v.block_x > static_cast<uint32_t>(max_threads)) {
    return absl::ResourceExhaustedError(
        absl::StrCat(what, ": num_warps ", s.num_warps, " needs ", v.block_x,
                     " threads per block, but the kernel can run at most ", max_threads,
                     " on the current device"));
  }
  if (s.shared > kDefaultSharedLimit) {
    // Without this opt-in a launch asking for more than 48 KiB fails with
    // CUDA_ERROR_INVALID_VALUE. It applies to the device, so to all its contexts.
    KPACK_RETURN_IF_ERROR(
        d.Check(d.KernelSetAttribute(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                     optin - static_shared, kernel, device),
                absl::StrCat("cuKernelSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES) for ", what)));
  }
  if (s.num_ctas > 8) {
    KPACK_RETURN_IF_ERROR(d.Check(
        d.KernelSetAttribute(CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1, kernel, device),
        absl::StrCat("cuKernelSetAttribute(NON_PORTABLE_CLUSTER_SIZE_ALLOWED) for ", what)));
  }
  return absl::OkStatus();
}

absl::StatusOr<CUfunction> RuntimeImpl::FunctionFor(const VariantData& v, uint64_t context,
                                                    CUstream stream) const {
  for (const ContextFunction* c = v.contexts.load(std::memory_order_acquire); c != nullptr;
       c = c->next) {
    if (c->context == context) return c->function;
  }
  // Not loaded for this context yet. Loading (the library, or only cuKernelGetFunction)
  // is not allowed while a stream is captured; refuse rather than invalidate the
  // caller's capture.
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  const CUresult r = driver_->StreamIsCapturing(stream, &status);
  if (r == CUDA_ERROR_STREAM_CAPTURE_IMPLICIT ||
      (r == CUDA_SUCCESS && status != CU_STREAM_CAPTURE_STATUS_NONE)) {
    return absl::FailedPreconditionError(absl::StrCat(
        Describe(v), " is not loaded in this CUDA context, and the launch's stream is being "
        "captured into a CUDA graph, during which kpack does not load kernels: call "
        "Runtime::Preload() or Kernel::Preload() in this context before beginning the capture"));
  }
  KPACK_RETURN_IF_ERROR(driver_->Check(r, "cuStreamIsCapturing"));
  return Load(v);
}

absl::StatusOr<CUfunction> RuntimeImpl::Load(const VariantData& v) const {
  const Driver& d = *driver_;
  const VariantSpec& s = *v.spec;
  const std::string what = Describe(v);
  unsigned long long context = 0;  // NOLINT(runtime/int)
  if (CUresult r = d.CtxGetId(nullptr, &context); r != CUDA_SUCCESS) {
    return ContextError(d, r, absl::StrCat("loading ", what));
  }

  std::lock_guard<std::mutex> lock(v.load_mu);
  CUfunction home = v.home_function.load(std::memory_order_acquire);
  if (home != nullptr && v.home_context == context) return home;
  for (const ContextFunction* c = v.contexts.load(std::memory_order_acquire); c != nullptr;
       c = c->next) {
    if (c->context == context) return c->function;
  }

  CUdevice device = 0;
  KPACK_RETURN_IF_ERROR(d.Check(d.CtxGetDevice(&device), "cuCtxGetDevice"));
  KPACK_ASSIGN_OR_RETURN(int cc, ComputeCapability(d, device));
  if (!ArchRunsOn(s.arch, cc)) {
    return absl::FailedPreconditionError(absl::StrCat(
        what, ": the cubin was built for arch ", s.arch, " (sm_", s.arch, s.arch >= 90 ? "a" : "",
        "), but the current device has compute capability ", cc / 10, ".", cc % 10));
  }

  // Loading is "potentially unsafe" during a capture: in the thread's own (GLOBAL or
  // THREAD_LOCAL) mode it would be refused and invalidate a capture this thread runs on
  // another stream, or another thread's global one. Nothing of it is captured, so it
  // runs in RELAXED mode (FunctionFor refuses a launch on a capturing stream before it
  // gets here; Preload loads off any stream).
  RelaxedCaptureMode relaxed(d);
  KPACK_RETURN_IF_ERROR(relaxed.status());
  // The library: loaded once, for every context (cuLibraryLoadData is context-free).
  const bool first_load = v.library == nullptr;
  if (first_load) {
    CUlibrary library = nullptr;
    KPACK_RETURN_IF_ERROR(d.Check(
        d.LibraryLoadData(&library, v.cubin.data(), nullptr, nullptr, 0, nullptr, nullptr, 0),
        absl::StrCat("cuLibraryLoadData for ", what)));
    CUkernel kernel = nullptr;
    absl::Status status = d.Check(d.LibraryGetKernel(&kernel, library, s.entry.c_str()),
                                  absl::StrCat("cuLibraryGetKernel('", s.entry, "') for ", what));
    if (status.ok()) status = CheckLayout(v, kernel);
    if (!status.ok()) {
      d.LibraryUnload(library);
      return status;
    }
    v.library = library;
    v.kernel_handle = kernel;
  }
  // This context: the device's limits and attributes, then its CUfunction (which loads
  // the kernel into the context now rather than lazily at a launch).
  CUfunction function = nullptr;
  absl::Status status = CheckDevice(v, v.kernel_handle, device);
  if (status.ok()) {
    status = d.Check(d.KernelGetFunction(&function, v.kernel_handle),
                     absl::StrCat("cuKernelGetFunction for ", what));
  }
  if (!status.ok()) {
    if (first_load) {  // a variant no context can use stays unloaded
      d.LibraryUnload(v.library);
      v.library = nullptr;
      v.kernel_handle = nullptr;
    }
    return status;
  }
  if (first_load) {
    std::vector<std::byte>().swap(v.cubin);  // the driver has its own copy now
    libraries_loaded_.fetch_add(1, std::memory_order_relaxed);
  }
  if (home == nullptr) {
    v.home_context = context;
    v.home_function.store(function, std::memory_order_release);
  } else {
    v.context_nodes.push_back(std::make_unique<ContextFunction>(
        ContextFunction{context, function, v.contexts.load(std::memory_order_relaxed)}));
    v.contexts.store(v.context_nodes.back().get(), std::memory_order_release);
  }
  Log().info("loaded {} for context {} (entry '{}', {} warps, {} ctas, {} B shared)", what,
             context, s.entry, s.num_warps, s.num_ctas, s.shared);
  return function;
}
}  // namespace kpack::internal
