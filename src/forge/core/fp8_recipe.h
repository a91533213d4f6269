// FP8 products in CUDA training (cuda::CudaBackend): which of a step's linear products run on
// Hopper's FP8 tensor cores, and in which formats. A setting of CUDA runs, read by the CLI from
// FORGE_FP8; here so that backend-agnostic settings (train/runner.h) can carry it.
#pragma once

#include <string>

namespace forge {

enum class Fp8Recipe {
  kOff,  // every product in the training dtype (the default)
  // The blocks' linear products' forward and input-gradient (dX) GEMMs in FP8 with per-row
  // power-of-two scales (ops/fp8_rows.h) where the operand casts pay (kFp8MinOutForCast,
  // kFp8MinOutWithBiasSum):
  // activations, weights and output gradients E4M3, f32 accumulation, bf16 out; and the LM
  // head's logits and dx products (the final norm and the cross-entropy row kernel write their
  // FP8 operands; cross_entropy.cu). Weight gradients (dW, the LM head's too) and the dX product
  // with the GELU backward in its epilogue (which cuBLASLt does not fuse in FP8) stay bf16. bf16
  // runs only.
  kRows,
  kRowsE5M2,  // the same with the output gradients in E5M2 (more range, one mantissa bit less)
  // kRows and the dX products of layers with a bias from a narrower output
  // (kFp8MinOutWithBiasSum: GPT-2's q|k|v and fc), their output gradients' casts taking the bias
  // gradients. Faster (GPT-2 124M +2% on an H100) but its 1,000-step loss curve sat further above
  // bf16's than kRows' (docs/perf-notes.md, docs/quality/fp8/): a separate choice, not kRows.
  kRowsDx,
};

// Under kRows / kRowsE5M2, a product whose x operand must be cast by a separate pass (not a norm's
// output, whose E4M3 rows the norm writes) runs in FP8 only when its output is at least this
// wide. The pass costs ~3 bytes of traffic an element of x (~1.1 ns per 1,000 elements at ~2.8
// TB/s); FP8 saves ~2·OUT flops an element at the difference of the two rates (bf16 ~660, FP8
// ~1,000 TFLOP/s in the H100's GPT-2 products, docs/perf-notes.md): even at OUT ≈ 1,040. Twice
// that, so the cast clearly pays: a Llama MLP's down projection's dX when the hidden width is ≥
// 2,048 (GPT-2's MLP projection's dX, OUT = 3,072, would be one but carries the DGELU epilogue);
// the attention output's and q|k|v's dX (OUT = the model width) would lose.
inline constexpr int kFp8MinOutForCast = 2048;

// Under kRowsDx: the dX product of a layer with a bias (GPT-2's q|k|v and MLP fc) reads its
// output gradient for the bias gradient anyway: cast_fp8_rows_bias (backend/cuda/ops.h) takes
// both from one read, so the cast costs the 1 byte an element it writes instead of 3, and FP8
// pays from an output a third as wide (~350). GPT-2 124M's two (OUT = 768) then save ~130 and
// ~170 µs a product (the bf16 / FP8 figures of docs/perf-notes.md) against ~70 and ~90 µs for
// the casts beyond the bias passes.
inline constexpr int kFp8MinOutWithBiasSum = 512;

// "off", "rows", "rows-e5m2", "rows-dx".
inline const char* fp8_recipe_name(Fp8Recipe r) {
  switch (r) {
    case Fp8Recipe::kRows:
      return "rows";
    case Fp8Recipe::kRowsE5M2:
      return "rows-e5m2";
    case Fp8Recipe::kRowsDx:
      return "rows-dx";
    default:
      return "off";
  }
}

// The inverse of fp8_recipe_name; false for any other string.
inline bool parse_fp8_recipe(const std::string& s, Fp8Recipe& out) {
  for (Fp8Recipe r : {Fp8Recipe::kOff, Fp8Recipe::kRows, Fp8Recipe::kRowsE5M2, Fp8Recipe::kRowsDx})
    if (s == fp8_recipe_name(r)) {
      out = r;
      return true;
    }
  return false;
}

}  // namespace forge
