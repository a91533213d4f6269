// Linear layer: out = inp · W (+ bias), as a matmul with layout flags.
// Weight layouts: kOutIn is (OC, C) as torch.nn.Linear stores it (Llama); kInOut is (C, OC) as
// GPT-2's Conv1D stores it. Keeping each family's Hugging Face layout means the flat parameter
// buffer is the checkpoint, with no transposed copies on import or export.
#pragma once

#include <cstdint>

namespace forge {

enum class WeightLayout { kOutIn, kInOut };

}  // namespace forge

namespace forge::cpu {

// out (N, OC) = inp (N, C) · Wᵀ + bias (OC). bias may be null.
template <typename T>
void linear_fwd(T* out, const T* inp, const T* weight, const T* bias, int N, int C, int OC,
                WeightLayout layout);

// Accumulates (+=): dinp (N, C), dweight (same layout as weight), dbias (OC). Each may be null
// (skipped; a null dweight is a frozen weight, LoRA's base: its product is not computed).
template <typename T>
void linear_bwd(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight,
                int N, int C, int OC, WeightLayout layout);

// dbias (OC) += Σ_n dout[n, :] over dout (N, OC): linear_bwd's bias gradient on its own. ld: dout's
// row stride (a column slice of a wider gradient), 0: OC.
template <typename T>
void bias_grad(T* dbias, const T* dout, int N, int OC, int64_t ld = 0);

}  // namespace forge::cpu
