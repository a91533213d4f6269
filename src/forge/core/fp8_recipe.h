// FP8 products in CUDA training (cuda::CudaBackend): which of a step's linear products run on
// Hopper's FP8 tensor cores, and in which formats. A setting of CUDA runs, read by the CLI from
// FORGE_FP8; here so that backend-agnostic settings (train/runner.h) can carry it.
#pragma once

#include <string>

namespace forge {

enum class Fp8Recipe {
  kOff,  // every product in the training dtype (the default)
  // The blocks' linear products' forward and input-gradient (dX) GEMMs in FP8 with per-row
  // power-of-two scales (ops/fp8_rows.h): activations, weights and output gradients E4M3, f32
  // accumulation, bf16 out; weight gradients (dW) and the LM head stay bf16. bf16 runs only.
  kRows,
  kRowsE5M2,  // the same with the output gradients in E5M2 (more range, one mantissa bit less)
};

// "off", "rows", "rows-e5m2".
inline const char* fp8_recipe_name(Fp8Recipe r) {
  switch (r) {
    case Fp8Recipe::kRows:
      return "rows";
    case Fp8Recipe::kRowsE5M2:
      return "rows-e5m2";
    default:
      return "off";
  }
}

// The inverse of fp8_recipe_name; false for any other string.
inline bool parse_fp8_recipe(const std::string& s, Fp8Recipe& out) {
  for (Fp8Recipe r : {Fp8Recipe::kOff, Fp8Recipe::kRows, Fp8Recipe::kRowsE5M2})
    if (s == fp8_recipe_name(r)) {
      out = r;
      return true;
    }
  return false;
}

}  // namespace forge
