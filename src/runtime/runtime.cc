// The public facades: kpack::Runtime, Kernel and BoundLaunch over RuntimeImpl. Opening is
// in open.cc, loading in load.cc, the launch path in launch.h and launch.cc.

#include "kpack/runtime.h"

#include <cuda.h>

#include <algorithm>
#include <cstring>
#include <span>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "runtime/launch.h"
#include "runtime/runtime_impl.h"
#include "util/status_macros.h"

namespace kpack {
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

const KernelInfo& Kernel::info() const { return *data_->info; }

absl::StatusOr<Kernel> Kernel::Restrict(std::span<const std::string> variants,
                                        bool ignore_buckets) const {
  if (data_ == nullptr) return EmptyKernel();
  KPACK_ASSIGN_OR_RETURN(const internal::KernelData* view,
                         data_->runtime->Restrict(*data_, variants, ignore_buckets));
  return Kernel(view);
}

absl::Status Kernel::Preload() const {
  if (data_ == nullptr) return EmptyKernel();
  for (const auto& v : data_->variants) KPACK_RETURN_IF_ERROR(data_->runtime->Load(*v).status());
  return absl::OkStatus();
}

absl::Status Kernel::LaunchArgs(const Grid& grid, CUstream stream,
                                std::span<const Arg> args) const {
  if (ABSL_PREDICT_FALSE(data_ == nullptr)) return EmptyKernel();
  return data_->runtime->LaunchArgs(*data_, &grid, stream, args, nullptr);
}

absl::Status Kernel::LaunchArgs(CUstream stream, std::span<const Arg> args) const {
  if (ABSL_PREDICT_FALSE(data_ == nullptr)) return EmptyKernel();
  return data_->runtime->LaunchArgs(*data_, nullptr, stream, args, nullptr);
}

absl::Status Kernel::LaunchArgs(const Grid& grid, CUstream stream, std::span<const Arg> args,
                                const ScratchAllocator& scratch) const {
  if (ABSL_PREDICT_FALSE(data_ == nullptr)) return EmptyKernel();
  return data_->runtime->LaunchArgs(*data_, &grid, stream, args,
                                    scratch.allocate != nullptr ? &scratch : nullptr);
}

absl::Status Kernel::LaunchArgs(CUstream stream, std::span<const Arg> args,
                                const ScratchAllocator& scratch) const {
  if (ABSL_PREDICT_FALSE(data_ == nullptr)) return EmptyKernel();
  return data_->runtime->LaunchArgs(*data_, nullptr, stream, args,
                                    scratch.allocate != nullptr ? &scratch : nullptr);
}

absl::StatusOr<std::string_view> Kernel::SelectVariant(std::span<const Arg> args) const {
  if (data_ == nullptr) return EmptyKernel();
  internal::DispatchTable::Choice choice{};
  KPACK_RETURN_IF_ERROR(data_->runtime->Select(*data_, args, &choice));
  return std::string_view(data_->variants[choice.variant]->spec->name);
}

absl::StatusOr<Grid> Kernel::GridFor(std::span<const Arg> args) const {
  if (data_ == nullptr) return EmptyKernel();
  internal::DispatchTable::Choice choice{};
  KPACK_RETURN_IF_ERROR(data_->runtime->Select(*data_, args, &choice));
  return data_->runtime->EvalGrid(*data_->variants[choice.variant], args);
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
  state->variant = data_->variants[choice.variant];
  state->fallback = choice.fallback;
  state->buf = state->storage.bytes + state->variant->buffer_shift;
  KPACK_RETURN_IF_ERROR(rt.PackArgs(*state->variant, args, state->buf));
  state->args.assign(args.begin(), args.end());
  // The caller's descriptors need to live only for this call: keep copies, and point the
  // kept arguments at them.
  state->descs.resize(state->variant->desc_slots.size());
  for (size_t i = 0; i < args.size(); ++i) {
    const internal::ArgSlot& slot = state->variant->arg_slots[i];
    if (slot.type != internal::ParamType::kTensorDesc) continue;
    state->descs[slot.desc] = args[i].tensor_desc();
    state->args[i] = Arg(state->descs[slot.desc]);
  }
  if (grid != nullptr) {
    state->grid = *grid;
  } else {
    state->grid_from_expressions = true;
    KPACK_ASSIGN_OR_RETURN(state->evaluated, rt.EvalGrid(*state->variant, args));
    state->evaluated_version = state->version;
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

namespace {

// Set for a tensor descriptor: only its slots are written (the CUtensorMap re-encoded), and
// the BoundLaunch keeps a copy. A refused descriptor leaves the bound one in place.
absl::Status SetDesc(internal::BoundState& st, size_t index, const Arg& value) {
  const internal::VariantData& v = *st.variant;
  const internal::Driver& driver = st.kernel->runtime->driver();
  const internal::ArgSlot& slot = v.arg_slots[index];
  const internal::DescSlot& desc = v.desc_slots[slot.desc];
  internal::DescResult r = internal::PackDesc(driver, desc, value, st.buf);
  if (ABSL_PREDICT_FALSE(r.problem != internal::DescProblem::kOk)) {
    // The slots may be half written: the bound descriptor, which packed before, again.
    internal::PackDesc(driver, desc, st.args[index], st.buf);
    return internal::BadDesc(driver, v, index, value, r);
  }
  st.descs[slot.desc] = value.tensor_desc();
  return absl::OkStatus();
}

// The bound launch's grid: the one given, or its expressions' value for the arguments
// as they are, evaluated once per version (an error is evaluated again each time).
absl::StatusOr<const Grid*> BoundGrid(internal::BoundState& st) {
  if (!st.grid_from_expressions) return &st.grid;
  if (ABSL_PREDICT_FALSE(st.evaluated_version != st.version)) {
    KPACK_ASSIGN_OR_RETURN(st.evaluated, st.kernel->runtime->EvalGrid(*st.variant, st.args));
    st.evaluated_version = st.version;
  }
  return &st.evaluated;
}

}  // namespace

absl::Status BoundLaunch::Set(size_t index, Arg value) {
  internal::BoundState& st = *state_;
  const internal::KernelData& k = *st.kernel;
  if (ABSL_PREDICT_FALSE(index >= st.args.size())) {
    return absl::OutOfRangeError(absl::StrCat("kernel '", k.spec->name, "' has ", st.args.size(),
                                              " arguments; no index ", index));
  }
  ++st.version;  // even if refused: a refused value may leave bytes rewritten
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
    const internal::VariantData* variant = k.variants[choice.variant];
    if (variant != st.variant) {
      internal::ParamStorage packed;
      std::byte* const buf = packed.bytes + variant->buffer_shift;
      // PackArgs writes every byte of the buffer, the gaps and scratch pointers as zeros.
      absl::Status s = k.runtime->PackArgs(*variant, st.args, buf);
      if (!s.ok()) {
        st.args[index] = old;
        return s;
      }
      // A CUtensorMap is a plain value: it may move to another address.
      st.buf = st.storage.bytes + variant->buffer_shift;
      std::memcpy(st.buf, buf, variant->param_bytes);
      st.variant = variant;
      st.fallback = choice.fallback;
      return absl::OkStatus();
    }
    st.args[index] = old;
    st.fallback = choice.fallback;
  }
  const internal::ArgSlot& slot = st.variant->arg_slots[index];
  if (slot.type == internal::ParamType::kTensorDesc) return SetDesc(st, index, value);
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
  ++state_->version;
}
void BoundLaunch::set_stream(CUstream stream) { state_->stream = stream; }
void BoundLaunch::set_scratch_allocator(const ScratchAllocator& allocator) {
  state_->scratch = allocator;
}

absl::Status BoundLaunch::Launch() {
  internal::BoundState& st = *state_;
  const internal::RuntimeImpl& rt = *st.kernel->runtime;
  const ScratchAllocator* scratch = st.scratch.allocate != nullptr ? &st.scratch : nullptr;
  KPACK_ASSIGN_OR_RETURN(const Grid* grid, BoundGrid(st));
  return rt.LaunchPacked(*st.variant, *grid, st.stream, scratch, st.buf, st.fallback);
}

absl::StatusOr<PreparedLaunch> BoundLaunch::Prepare() {
  internal::BoundState& st = *state_;
  const internal::RuntimeImpl& rt = *st.kernel->runtime;
  KPACK_ASSIGN_OR_RETURN(const Grid* grid, BoundGrid(st));
  internal::RuntimeImpl::DriverLaunch& p = st.prepared;
  KPACK_RETURN_IF_ERROR(rt.Prepare(*st.variant, *grid, st.stream,
                                   st.scratch.allocate != nullptr ? &st.scratch : nullptr, st.buf,
                                   &p));
  PreparedLaunch out;
  out.function = p.function;
  if (p.function == nullptr) return out;  // an empty grid: nothing to launch
  out.config = p.config;
  out.params = st.buf;
  out.param_bytes = p.param_bytes;
  out.extra = p.param_bytes != 0 ? p.extra : nullptr;
  return out;
}

BoundLaunchSnapshot BoundLaunch::snapshot() const {
  const internal::BoundState& st = *state_;
  BoundLaunchSnapshot snap;
  snap.kernel = internal::RuntimeImpl::MakeKernel(st.kernel);
  // The kernel's description lists its variants in the order of its VariantData.
  const std::vector<const internal::VariantData*>& variants = st.kernel->variants;
  const size_t index =
      static_cast<size_t>(std::find(variants.begin(), variants.end(), st.variant) -
                          variants.begin());
  snap.variant = &st.kernel->info->variants[index];
  snap.fallback = st.fallback;
  if (!st.grid_from_expressions) snap.grid = st.grid;
  snap.stream = st.stream;
  snap.scratch = st.scratch;
  snap.args = st.args;
  snap.params = std::span<const std::byte>(st.buf, st.variant->param_bytes);
  return snap;
}

// ---- Runtime ----

Runtime::Runtime(std::unique_ptr<internal::RuntimeImpl> impl) : impl_(std::move(impl)) {}
Runtime::Runtime(Runtime&&) noexcept = default;
Runtime& Runtime::operator=(Runtime&&) noexcept = default;
Runtime::~Runtime() = default;

absl::StatusOr<Runtime> Runtime::Open(std::string_view dir, const Options& options) {
  KPACK_ASSIGN_OR_RETURN(std::unique_ptr<internal::RuntimeImpl> impl,
                         internal::RuntimeImpl::Create(internal::AbslView(dir), options));
  impl->set_scratch_allocator(options.scratch_allocator);
  Runtime runtime(std::move(impl));
  if (options.preload) KPACK_RETURN_IF_ERROR(runtime.Preload());
  return runtime;
}

absl::StatusOr<Kernel> Runtime::Find(std::string_view name) const {
  const internal::KernelData* k = impl_->FindKernel(name);
  if (k == nullptr) return impl_->pack().Find(name).status();  // lists the kernels
  return internal::RuntimeImpl::MakeKernel(k);
}

const Pack& Runtime::pack() const { return impl_->pack(); }

std::vector<std::string> Runtime::kernel_names() const {
  std::vector<std::string> names;
  for (const auto& k : impl_->kernels()) names.push_back(k->spec->name);
  return names;
}

absl::Status Runtime::LaunchArgs(std::string_view name, const Grid& grid, CUstream stream,
                                 std::span<const Arg> args) const {
  const internal::KernelData* k = impl_->FindKernel(name);
  if (ABSL_PREDICT_FALSE(k == nullptr)) return Find(name).status();
  return impl_->LaunchArgs(*k, &grid, stream, args, nullptr);
}

absl::Status Runtime::LaunchArgs(std::string_view name, CUstream stream,
                                 std::span<const Arg> args) const {
  const internal::KernelData* k = impl_->FindKernel(name);
  if (ABSL_PREDICT_FALSE(k == nullptr)) return Find(name).status();
  return impl_->LaunchArgs(*k, nullptr, stream, args, nullptr);
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

absl::Status Runtime::ReleaseScratch(CUstream stream) { return impl_->scratch().Release(stream); }

Runtime::Stats Runtime::stats() const {
  const internal::ScratchArenas::Stats scratch = impl_->scratch().stats();
  Stats s;
  s.libraries_loaded = impl_->libraries_loaded();
  s.scratch_arenas = scratch.stream_arenas;
  s.scratch_reserved = scratch.reserved;
  s.scratch_in_graphs = scratch.in_graphs;
  s.scratch_idle = scratch.idle;
  s.scratch_bytes = scratch.bytes;
  return s;
}

}  // namespace kpack