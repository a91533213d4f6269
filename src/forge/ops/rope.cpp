// RoPE frequencies (ops/rope.h), the one implementation for every backend: the CPU ops build
// their angle tables from it, the CUDA ops pass it (divided by π) to their kernels. Written after
// transformers' modeling_rope_utils (the default, linear and llama3 rope_types), but in double
// where transformers computes in f32, so the CPU reference stays exact to the last rounding of
// the rotation.
#include "forge/ops/rope.h"

#include <cmath>
#include <numbers>
#include <vector>

#include "forge/core/error.h"

namespace forge {
namespace {

const char* scaling_name(RopeScaling s) {
  switch (s) {
    case RopeScaling::kLinear:
      return "linear";
    case RopeScaling::kLlama3:
      return "llama3";
    case RopeScaling::kDynamic:
      return "dynamic";
    case RopeScaling::kNone:
      break;
  }
  return "none";
}

// Llama 3.1: wavelengths longer than the pretraining context / low_freq_factor are stretched by
// `factor` (interpolated), shorter than context / high_freq_factor are kept (extrapolated), and
// the band between blends the two linearly in context / wavelength.
void apply_llama3(std::vector<double>& inv_freq, const Rope& rope) {
  if (rope.original_max_positions <= 0)
    throw Error(str("[rope] llama3 scaling needs original_max_positions > 0, got ",
                    rope.original_max_positions));
  if (!(rope.low_freq_factor > 0.0f) || !(rope.high_freq_factor > rope.low_freq_factor))
    throw Error(str("[rope] llama3 scaling needs 0 < low_freq_factor < high_freq_factor, got ",
                    "low_freq_factor ", rope.low_freq_factor, ", high_freq_factor ",
                    rope.high_freq_factor));
  const double orig = rope.original_max_positions, factor = rope.factor;
  const double low = rope.low_freq_factor, high = rope.high_freq_factor;
  const double low_freq_wavelen = orig / low, high_freq_wavelen = orig / high;
  for (double& f : inv_freq) {
    const double wavelen = 2.0 * std::numbers::pi / f;
    if (wavelen > low_freq_wavelen) {
      f /= factor;
    } else if (!(wavelen < high_freq_wavelen)) {  // both band edges included, as transformers
      const double smooth = (orig / wavelen - low) / (high - low);
      f = (1.0 - smooth) * f / factor + smooth * f;
    }
  }
}

}  // namespace

std::vector<double> rope_inv_freq(const Rope& rope, int HS) {
  if (HS <= 0 || HS % 2 != 0)
    throw Error(str("[rope] head size must be even and > 0, got HS=", HS));
  if (!(rope.theta > 0.0f)) throw Error(str("[rope] theta must be > 0, got ", rope.theta));
  if (rope.scaling != RopeScaling::kNone && !(rope.factor > 0.0f))
    throw Error(
        str("[rope] ", scaling_name(rope.scaling), " scaling needs factor > 0, got ", rope.factor));
  const int half = HS / 2;
  std::vector<double> inv_freq(half);  // (HS/2)
  // The ops' expression from before scaling existed, so unscaled models keep their bits.
  for (int i = 0; i < half; ++i)
    inv_freq[i] = std::pow(static_cast<double>(rope.theta), -2.0 * i / static_cast<double>(HS));
  switch (rope.scaling) {
    case RopeScaling::kNone:
      break;
    case RopeScaling::kLinear:  // positions divided by factor, i.e. every frequency
      for (double& f : inv_freq) f /= static_cast<double>(rope.factor);
      break;
    case RopeScaling::kLlama3:
      apply_llama3(inv_freq, rope);
      break;
    case RopeScaling::kDynamic:
      // Dynamic NTK raises the base only once a sequence grows past original_max_positions
      // (transformers recomputes inv_freq per forward pass then); up to that length it is the
      // default RoPE. Forge's config layer keeps a dynamic-scaled model within that length, so
      // the unscaled frequencies are exact for every context Forge runs it at.
      break;
  }
  return inv_freq;
}

}  // namespace forge
