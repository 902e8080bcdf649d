// llama/cli.h: the `kpack-llama` program (ENGINE_IFACE.md), callable in-process so the
// tests run it against the fake driver with the kernels emulated.
//
//   kpack-llama --pack DIR --checkpoint DIR [--batch B] [--prompt-lens L[,L...]]
//       [--steps N] [--capacity C] [--graphs on|off] [--seed S] [--warmup-seqs W]
//       [--timed-seqs T] [--json FILE] [--digests]
//
// Loads the CUDA driver ($KPACK_CUDA_DRIVER, else libcuda.so.1) and device 0, the pack
// and the checkpoint, runs W + T sequences (llama/run.h) and prints each row's generated
// tokens, µs/step, tokens/s and the host's µs to issue a step; --json FILE writes the
// document run.h's ResultJson describes. Exit status 0, 1 on any error (printed to `err`
// naming what failed), 2 for a usage error.

#ifndef KPACK_EXAMPLES_LLAMA_CLI_H_
#define KPACK_EXAMPLES_LLAMA_CLI_H_

#include <ostream>

namespace kpack::llama {

int KpackLlamaMain(int argc, const char* const* argv, std::ostream& out, std::ostream& err);

}  // namespace kpack::llama

#endif  // KPACK_EXAMPLES_LLAMA_CLI_H_
