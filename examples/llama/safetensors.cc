#include "safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"

namespace kpack::llama {
namespace {

using Json = nlohmann::json;

// The safetensors package refuses headers above 100 MB; so do we.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

// Byte-sized element types of the safetensors format.
struct DtypeSize {
  absl::string_view name;
  size_t size;
};
constexpr DtypeSize kDtypes[] = {
    {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1}, {"F8_E8M0", 1},
    {"I16", 2},  {"U16", 2}, {"F16", 2}, {"BF16", 2},    {"I32", 4},     {"U32", 4},
    {"F32", 4},  {"F64", 8}, {"I64", 8}, {"U64", 8},
};

size_t DtypeBytes(absl::string_view name) {
  for (const DtypeSize& d : kDtypes) {
    if (d.name == name) return d.size;
  }
  return 0;
}

absl::Status Bad(absl::string_view source, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(source, ": ", what));
}

absl::Status BadTensor(absl::string_view source, absl::string_view tensor, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(source, ": tensor '", tensor, "' ", what));
}

// A JSON value as a non-negative integer that fits in uint64.
bool AsCount(const Json& j, uint64_t* value) {
  if (j.is_number_unsigned()) {
    *value = j.get<uint64_t>();
    return true;
  }
  if (j.is_number_integer() && j.get<int64_t>() >= 0) {
    *value = static_cast<uint64_t>(j.get<int64_t>());
    return true;
  }
  return false;
}

absl::StatusOr<TensorInfo> ParseEntry(absl::string_view source, const std::string& name,
                                      const Json& entry, uint64_t data_bytes) {
  if (!entry.is_object()) return BadTensor(source, name, "is not a JSON object");
  TensorInfo t;
  t.name = name;
  auto dtype = entry.find("dtype");
  if (dtype == entry.end() || !dtype->is_string()) {
    return BadTensor(source, name, "has no \"dtype\" string");
  }
  t.dtype = dtype->get<std::string>();
  t.dtype_size = DtypeBytes(t.dtype);
  if (t.dtype_size == 0) {
    return BadTensor(source, name,
                     absl::StrCat("has an unknown or unsupported dtype '", t.dtype, "'"));
  }
  auto shape = entry.find("shape");
  if (shape == entry.end() || !shape->is_array()) {
    return BadTensor(source, name, "has no \"shape\" array");
  }
  uint64_t elements = 1;
  bool overflow = false;
  for (const Json& dim : *shape) {
    uint64_t n = 0;
    if (!AsCount(dim, &n) || n > uint64_t{std::numeric_limits<int64_t>::max()}) {
      return BadTensor(
          source, name,
          absl::StrCat("has a shape entry that is not a non-negative integer: ", shape->dump()));
    }
    t.shape.push_back(static_cast<int64_t>(n));
    if (n != 0 && elements > std::numeric_limits<uint64_t>::max() / n) overflow = true;
    elements *= n;
  }
  auto offsets = entry.find("data_offsets");
  uint64_t begin = 0, end = 0;
  if (offsets == entry.end() || !offsets->is_array() || offsets->size() != 2 ||
      !AsCount((*offsets)[0], &begin) || !AsCount((*offsets)[1], &end)) {
    return BadTensor(source, name, "has no \"data_offsets\" pair of non-negative integers");
  }
  if (begin > end) {
    return BadTensor(
        source, name,
        absl::StrCat("has data_offsets [", begin, ", ", end, "] that end before they begin"));
  }
  if (end > data_bytes) {
    return BadTensor(
        source, name,
        absl::StrCat("has data_offsets [", begin, ", ", end, "] past the data region's ",
                     data_bytes, " bytes (the file is truncated or its header is wrong)"));
  }
  const bool fits = !overflow && elements <= std::numeric_limits<uint64_t>::max() / t.dtype_size;
  if (!fits || elements * t.dtype_size != end - begin) {
    return BadTensor(
        source, name,
        absl::StrCat("has data_offsets [", begin, ", ", end, "] covering ", end - begin,
                     " bytes, but dtype ", t.dtype, " and shape ", ShapeString(t.shape), " need ",
                     fits ? absl::StrCat(elements * t.dtype_size) : "more than 2^64"));
  }
  t.begin = begin;
  t.end = end;
  return t;
}

}  // namespace

