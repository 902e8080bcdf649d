// Files the Llama tests write themselves: safetensors files with any header (valid or
// hostile), and small valid checkpoints of a given config, in a temporary directory.

#ifndef KPACK_TESTS_LLAMA_TEST_FILES_H_
#define KPACK_TESTS_LLAMA_TEST_FILES_H_

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "config.h"
#include "nlohmann/json.hpp"

namespace kpack::llama::testing {

// A fresh temporary directory, removed with everything in it on destruction.
class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/kpack_llama_test_XXXXXX";
    path_ = mkdtemp(tmpl);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  const std::filesystem::path& path() const { return path_; }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

inline void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out << bytes;
}

// A safetensors file: the 8-byte little-endian `header_length` (default: the header's
// size), the header text, then `data`.
inline std::string Safetensors(const std::string& header, const std::string& data,
                               uint64_t header_length = UINT64_MAX) {
  if (header_length == UINT64_MAX) header_length = header.size();
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i)
    out[static_cast<size_t>(i)] = static_cast<char>(header_length >> (8 * i));
  return out + header + data;
}

// One tensor to write: dtype, shape, and its bytes (filled with a pattern unless given).
struct TensorSpec {
  std::string dtype = "BF16";
  std::vector<int64_t> shape;
  std::string bytes;  // empty: elements * dtype size bytes of a pattern
};

inline size_t DtypeSize(const std::string& dtype) {
  if (dtype == "F32" || dtype == "I32") return 4;
  if (dtype == "F64" || dtype == "I64") return 8;
  if (dtype == "U8" || dtype == "I8" || dtype == "BOOL") return 1;
  return 2;
}

// A valid safetensors file of `tensors` (packed in name order) with optional metadata.
// Tensors without bytes get a pattern that differs per tensor.
inline std::string SafetensorsOf(std::map<std::string, TensorSpec> tensors,
                                 const std::map<std::string, std::string>& metadata = {}) {
  nlohmann::json header = nlohmann::json::object();
  std::string data;
  uint32_t seed = 1;
  for (auto& [name, t] : tensors) {
    if (t.bytes.empty()) {
      size_t n = DtypeSize(t.dtype);
      for (int64_t d : t.shape) n *= static_cast<size_t>(d);
      t.bytes.resize(n);
      for (size_t i = 0; i < n; ++i) {
        seed = seed * 1103515245u + 12345u;
        t.bytes[i] = static_cast<char>(seed >> 16);
      }
    }
    header[name] = {{"dtype", t.dtype},
                    {"shape", t.shape},
                    {"data_offsets", {data.size(), data.size() + t.bytes.size()}}};
    data += t.bytes;
  }
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::string text = header.dump();
  text.resize((text.size() + 7) / 8 * 8, ' ');  // padded as the safetensors package pads
  return Safetensors(text, data);
}

// The tensors of a complete checkpoint of `config` (llama/checkpoint.h's list), with
// distinct byte patterns.
std::map<std::string, TensorSpec> CheckpointTensors(const LlamaConfig& config);

// config.json text for `config` (the fields ReadConfig reads).
std::string ConfigJson(const LlamaConfig& config);

// A config small enough to write in a test: H 8, L 2, NH 2, NKV 1, D 4, I 16, V 10, tied.
LlamaConfig MicroConfig();

}  // namespace kpack::llama::testing

#endif  // KPACK_TESTS_LLAMA_TEST_FILES_H_
