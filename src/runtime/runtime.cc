#include "kpack/runtime.h"

#include <cuda.h>

#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "launch/args.h"
#include "runtime/runtime_impl.h"
#include "util/log.h"
#include "util/status_macros.h"

#if KPACK_ENABLE_NVTX
#include <nvtx3/nvToolsExt.h>
#endif

namespace kpack {
namespace internal {
namespace {

// The public API speaks std::string_view; Debian's abseil has its own string_view type.
absl::string_view AbslView(std::string_view s) { return absl::string_view(s.data(), s.size()); }

constexpr uint32_t kDefaultSharedLimit = 48 * 1024;

std::string Describe(const VariantData& v) {
  return absl::StrCat("kernel '", v.kernel->spec->name, "' variant '", v.spec->name, "'");
}

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

bool NvtxRequested(const Options& options) {
#if KPACK_ENABLE_NVTX
  const char* env = std::getenv("KPACK_NVTX");
  return options.nvtx && !(env != nullptr && std::string_view(env) == "0");
#else
  (void)options;
  return false;
#endif
}

ABSL_ATTRIBUTE_NOINLINE absl::Status ArgCountError(const KernelData& k, size_t got) {
  std::vector<std::string> expected;
  for (int a : k.spec->args) {
    const ParamSpec& p = k.spec->params[a];
    expected.push_back(absl::StrCat(p.name, ": ", p.type_name));
  }
  return absl::InvalidArgumentError(absl::StrCat("kernel '", k.spec->name, "' takes ", k.num_args,
                                                 " arguments (", absl::StrJoin(expected, ", "),
                                                 "), got ", got));
}

ABSL_ATTRIBUTE_NOINLINE absl::Status BadArg(const VariantData& v, size_t i, const Arg& a) {
  const ParamSpec& p = v.kernel->spec->params[v.kernel->spec->args[i]];
  return ArgError(v.kernel->spec->name, i, p.name, p.type_name, a);
}

ABSL_ATTRIBUTE_NOINLINE absl::Status GridError(const VariantData& v, const Grid& grid) {
  return absl::InvalidArgumentError(
      absl::StrCat(Describe(v), ": grid (", grid.x, ", ", grid.y, ", ", grid.z, ") times num_ctas ",
                   v.num_ctas, " exceeds the driver's limit of 2^31-1 blocks along x"));
}

ABSL_ATTRIBUTE_NOINLINE absl::Status GridValueError(const VariantData& v, int axis) {
  return absl::InvalidArgumentError(
      absl::StrCat(Describe(v), ": grid[", axis, "] = '", v.kernel->spec->grid[axis],
                   "' overflows, divides by zero, or falls outside [0, 2^32) for these arguments"));
}

ABSL_ATTRIBUTE_NOINLINE absl::Status LaunchError(const Driver& d, const VariantData& v,
                                                 CUresult r) {
  return d.Error(r, absl::StrCat("cuLaunchKernelEx for ", Describe(v)));
}

void BuildLaunchAttributes(VariantData& v) {
  const VariantSpec& s = *v.spec;
  if (s.num_ctas != 1) {
    CUlaunchAttribute& cluster = v.attrs[v.num_attrs++];
    cluster.id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
    cluster.value.clusterDim.x = static_cast<unsigned>(s.num_ctas);
    cluster.value.clusterDim.y = 1;
    cluster.value.clusterDim.z = 1;
    CUlaunchAttribute& policy = v.attrs[v.num_attrs++];
    policy.id = CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE;
    policy.value.clusterSchedulingPolicyPreference = CU_CLUSTER_SCHEDULING_POLICY_SPREAD;
  }
  if (s.launch_pdl) {
    CUlaunchAttribute& pdl = v.attrs[v.num_attrs++];
    pdl.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    pdl.value.programmaticStreamSerializationAllowed = 1;
  }
  if (s.launch_cooperative_grid) {
    CUlaunchAttribute& coop = v.attrs[v.num_attrs++];
    coop.id = CU_LAUNCH_ATTRIBUTE_COOPERATIVE;
    coop.value.cooperative = 1;
  }
}

// Compiles the kernel's grid expressions against one variant (see VariantGridResolver).
absl::Status CompileGrid(const KernelSpec& k, const VariantSpec& v, absl::string_view where,
                         std::array<GridExpr, 3>& grid) {
  const GridExpr::Resolver resolve = VariantGridResolver(k, v);
  for (size_t axis = 0; axis < k.grid.size(); ++axis) {
    absl::StatusOr<GridExpr> expr = GridExpr::Compile(k.grid[axis], resolve);
    if (!expr.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": variant '", v.name, "': field 'grid[", axis, "]': ", expr.status().message()));
    }
    grid[axis] = *std::move(expr);
  }
  return absl::OkStatus();
}

// A call argument's slot type, and the Arg kind PackArgs may copy into it without
// PackArg's conversions (the kind a C++ caller passes for it most often). After the
// slot's offset is set: a dropped (eq1) slot has nothing to write and no fast path.
void SetArgType(ParamType type, ArgSlot* slot) {
  slot->type = type;
  if (slot->offset == ArgSlot::kDropped) return;
  switch (type) {
    case ParamType::kPointer:  // CUdeviceptr; typed host pointers take PackArg
      slot->fast_kind = Arg::Kind::kDevicePtr;
      slot->fast_size = 8;
      break;
    case ParamType::kI32:
      slot->fast_kind = Arg::Kind::kSigned;
      slot->fast_size = 4;
      slot->fast_check_i32 = true;
      break;
    case ParamType::kI64:
      slot->fast_kind = Arg::Kind::kSigned;
      slot->fast_size = 8;
      break;
    case ParamType::kFp32:
      slot->fast_kind = Arg::Kind::kFloat32;
      slot->fast_size = 4;
      break;
    default:
      slot->fast_size = 0;
      break;
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<RuntimeImpl>> RuntimeImpl::Create(absl::string_view dir,
                                                                 const Options& options) {
  std::unique_ptr<RuntimeImpl> rt(new RuntimeImpl());
  KPACK_ASSIGN_OR_RETURN(rt->pack_, ReadPack(dir));
  KPACK_ASSIGN_OR_RETURN(rt->driver_, Driver::Load(options.driver_path));
  rt->scratch_ = std::make_unique<ScratchArenas>(*rt->driver_);

#if KPACK_ENABLE_NVTX
  if (NvtxRequested(options)) rt->nvtx_domain_ = nvtxDomainCreateA("kpack");
#endif

  const ManifestSpec& manifest = rt->pack_.manifest;
  for (size_t ki = 0; ki < manifest.kernels.size(); ++ki) {
    const KernelSpec& ks = manifest.kernels[ki];
    auto k = std::make_unique<KernelData>();
    k->spec = &ks;
    k->runtime = rt.get();
    k->num_args = ks.args.size();
#if KPACK_ENABLE_NVTX
    if (rt->nvtx_domain_ != nullptr) {
      k->nvtx_domain = rt->nvtx_domain_;
      k->nvtx_message = nvtxDomainRegisterStringA(static_cast<nvtxDomainHandle_t>(rt->nvtx_domain_),
                                                  ks.name.c_str());
    }
#endif
    const std::string where = absl::StrCat(rt->pack_.dir, "/manifest.json: kernel '", ks.name, "'");
    absl::StatusOr<DispatchTable> dispatch = DispatchTable::Build(ks);
    if (!dispatch.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": ", dispatch.status().message()));
    }
    k->dispatch = *std::move(dispatch);
    for (size_t vi = 0; vi < ks.variants.size(); ++vi) {
      const VariantSpec& vs = ks.variants[vi];
      auto v = std::make_unique<VariantData>();
      v->spec = &vs;
      v->kernel = k.get();
      v->arg_slots.assign(ks.args.size(), {ArgSlot::kDropped, ParamType::kConstexpr});
      KPACK_RETURN_IF_ERROR(CompileGrid(ks, vs, where, v->grid));
      for (const SlotSpec& slot : vs.layout) {
        switch (slot.kind) {
          case SlotKind::kArg:
            v->arg_slots[slot.arg].offset = slot.offset;
            break;
          case SlotKind::kGlobalScratch:
            v->global_scratch_offset = static_cast<int32_t>(slot.offset);
            break;
          case SlotKind::kProfileScratch:
            v->profile_scratch_offset = static_cast<int32_t>(slot.offset);
            break;
        }
      }
      for (size_t a = 0; a < ks.args.size(); ++a) SetArgType(vs.arg_types[a], &v->arg_slots[a]);
      v->param_bytes = vs.param_bytes;
      v->block_x = 32u * static_cast<uint32_t>(vs.num_warps);
      v->num_ctas = static_cast<uint32_t>(vs.num_ctas);
      v->shared = vs.shared;
      v->global_scratch_size = vs.global_scratch_size;
      v->profile_scratch_size = vs.profile_scratch_size;
      v->profile_scratch_align = vs.profile_scratch_align;
      BuildLaunchAttributes(*v);
      v->cubin = std::move(rt->pack_.cubins[ki][vi]);
      k->variants.push_back(std::move(v));
    }
    if (k->variants.size() == 1 && k->dispatch.num_properties() == 0 &&
        k->dispatch.num_buckets() == 1) {
      // Nothing to dispatch on: Select reads no argument and finds the one variant.
      const DispatchTable::Choice only = k->dispatch.Select({});
      if (only.variant == 0 && !only.fallback) k->sole_variant = k->variants[0].get();
    }
    rt->by_name_[ks.name] = k.get();
    rt->kernels_.push_back(std::move(k));
  }
  rt->pack_.cubins.clear();
  Log().info("opened pack '{}': {} kernels, driver '{}'", rt->pack_.dir, rt->kernels_.size(),
             rt->driver_->path);
  return rt;
}

RuntimeImpl::~RuntimeImpl() {
  scratch_.reset();
  for (const auto& k : kernels_) {
    for (const auto& v : k->variants) {
      std::lock_guard<std::mutex> lock(v->load_mu);
      if (v->library != nullptr) driver_->LibraryUnload(v->library);
    }
  }
#if KPACK_ENABLE_NVTX
  if (nvtx_domain_ != nullptr) {
    nvtxDomainDestroy(static_cast<nvtxDomainHandle_t>(nvtx_domain_));
  }
#endif
}

absl::Status RuntimeImpl::CheckAndPrepare(const VariantData& v, CUkernel kernel) const {
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

  int count = 0;
  KPACK_RETURN_IF_ERROR(d.Check(d.DeviceGetCount(&count), "cuDeviceGetCount"));
  for (CUdevice dev = 0; dev < count; ++dev) {
    KPACK_ASSIGN_OR_RETURN(int cc, ComputeCapability(d, dev));
    // Load checked the current device; GPUs of another kind never run this variant.
    if (!ArchRunsOn(s.arch, cc)) continue;
    int optin = 0;
    KPACK_RETURN_IF_ERROR(d.Check(
        d.DeviceGetAttribute(&optin, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, dev),
        "cuDeviceGetAttribute(MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)"));
    int static_shared = 0, max_threads = 0;
    KPACK_RETURN_IF_ERROR(d.Check(
        d.KernelGetAttribute(&static_shared, CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, kernel, dev),
        absl::StrCat("cuKernelGetAttribute(SHARED_SIZE_BYTES) for ", what)));
    KPACK_RETURN_IF_ERROR(d.Check(
        d.KernelGetAttribute(&max_threads, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, kernel, dev),
        absl::StrCat("cuKernelGetAttribute(MAX_THREADS_PER_BLOCK) for ", what)));
    if (static_cast<int64_t>(s.shared) + static_shared > optin) {
      return absl::ResourceExhaustedError(absl::StrCat(
          what, ": needs ", s.shared, " bytes of dynamic shared memory (plus ", static_shared,
          " static), but device ", dev, " allows at most ", optin, " per block"));
    }
    if (v.block_x > static_cast<uint32_t>(max_threads)) {
      return absl::ResourceExhaustedError(absl::StrCat(
          what, ": num_warps ", s.num_warps, " needs ", v.block_x,
          " threads per block, but the kernel can run at most ", max_threads, " on device ", dev));
    }
    if (s.shared > kDefaultSharedLimit) {
      // Without this opt-in a launch asking for more than 48 KiB fails with
      // CUDA_ERROR_INVALID_VALUE. Set once per device; it applies to all its contexts.
      KPACK_RETURN_IF_ERROR(
          d.Check(d.KernelSetAttribute(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                       optin - static_shared, kernel, dev),
                  absl::StrCat("cuKernelSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES) for ", what)));
    }
    if (s.num_ctas > 8) {
      KPACK_RETURN_IF_ERROR(d.Check(
          d.KernelSetAttribute(CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1, kernel, dev),
          absl::StrCat("cuKernelSetAttribute(NON_PORTABLE_CLUSTER_SIZE_ALLOWED) for ", what)));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<CUfunction> RuntimeImpl::Load(const VariantData& v) const {
  std::lock_guard<std::mutex> lock(v.load_mu);
  if (CUfunction f = v.function.load(std::memory_order_acquire)) return f;
  const Driver& d = *driver_;
  const VariantSpec& s = *v.spec;
  const std::string what = Describe(v);

  CUcontext ctx = nullptr;
  KPACK_RETURN_IF_ERROR(d.Check(d.CtxGetCurrent(&ctx), "cuCtxGetCurrent"));
  if (ctx == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "loading ", what,
        ": no CUDA context is current on this thread; make one current "
        "(cuDevicePrimaryCtxRetain + cuCtxSetCurrent, or any CUDA runtime call) first"));
  }
  CUdevice device = 0;
  KPACK_RETURN_IF_ERROR(d.Check(d.CtxGetDevice(&device), "cuCtxGetDevice"));
  KPACK_ASSIGN_OR_RETURN(int cc, ComputeCapability(d, device));
  if (!ArchRunsOn(s.arch, cc)) {
    return absl::FailedPreconditionError(absl::StrCat(
        what, ": the cubin was built for arch ", s.arch, " (sm_", s.arch, s.arch >= 90 ? "a" : "",
        "), but the current device ", device, " has compute capability ", cc / 10, ".", cc % 10));
  }

  CUlibrary library = nullptr;
  KPACK_RETURN_IF_ERROR(
      d.Check(d.LibraryLoadData(&library, v.cubin.data(), nullptr, nullptr, 0, nullptr, nullptr, 0),
              absl::StrCat("cuLibraryLoadData for ", what)));
  CUkernel kernel = nullptr;
  absl::Status status = d.Check(d.LibraryGetKernel(&kernel, library, s.entry.c_str()),
                                absl::StrCat("cuLibraryGetKernel('", s.entry, "') for ", what));
  if (status.ok()) status = CheckAndPrepare(v, kernel);
  CUfunction home_function = nullptr;
  if (status.ok()) {
    status = d.Check(d.KernelGetFunction(&home_function, kernel),
                     absl::StrCat("cuKernelGetFunction for ", what));
  }
  if (!status.ok()) {
    d.LibraryUnload(library);
    return status;
  }
  v.home_context = ctx;
  v.home_function = home_function;
  v.library = library;
  std::vector<std::byte>().swap(v.cubin);  // the driver has its own copy now
  libraries_loaded_.fetch_add(1, std::memory_order_relaxed);
  Log().info("loaded {} (entry '{}', {} warps, {} ctas, {} B shared)", what, s.entry, s.num_warps,
             s.num_ctas, s.shared);
  auto function = reinterpret_cast<CUfunction>(kernel);
  v.function.store(function, std::memory_order_release);
  return function;
}

ABSL_ATTRIBUTE_ALWAYS_INLINE inline absl::Status RuntimeImpl::PackArgsInline(
    const VariantData& v, std::span<const Arg> args, std::byte* buf) const {
  if (ABSL_PREDICT_FALSE(args.size() != v.arg_slots.size())) {
    return ArgCountError(*v.kernel, args.size());
  }
  std::memset(buf, 0, v.param_bytes);
  for (size_t i = 0; i < args.size(); ++i) {
    const ArgSlot& slot = v.arg_slots[i];
    const Arg& a = args[i];
    if (ABSL_PREDICT_TRUE(a.kind() == slot.fast_kind)) {
      const uint64_t bits = a.bits();
      if (slot.fast_size == 8) {
        std::memcpy(buf + slot.offset, &bits, 8);
        continue;
      }
      if (slot.fast_size == 4 &&
          (!slot.fast_check_i32 || static_cast<int64_t>(bits) == static_cast<int32_t>(bits))) {
        const uint32_t low = static_cast<uint32_t>(bits);
        std::memcpy(buf + slot.offset, &low, 4);
        continue;
      }
    }
    if (slot.offset == ArgSlot::kDropped) continue;  // eq1: dispatch checked it is 1
    if (ABSL_PREDICT_FALSE(!PackArg(slot.type, a, buf + slot.offset))) {
      return BadArg(v, i, a);
    }
  }
  return absl::OkStatus();
}

ABSL_ATTRIBUTE_ALWAYS_INLINE inline absl::Status RuntimeImpl::SelectInline(
    const KernelData& k, std::span<const Arg> args, DispatchTable::Choice* choice) const {
  if (ABSL_PREDICT_FALSE(args.size() != k.num_args)) return ArgCountError(k, args.size());
  if (k.sole_variant != nullptr) {
    *choice = {0, false};
    return absl::OkStatus();
  }
  *choice = k.dispatch.Select(args);
  if (ABSL_PREDICT_FALSE(choice->variant < 0)) return k.dispatch.NoVariantError(*k.spec, args);
  return absl::OkStatus();
}

absl::StatusOr<Grid> RuntimeImpl::EvalGrid(const VariantData& v, std::span<const Arg> args) const {
  const KernelSpec& k = *v.kernel->spec;
  if (ABSL_PREDICT_FALSE(k.grid.empty())) {
    return absl::FailedPreconditionError(
        absl::StrCat("kernel '", k.name, "' has no grid expression in its manifest; pass a grid"));
  }
  uint32_t dims[3];
  for (int axis = 0; axis < 3; ++axis) {
    int64_t value;
    if (ABSL_PREDICT_FALSE(!v.grid[axis].Evaluate(args, &value) || value < 0 ||
                           value > int64_t{UINT32_MAX})) {
      return GridValueError(v, axis);
    }
    dims[axis] = static_cast<uint32_t>(value);
  }
  return Grid{dims[0], dims[1], dims[2]};
}

ABSL_ATTRIBUTE_ALWAYS_INLINE inline absl::Status RuntimeImpl::PrepareInline(
    const VariantData& v, const Grid& grid, CUstream stream, std::byte* buf,
    PreparedLaunch* p) const {
  const uint64_t programs = uint64_t{grid.x} * grid.y * grid.z;
  if (programs == 0) {  // Triton skips empty grids too
    p->function = nullptr;
    return absl::OkStatus();
  }
  const uint64_t grid_x = uint64_t{grid.x} * v.num_ctas;
  if (ABSL_PREDICT_FALSE(grid_x > std::numeric_limits<int32_t>::max())) {
    return GridError(v, grid);
  }
  CUfunction function = v.function.load(std::memory_order_acquire);
  if (ABSL_PREDICT_FALSE(function == nullptr)) {
    KPACK_ASSIGN_OR_RETURN(function, Load(v));
  }
  CUcontext context = nullptr;
  driver_->CtxGetCurrent(&context);  // a thread-local read in the driver
  if (ABSL_PREDICT_TRUE(context == v.home_context)) function = v.home_function;
  p->function = function;

  if (v.global_scratch_size != 0 || v.profile_scratch_size != 0) {
    const uint64_t blocks = programs * v.num_ctas;
    const uint64_t global_bytes = blocks * v.global_scratch_size;
    const uint64_t profile_start = (global_bytes + v.profile_scratch_align - 1) /
                                   v.profile_scratch_align * v.profile_scratch_align;
    KPACK_ASSIGN_OR_RETURN(CUdeviceptr base,
                           scratch_->Get(stream, profile_start + blocks * v.profile_scratch_size));
    if (v.global_scratch_size != 0) {
      std::memcpy(buf + v.global_scratch_offset, &base, sizeof(base));
    }
    if (v.profile_scratch_size != 0) {
      CUdeviceptr profile = base + profile_start;
      std::memcpy(buf + v.profile_scratch_offset, &profile, sizeof(profile));
    }
  }

  CUlaunchConfig& config = p->config;
  config.gridDimX = static_cast<unsigned>(grid_x);
  config.gridDimY = grid.y;
  config.gridDimZ = grid.z;
  config.blockDimX = v.block_x;
  config.blockDimY = 1;
  config.blockDimZ = 1;
  config.sharedMemBytes = v.shared;
  config.hStream = stream;
  // The driver reads the attributes and does not keep or modify them.
  config.attrs = const_cast<CUlaunchAttribute*>(v.attrs.data());
  config.numAttrs = v.num_attrs;
  p->param_bytes = v.param_bytes;
  p->extra[0] = CU_LAUNCH_PARAM_BUFFER_POINTER;
  p->extra[1] = buf;
  p->extra[2] = CU_LAUNCH_PARAM_BUFFER_SIZE;
  p->extra[3] = &p->param_bytes;
  p->extra[4] = CU_LAUNCH_PARAM_END;
  return absl::OkStatus();
}

absl::Status RuntimeImpl::Select(const KernelData& k, std::span<const Arg> args,
                                 DispatchTable::Choice* choice) const {
  return SelectInline(k, args, choice);
}
absl::Status RuntimeImpl::PackArgs(const VariantData& v, std::span<const Arg> args,
                                   std::byte* buf) const {
  return PackArgsInline(v, args, buf);
}
absl::Status RuntimeImpl::Prepare(const VariantData& v, const Grid& grid, CUstream stream,
                                  std::byte* buf, PreparedLaunch* p) const {
  return PrepareInline(v, grid, stream, buf, p);
}

absl::Status RuntimeImpl::LaunchPacked(const VariantData& v, const Grid& grid, CUstream stream,
                                       std::byte* buf, bool fallback) const {
  PreparedLaunch p;
  KPACK_RETURN_IF_ERROR(PrepareInline(v, grid, stream, buf, &p));
  if (p.function == nullptr) return absl::OkStatus();  // empty grid

#if KPACK_ENABLE_NVTX
  const KernelData& k = *v.kernel;
  auto domain = static_cast<nvtxDomainHandle_t>(k.nvtx_domain);
  if (domain != nullptr) {
    nvtxEventAttributes_t attrs = {};
    attrs.version = NVTX_VERSION;
    attrs.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
    attrs.messageType = NVTX_MESSAGE_TYPE_REGISTERED;
    attrs.message.registered = static_cast<nvtxStringHandle_t>(k.nvtx_message);
    nvtxDomainRangePushEx(domain, &attrs);
  }
#endif
  CUresult r = driver_->LaunchKernelEx(&p.config, p.function, nullptr,
                                       p.param_bytes != 0 ? p.extra : nullptr);
#if KPACK_ENABLE_NVTX
  if (domain != nullptr) nvtxDomainRangePop(domain);
#endif
  if (ABSL_PREDICT_FALSE(r != CUDA_SUCCESS)) return LaunchError(*driver_, v, r);
  CounterShard& counters = v.counters[ThreadShard()];
  counters.launches.fetch_add(1, std::memory_order_relaxed);
  if (fallback) counters.fallbacks.fetch_add(1, std::memory_order_relaxed);
  return absl::OkStatus();
}

absl::Status RuntimeImpl::LaunchArgs(const KernelData& k, const Grid* grid, CUstream stream,
                                     std::span<const Arg> args) const {
  DispatchTable::Choice choice{};
  KPACK_RETURN_IF_ERROR(SelectInline(k, args, &choice));
  // The sole variant, when there is one, without reading the variants vector.
  const VariantData& v = k.sole_variant != nullptr ? *k.sole_variant : *k.variants[choice.variant];
  alignas(16) std::byte buf[kMaxParamBytes];
  KPACK_RETURN_IF_ERROR(PackArgsInline(v, args, buf));
  if (grid != nullptr) return LaunchPacked(v, *grid, stream, buf, choice.fallback);
  KPACK_ASSIGN_OR_RETURN(Grid computed, EvalGrid(v, args));
  return LaunchPacked(v, computed, stream, buf, choice.fallback);
}

}  // namespace internal

// ---- Kernel ----

namespace {
absl::Status EmptyKernel() {
  return absl::FailedPreconditionError("launch through an empty kpack::Kernel handle");
}
}  // namespace

std::string_view Kernel::name() const {
  if (data_ == nullptr) return {};
  return data_->spec->name;  // not `data_ ? name : ""`: that makes a temporary std::string
}
size_t Kernel::num_args() const { return data_ ? data_->num_args : 0; }
std::string_view Kernel::arg_name(size_t index) const {
  if (data_ == nullptr || index >= data_->num_args) return "";
  return data_->spec->params[data_->spec->args[index]].name;
}
std::string_view Kernel::arg_type(size_t index) const {
  if (data_ == nullptr || index >= data_->num_args) return "";
  return data_->spec->params[data_->spec->args[index]].type_name;
}
absl::StatusOr<size_t> Kernel::ArgIndex(std::string_view name) const {
  if (data_ == nullptr) return EmptyKernel();
  for (size_t i = 0; i < data_->num_args; ++i) {
    if (arg_name(i) == name) return i;
  }
  return absl::NotFoundError(absl::StrCat(
      "kernel '", data_->spec->name, "' has no call parameter '", internal::AbslView(name), "'"));
}

absl::Status Kernel::Preload() const {
  if (data_ == nullptr) return EmptyKernel();
  for (const auto& v : data_->variants) KPACK_RETURN_IF_ERROR(data_->runtime->Load(*v).status());
  return absl::OkStatus();
}

absl::Status Kernel::LaunchArgs(const Grid& grid, CUstream stream,
                                std::span<const Arg> args) const {
  if (ABSL_PREDICT_FALSE(data_ == nullptr)) return EmptyKernel();
  return data_->runtime->LaunchArgs(*data_, &grid, stream, args);
}

absl::Status Kernel::LaunchArgs(CUstream stream, std::span<const Arg> args) const {
  if (ABSL_PREDICT_FALSE(data_ == nullptr)) return EmptyKernel();
  return data_->runtime->LaunchArgs(*data_, nullptr, stream, args);
}

absl::StatusOr<std::string_view> Kernel::SelectVariant(std::span<const Arg> args) const {
  if (data_ == nullptr) return EmptyKernel();
  internal::DispatchTable::Choice choice{};
  KPACK_RETURN_IF_ERROR(data_->runtime->Select(*data_, args, &choice));
  return std::string_view(data_->variants[choice.variant]->spec->name);
}

std::vector<Kernel::VariantStats> Kernel::variant_stats() const {
  std::vector<VariantStats> stats;
  if (data_ == nullptr) return stats;
  for (const auto& v : data_->variants) {
    VariantStats s{v->spec->name, 0, 0};
    for (const internal::CounterShard& c : v->counters) {
      s.launches += c.launches.load(std::memory_order_relaxed);
      s.fallback_launches += c.fallbacks.load(std::memory_order_relaxed);
    }
    stats.push_back(s);
  }
  return stats;
}

absl::StatusOr<BoundLaunch> Kernel::BindImpl(const Grid* grid, CUstream stream,
                                             std::span<const Arg> args) const {
  if (data_ == nullptr) return EmptyKernel();
  const internal::RuntimeImpl& rt = *data_->runtime;
  auto state = std::make_unique<internal::BoundState>();
  state->kernel = data_;
  state->stream = stream;
  internal::DispatchTable::Choice choice{};
  KPACK_RETURN_IF_ERROR(rt.Select(*data_, args, &choice));
  state->variant = data_->variants[choice.variant].get();
  state->fallback = choice.fallback;
  KPACK_RETURN_IF_ERROR(rt.PackArgs(*state->variant, args, state->buf));
  state->args.assign(args.begin(), args.end());
  if (grid != nullptr) {
    state->grid = *grid;
  } else {
    state->grid_from_expressions = true;
    KPACK_RETURN_IF_ERROR(rt.EvalGrid(*state->variant, args).status());
  }
  return BoundLaunch(std::move(state));
}

absl::StatusOr<BoundLaunch> Kernel::Bind(const Grid& grid, CUstream stream,
                                         std::span<const Arg> args) const {
  return BindImpl(&grid, stream, args);
}

absl::StatusOr<BoundLaunch> Kernel::Bind(CUstream stream, std::span<const Arg> args) const {
  return BindImpl(nullptr, stream, args);
}

// ---- BoundLaunch ----

BoundLaunch::BoundLaunch(std::unique_ptr<internal::BoundState> state) : state_(std::move(state)) {}
BoundLaunch::BoundLaunch(BoundLaunch&&) noexcept = default;
BoundLaunch& BoundLaunch::operator=(BoundLaunch&&) noexcept = default;
BoundLaunch::~BoundLaunch() = default;

absl::Status BoundLaunch::Set(size_t index, Arg value) {
  internal::BoundState& st = *state_;
  const internal::KernelData& k = *st.kernel;
  if (ABSL_PREDICT_FALSE(index >= st.args.size())) {
    return absl::OutOfRangeError(absl::StrCat("kernel '", k.spec->name, "' has ", st.args.size(),
                                              " arguments; no index ", index));
  }
  if (k.dispatch.DependsOn(static_cast<int>(index))) {
    // The value may change the bucket or an assumption: select again, and repack the
    // whole buffer if that picks another variant.
    const Arg old = st.args[index];
    st.args[index] = value;
    internal::DispatchTable::Choice choice = k.dispatch.Select(st.args);
    if (choice.variant < 0) {
      absl::Status error = k.dispatch.NoVariantError(*k.spec, st.args);
      st.args[index] = old;
      return error;
    }
    const internal::VariantData* variant = k.variants[choice.variant].get();
    if (variant != st.variant) {
      alignas(16) std::byte packed[internal::kMaxParamBytes];
      absl::Status s = k.runtime->PackArgs(*variant, st.args, packed);
      if (!s.ok()) {
        st.args[index] = old;
        return s;
      }
      std::memcpy(st.buf, packed, variant->param_bytes);
      st.variant = variant;
      st.fallback = choice.fallback;
      return absl::OkStatus();
    }
    st.args[index] = old;
    st.fallback = choice.fallback;
  }
  const internal::ArgSlot& slot = st.variant->arg_slots[index];
  if (slot.offset != internal::ArgSlot::kDropped &&
      ABSL_PREDICT_FALSE(!internal::PackArg(slot.type, value, st.buf + slot.offset))) {
    return internal::BadArg(*st.variant, index, value);
  }
  st.args[index] = value;
  return absl::OkStatus();
}

void BoundLaunch::set_grid(const Grid& grid) {
  state_->grid = grid;
  state_->grid_from_expressions = false;
}
void BoundLaunch::set_stream(CUstream stream) { state_->stream = stream; }

absl::Status BoundLaunch::Launch() {
  const internal::BoundState& st = *state_;
  const internal::RuntimeImpl& rt = *st.kernel->runtime;
  if (!st.grid_from_expressions) {
    return rt.LaunchPacked(*st.variant, st.grid, st.stream, state_->buf, st.fallback);
  }
  KPACK_ASSIGN_OR_RETURN(Grid grid, rt.EvalGrid(*st.variant, st.args));
  return rt.LaunchPacked(*st.variant, grid, st.stream, state_->buf, st.fallback);
}

// ---- Runtime ----

Runtime::Runtime(std::unique_ptr<internal::RuntimeImpl> impl) : impl_(std::move(impl)) {}
Runtime::Runtime(Runtime&&) noexcept = default;
Runtime& Runtime::operator=(Runtime&&) noexcept = default;
Runtime::~Runtime() = default;

absl::StatusOr<Runtime> Runtime::Open(std::string_view dir, const Options& options) {
  KPACK_ASSIGN_OR_RETURN(std::unique_ptr<internal::RuntimeImpl> impl,
                         internal::RuntimeImpl::Create(internal::AbslView(dir), options));
  Runtime runtime(std::move(impl));
  if (options.preload) KPACK_RETURN_IF_ERROR(runtime.Preload());
  return runtime;
}

absl::StatusOr<Kernel> Runtime::Find(std::string_view name) const {
  const internal::KernelData* k = impl_->FindKernel(name);
  if (k == nullptr) {
    return absl::NotFoundError(absl::StrCat("no kernel named '", internal::AbslView(name),
                                            "' in pack '", impl_->dir(), "'"));
  }
  return internal::RuntimeImpl::MakeKernel(k);
}

std::vector<std::string> Runtime::kernel_names() const {
  std::vector<std::string> names;
  for (const auto& k : impl_->kernels()) names.push_back(k->spec->name);
  return names;
}

absl::Status Runtime::LaunchArgs(std::string_view name, const Grid& grid, CUstream stream,
                                 std::span<const Arg> args) const {
  const internal::KernelData* k = impl_->FindKernel(name);
  if (ABSL_PREDICT_FALSE(k == nullptr)) return Find(name).status();
  return impl_->LaunchArgs(*k, &grid, stream, args);
}

absl::Status Runtime::LaunchArgs(std::string_view name, CUstream stream,
                                 std::span<const Arg> args) const {
  const internal::KernelData* k = impl_->FindKernel(name);
  if (ABSL_PREDICT_FALSE(k == nullptr)) return Find(name).status();
  return impl_->LaunchArgs(*k, nullptr, stream, args);
}

absl::Status Runtime::Preload() {
  for (const auto& k : impl_->kernels()) {
    KPACK_RETURN_IF_ERROR(internal::RuntimeImpl::MakeKernel(k.get()).Preload());
  }
  return absl::OkStatus();
}

absl::Status Runtime::ReserveScratch(CUstream stream, size_t bytes) {
  return impl_->scratch().Reserve(stream, bytes);
}

Runtime::Stats Runtime::stats() const {
  Stats s;
  s.libraries_loaded = impl_->libraries_loaded();
  s.scratch_arenas = impl_->scratch().arenas();
  s.scratch_bytes = impl_->scratch().bytes();
  return s;
}

}  // namespace kpack
