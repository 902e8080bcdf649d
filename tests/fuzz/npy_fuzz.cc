// Fuzzes ParseNpy, the .npy reader of `kpack run`: documented safe on arbitrary input
// (an error status, never a crash or a huge allocation), and an array it returns holds
// exactly itemsize() * size() bytes of a supported dtype.

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "absl/status/statusor.h"
#include "fuzz_check.h"
#include "npy.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  absl::StatusOr<kpack::cli::NpyArray> array =
      kpack::cli::ParseNpy(std::as_bytes(std::span(data, size)), "fuzz.npy");
  if (!array.ok()) {
    KPACK_FUZZ_CHECK(array.status().code() == absl::StatusCode::kInvalidArgument);
    return 0;
  }
  KPACK_FUZZ_CHECK(array->itemsize() != 0);  // a supported, normalized dtype
  absl::StatusOr<std::string> descr = kpack::cli::DtypeDescr(array->dtype);
  KPACK_FUZZ_CHECK(descr.ok() && *descr == array->dtype);
  for (int64_t dim : array->shape) KPACK_FUZZ_CHECK(dim >= 0);
  KPACK_FUZZ_CHECK(array->data.size() == array->itemsize() * static_cast<uint64_t>(array->size()));
  KPACK_FUZZ_CHECK(array->data.size() <= size);
  return 0;
}
