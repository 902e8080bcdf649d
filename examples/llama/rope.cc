#include "rope.h"

#include <cmath>
#include <numbers>

namespace kpack::llama {

std::vector<float> RopeInvFreq(const LlamaConfig& config) {
  const int64_t d = config.head_dim;
  std::vector<float> out(static_cast<size_t>(d / 2));
  for (int64_t j = 0; j < d / 2; ++j) {
    double f =
        std::pow(config.rope_theta, -(2.0 * static_cast<double>(j)) / static_cast<double>(d));
    if (config.rope_scaling.has_value()) {
      const Llama3RopeScaling& s = *config.rope_scaling;
      const double original = static_cast<double>(s.original_max_position_embeddings);
      const double low_freq_wavelen = original / s.low_freq_factor;
      const double high_freq_wavelen = original / s.high_freq_factor;
      const double wavelen = 2 * std::numbers::pi / f;
      if (wavelen < high_freq_wavelen) {
        // High frequencies stay.
      } else if (wavelen > low_freq_wavelen) {
        f = f / s.factor;
      } else {
        const double smooth =
            (original / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
        f = (1 - smooth) * f / s.factor + smooth * f;
      }
    }
    out[static_cast<size_t>(j)] = static_cast<float>(f);
  }
  return out;
}

}  // namespace kpack::llama
