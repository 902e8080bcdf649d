// Fixed-size byte copies for the launch path (PackArgs, PackArg, PackDesc and its memo,
// the scratch pointers): plain loads and stores with every toolchain.
//
// std::memcpy of a constant size compiles to moves, except under _FORTIFY_SOURCE (on by
// default in Ubuntu's GCC, the GPU machine's): a copy into an object whose size the
// compiler tracks -- the launch path's parameter buffer on the stack, a BoundLaunch's
// storage -- becomes a call to __memcpy_chk with the room left computed at run time. In
// PackArgs that was one call per argument: there PackArgs cost 5-8 ns per argument on the
// GPU machine's host, where a copy of its loops without the calls costs 1-2 ns
// (bench/RESULTS.md, session 29). __builtin_memcpy and __builtin_memset are the
// compiler's own, which the fortified wrappers do not redirect; the sizes are the
// callers' to get right, as with memcpy.

#ifndef KPACK_SRC_UTIL_BYTES_H_
#define KPACK_SRC_UTIL_BYTES_H_

#include <cstddef>

#include "absl/base/attributes.h"

namespace kpack::internal {

// Copies N bytes from `src` to `dst` (N a constant: a few moves).
template <size_t N>
ABSL_ATTRIBUTE_ALWAYS_INLINE inline void CopyBytes(void* dst, const void* src) {
  __builtin_memcpy(dst, src, N);
}

// Stores the bytes of `value` at `dst` (a parameter slot: any alignment).
template <typename T>
ABSL_ATTRIBUTE_ALWAYS_INLINE inline void StoreBytes(std::byte* dst, T value) {
  CopyBytes<sizeof(T)>(dst, &value);
}

// Zeroes `n` bytes at `dst`.
ABSL_ATTRIBUTE_ALWAYS_INLINE inline void ZeroBytes(void* dst, size_t n) {
  __builtin_memset(dst, 0, n);
}

}  // namespace kpack::internal

#endif  // KPACK_SRC_UTIL_BYTES_H_
