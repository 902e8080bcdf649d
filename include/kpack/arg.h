// kpack/arg.h: launch arguments and grids.
//
// A `kpack::Arg` is one call argument, tagged with the C++ type it came from. The runtime
// checks it against the parameter's Triton type at launch and converts it into the slot.
// A mismatch is an error that names the parameter, never a silent bad launch.
//
// Floating-point scalars. A float or double is converted exactly as Triton 3.6's launcher
// converts a Python float of the same value (a float widens to double exactly), so a
// kernel gets the same bits from kpack as from Triton's JIT:
//  - fp64: the double;
//  - fp32: the double rounded to float (4 bytes, never a double);
//  - fp16: the double rounded once to the nearest half, ties to even (CPython's
//    PyFloat_Pack2). Not through float: 1 + 2^-11 + 2^-40 gives 0x3c01, not 0x3c00.
//    NaN gives 0x7e00 (with its sign). A finite value that rounds beyond 65504 is
//    INVALID_ARGUMENT and nothing launches (Triton raises OverflowError);
//  - bf16: the double rounded to float, then its upper 16 bits: truncated, not rounded
//    (0.1 gives 0x3dcc, where the nearest bf16 is 0x3dcd).
// For other bits pass kpack::Half / kpack::BFloat16, which go to the slot unchanged.
//
// C++ types and the parameters they fit (a table, not compiled):
//   Pointers        T*, void*, CUdeviceptr          -> pointer params (`*fp32`, ...)
//   Integers        any integral type but bool      -> iN/uN params, range-checked
//   bool                                            -> i1/u1 params
//   float, double                                   -> fp16/bf16/fp32/fp64 params
//   kpack::Half, kpack::BFloat16 (raw bit patterns) -> fp16 / bf16 params only
//   const kpack::TensorDesc&                        -> tensordesc<...> params only
//
// `CUdeviceptr` is `unsigned long long`, so a value of that type is a device pointer; it
// is also accepted by 64-bit integer parameters (u64/i64, range-checked), because the same
// C++ type is often used for both. Use int64_t/uint64_t for plain integers.
//
// Arg is a trivially copyable 16-byte value; building one allocates nothing.
//
// Tensor descriptors. A `tensordesc<DTYPE[B0, ...]>` parameter (a Triton kernel taking a
// host TensorDescriptor, e.g. for Hopper's TMA) takes a kpack::TensorDesc: the tensor's
// device address, shape and strides (in elements, outer dimension first, as torch and
// Triton give them) and the padding for out-of-bounds loads. The block shape is the
// chosen variant's (its compiled type), so one TensorDesc serves every variant of an
// autotuned kernel. The Arg made from it points at it, so the TensorDesc must stay alive
// for the call that takes the Arg (a launch, Bind, BoundLaunch::Set, SelectVariant,
// GridFor); Launch(grid, stream, desc, ...) and BindArgs(...) take care of that. A
// BoundLaunch keeps its own copy. At launch kpack checks it as Triton's TensorDescriptor
// and launcher do (rank, last stride 1, 16-byte aligned base and positive strides, shape
// within i32, NaN padding only for floating-point elements) and, for a variant that lowered it to
// TMA, encodes the CUtensorMap with cuTensorMapEncodeTiled into the parameter buffer. Each
// TMA parameter of a variant remembers the last 4 descriptors it encoded, compared field
// by field: a launch with one of those copies its 128-byte map instead of checking and
// encoding it again (a map depends only on these fields, so nothing ever needs to be
// invalidated; see DescMemo in src/launch/tensordesc.h).

#ifndef KPACK_ARG_H_
#define KPACK_ARG_H_

#include <cuda.h>

#include <bit>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <type_traits>

namespace kpack {

// The raw 16-bit pattern of an IEEE half. Passed unchanged to `fp16` parameters.
struct Half {
  uint16_t bits;
};

// The raw 16-bit pattern of a bfloat16. Passed unchanged to `bf16` parameters.
struct BFloat16 {
  uint16_t bits;
};

// Out-of-bounds fill of a tensor descriptor's loads (Triton's `padding`).
enum class TensorDescPadding : uint8_t {
  kZero,  // "zero" (CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE: zeros)
  kNan,   // "nan" (CU_TENSOR_MAP_FLOAT_OOB_FILL_NAN_REQUEST_ZERO_FMA; floating point only)
};

// A tensor as a tensordesc parameter sees it (see "Tensor descriptors" above).
struct TensorDesc {
  static constexpr int kMaxRank = 5;
  CUdeviceptr base = 0;           // 16-byte aligned
  int rank = 0;                   // 1..5: the parameter's block rank
  int64_t shape[kMaxRank] = {};   // elements per dimension, outer first; each in [1, 2^31)
  int64_t strides[kMaxRank] = {};  // in elements; strides[rank - 1] must be 1, the others
                                   // positive multiples of 16 bytes
  TensorDescPadding padding = TensorDescPadding::kZero;

