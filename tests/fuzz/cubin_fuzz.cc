// Fuzzes ReadCubin, the cubin (NVIDIA ELF) reader behind Open, `kpack verify` and the fake
// driver: the input is untrusted, so anything but a well-formed cubin must be an
// INVALID_ARGUMENT status, never a crash; what it accepts must keep the documented shape.

#include <cstddef>
#include <cstdint>
#include <span>

#include "absl/status/statusor.h"
#include "cubin/cubin_reader.h"
#include "fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  absl::StatusOr<kpack::internal::CubinInfo> info =
      kpack::internal::ReadCubin(std::as_bytes(std::span(data, size)));
  if (!info.ok()) {
    KPACK_FUZZ_CHECK(info.status().code() == absl::StatusCode::kInvalidArgument);
    return 0;
  }
  KPACK_FUZZ_CHECK(info->arch >= 10);
  for (size_t i = 0; i < info->kernels.size(); ++i) {
    const kpack::internal::CubinKernel& kernel = info->kernels[i];
    KPACK_FUZZ_CHECK(!kernel.name.empty());
    // Sorted by name, names unique.
    if (i > 0) KPACK_FUZZ_CHECK(info->kernels[i - 1].name < kernel.name);
    // Sorted by ordinal, the ordinals exactly 0..n-1.
    uint32_t end = 0;
    for (size_t p = 0; p < kernel.params.size(); ++p) {
      KPACK_FUZZ_CHECK(kernel.params[p].ordinal == p);
      if (kernel.params[p].offset + kernel.params[p].size > end) {
        end = kernel.params[p].offset + kernel.params[p].size;
      }
    }
    KPACK_FUZZ_CHECK(kpack::internal::ParamBufferSize(kernel) == end);
  }
  return 0;
}
