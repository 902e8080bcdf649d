// Reading a pack directory: manifest.json plus the cubins it names, each checked against
// its sha256 and confined to the pack directory.

#ifndef KPACK_SRC_MANIFEST_PACK_H_
#define KPACK_SRC_MANIFEST_PACK_H_

#include <cstddef>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "manifest/manifest.h"

namespace kpack::internal {

struct PackContents {
  std::string dir;  // canonical absolute path of the pack directory
  ManifestSpec manifest;
  // cubins[k][v]: the bytes of kernel k's variant v.
  std::vector<std::vector<std::vector<std::byte>>> cubins;
};

// Reads and validates `dir`/manifest.json. Sets *root to the pack's canonical path.
absl::StatusOr<ManifestSpec> ReadManifest(absl::string_view dir, std::string* root);

// Reads one variant's cubin: confined to `root`, non-empty, matching its sha256, and a
// 64-bit ELF image whose headers and sections all lie inside the file (the driver
// reads an image as far as its headers say, so a short one would be over-read).
// `where` prefixes errors ("<manifest>: kernel 'k': variant 'v'").
absl::StatusOr<std::vector<std::byte>> ReadVariantCubin(const std::string& root,
                                                        const VariantSpec& variant,
                                                        absl::string_view where);

// Reads `dir`/manifest.json and every cubin. NOT_FOUND when the directory, manifest or a
// cubin is missing; INVALID_ARGUMENT for a manifest problem, a cubin path that leaves the
// pack (absolute, "..", or a symlink pointing outside), an empty cubin, or a sha256
// mismatch — each naming the file, kernel and variant.
absl::StatusOr<PackContents> ReadPack(absl::string_view dir);

}  // namespace kpack::internal

#endif  // KPACK_SRC_MANIFEST_PACK_H_
