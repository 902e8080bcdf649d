// Reading a pack's files (pack/files.h): the directory opened once, each cubin opened
// beneath it and read whole, checked against its sha256 and the manifest's variant.

#include "pack/files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>
#if __has_include(<linux/openat2.h>)
#include <linux/openat2.h>  // struct open_how, RESOLVE_BENEATH
#endif

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <new>
#include <span>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "cubin/cubin_reader.h"
#include "util/sha256.h"
#include "util/status_macros.h"

namespace kpack::internal {
namespace {

namespace fs = std::filesystem;

// A file of a pack, for ReadFd: what it is, and the most bytes it may have.
struct FileKind {
  const char* name;    // "manifest", "cubin"
  const char* field;   // the manifest field naming it, or null
  uint64_t max_bytes;
};
constexpr FileKind kManifestFile{"manifest", nullptr, kMaxManifestBytes};
constexpr FileKind kCubinFile{"cubin", "cubin", kMaxCubinBytes};

// Reads the regular file open as `fd` (closing it); -1 means open failed with `errno`.
// `path` names it in messages. The size fstat gives is checked against `kind`'s limit
// before anything is allocated, and an allocation that fails anyway is an error, not a
// std::bad_alloc.
absl::StatusOr<std::vector<std::byte>> ReadFd(int fd, const fs::path& path,
                                              absl::string_view what, const FileKind& kind) {
  struct stat st;
  if (fd < 0 || ::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    const int error = errno;
    if (fd >= 0) ::close(fd);
    if (fd < 0 && error != ENOENT && error != ENOTDIR) {
      return absl::PermissionDeniedError(
          absl::StrCat(what, ": cannot open '", path.string(), "': ", std::strerror(error)));
    }
    return absl::NotFoundError(
        absl::StrCat(what, ": '", path.string(), "' does not exist or is not a regular file"));
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size > kind.max_bytes) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(
        what, kind.field != nullptr ? absl::StrCat(": field '", kind.field, "'") : "", ": ",
        kind.name, " '", path.string(), "' is ", size, " bytes, more than the ",
        kind.max_bytes, " a pack's ", kind.name, " may have"));
  }
  std::vector<std::byte> data;
  try {
    data.resize(static_cast<size_t>(size));
  } catch (const std::bad_alloc&) {
    ::close(fd);
    return absl::ResourceExhaustedError(absl::StrCat(what, ": no memory for the ", size,
                                                     " bytes of '", path.string(), "'"));
  }
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::read(fd, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    done += static_cast<size_t>(n);
  }
  ::close(fd);
  if (done != data.size()) {
    return absl::DataLossError(absl::StrCat(what, ": short read of '", path.string(), "'"));
  }
  return data;
}

// POSIX rather than ifstream: Open reads a file per variant, and a stream's set-up costs
// as much as reading a small cubin. O_NONBLOCK: a FIFO is refused as "not a regular file"
// instead of blocking the open.
constexpr int kOpenFlags = O_RDONLY | O_CLOEXEC | O_NONBLOCK;

absl::StatusOr<std::vector<std::byte>> ReadFile(const fs::path& path, absl::string_view what,
                                                const FileKind& kind) {
  return ReadFd(::open(path.c_str(), kOpenFlags), path, what, kind);
}

// Opens `rel` below the directory `dir` in one system call, the kernel refusing any
// resolution (a "..", an absolute or an escaping symlink) that leaves it. -1 with errno
// set when it cannot (ENOSYS before Linux 5.6 or under a seccomp filter that lacks
// openat2), or for any refusal; the caller then takes the slow, precise path.
int OpenBeneath(int dir, const std::string& rel) {
#if defined(SYS_openat2) && defined(RESOLVE_BENEATH)
  open_how how{};
  how.flags = kOpenFlags;
  how.resolve = RESOLVE_BENEATH;
  return static_cast<int>(::syscall(SYS_openat2, dir, rel.c_str(), &how, sizeof(how)));
#else
  (void)dir;
  (void)rel;
  errno = ENOSYS;
  return -1;
#endif
}

// `rel` (relative and free of "..", which the caller checked) must name a file inside
// `root` (canonical), also after following symlinks.
absl::StatusOr<fs::path> ResolveInside(const fs::path& root, absl::string_view rel,
                                       absl::string_view where) {
  std::error_code ec;
  fs::path full = fs::weakly_canonical(root / fs::path(std::string(rel)), ec);
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
                         ReadFile(manifest_path, absl::StrCat("pack '", dir, "'"), kManifestFile));
  return ParseManifest(absl::string_view(reinterpret_cast<const char*>(text.data()), text.size()),
                       manifest_path.string());
}

