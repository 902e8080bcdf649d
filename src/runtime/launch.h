// The launch path. Every launch, by name, by Kernel or by BoundLaunch, runs these three
// steps and then one cuLaunchKernelEx (RuntimeImpl::SendInline, launch.cc; a launch from
// call arguments runs all of them in the one body of RuntimeImpl::LaunchArgs, a
// BoundLaunch calls LaunchPacked, Prepare and the send):
//
//   Select    the variant: bucket from the bucket arguments, then the property mask
//             (div16 / eq1 / integer fit) looked up in the kernel's DispatchTable;
//   PackArgs  the arguments into the variant's parameter buffer at the manifest's
//             offsets, checked against each slot's Triton type, by the variant's
//             packing plan (PackOp);
//   Prepare   the variant's CUfunction in the current context (loading it there on
//             first use), the scratch pointers, and the CUlaunchConfig.
//
// They are defined here, inline and always inlined, so that the launch functions in
// launch.cc compile into one straight-line body, while Bind and BoundLaunch::Set (and
// kpack's own tools) call the same code. Rules for everything in this file: no heap
// allocation, no lock, no string formatting, no logging on success; the error builders
// below are out of line and run only on failure; bytes are copied with CopyBytes and
// ZeroBytes (util/bytes.h), never std::memcpy, which a fortified build (_FORTIFY_SOURCE,
// Ubuntu's default) turns into a library call per copy into the stack buffer.

#ifndef KPACK_SRC_RUNTIME_LAUNCH_H_
#define KPACK_SRC_RUNTIME_LAUNCH_H_

#include <cuda.h>

#include <bit>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>

#include "absl/base/attributes.h"
#include "absl/base/optimization.h"
#include "absl/status/status.h"
#include "kpack/arg.h"
#include "launch/args.h"
#include "runtime/runtime_impl.h"
#include "util/bytes.h"
#include "util/status_macros.h"

#if KPACK_LAUNCH_STAMPS
#include "util/ticks.h"
// Profiling builds only (CMake -DKPACK_LAUNCH_STAMPS=ON): Ticks() at the launch path's
// steps, kpack_launch_stamps[0] on entry, [1] after Select, [2] after PackArgs, [3] after
// Prepare (a BoundLaunch stamps [0] to [2] on entry), read by bench/launch_split.cc.
// One array for the process: a profile of one launching thread.
extern "C" uint64_t kpack_launch_stamps[4];
// The empty asm keeps the compiler from moving memory accesses across a stamp.
#define KPACK_LAUNCH_STAMP(i)                             \
  do {                                                    \
    asm volatile("" ::: "memory");                        \
    kpack_launch_stamps[i] = ::kpack::internal::Ticks(); \
    asm volatile("" ::: "memory");                        \
  } while (0)
#else
#define KPACK_LAUNCH_STAMP(i) \
  do {                        \
  } while (0)
#endif

