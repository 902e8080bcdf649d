// Host emulators of docs/llama.md's kernels for the fake CUDA driver, so the CPU tier runs
// the whole engine: each emulator decodes a launch's parameter bytes by the launching
// variant's layout (the manifest's, matched against the cubin's parameter layout that the
// fake hands the emulator) and computes the contract's "Common math" in fp32 with bf16
// stores where the contract has them. Device memory is reached only through
// fake::DeviceArray with the exact extent each access needs, so a pointer or size the
// engine gets wrong is a recorded fault (fake::Faults()), not a silent read.
//
// The emulators also check what the contract promises the kernels can rely on, recording
// a sentence per violation (TakeEmulatorErrors): a grid too small for the sizes (on the
// axes that do not depend on block sizes), a counter not zero when a kernel starts.
//
// Not the GPU's bits (summation order differs); deterministic, so two runs of the same
// launches agree bit for bit.

#ifndef KPACK_TESTS_LLAMA_LLAMA_EMULATORS_H_
#define KPACK_TESTS_LLAMA_LLAMA_EMULATORS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "kpack/pack.h"

namespace kpack::llama::testing {

// Registers an emulator for the entry of every llama_* kernel of `pack` (call it after
// each fake::Reset()). INVALID_ARGUMENT when two variants of one entry have the same
// parameter layout under different parameter names (a launch could not be decoded).
absl::Status InstallLlamaEmulators(const Pack& pack, int64_t head_dim);

// The violations recorded since the last call, and clears them.
std::vector<std::string> TakeEmulatorErrors();

// Emulated launches per pack kernel entry since InstallLlamaEmulators.
int64_t EmulatedLaunches();

// bf16 <-> fp32 as the GPU converts (round to nearest even).
float Bf16ToFloat(uint16_t bits);
uint16_t FloatToBf16(float value);

}  // namespace kpack::llama::testing

#endif  // KPACK_TESTS_LLAMA_LLAMA_EMULATORS_H_
