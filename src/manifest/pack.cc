#include "manifest/pack.h"

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <span>
#include <system_error>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "util/sha256.h"
#include "util/status_macros.h"

namespace kpack::internal {
namespace {

namespace fs = std::filesystem;

absl::StatusOr<std::vector<std::byte>> ReadFile(const fs::path& path, absl::string_view what) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) {
    return absl::NotFoundError(
        absl::StrCat(what, ": '", path.string(), "' does not exist or is not a regular file"));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::PermissionDeniedError(absl::StrCat(what, ": cannot open '", path.string(), "'"));
  }
  in.seekg(0, std::ios::end);
  std::streamoff size = in.tellg();
  in.seekg(0, std::ios::beg);
  std::vector<std::byte> data(static_cast<size_t>(size));
  if (size > 0 && !in.read(reinterpret_cast<char*>(data.data()), size)) {
    return absl::DataLossError(absl::StrCat(what, ": short read of '", path.string(), "'"));
  }
  return data;
}

// `rel` must name a file inside `root` (canonical), also after following symlinks.
absl::StatusOr<fs::path> ResolveInside(const fs::path& root, absl::string_view rel,
                                       absl::string_view where) {
  fs::path p{std::string(rel)};
  if (p.is_absolute()) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": field 'cubin': '", rel, "' is absolute; cubin paths are relative to the pack"));
  }
  for (const fs::path& part : p) {
    if (part == "..") {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": field 'cubin': '", rel, "' contains '..'; cubins must stay inside the pack"));
    }
  }
  std::error_code ec;
  fs::path full = fs::weakly_canonical(root / p, ec);
  if (ec) {
    return absl::NotFoundError(
        absl::StrCat(where, ": field 'cubin': cannot resolve '", rel, "': ", ec.message()));
  }
  auto [root_end, full_it] = std::mismatch(root.begin(), root.end(), full.begin(), full.end());
  if (root_end != root.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": field 'cubin': '", rel, "' resolves to '", full.string(),
                     "', outside the pack directory (through a symlink)"));
  }
  return full;
}

template <typename T>
T Load(const std::byte* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

// cuLibraryLoadData takes no size: the driver finds the image's extent in its ELF
// headers and reads that far. So a cubin cut short (or lying in its headers) would make
// the driver read past our buffer. Check that every header and every section the ELF
// describes lies inside the bytes we have.
absl::Status CheckElfBounds(std::span<const std::byte> image, absl::string_view where) {
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": the cubin is not a complete 64-bit ELF image (", why, ")"));
  };
  const uint64_t size = image.size();
  if (size < 64) return bad(absl::StrCat("only ", size, " bytes"));
  const std::byte* p = image.data();
  if (Load<uint32_t>(p) != 0x464c457fu) return bad("no ELF magic");
  if (static_cast<uint8_t>(p[4]) != 2 || static_cast<uint8_t>(p[5]) != 1) {
    return bad("not 64-bit little-endian");
  }
  const uint64_t phoff = Load<uint64_t>(p + 32), shoff = Load<uint64_t>(p + 40);
  const uint64_t phentsize = Load<uint16_t>(p + 54), phnum = Load<uint16_t>(p + 56);
  const uint64_t shentsize = Load<uint16_t>(p + 58), shnum = Load<uint16_t>(p + 60);
  // All factors are below 2^16 and offsets are checked against size first: no overflow.
  if (phnum != 0 && (phoff > size || phentsize * phnum > size - phoff)) {
    return bad(absl::StrCat("program headers end past byte ", size));
  }
  if (shnum != 0 && (shoff > size || shentsize * shnum > size - shoff || shentsize < 64)) {
    return bad(absl::StrCat("section headers end past byte ", size));
  }
  for (uint64_t i = 0; i < shnum; ++i) {
    const std::byte* sh = p + shoff + i * shentsize;
    const uint32_t type = Load<uint32_t>(sh + 4);
    const uint64_t offset = Load<uint64_t>(sh + 24), length = Load<uint64_t>(sh + 32);
    if (type == 8) continue;  // SHT_NOBITS occupies no file bytes
    if (offset > size || length > size - offset) {
      return bad(absl::StrCat("section ", i, " ends at byte ", offset + length,
                              " but the file has ", size));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ManifestSpec> ReadManifest(absl::string_view dir, std::string* root) {
  std::error_code ec;
  if (!fs::is_directory(fs::path(std::string(dir)), ec)) {
    return absl::NotFoundError(absl::StrCat("pack '", dir, "' is not a directory"));
  }
  fs::path canonical = fs::canonical(fs::path(std::string(dir)), ec);
  if (ec) return absl::NotFoundError(absl::StrCat("pack '", dir, "': ", ec.message()));
  *root = canonical.string();
  fs::path manifest_path = canonical / "manifest.json";
  KPACK_ASSIGN_OR_RETURN(std::vector<std::byte> text,
                         ReadFile(manifest_path, absl::StrCat("pack '", dir, "'")));
  return ParseManifest(absl::string_view(reinterpret_cast<const char*>(text.data()), text.size()),
                       manifest_path.string());
}

absl::StatusOr<std::vector<std::byte>> ReadVariantCubin(const std::string& root,
                                                        const VariantSpec& variant,
                                                        absl::string_view where) {
  KPACK_ASSIGN_OR_RETURN(fs::path path, ResolveInside(fs::path(root), variant.cubin, where));
  KPACK_ASSIGN_OR_RETURN(std::vector<std::byte> bytes, ReadFile(path, where));
  if (bytes.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": cubin '", path.string(), "' is empty"));
  }
  std::string digest = Sha256Hex(bytes);
  if (digest != variant.sha256) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": field 'sha256': cubin '", path.string(), "' has sha256 ", digest,
        ", the manifest says ", variant.sha256, " (the file was changed or corrupted)"));
  }
  KPACK_RETURN_IF_ERROR(CheckElfBounds(bytes, where));
  return bytes;
}

absl::StatusOr<PackContents> ReadPack(absl::string_view dir) {
  PackContents pack;
  KPACK_ASSIGN_OR_RETURN(pack.manifest, ReadManifest(dir, &pack.dir));
  const std::string manifest_path = (fs::path(pack.dir) / "manifest.json").string();
  for (const KernelSpec& kernel : pack.manifest.kernels) {
    auto& kernel_cubins = pack.cubins.emplace_back();
    for (const VariantSpec& variant : kernel.variants) {
      std::string where =
          absl::StrCat(manifest_path, ": kernel '", kernel.name, "': variant '", variant.name, "'");
      KPACK_ASSIGN_OR_RETURN(std::vector<std::byte> bytes,
                             ReadVariantCubin(pack.dir, variant, where));
      kernel_cubins.push_back(std::move(bytes));
    }
  }
  return pack;
}

}  // namespace kpack::internal
