// Opening a pack: read and validate it (pack/pack_state.h, the same code path as
// kpack::Pack::Read), load the driver, and build the immutable launch-time state
// (KernelData, VariantData) from what reading built.

#include <cuda.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include "absl/strings/str_cat.h"
#include "runtime/runtime_impl.h"
#include "util/log.h"
#include "util/status_macros.h"

#if KPACK_ENABLE_NVTX
#include <nvtx3/nvToolsExt.h>
#endif

namespace kpack::internal {
namespace {

bool NvtxRequested(const Options& options) {
#if KPACK_ENABLE_NVTX
  const char* env = std::getenv("KPACK_NVTX");
  return options.nvtx && !(env != nullptr && std::string_view(env) == "0");
#else
  (void)options;
  return false;
#endif
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
  // A KPACK_LOG_LEVEL that names no level is refused here, where the user sees it, rather
  // than turning logging off.
  KPACK_RETURN_IF_ERROR(LogLevelFromEnvironment().status());
  std::unique_ptr<RuntimeImpl> rt(new RuntimeImpl());
  // Every check that needs no device, exactly as Pack::Read makes them; what it built for
  // the launch path (dispatch tables, compiled grids, cubins) is moved in below.
  KPACK_ASSIGN_OR_RETURN(ReadPackResult read, ReadPack(dir, {.keep_cubins = true}));
  KPACK_ASSIGN_OR_RETURN(rt->driver_, Driver::Load(options.driver_path));
  rt->pack_ = PackAccess::Make(read.state);
  rt->scratch_ = std::make_unique<ScratchArenas>(*rt->driver_);

#if KPACK_ENABLE_NVTX
  if (NvtxRequested(options)) rt->nvtx_domain_ = nvtxDomainCreateA("kpack");
#endif

  const ManifestSpec& manifest = read.state->manifest;
  rt->kernels_.reserve(manifest.kernels.size());
  rt->by_name_.reserve(manifest.kernels.size());
  for (size_t ki = 0; ki < manifest.kernels.size(); ++ki) {
    const KernelSpec& ks = manifest.kernels[ki];
    KernelTables& tables = read.tables[ki];
    auto k = std::make_unique<KernelData>();
    k->spec = &ks;
    k->info = &read.state->kernels[ki];
    k->runtime = rt.get();
    k->num_args = ks.args.size();
#if KPACK_ENABLE_NVTX
    if (rt->nvtx_domain_ != nullptr) {
      k->nvtx_domain = rt->nvtx_domain_;
      k->nvtx_message = nvtxDomainRegisterStringA(static_cast<nvtxDomainHandle_t>(rt->nvtx_domain_),
                                                  ks.name.c_str());
    }
#endif
    k->dispatch = std::move(tables.dispatch);
    k->variants.reserve(ks.variants.size());
    for (size_t vi = 0; vi < ks.variants.size(); ++vi) {
      const VariantSpec& vs = ks.variants[vi];
      auto v = std::make_unique<VariantData>();
      v->spec = &vs;
      v->kernel = k.get();
      v->arg_slots.assign(ks.args.size(), {ArgSlot::kDropped, ParamType::kConstexpr});
      v->grid = tables.variants[vi].grid;
      for (const SlotSpec& slot : vs.layout) {
        switch (slot.kind) {
          case SlotKind::kArg:
            // A descriptor's first part (tma or base) stands for it; its parts are in
            // desc_slots.
            if (slot.part == DescPart::kNone || slot.part == DescPart::kTma ||
                slot.part == DescPart::kBase) {
              v->arg_slots[slot.arg].offset = static_cast<uint16_t>(slot.offset);
            }
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
      for (size_t d = 0; d < vs.descs.size(); ++d) {
        v->arg_slots[vs.descs[d].arg].desc = static_cast<uint8_t>(d);
        v->desc_slots.push_back(MakeDescSlot(vs, vs.descs[d]));
      }
      v->param_bytes = vs.param_bytes;
      v->buffer_shift = (64 - vs.tma_offset_mod64) % 64;
      v->block_x = 32u * static_cast<uint32_t>(vs.num_warps);
      v->num_ctas = static_cast<uint32_t>(vs.num_ctas);
      v->shared = vs.shared;
      v->global_scratch_size = vs.global_scratch_size;
      v->profile_scratch_size = vs.profile_scratch_size;
      v->profile_scratch_align = vs.profile_scratch_align;
      BuildLaunchAttributes(*v);
      v->cubin = std::move(tables.variants[vi].cubin);
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
  Log().info("opened pack '{}': {} kernels, driver '{}'", rt->dir(), rt->kernels_.size(),
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
}  // namespace kpack::internal
