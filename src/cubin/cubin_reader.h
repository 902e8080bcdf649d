// Reads what kpack needs from a cubin (an NVIDIA ELF image, as ptxas writes it): the SM
// architecture it was built for and, for each kernel entry, the parameter layout and the
// block-size requirements ptxas recorded in `.nv.info.<kernel>`.
//
// Runtime::Open and Pack::Read read every cubin with it, to hold the manifest's `entry`,
// `arch` and `layout` against the ELF before anything launches; `kpack verify` does the
// same through Pack, and the CPU tests' fake driver answers `cuKernelGetParamInfo` from it.
// It depends on nothing but <elf.h>'s definitions (no libelf). The input is untrusted:
// every offset and length is checked, every header and section the ELF describes must lie
// inside the image (the driver reads an image as far as its headers say), and any
// inconsistency is an INVALID_ARGUMENT status, never a crash.
//
// Thread safety: ReadCubin may be called from any number of threads at once.

#ifndef KPACK_CUBIN_CUBIN_READER_H_
#define KPACK_CUBIN_CUBIN_READER_H_

#include <cstddef>
#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace kpack::internal {

// One kernel parameter, as its EIATTR_KPARAM_INFO record (and cuKernelGetParamInfo)
// describes it.
struct CubinParam {
  uint32_t ordinal;  // 0-based position in the compiled kernel's signature
  uint32_t offset;   // byte offset in the parameter buffer
  uint32_t size;     // bytes
};

struct CubinKernel {
  std::string name;                // the entry symbol, e.g. "add_kernel"
  std::vector<CubinParam> params;  // sorted by ordinal; the ordinals are exactly 0..n-1
  // The block shape (x, y, z) the kernel must be launched with, when the cubin says
  // (EIATTR_REQNTID, from PTX `.reqntid`: Triton sets it to 32 * num_warps threads).
  std::optional<std::array<uint32_t, 3>> required_block;
  // The most threads a block may have, as x * y * z, when the cubin says
  // (EIATTR_MAX_THREADS, from PTX `.maxntid`).
  std::optional<std::array<uint32_t, 3>> max_block;
};

struct CubinInfo {
  // The real SM architecture, major * 10 + minor: 90 for both sm_90 and sm_90a. Whether the
  // cubin is an architecture-specific ("a") variant is not reported: CUDA 13's ptxas no
  // longer marks it in e_flags.
  int arch = 0;
  std::vector<CubinKernel> kernels;  // sorted by name
};

// Parses `image`, a whole cubin file. Kernels are the global function symbols that ptxas
// marked as entries; each must have its `.nv.info.<name>` section. INVALID_ARGUMENT,
// with a sentence saying what is wrong, for anything that is not a well-formed cubin.
absl::StatusOr<CubinInfo> ReadCubin(std::span<const std::byte> image);

// The size of the kernel's parameter buffer: the end of its furthest parameter (0 for a
// kernel without parameters). This is the size `cuLaunchKernelEx` expects in
// CU_LAUNCH_PARAM_BUFFER_SIZE.
uint32_t ParamBufferSize(const CubinKernel& kernel);

}  // namespace kpack::internal

#endif  // KPACK_CUBIN_CUBIN_READER_H_