absl::Status CheckCubin(const KernelSpec& kernel, const VariantSpec& variant,
                        std::span<const std::byte> image, absl::string_view where) {
  absl::StatusOr<CubinInfo> cubin = ReadCubin(image);
  if (!cubin.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": cubin '", variant.cubin, "': ", cubin.status().message()));
  }
  if (cubin->arch != variant.arch) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": field 'arch': the manifest says ", variant.arch, ", cubin '",
                     variant.cubin, "' was built for ", cubin->arch, " (its ELF header)"));
  }
  auto entry = std::find_if(cubin->kernels.begin(), cubin->kernels.end(),
                            [&](const CubinKernel& c) { return c.name == variant.entry; });
  if (entry == cubin->kernels.end()) {
    std::vector<absl::string_view> names;
    for (const CubinKernel& c : cubin->kernels) names.push_back(c.name);
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": field 'entry': '", variant.entry, "' is not a kernel of cubin '", variant.cubin,
        "' (it has: ", names.empty() ? "none" : absl::StrJoin(names, ", "), ")"));
  }
  // The block a launch uses, 32 * num_warps threads in x, against what ptxas recorded: a
  // contradiction would fail only when the driver loads or launches it.
  const uint64_t threads = uint64_t{32} * static_cast<uint64_t>(variant.num_warps);
  const std::string block = absl::StrCat(variant.num_warps, " warps launch blocks of ",
                                         threads, "x1x1 threads");
  if (const auto& r = entry->required_block; r.has_value() && *r != std::array<uint32_t, 3>{
                                                 static_cast<uint32_t>(threads), 1, 1}) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": field 'num_warps': ", block, ", but entry '", variant.entry, "' in cubin '",
        variant.cubin, "' requires blocks of ", (*r)[0], "x", (*r)[1], "x", (*r)[2],
        " (its .reqntid, EIATTR_REQNTID)"));
  }
  if (const auto& m = entry->max_block;
      m.has_value() && threads > uint64_t{(*m)[0]} * (*m)[1] * (*m)[2]) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": field 'num_warps': ", block, ", but entry '", variant.entry, "' in cubin '",
        variant.cubin, "' takes at most ", uint64_t{(*m)[0]} * (*m)[1] * (*m)[2],
        " threads per block (its .maxntid ", (*m)[0], "x", (*m)[1], "x", (*m)[2],
        ", EIATTR_MAX_THREADS)"));
  }
  std::vector<std::string> differences;
  const size_t n = std::max(variant.layout.size(), entry->params.size());
  for (size_t i = 0; i < n; ++i) {
    if (i >= variant.layout.size()) {
      const CubinParam& c = entry->params[i];
      differences.push_back(absl::StrCat("parameter #", i, ": the cubin has it (offset ", c.offset,
                                         " size ", c.size, "), the manifest's layout does not"));
      continue;
    }
    const SlotSpec& s = variant.layout[i];
    const std::string param = absl::StrCat("parameter '", SlotName(kernel, s), "' (#", i, ")");
    if (i >= entry->params.size()) {
      differences.push_back(absl::StrCat(param, ": expected offset ", s.offset, " size ", s.size,
                                         " (manifest), the cubin has no such parameter"));
      continue;
    }
    const CubinParam& c = entry->params[i];
    if (c.offset != s.offset || c.size != s.size) {
      differences.push_back(absl::StrCat(param, ": expected offset ", s.offset, " size ", s.size,
                                         " (manifest), found offset ", c.offset, " size ", c.size,
                                         " (cubin)"));
    }
  }
  if (!differences.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": field 'layout': differs from the KPARAM_INFO records of entry '", variant.entry,
        "' in cubin '", variant.cubin, "': ", absl::StrJoin(differences, "; ")));
  }
  return absl::OkStatus();
}

absl::StatusOr<PackDir> PackDir::Open(std::string root) {
  const int fd = ::open(root.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) {
    return absl::NotFoundError(
        absl::StrCat("pack '", root, "': cannot open the directory: ", std::strerror(errno)));
  }
  return PackDir(std::move(root), fd);
}

PackDir::PackDir(PackDir&& other) noexcept
    : root_(std::move(other.root_)), fd_(std::exchange(other.fd_, -1)) {}

PackDir::~PackDir() {
  if (fd_ >= 0) ::close(fd_);
}

absl::StatusOr<std::vector<std::byte>> PackDir::ReadFile(absl::string_view rel,
                                                         absl::string_view where) const {
  fs::path path{std::string(rel)};
  if (path.is_absolute()) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": field 'cubin': '", rel, "' is absolute; cubin paths are relative to the pack"));
  }
  for (const fs::path& part : path) {
    if (part == "..") {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": field 'cubin': '", rel, "' contains '..'; cubins must stay inside the pack"));
    }
  }
  // The common case in one system call; everything else (a symlink, even one that stays
  // inside; a missing file; an old kernel) through the path that says precisely why.
  const int fd = OpenBeneath(fd_, path.native());
  if (fd >= 0) return ReadFd(fd, (fs::path(root_) / path).lexically_normal(), where, kCubinFile);
  KPACK_ASSIGN_OR_RETURN(fs::path full, ResolveInside(fs::path(root_), rel, where));
  return internal::ReadFile(full, where, kCubinFile);
}

absl::StatusOr<std::vector<std::byte>> ReadVariantCubin(const PackDir& dir,
                                                        const KernelSpec& kernel,
                                                        const VariantSpec& variant,
                                                        absl::string_view where) {
  KPACK_ASSIGN_OR_RETURN(std::vector<std::byte> bytes, dir.ReadFile(variant.cubin, where));
  if (bytes.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": cubin '", (fs::path(dir.root()) / variant.cubin).string(), "' is empty"));
  }
  std::string digest = Sha256Hex(bytes);
  if (digest != variant.sha256) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": field 'sha256': cubin '", variant.cubin, "' has sha256 ", digest,
        ", the manifest says ", variant.sha256, " (the file was changed or corrupted)"));
  }
  KPACK_RETURN_IF_ERROR(CheckCubin(kernel, variant, bytes, where));
  return bytes;
}

}  // namespace kpack::internal
