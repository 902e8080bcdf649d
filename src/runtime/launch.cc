// The launch path's out-of-line half: the launch entry points that send a packed buffer,
// grid evaluation, and the error builders. The inline steps are in launch.h.

#include "runtime/launch.h"

#include <cuda.h>

#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

#if KPACK_ENABLE_NVTX
#include <nvtx3/nvToolsExt.h>
#endif

#if KPACK_LAUNCH_STAMPS
extern "C" {
uint64_t kpack_launch_stamps[4] = {};
}
#endif

namespace kpack::internal {

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

ABSL_ATTRIBUTE_NOINLINE absl::Status BadDesc(const Driver& d, const VariantData& v, size_t i,
                                             const Arg& a, const DescResult& r) {
  const KernelSpec& k = *v.kernel->spec;
  const TensorDescSpec& spec = v.spec->descs[v.arg_slots[i].desc];
  return DescError(d, Describe(v), i, k.arg(static_cast<int>(i)), spec, a, r);
}

ABSL_ATTRIBUTE_NOINLINE absl::Status GridError(const VariantData& v, const Grid& grid) {
  return absl::InvalidArgumentError(
      absl::StrCat(Describe(v), ": grid (", grid.x, ", ", grid.y, ", ", grid.z, ") with num_ctas ",
                   v.num_ctas, " exceeds the driver's limits: 2^31-1 blocks along x (grid x "
                   "times num_ctas), ", kMaxGridYZ, " along y and z"));
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

ABSL_ATTRIBUTE_NOINLINE absl::Status NoContextError(const Driver& d, const VariantData& v,
                                                    CUresult r) {
  return ContextError(d, r, absl::StrCat("launching ", Describe(v)));
}

absl::Status RuntimeImpl::PackOne(const VariantData& v, size_t i, const Arg& a,
                                  std::byte* buf) const {
  const ArgSlot& slot = v.arg_slots[i];
  if (slot.offset == ArgSlot::kDropped) return absl::OkStatus();  // eq1: dispatch checked it
  if (slot.type == ParamType::kTensorDesc) return PackDescArg(v, i, a, buf);
  if (ABSL_PREDICT_FALSE(!PackArg(slot.type, a, buf + slot.offset))) return BadArg(v, i, a);
  return absl::OkStatus();
}

absl::Status RuntimeImpl::PackEach(const VariantData& v, std::span<const Arg> args,
                                   std::byte* buf) const {
  for (size_t i = 0; i < args.size(); ++i) KPACK_RETURN_IF_ERROR(PackOne(v, i, args[i], buf));
  return absl::OkStatus();
}

namespace {

// `a` * `b` into `out`; false on overflow.
bool Mul(uint64_t a, uint64_t b, uint64_t* out) { return !__builtin_mul_overflow(a, b, out); }

}  // namespace

// Scratch sizes are products of the grid, num_ctas and per-program sizes from the pack:
// each is checked, so that a huge grid is an error and never a short buffer.
absl::Status RuntimeImpl::FillScratch(const VariantData& v, const Grid& grid, uint64_t context,
                                      CUstream stream, const ScratchAllocator* scratch,
                                      std::byte* buf) const {
  uint64_t blocks = 0, global_bytes = 0, profile_bytes = 0;
  if (!Mul(uint64_t{grid.x} * grid.y, grid.z, &blocks) || !Mul(blocks, v.num_ctas, &blocks) ||
      !Mul(blocks, v.global_scratch_size, &global_bytes) ||
      !Mul(blocks, v.profile_scratch_size, &profile_bytes)) {
    return absl::InvalidArgumentError(absl::StrCat(
        Describe(v), ": the scratch memory for grid (", grid.x, ", ", grid.y, ", ", grid.z,
        ") overflows 64 bits"));
  }
  if (scratch == nullptr && scratch_allocator_.allocate != nullptr) scratch = &scratch_allocator_;
  CUdeviceptr global = 0, profile = 0;
  if (scratch != nullptr) {
    // The caller's memory, asked for as Triton asks its allocator: one buffer per kind.
    for (auto [bytes, align, out] :
         {std::tuple{global_bytes, uint64_t{v.spec->global_scratch_align}, &global},
          std::tuple{profile_bytes, v.profile_scratch_align, &profile}}) {
      if (bytes == 0) continue;
      *out = scratch->allocate(bytes, align, stream, scratch->user_data);
      if (*out == 0 || *out % align != 0) {
        return absl::ResourceExhaustedError(absl::StrCat(
            Describe(v), ": the ScratchAllocator returned ", *out == 0 ? "null" : "a misaligned "
            "pointer", " for ", bytes, " bytes of scratch aligned to ", align));
      }
    }
  } else {
    // kpack's arena: global scratch, then profile scratch at its alignment.
    const uint64_t align = v.profile_scratch_align;
    const uint64_t profile_start = (global_bytes + align - 1) / align * align;
    if (profile_start < global_bytes || profile_start + profile_bytes < profile_start) {
      return absl::InvalidArgumentError(
          absl::StrCat(Describe(v), ": the scratch memory for this grid overflows 64 bits"));
    }
    absl::StatusOr<CUdeviceptr> base = scratch_->Get(stream, context, profile_start + profile_bytes);
    if (!base.ok()) {
      return absl::Status(base.status().code(),
                          absl::StrCat(Describe(v), ": ", base.status().message()));
    }
    global = *base;
    profile = *base + profile_start;
  }
  if (v.global_scratch_size != 0) CopyBytes<8>(buf + v.global_scratch_offset, &global);
  if (v.profile_scratch_size != 0) CopyBytes<8>(buf + v.profile_scratch_offset, &profile);
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

// Inlined into LaunchPacked (the launch path) and Send (kpack::StepGraph's, which sends
// launches it prepared all at once).
ABSL_ATTRIBUTE_ALWAYS_INLINE inline absl::Status RuntimeImpl::SendInline(const VariantData& v,
                                                                        const DriverLaunch& p,
                                                                        bool fallback) const {
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
                                       p.param_bytes != 0 ? const_cast<void**>(p.extra) : nullptr);
#if KPACK_ENABLE_NVTX
  if (domain != nullptr) nvtxDomainRangePop(domain);
#endif
  if (ABSL_PREDICT_FALSE(r != CUDA_SUCCESS)) return LaunchError(*driver_, v, r);
  CounterShard& counters = v.counters[ThreadShard()];
  counters.launches.fetch_add(1, std::memory_order_relaxed);
  if (fallback) counters.fallbacks.fetch_add(1, std::memory_order_relaxed);
  return absl::OkStatus();
}

absl::Status RuntimeImpl::LaunchPacked(const VariantData& v, const Grid& grid, CUstream stream,
                                       const ScratchAllocator* scratch, std::byte* buf,
                                       bool fallback) const {
  KPACK_LAUNCH_STAMP(0);
  KPACK_LAUNCH_STAMP(1);
  KPACK_LAUNCH_STAMP(2);
  DriverLaunch p;
  KPACK_RETURN_IF_ERROR(Prepare(v, grid, stream, scratch, buf, &p));
  KPACK_LAUNCH_STAMP(3);
  return SendInline(v, p, fallback);
}

absl::Status RuntimeImpl::Send(const VariantData& v, const DriverLaunch& p, bool fallback) const {
  return SendInline(v, p, fallback);
}

absl::Status RuntimeImpl::LaunchArgs(const KernelData& k, const Grid* grid, CUstream stream,
                                     std::span<const Arg> args,
                                     const ScratchAllocator* scratch) const {
  KPACK_LAUNCH_STAMP(0);
  DispatchTable::Choice choice{};
  KPACK_RETURN_IF_ERROR(Select(k, args, &choice));
  KPACK_LAUNCH_STAMP(1);
  // The sole variant, when there is one, without reading the variants vector.
  const VariantData& v = k.sole_variant != nullptr ? *k.sole_variant : *k.variants[choice.variant];
  ParamStorage storage;
  std::byte* const buf = storage.bytes + v.buffer_shift;
  KPACK_RETURN_IF_ERROR(PackArgs(v, args, buf));
  KPACK_LAUNCH_STAMP(2);
  Grid computed;
  if (grid == nullptr) {
    if (ABSL_PREDICT_FALSE(!GridOf(v, args, &computed))) return EvalGrid(v, args).status();
    grid = &computed;
  }
  DriverLaunch p;
  KPACK_RETURN_IF_ERROR(Prepare(v, *grid, stream, scratch, buf, &p));
  KPACK_LAUNCH_STAMP(3);
  return SendInline(v, p, choice.fallback);
}
}  // namespace kpack::internal
