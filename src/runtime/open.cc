// Opening a pack: read and validate it (pack/pack_state.h, the same code path as
// kpack::Pack::Read), load the driver, and build the immutable launch-time state
// (KernelData, VariantData) from what reading built.

#include <cuda.h>

#include <cstdlib>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
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

// A kernel with nothing to dispatch on gets `sole_variant`: Select then reads no argument.
void SetSoleVariant(KernelData& k) {
  if (k.variants.size() == 1 && k.dispatch.num_properties() == 0 && k.dispatch.num_buckets() == 1) {
    const DispatchTable::Choice only = k.dispatch.Select({});
    if (only.variant == 0 && !only.fallback) k.sole_variant = k.variants[0];
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
      k->variants.push_back(v.get());
      k->owned.push_back(std::move(v));
    }
    SetSoleVariant(*k);
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
    for (const auto& v : k->owned) {
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
absl::StatusOr<const KernelData*> RuntimeImpl::Restrict(const KernelData& k,
                                                        std::span<const std::string> variants,
                                                        bool ignore_buckets) const {
  const KernelSpec& ks = *k.spec;
  // The chosen variants in the kernel's order, so that ties in the ranking keep going to
  // the earlier variant of the manifest.
  std::vector<bool> chosen(ks.variants.size(), false);
  for (const std::string& name : variants) {
    size_t i = 0;
    while (i < ks.variants.size() && ks.variants[i].name != name) ++i;
    if (i == ks.variants.size()) {
      std::vector<std::string> names;
      for (const VariantSpec& v : ks.variants) names.push_back(v.name);
      return absl::InvalidArgumentError(absl::StrCat("kernel '", ks.name, "' has no variant '",
                                                     name, "' (it has: ",
                                                     absl::StrJoin(names, ", "), ")"));
    }
    if (chosen[i]) {
      return absl::InvalidArgumentError(
          absl::StrCat("kernel '", ks.name, "': variant '", name, "' is listed twice"));
    }
    chosen[i] = true;
  }
  if (variants.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("kernel '", ks.name, "': restricting it to no variant"));
  }
  if (variants.size() == ks.variants.size() && !(ignore_buckets && !ks.buckets.empty())) {
    return &k;  // every variant, same dispatch
  }
  // The key names the VariantData, so that restricting a view and restricting its kernel
  // to the same variants give the same view.
  std::string key = absl::StrCat(ks.name, ignore_buckets ? "|all" : "|buckets");
  for (size_t i = 0; i < chosen.size(); ++i) {
    if (chosen[i]) absl::StrAppend(&key, "|", reinterpret_cast<uintptr_t>(k.variants[i]));
  }
  std::lock_guard<std::mutex> lock(views_mu_);
  if (auto it = views_.find(key); it != views_.end()) return &it->second->data;

  auto view = std::make_unique<KernelView>();
  view->spec = ks;
  view->spec.variants.clear();
  view->info = *k.info;
  view->info.variants.clear();
  std::vector<std::string> kept;
  for (size_t i = 0; i < chosen.size(); ++i) {
    if (!chosen[i]) continue;
    view->spec.variants.push_back(ks.variants[i]);
    view->info.variants.push_back(k.info->variants[i]);
    view->data.variants.push_back(k.variants[i]);
    kept.push_back(ks.variants[i].name);
  }
  if (ignore_buckets) {
    view->spec.buckets.clear();
    view->info.buckets.clear();
    for (VariantSpec& v : view->spec.variants) v.bucket.clear();
    for (VariantInfo& v : view->info.variants) v.bucket.clear();
  }
  absl::StatusOr<DispatchTable> dispatch = DispatchTable::Build(view->spec);
  if (!dispatch.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("kernel '", ks.name, "' restricted to ",
                                                   absl::StrJoin(kept, ", "), ": ",
                                                   dispatch.status().message()));
  }
  KernelData& d = view->data;
  d.runtime = k.runtime;
  d.num_args = k.num_args;
  d.nvtx_domain = k.nvtx_domain;
  d.nvtx_message = k.nvtx_message;
  d.dispatch = *std::move(dispatch);
  d.spec = &view->spec;
  d.info = &view->info;
  SetSoleVariant(d);
  const KernelData* result = &d;
  views_.emplace(std::move(key), std::move(view));
  return result;
}

}  // namespace kpack::internal