namespace kpack::internal {

// The driver's largest grid along y and z (CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y/Z on every
// GPU kpack targets); along x it is 2^31-1 blocks, the grid times num_ctas.
inline constexpr uint32_t kMaxGridYZ = 65535;

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

ABSL_ATTRIBUTE_ALWAYS_INLINE inline absl::Status RuntimeImpl::PackDescArg(
    const VariantData& v, size_t i, const Arg& a, std::byte* buf) const {
  const DescResult r = PackDesc(*driver_, v.desc_slots[v.arg_slots[i].desc], a, buf);
  if (ABSL_PREDICT_FALSE(r.problem != DescProblem::kOk)) return BadDesc(*driver_, v, i, a, r);
  return absl::OkStatus();
}

// PackArgs runs the variant's plan (PackOp, built at Open). Its four loops store every
// argument of their group without a branch and fold their checks into `bad_kind` and
// `bad_value`, which stay zero while every check passes. When some check fails, PackEach
// packs the whole call again, argument by argument through PackArg's checks and
// conversions, and returns the first bad argument's error in call order. A group packs
// only kinds that PackArg stores the same way, so the bytes and the status are PackEach's
// in every case, and a well-typed call pays two loads, a kind test and a store per
// argument; the other arguments (conversions, narrow integers, descriptors) go through
// PackOne, in call order, after the groups.
ABSL_ATTRIBUTE_ALWAYS_INLINE inline absl::Status RuntimeImpl::PackArgs(
    const VariantData& v, std::span<const Arg> args, std::byte* buf) const {
  if (ABSL_PREDICT_FALSE(args.size() != v.num_args)) {
    return ArgCountError(*v.kernel, args.size());
  }
  const uint32_t* const more = v.pack_more;
  if (ABSL_PREDICT_FALSE(v.zero_all)) {
    ZeroBytes(buf, v.param_bytes);
  } else {
    const uint32_t* const zero = more + v.num_generic;
    static constexpr std::byte kNone[kZeroStoreBytes] = {};
    for (uint32_t z = 0, n = v.num_zero_stores; z < n; ++z) {
      CopyBytes<kZeroStoreBytes>(buf + zero[z], kNone);
    }
  }
  // An Arg is its 8 payload bytes, then its kind byte (kpack/arg.h).
  const auto* const a = reinterpret_cast<const unsigned char*>(args.data());
  const PackOp* op = v.pack_ops;
  // Pointer slots: every kind byte ORed together. The pointer kinds are 0 and 1, so the
  // OR stays within bit 0 exactly when every one of them is a pointer kind.
  static_assert(static_cast<unsigned>(Arg::Kind::kHostTypedPointer) == 0 &&
                static_cast<unsigned>(Arg::Kind::kDevicePtr) == 1);
  unsigned char pointer_kinds = 0;
#pragma GCC unroll 2
  for (const PackOp* const end = op + v.num_pointer; op != end; ++op) {
    uint64_t bits;
    CopyBytes<8>(&bits, a + op->arg_byte);
    pointer_kinds |= a[op->arg_byte + 8];
    CopyBytes<8>(buf + op->offset, &bits);
  }
  unsigned char bad_kind = pointer_kinds & ~1u;  // a byte: the kind tests are byte operations
  uint64_t bad_value = 0;
  // The other 8-byte slots: each op's kind test follows the zero stores in pack_more.
  const uint32_t* test = more + v.num_generic + v.num_zero_stores;
  for (const PackOp* const end = op + v.num_copy8; op != end; ++op, ++test) {
    uint64_t bits;
    CopyBytes<8>(&bits, a + op->arg_byte);
    bad_kind |= (a[op->arg_byte + 8] & *test) ^ (*test >> 8);
    CopyBytes<8>(buf + op->offset, &bits);
  }
  // i32 slots: every kind is kSigned exactly when their OR and their AND both are.
  constexpr auto kSigned = static_cast<unsigned char>(Arg::Kind::kSigned);
  unsigned char i32_or = kSigned, i32_and = kSigned;
#pragma GCC unroll 2
  for (const PackOp* const end = op + v.num_i32; op != end; ++op) {
    uint64_t bits;
    CopyBytes<8>(&bits, a + op->arg_byte);
    const auto low = static_cast<uint32_t>(bits);
    i32_or |= a[op->arg_byte + 8];
    i32_and &= a[op->arg_byte + 8];
    bad_value |= bits ^ static_cast<uint64_t>(static_cast<int64_t>(static_cast<int32_t>(low)));
    CopyBytes<4>(buf + op->offset, &low);
  }
  bad_kind |= (i32_or ^ kSigned) | (i32_and ^ kSigned);
  // fp32: a float's bits, or a double rounded to float (what a Python float becomes).
  static_assert(static_cast<unsigned>(Arg::Kind::kFloat64) ==
                static_cast<unsigned>(Arg::Kind::kFloat32) + 1);
  for (const PackOp* const end = op + v.num_fp32; op != end; ++op) {
    uint64_t bits;
    CopyBytes<8>(&bits, a + op->arg_byte);
    const unsigned kind = a[op->arg_byte + 8];
    const bool is_double = kind == static_cast<unsigned>(Arg::Kind::kFloat64);
    // Only a double is converted: a float's bits read as a double are a denormal, which
    // costs some CPUs a slow conversion.
    const float rounded = static_cast<float>(std::bit_cast<double>(is_double ? bits : 0));
    const uint32_t value =
        is_double ? std::bit_cast<uint32_t>(rounded) : static_cast<uint32_t>(bits);
    bad_kind |= (kind - static_cast<unsigned>(Arg::Kind::kFloat32)) > 1;  // neither of the two
    CopyBytes<4>(buf + op->offset, &value);
  }
  if (ABSL_PREDICT_FALSE((bad_kind | bad_value) != 0)) return PackEach(v, args, buf);
  for (uint32_t g = 0; g < v.num_generic; ++g) {
    const size_t i = more[g];
    // A descriptor without the PackOne call (which makes the same one).
    KPACK_RETURN_IF_ERROR(v.arg_slots[i].type == ParamType::kTensorDesc
                              ? PackDescArg(v, i, args[i], buf)
                              : PackOne(v, i, args[i], buf));
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

// The grid from the variant's grid expressions; false when the kernel has none or an
// axis fails to evaluate or falls outside [0, 2^32) (RuntimeImpl::EvalGrid says which).
ABSL_ATTRIBUTE_ALWAYS_INLINE inline bool GridOf(const VariantData& v, std::span<const Arg> args,
                                                Grid* grid) {
  if (ABSL_PREDICT_FALSE(!v.has_grid)) return false;
  int64_t dims[3];
  for (int axis = 0; axis < 3; ++axis) {
    if (ABSL_PREDICT_FALSE(!v.grid[axis].Evaluate(args, &dims[axis]) ||
                           static_cast<uint64_t>(dims[axis]) > UINT32_MAX)) {
      return false;
    }
  }
  *grid = {static_cast<uint32_t>(dims[0]), static_cast<uint32_t>(dims[1]),
           static_cast<uint32_t>(dims[2])};
  return true;
}

ABSL_ATTRIBUTE_ALWAYS_INLINE inline absl::Status RuntimeImpl::Prepare(
    const VariantData& v, const Grid& grid, CUstream stream, const ScratchAllocator* scratch,
    std::byte* buf, DriverLaunch* p) const {
  if (grid.x == 0 || grid.y == 0 || grid.z == 0) {  // Triton skips empty grids too
    p->function = nullptr;
    return absl::OkStatus();
  }
  const uint64_t grid_x = uint64_t{grid.x} * v.num_ctas;
  if (ABSL_PREDICT_FALSE(grid_x > std::numeric_limits<int32_t>::max() ||
                         grid.y > kMaxGridYZ || grid.z > kMaxGridYZ)) {
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
