// Reading and writing NumPy .npy files, for `kpack run`: kernel inputs come from .npy files
// and outputs go back to them.
//
// Format: https://numpy.org/doc/stable/reference/generated/numpy.lib.format.html
// Supported: versions 1.0, 2.0 and 3.0; C-order arrays of little-endian (or single-byte)
// bool, signed and unsigned integers of 1, 2, 4 and 8 bytes, and float16/32/64. Everything
// else (Fortran order, big-endian, object, structured, string, complex, datetime dtypes) is
// rejected with an INVALID_ARGUMENT naming the file and the problem.

#ifndef KPACK_TOOLS_CLI_NPY_H_
#define KPACK_TOOLS_CLI_NPY_H_

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kpack::cli {

struct NpyArray {
  // NumPy descr, normalized: "<f2", "<f4", "<f8", "<i1", "<i2", "<i4", "<i8", "<u1",
  // "<u2", "<u4", "<u8" or "|b1" (bool). Single-byte integers are "<i1"/"<u1" here even
  // though NumPy itself writes "|i1"/"|u1".
  std::string dtype;
  // C order; empty means a scalar (one element).
  std::vector<int64_t> shape;
  // Raw little-endian element bytes; data.size() == itemsize() * size() for a valid array.
  // Bool elements are stored as read, one byte each (NumPy writes 0 and 1).
  std::vector<std::byte> data;

  // Bytes per element (DescrItemSize(dtype)); 0 when `dtype` is not supported.
  size_t itemsize() const;
  // Number of elements: the product of `shape` (1 for a scalar). Does not check for
  // overflow; arrays from ReadNpy/ParseNpy never overflow.
  int64_t size() const;
};

// Reads a .npy file. NOT_FOUND if `path` does not exist; INVALID_ARGUMENT, naming the
// file and the problem, for a directory, bad magic, an unsupported version, a malformed
// header, Fortran order, a big-endian / object / structured / otherwise unsupported dtype,
// a shape whose byte size overflows, or data that is truncated or followed by extra bytes.
// Other I/O failures map from errno (e.g. PERMISSION_DENIED).
absl::StatusOr<NpyArray> ReadNpy(const std::string& path);

// Parses the bytes of a .npy file held in memory; `name` is used in error messages only.
// Same checks as ReadNpy. Safe on arbitrary input: every read is bounds-checked, header
// nesting is limited, and integer parsing and shape products are overflow-checked, so
// hostile input yields an error status, never a crash or a huge allocation (the data
// copied out is never larger than `bytes`).
absl::StatusOr<NpyArray> ParseNpy(std::span<const std::byte> bytes, absl::string_view name);

// Writes `array` as a version 1.0 .npy file (the header, newline included, is padded with
// spaces so that the data starts at a multiple of 64 bytes), byte-identical to what
// numpy.save writes for the same array. `array.dtype` may be any name DtypeDescr accepts.
// INVALID_ARGUMENT for an unknown dtype, a negative dimension, or data whose size does not
// match the shape; an errno-derived status if the file cannot be written.
absl::Status WriteNpy(const std::string& path, const NpyArray& array);

// Maps a user dtype name — "float16", "float32", "float64", "int8", "int16", "int32",
// "int64", "uint8", "uint16", "uint32", "uint64", "bool" — or a NumPy descr such as "<f4",
// "|u1", "=i2", "|b1" or "f8" (no byte-order character means little-endian) to its
// normalized descr (see NpyArray::dtype). INVALID_ARGUMENT for anything else, including
// big-endian descrs of multi-byte types.
absl::StatusOr<std::string> DtypeDescr(absl::string_view name);

// Bytes per element of anything DtypeDescr accepts ("<f4", "|b1", "float32", ...); 0 if
// DtypeDescr would reject it.
size_t DescrItemSize(absl::string_view descr);

}  // namespace kpack::cli

#endif  // KPACK_TOOLS_CLI_NPY_H_
