// llama/safetensors.h: read a `.safetensors` file as Hugging Face publishes weights.
//
// The format: an 8-byte little-endian header length N, N bytes of JSON mapping each tensor
// name to {"dtype": "BF16", "shape": [...], "data_offsets": [begin, end]} (byte offsets
// into the data region that follows the header) plus an optional "__metadata__" object of
// strings, then the data region. `SafetensorsFile::Open` maps the file read-only and
// checks all of it before anyone reads a byte, as the `safetensors` package does: the
// header length against the file, the JSON, every entry's dtype, shape and offsets (inside
// the data region, exactly dtype size × elements long, no two tensors overlapping, no
// bytes that belong to no tensor). Each error is INVALID_ARGUMENT (NOT_FOUND for a missing
// file) naming the file and, where there is one, the tensor. A hostile file gives an
// error, never a crash or a read outside the mapping.
//
//   absl::StatusOr<SafetensorsFile> file = SafetensorsFile::Open(dir + "/model.safetensors");
//   if (!file.ok()) return file.status();
//   const TensorInfo* t = file->Find("model.norm.weight");   // null if absent
//   std::span<const std::byte> bytes = file->Data(*t);        // t->bytes() long
//
// Thread safety: an open file is immutable; any number of threads may read it. The
// mapping lives as long as the last copy of the SafetensorsFile (copies share it).

#ifndef KPACK_EXAMPLES_LLAMA_SAFETENSORS_H_
#define KPACK_EXAMPLES_LLAMA_SAFETENSORS_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kpack::llama {

struct TensorInfo {
  std::string name;
  std::string dtype;           // as the header spells it: "BF16", "F32", ...
  size_t dtype_size = 0;       // bytes per element
  std::vector<int64_t> shape;  // outer dimension first
  uint64_t begin = 0;          // [begin, end): bytes of the data region
  uint64_t end = 0;
  uint64_t bytes() const { return end - begin; }
};

// "[2048, 8192]": a shape as errors print it.
std::string ShapeString(std::span<const int64_t> shape);

class SafetensorsFile {
 public:
  // Maps and checks the file at `path` (see the top of this file).
  static absl::StatusOr<SafetensorsFile> Open(const std::string& path);
  // Checks a whole file's bytes already in memory; `source` names it in errors. The
  // result refers to `file`, which must outlive it.
  static absl::StatusOr<SafetensorsFile> Parse(std::span<const std::byte> file,
                                               absl::string_view source);

  const std::string& path() const { return path_; }
  // Sorted by name.
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  // The tensor called `name`, or null.
  const TensorInfo* Find(absl::string_view name) const;
  // The tensor's bytes (little-endian elements, row-major), inside the mapping.
  std::span<const std::byte> Data(const TensorInfo& tensor) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  struct Mapping;
  std::string path_;
  std::shared_ptr<const Mapping> mapping_;  // null when parsed from caller's memory
  std::span<const std::byte> data_;         // the data region
  std::vector<TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace kpack::llama

#endif  // KPACK_EXAMPLES_LLAMA_SAFETENSORS_H_