std::string ShapeString(std::span<const int64_t> shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

struct SafetensorsFile::Mapping {
  void* address = nullptr;
  size_t size = 0;
  ~Mapping() {
    if (address != nullptr) munmap(address, size);
  }
};

absl::StatusOr<SafetensorsFile> SafetensorsFile::Parse(std::span<const std::byte> file,
                                                       absl::string_view source) {
  if (file.size() < 8) {
    return Bad(source, absl::StrCat("truncated: ", file.size(),
                                    " bytes, less than the 8-byte header length"));
  }
  uint64_t header_bytes = 0;
  for (int i = 7; i >= 0; --i) {
    header_bytes = header_bytes << 8 | static_cast<uint8_t>(file[static_cast<size_t>(i)]);
  }
  if (header_bytes > file.size() - 8) {
    return Bad(source, absl::StrCat("header length ", header_bytes, " runs past the file's ",
                                    file.size(), " bytes (truncated?)"));
  }
  if (header_bytes > kMaxHeaderBytes) {
    return Bad(source, absl::StrCat("header length ", header_bytes,
                                    " exceeds the format's limit of ", kMaxHeaderBytes, " bytes"));
  }
  const auto* text = reinterpret_cast<const char*>(file.data() + 8);
  Json header;
  try {
    header = Json::parse(text, text + header_bytes);
  } catch (const Json::exception& e) {
    return Bad(source, absl::StrCat("header is not valid JSON (", e.what(), ")"));
  }
  if (!header.is_object()) return Bad(source, "header is not a JSON object");

  SafetensorsFile f;
  f.path_ = std::string(source);
  f.data_ = file.subspan(8 + header_bytes);
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (!it->is_object()) return Bad(source, "__metadata__ is not a JSON object");
      for (auto m = it->begin(); m != it->end(); ++m) {
        if (!m->is_string()) {
          return Bad(source, absl::StrCat("__metadata__ entry '", m.key(), "' is not a string"));
        }
        f.metadata_[m.key()] = m->get<std::string>();
      }
      continue;
    }
    absl::StatusOr<TensorInfo> t = ParseEntry(source, it.key(), *it, f.data_.size());
    if (!t.ok()) return t.status();
    f.tensors_.push_back(*std::move(t));
  }

  // Every byte of the data region belongs to exactly one tensor, in some order.
  std::vector<const TensorInfo*> by_offset;
  by_offset.reserve(f.tensors_.size());
  for (const TensorInfo& t : f.tensors_) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(), [](const TensorInfo* a, const TensorInfo* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  uint64_t covered = 0;
  const TensorInfo* previous = nullptr;
  for (const TensorInfo* t : by_offset) {
    if (t->begin < covered) {
      return BadTensor(
          source, t->name,
          absl::StrCat("(data_offsets [", t->begin, ", ", t->end, "]) overlaps tensor '",
                       previous->name, "' ([", previous->begin, ", ", previous->end, "])"));
    }
    if (t->begin > covered) {
      return BadTensor(
          source, t->name,
          absl::StrCat("(data_offsets [", t->begin, ", ", t->end, "]) leaves bytes [", covered,
                       ", ", t->begin, ") of the data region unused",
                       previous != nullptr ? absl::StrCat(" after tensor '", previous->name, "'")
                                           : std::string()));
    }
    covered = t->end;
    previous = t;
  }
  if (covered != f.data_.size()) {
    return Bad(source, absl::StrCat("the data region has ", f.data_.size() - covered,
                                    " bytes after the last tensor's data (", f.data_.size(),
                                    " bytes in all)"));
  }
  std::sort(f.tensors_.begin(), f.tensors_.end(),
            [](const TensorInfo& a, const TensorInfo& b) { return a.name < b.name; });
  return f;
}

absl::StatusOr<SafetensorsFile> SafetensorsFile::Open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int error = errno;
    const std::string what = absl::StrCat(path, ": cannot open (", std::strerror(error), ")");
    return error == ENOENT ? absl::NotFoundError(what) : absl::PermissionDeniedError(what);
  }
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a regular file"));
  }
  auto mapping = std::make_shared<Mapping>();
  mapping->size = static_cast<size_t>(st.st_size);
  if (mapping->size > 0) {
    void* address = mmap(nullptr, mapping->size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (address == MAP_FAILED) {
      const int error = errno;
      ::close(fd);
      return absl::ResourceExhaustedError(absl::StrCat(
          path, ": mmap of ", mapping->size, " bytes failed (", std::strerror(error), ")"));
    }
    mapping->address = address;
  }
  ::close(fd);  // the mapping keeps the file
  std::span<const std::byte> bytes(static_cast<const std::byte*>(mapping->address), mapping->size);
  absl::StatusOr<SafetensorsFile> f = Parse(bytes, path);
  if (!f.ok()) return f.status();
  f->mapping_ = std::move(mapping);
  return f;
}

const TensorInfo* SafetensorsFile::Find(absl::string_view name) const {
  auto it = std::lower_bound(tensors_.begin(), tensors_.end(), name,
                             [](const TensorInfo& t, absl::string_view n) { return t.name < n; });
  return it != tensors_.end() && it->name == name ? &*it : nullptr;
}

std::span<const std::byte> SafetensorsFile::Data(const TensorInfo& tensor) const {
  return data_.subspan(tensor.begin, tensor.bytes());
}

}  // namespace kpack::llama
