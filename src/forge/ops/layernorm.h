// LayerNorm over the last dimension (GPT-2): y = (x − mean) · rstd · weight + bias.
#pragma once

namespace forge::cpu {

// out (N, C); saves mean (N) and rstd (N) = 1 / sqrt(var + eps), var biased (÷C).
template <typename T>
void layernorm_fwd(T* out, T* mean, T* rstd, const T* inp, const T* weight, const T* bias,
                   int N, int C, float eps);

// res (N, C) = a + b (residual_fwd), then out, mean, rstd = layernorm_fwd of res.
template <typename T>
void residual_layernorm_fwd(T* res, T* out, T* mean, T* rstd, const T* a, const T* b,
                            const T* weight, const T* bias, int N, int C, float eps);

// Accumulates (+=) into dinp (N, C), dweight (C), dbias (C).
template <typename T>
void layernorm_bwd(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight,
                   const T* mean, const T* rstd, int N, int C);

}  // namespace forge::cpu
