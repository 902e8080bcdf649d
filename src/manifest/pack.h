// Reading a pack's files: manifest.json, and the cubins it names, each confined to the
// pack directory and checked against its sha256 and the manifest (pack/pack_state.h reads
// a whole pack with these).

#ifndef KPACK_SRC_MANIFEST_PACK_H_
#define KPACK_SRC_MANIFEST_PACK_H_

#include <cstddef>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "manifest/manifest.h"

namespace kpack::internal {

// Reads and validates `dir`/manifest.json. Sets *root to the pack's canonical path.
// NOT_FOUND when the directory or the manifest is missing.
absl::StatusOr<ManifestSpec> ReadManifest(absl::string_view dir, std::string* root);

// Holds a variant against its cubin's ELF `image`: a complete, well-formed cubin (the
// driver reads an image as far as its headers say, so a short one would be over-read)
// whose SM architecture is the variant's `arch`, which has a kernel named `entry`, and
// whose KPARAM_INFO records for it are the variant's `layout`, slot for slot.
// INVALID_ARGUMENT prefixed with `where`, naming the field and, for the layout, every
// slot that differs.
absl::Status CheckCubin(const KernelSpec& kernel, const VariantSpec& variant,
                        std::span<const std::byte> image, absl::string_view where);

// Reads one variant's cubin: confined to `root` (not absolute, no "..", no symlink out of
// it), non-empty, matching its sha256, and passing CheckCubin. NOT_FOUND for a missing
// file; INVALID_ARGUMENT otherwise. `where` prefixes errors
// ("<manifest>: kernel 'k': variant 'v'").
absl::StatusOr<std::vector<std::byte>> ReadVariantCubin(const std::string& root,
                                                        const KernelSpec& kernel,
                                                        const VariantSpec& variant,
                                                        absl::string_view where);

}  // namespace kpack::internal

#endif  // KPACK_SRC_MANIFEST_PACK_H_
