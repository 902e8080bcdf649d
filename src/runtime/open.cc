// Opening a pack: read and validate it (pack/pack_state.h, the same code path as
// kpack::Pack::Read), load the driver, and build the immutable launch-time state
// (KernelData, VariantData) from what reading built.

#include <cuda.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstdlib>
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

// The kinds a PackOp passes: (kind & mask) == want.
struct KindTest {
  uint8_t mask;
  uint8_t want;
};
constexpr uint8_t K(Arg::Kind kind) { return static_cast<uint8_t>(kind); }
constexpr KindTest Exactly(Arg::Kind kind) { return {0xff, K(kind)}; }
// `a` or `b`, which must differ in exactly one bit (asserted where it is used).
constexpr bool OneBitApart(Arg::Kind a, Arg::Kind b) {
  return std::has_single_bit(static_cast<unsigned>(K(a) ^ K(b)));
}
constexpr KindTest Either(Arg::Kind a, Arg::Kind b) {
  return {static_cast<uint8_t>(~(K(a) ^ K(b))), static_cast<uint8_t>(K(a) & K(b))};
}
// A pointer parameter takes T* and CUdeviceptr; a u64 one, CUdeviceptr and the other
// unsigned integers (no range to check at 64 bits).
static_assert(OneBitApart(Arg::Kind::kHostTypedPointer, Arg::Kind::kDevicePtr));
static_assert(OneBitApart(Arg::Kind::kDevicePtr, Arg::Kind::kUnsigned));
constexpr KindTest kPointerKinds = Either(Arg::Kind::kHostTypedPointer, Arg::Kind::kDevicePtr);
constexpr KindTest kU64Kinds = Either(Arg::Kind::kDevicePtr, Arg::Kind::kUnsigned);

// The packing plan of a variant (VariantData::pack_ops and pack_more; PackArgs runs it).
// Per call argument, the group its slot type falls in and the Arg kinds that group packs
// without PackArg: exactly the kinds for which PackArg would store the same bytes (a C++
// caller's usual types, and the double a Python float becomes for an fp32 parameter).
// Every other kind is PackArg's when a launch brings one. Then the zero stores: every
// byte of the buffer that no argument slot covers is written at every launch, so that
// the kernel and the driver never see what the buffer held before.
void BuildPackPlan(VariantData& v) {
  std::vector<PackOp> pointer, copy8, i32, fp32;
  std::vector<uint32_t> generic, copy8_tests;
  for (size_t a = 0; a < v.arg_slots.size(); ++a) {
    const ArgSlot& slot = v.arg_slots[a];
    if (slot.offset == ArgSlot::kDropped) continue;  // eq1: nothing to pack
    KindTest test{};
    std::vector<PackOp>* group = nullptr;
    switch (slot.type) {
      case ParamType::kPointer:  // the kinds' test is PackArgs's own (kPointerKinds)
        test = kPointerKinds;
        group = &pointer;
        break;
      case ParamType::kI64:
        test = Exactly(Arg::Kind::kSigned);
        group = &copy8;
        break;
      case ParamType::kU64:
        test = kU64Kinds;
        group = &copy8;
        break;
      case ParamType::kFp64:
        test = Exactly(Arg::Kind::kFloat64);
        group = &copy8;
        break;
      case ParamType::kI32:  // kSigned and a value that fits: PackArgs's own test
        test = Exactly(Arg::Kind::kSigned);
        group = &i32;
        break;
      case ParamType::kFp32:  // kFloat32 or kFloat64: PackArgs tests the kind itself
        group = &fp32;
        break;
      default:  // conversions (fp16, bf16), range checks (8/16-bit, u32), descriptors
        break;
    }
    if (group == nullptr || a * sizeof(Arg) > UINT16_MAX) {
      generic.push_back(static_cast<uint32_t>(a));
    } else {
      group->push_back({slot.offset, static_cast<uint16_t>(a * sizeof(Arg))});
      if (group == &copy8) copy8_tests.push_back(test.mask | uint32_t{test.want} << 8);
    }
  }
  // The bytes no argument slot covers (alignment gaps, the scratch pointers, which
  // Prepare fills at a launch that has scratch), covered by zero stores of
  // kZeroStoreBytes that stay inside the buffer. A store may overlap argument bytes: the
  // packing writes those after it, and fills every byte of each slot it writes (PackArg
  // and PackDesc store the slot's size). Too many stores: one memset instead.
  std::vector<bool> covered(v.param_bytes, false);
  for (const SlotSpec& slot : v.spec->layout) {
    if (slot.kind != SlotKind::kArg) continue;
    for (uint32_t b = slot.offset; b < slot.offset + slot.size && b < v.param_bytes; ++b) {
      covered[b] = true;
    }
  }
  constexpr size_t kMaxZeroStores = 8;
  std::vector<uint32_t> zeros;
  for (uint32_t b = 0; b < v.param_bytes && !v.zero_all; ++b) {
    if (covered[b]) continue;
    if (v.param_bytes < kZeroStoreBytes || zeros.size() == kMaxZeroStores) {
      v.zero_all = true;
      break;
    }
    const uint32_t at = std::min(b, v.param_bytes - kZeroStoreBytes);
    zeros.push_back(at);
    b = at + kZeroStoreBytes - 1;  // the loop's ++b moves past the store
  }
  if (v.zero_all) zeros.clear();

  v.num_args = static_cast<uint32_t>(v.arg_slots.size());
  v.num_pointer = static_cast<uint16_t>(pointer.size());
  v.num_copy8 = static_cast<uint16_t>(copy8.size());
  v.num_i32 = static_cast<uint16_t>(i32.size());
  v.num_fp32 = static_cast<uint16_t>(fp32.size());
  v.num_generic = static_cast<uint32_t>(generic.size());
  v.num_zero_stores = static_cast<uint16_t>(zeros.size());
  for (const std::vector<PackOp>* group : {&pointer, &copy8, &i32, &fp32}) {
    v.plan_ops.insert(v.plan_ops.end(), group->begin(), group->end());
  }
  v.plan_more = std::move(generic);
  v.plan_more.insert(v.plan_more.end(), zeros.begin(), zeros.end());
  v.plan_more.insert(v.plan_more.end(), copy8_tests.begin(), copy8_tests.end());
  v.pack_ops = v.plan_ops.data();
  v.pack_more = v.plan_more.data();
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
      v->has_grid = !ks.grid.empty();
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
      for (size_t a = 0; a < ks.args.size(); ++a) v->arg_slots[a].type = vs.arg_types[a];
      for (size_t d = 0; d < vs.descs.size(); ++d) {
        v->arg_slots[vs.descs[d].arg].desc = static_cast<uint8_t>(d);
        v->desc_slots.push_back(MakeDescSlot(vs, vs.descs[d]));
      }
      if (!v->desc_slots.empty()) {
        v->desc_memos = std::make_unique<DescMemo[]>(v->desc_slots.size());
        for (size_t d = 0; d < v->desc_slots.size(); ++d) {
          if (v->desc_slots[d].tma) v->desc_slots[d].memo = &v->desc_memos[d];
        }
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
      BuildPackPlan(*v);
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
