// Reading a pack's files: manifest.json, and the cubins it names, each confined to the
// pack directory and checked against its sha256 and the manifest (pack/pack_state.h reads
// a whole pack with these). Files are opened without following a path out of the pack,
// and their sizes are checked before anything is read.

#ifndef KPACK_SRC_PACK_FILES_H_
#define KPACK_SRC_PACK_FILES_H_

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "manifest/manifest.h"

namespace kpack::internal {

// The largest manifest.json and cubin a pack may have: far beyond any real one (a
// 1,000-variant manifest is about 3 MB, a Triton cubin tens of KB to a few MB), and small
// enough that a hostile file (a sparse one can claim a terabyte) is refused by its size,
// before anything is allocated or read.
inline constexpr uint64_t kMaxManifestBytes = uint64_t{256} << 20;
inline constexpr uint64_t kMaxCubinBytes = uint64_t{1} << 30;

// Reads and validates `dir`/manifest.json. Sets *root to the pack's canonical path.
// NOT_FOUND when the directory or the manifest is missing; INVALID_ARGUMENT for a
// manifest larger than kMaxManifestBytes.
absl::StatusOr<ManifestSpec> ReadManifest(absl::string_view dir, std::string* root);

// Holds a variant against its cubin's ELF `image`: a complete, well-formed cubin (the
// driver reads an image as far as its headers say, so a short one would be over-read)
// whose SM architecture is the variant's `arch`, which has a kernel named `entry`, and
// whose KPARAM_INFO records for it are the variant's `layout`, slot for slot, and whose
// required block shape (.reqntid) or thread limit (.maxntid), where it records one, admits
// the variant's 32 * num_warps threads.
// INVALID_ARGUMENT prefixed with `where`, naming the field and, for the layout, every
// slot that differs.
absl::Status CheckCubin(const KernelSpec& kernel, const VariantSpec& variant,
                        std::span<const std::byte> image, absl::string_view where);

// A pack directory, open: its canonical path, and a descriptor below which its cubins are
// opened (one openat2(RESOLVE_BENEATH) call per cubin where the kernel has it).
class PackDir {
 public:
  // NOT_FOUND when `root` cannot be opened as a directory.
  static absl::StatusOr<PackDir> Open(std::string root);
  PackDir(PackDir&& other) noexcept;
  PackDir& operator=(PackDir&&) = delete;
  ~PackDir();

  const std::string& root() const { return root_; }
  // The bytes of the regular file `rel`, which must stay inside the directory: not
  // absolute, no "..", no symlink leading out. INVALID_ARGUMENT for a path that leaves or
  // a file larger than kMaxCubinBytes, NOT_FOUND for a missing file, each prefixed with
  // `where` and naming field 'cubin'.
  absl::StatusOr<std::vector<std::byte>> ReadFile(absl::string_view rel,
                                                  absl::string_view where) const;

 private:
  PackDir(std::string root, int fd) : root_(std::move(root)), fd_(fd) {}
  std::string root_;
  int fd_ = -1;
};

// Reads one variant's cubin from `dir` (PackDir::ReadFile): non-empty, matching its
// sha256, and passing CheckCubin. `where` prefixes errors
// ("<manifest>: kernel 'k': variant 'v'").
absl::StatusOr<std::vector<std::byte>> ReadVariantCubin(const PackDir& dir,
                                                        const KernelSpec& kernel,
                                                        const VariantSpec& variant,
                                                        absl::string_view where);

}  // namespace kpack::internal

#endif  // KPACK_SRC_PACK_FILES_H_
