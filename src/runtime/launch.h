// The launch path. Every launch, by name, by Kernel or by BoundLaunch, runs these three
// steps and then one cuLaunchKernelEx (RuntimeImpl::LaunchPacked, launch.cc):
//
//   Select    the variant: bucket from the bucket arguments, then the property mask
//             (div16 / eq1 / integer fit) looked up in the kernel's DispatchTable;
//   PackArgs  the arguments into the variant's parameter buffer at the manifest's
//             offsets, checked against each slot's Triton type;
//   Prepare   the variant's CUfunction in the current context (loading it there on
//             first use), the scratch pointers, and the CUlaunchConfig.
//
// They are defined here, inline and always inlined, so that the launch functions in
// launch.cc compile into one straight-line body, while Bind and BoundLaunch::Set (and
// kpack's own tools) call the same code. Rules for everything in this file: no heap
// allocation, no lock, no string formatting, no logging on success; the error builders
// below are out of line and run only on failure.

#ifndef KPACK_SRC_RUNTIME_LAUNCH_H_
#define KPACK_SRC_RUNTIME_LAUNCH_H_

#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>

#include "absl/base/attributes.h"
#include "absl/base/optimization.h"
#include "absl/status/status.h"
#include "kpack/arg.h"
#include "launch/args.h"
#include "runtime/runtime_impl.h"
#include "util/status_macros.h"

namespace kpack::internal {

// Failure halves of the launch path (launch.cc): they format the message.
ABSL_ATTRIBUTE_NOINLINE absl::Status ArgCountError(const KernelData& k, size_t got);
ABSL_ATTRIBUTE_NOINLINE absl::Status BadArg(const VariantData& v, size_t i, const Arg& a);
ABSL_ATTRIBUTE_NOINLINE absl::Status BadDesc(const Driver& d, const VariantData& v, size_t i,
                                             const Arg& a, const DescResult& r);
ABSL_ATTRIBUTE_NOINLINE absl::Status GridError(const VariantData& v, const Grid& grid);
ABSL_ATTRIBUTE_NOINLINE absl::Status GridValueError(const VariantData& v, int axis);
ABSL_ATTRIBUTE_NOINLINE absl::Status LaunchError(const Driver& d, const VariantData& v,
                                                 CUresult r);
ABSL_ATTRIBUTE_NOINLINE absl::Status NoContextError(const Driver& d, const VariantData& v,
                                                    CUresult r);

ABSL_ATTRIBUTE_ALWAYS_INLINE inline absl::Status RuntimeImpl::PackArgs(
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
    if (slot.type == ParamType::kTensorDesc) {
      const DescResult r = PackDesc(*driver_, v.desc_slots[slot.desc], a, buf);
      if (ABSL_PREDICT_FALSE(r.problem != DescProblem::kOk)) return BadDesc(*driver_, v, i, a, r);
      continue;
    }
    if (ABSL_PREDICT_FALSE(!PackArg(slot.type, a, buf + slot.offset))) {
      return BadArg(v, i, a);
    }
  }
  return absl::OkStatus();
}

ABSL_ATTRIBUTE_ALWAYS_INLINE inline absl::Status RuntimeImpl::Select(
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

ABSL_ATTRIBUTE_ALWAYS_INLINE inline absl::Status RuntimeImpl::Prepare(
    const VariantData& v, const Grid& grid, CUstream stream, const ScratchAllocator* scratch,
    std::byte* buf, DriverLaunch* p) const {
  if (grid.x == 0 || grid.y == 0 || grid.z == 0) {  // Triton skips empty grids too
    p->function = nullptr;
    return absl::OkStatus();
  }
  const uint64_t grid_x = uint64_t{grid.x} * v.num_ctas;
  if (ABSL_PREDICT_FALSE(grid_x > std::numeric_limits<int32_t>::max())) {
    return GridError(v, grid);
  }
  // The current context, by its id (a thread-local read in the driver): a CUfunction
  // belongs to one context, and a context's handle may be reused by a new one.
  unsigned long long context = 0;  // NOLINT(runtime/int)
  const CUresult r = driver_->CtxGetId(nullptr, &context);
  if (ABSL_PREDICT_FALSE(r != CUDA_SUCCESS)) return NoContextError(*driver_, v, r);
  CUfunction function = v.home_function.load(std::memory_order_acquire);
  if (ABSL_PREDICT_FALSE(function == nullptr || v.home_context != context)) {
    KPACK_ASSIGN_OR_RETURN(function, FunctionFor(v, context, stream));
  }
  p->function = function;
  if (v.global_scratch_size != 0 || v.profile_scratch_size != 0) {
    KPACK_RETURN_IF_ERROR(FillScratch(v, grid, context, stream, scratch, buf));
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
}  // namespace kpack::internal

#endif  // KPACK_SRC_RUNTIME_LAUNCH_H_
