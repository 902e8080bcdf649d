// SHA-256 through OpenSSL's EVP interface (sha256.h).

#include "util/sha256.h"

#include <openssl/evp.h>

#include <cstdio>
#include <cstdlib>

namespace kpack::internal {
namespace {

// The SHA-256 implementation, fetched once: OpenSSL 3 looks an algorithm up in its
// provider tables on every implicit fetch (EVP_sha256() with EVP_Digest), which would cost
// more than hashing a small cubin. Never freed: it lives as long as the process.
const EVP_MD* Sha256() {
  static const EVP_MD* const md = [] {
    EVP_MD* fetched = EVP_MD_fetch(nullptr, "SHA256", nullptr);
    if (fetched == nullptr) {
      // Only a broken OpenSSL installation (no default provider) gets here; checking a
      // pack without its hash function is impossible, and skipping it would be silent.
      std::fputs("kpack: OpenSSL has no SHA256 (EVP_MD_fetch failed)\n", stderr);
      std::abort();
    }
    return fetched;
  }();
  return md;
}

}  // namespace

std::string Sha256Hex(std::span<const std::byte> data) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  if (EVP_Digest(data.data(), data.size(), digest, &length, Sha256(), nullptr) != 1 ||
      length != 32) {
    std::fputs("kpack: OpenSSL's EVP_Digest(SHA256) failed\n", stderr);
    std::abort();
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string hex(64, '\0');
  for (int i = 0; i < 32; ++i) {
    hex[2 * i] = kHex[digest[i] >> 4];
    hex[2 * i + 1] = kHex[digest[i] & 15];
  }
  return hex;
}

}  // namespace kpack::internal
