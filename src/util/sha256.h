// SHA-256, used to check cubins against the manifest at Open: OpenSSL's libcrypto (which
// uses the CPU's SHA instructions where there are any).

#ifndef KPACK_SRC_UTIL_SHA256_H_
#define KPACK_SRC_UTIL_SHA256_H_

#include <cstddef>
#include <span>
#include <string>

namespace kpack::internal {

// Lowercase hex digest of `data`. Thread-safe.
std::string Sha256Hex(std::span<const std::byte> data);

}  // namespace kpack::internal

#endif  // KPACK_SRC_UTIL_SHA256_H_