  // A contiguous (row-major) tensor of `shape` at `base`. A stride that would not fit in
  // int64 (a hostile shape) is INT64_MAX, which the launch refuses.
  static TensorDesc RowMajor(CUdeviceptr base, std::initializer_list<int64_t> shape,
                             TensorDescPadding padding = TensorDescPadding::kZero) {
    TensorDesc d;
    d.base = base;
    d.padding = padding;
    for (int64_t n : shape) {
      if (d.rank == kMaxRank) {
        d.rank = kMaxRank + 1;  // refused at launch, naming the parameter
        break;
      }
      d.shape[d.rank++] = n;
    }
    constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
    int64_t stride = 1;
    for (int i = d.rank < kMaxRank ? d.rank : kMaxRank; i-- > 0;) {
      d.strides[i] = stride;
      const int64_t n = d.shape[i];
      stride = n > 0 && stride <= kMax / n ? stride * n : kMax;
    }
    return d;
  }
};

// Launch grid in programs (Triton's grid), before kpack multiplies x by num_ctas.
struct Grid {
  uint32_t x = 1;
  uint32_t y = 1;
  uint32_t z = 1;
};

class Arg {
 public:
  enum class Kind : uint8_t {
    kHostTypedPointer,  // T* or void*
    kDevicePtr,         // CUdeviceptr (unsigned long long)
    kSigned,            // signed integral types
    kUnsigned,          // unsigned integral types other than unsigned long long
    kBool,
    kFloat32,
    kFloat64,
    kHalf,
    kBFloat16,
    kTensorDesc,  // the address of a caller-owned kpack::TensorDesc
  };

  template <typename T>
  static constexpr bool kSupported =
      std::is_pointer_v<T> || std::is_arithmetic_v<T> || std::is_same_v<T, Half> ||
      std::is_same_v<T, BFloat16> || std::is_null_pointer_v<T>;

  // Implicit on purpose: `Launch(grid, stream, x, y, n)` builds Args from the values.
  template <typename T, typename U = std::remove_cvref_t<T>,
            typename = std::enable_if_t<kSupported<U>>>
  Arg(T value) {  // NOLINT(google-explicit-constructor)
    if constexpr (std::is_pointer_v<U> || std::is_null_pointer_v<U>) {
      kind_ = Kind::kHostTypedPointer;
      bits_ = reinterpret_cast<uint64_t>(static_cast<const volatile void*>(value));
    } else if constexpr (std::is_same_v<U, bool>) {
      kind_ = Kind::kBool;
      bits_ = value ? 1 : 0;
    } else if constexpr (std::is_same_v<U, unsigned long long>) {  // NOLINT(runtime/int)
      kind_ = Kind::kDevicePtr;
      bits_ = value;
    } else if constexpr (std::is_integral_v<U> && std::is_signed_v<U>) {
      kind_ = Kind::kSigned;
      bits_ = static_cast<uint64_t>(static_cast<int64_t>(value));
    } else if constexpr (std::is_integral_v<U>) {
      kind_ = Kind::kUnsigned;
      bits_ = static_cast<uint64_t>(value);
    } else if constexpr (std::is_same_v<U, float>) {
      kind_ = Kind::kFloat32;
      bits_ = std::bit_cast<uint32_t>(value);
    } else if constexpr (std::is_floating_point_v<U>) {
      kind_ = Kind::kFloat64;
      bits_ = std::bit_cast<uint64_t>(static_cast<double>(value));
    } else if constexpr (std::is_same_v<U, Half>) {
      kind_ = Kind::kHalf;
      bits_ = value.bits;
    } else {
      kind_ = Kind::kBFloat16;
      bits_ = value.bits;
    }
  }

  // A tensordesc argument: points at `desc`, which must outlive the call (see above).
  Arg(const TensorDesc& desc)  // NOLINT(google-explicit-constructor)
      : bits_(reinterpret_cast<uint64_t>(&desc)), kind_(Kind::kTensorDesc) {}
  // Not from a temporary: the Arg would outlive it.
  Arg(TensorDesc&&) = delete;
  Arg(const TensorDesc&&) = delete;

  Kind kind() const { return kind_; }
  // The TensorDesc of a kTensorDesc Arg.
  const TensorDesc& tensor_desc() const { return *reinterpret_cast<const TensorDesc*>(bits_); }
  // The payload: pointer address, integer (two's complement for kSigned), IEEE bits.
  uint64_t bits() const { return bits_; }

 private:
  // In this order: the runtime's packing reads an Arg array as 16-byte records, the
  // payload at byte 0 and the kind at byte 8.
  uint64_t bits_ = 0;
  Kind kind_ = Kind::kUnsigned;
};

static_assert(sizeof(Arg) == 16);
static_assert(std::is_trivially_copyable_v<Arg> && std::is_standard_layout_v<Arg>);

// A short English description of an Arg's C++ type, for error messages.
const char* ArgKindName(Arg::Kind kind);

}  // namespace kpack

#endif  // KPACK_ARG_H_
