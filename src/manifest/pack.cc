#include "manifest/pack.h"

#include <filesystem>
#include <fstream>
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
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": field 'cubin': '", rel, "' resolves to '", full.string(),
        "', outside the pack directory (through a symlink)"));
  }
  return full;
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
  return ParseManifest(
      absl::string_view(reinterpret_cast<const char*>(text.data()), text.size()),
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
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": field 'sha256': cubin '", path.string(), "' has sha256 ",
                     digest, ", the manifest says ", variant.sha256,
                     " (the file was changed or corrupted)"));
  }
  return bytes;
}

absl::StatusOr<PackContents> ReadPack(absl::string_view dir) {
  PackContents pack;
  KPACK_ASSIGN_OR_RETURN(pack.manifest, ReadManifest(dir, &pack.dir));
  const std::string manifest_path = (fs::path(pack.dir) / "manifest.json").string();
  for (const KernelSpec& kernel : pack.manifest.kernels) {
    auto& kernel_cubins = pack.cubins.emplace_back();
    for (const VariantSpec& variant : kernel.variants) {
      std::string where = absl::StrCat(manifest_path, ": kernel '", kernel.name,
                                       "': variant '", variant.name, "'");
      KPACK_ASSIGN_OR_RETURN(std::vector<std::byte> bytes,
                             ReadVariantCubin(pack.dir, variant, where));
      kernel_cubins.push_back(std::move(bytes));
    }
  }
  return pack;
}

}  // namespace kpack::internal
