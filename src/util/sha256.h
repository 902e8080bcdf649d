// SHA-256 (FIPS 180-4), used to check cubins against the manifest at load. Written here
// because none of the project's dependencies provides it.

#ifndef KPACK_SRC_UTIL_SHA256_H_
#define KPACK_SRC_UTIL_SHA256_H_

#include <cstddef>
#include <span>
#include <string>

namespace kpack::internal {

// Lowercase hex digest of `data`.
std::string Sha256Hex(std::span<const std::byte> data);

}  // namespace kpack::internal

#endif  // KPACK_SRC_UTIL_SHA256_H_
