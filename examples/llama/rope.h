// llama/rope.h: the rotary embedding's inverse frequencies, as both engines upload them.
//
// docs/llama.md fixes the computation so that the C++ and the Python engine upload the
// same bits: in float64, for j in [0, D/2), f = theta^(-(2j)/D) (`std::pow(theta, -(2.0 *
// j) / D)`, as Python's `theta ** (-(2 * j) / D)`), then, with llama3 rope_scaling
// (Hugging Face's rule, in its operation order):
//   wavelen = 2π / f
//   wavelen < original / high_freq_factor:  f
//   wavelen > original / low_freq_factor:   f / factor
//   otherwise: s = (original / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor),
//              (1 - s) * f / factor + s * f
// and each value rounded once to fp32.

#ifndef KPACK_EXAMPLES_LLAMA_ROPE_H_
#define KPACK_EXAMPLES_LLAMA_ROPE_H_

#include <vector>

#include "config.h"

namespace kpack::llama {

// head_dim / 2 values.
std::vector<float> RopeInvFreq(const LlamaConfig& config);

}  // namespace kpack::llama

#endif  // KPACK_EXAMPLES_LLAMA_ROPE_H_
