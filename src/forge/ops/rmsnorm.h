// RMSNorm over the last dimension (Llama): y = x · rstd · weight, rstd = 1/sqrt(mean(x²) + eps).
#pragma once

#include <cstdint>

namespace forge::cpu {

// out (N, C); saves rstd (N).
template <typename T>
void rmsnorm_fwd(T* out, T* rstd, const T* inp, const T* weight, int N, int C, float eps);

// res (N, C) = a + b (residual_fwd), then out, rstd = rmsnorm_fwd of res.
template <typename T>
void residual_rmsnorm_fwd(T* res, T* out, T* rstd, const T* a, const T* b, const T* weight, int N,
                          int C, float eps);

// In place over H heads of HS per row, rows `stride` elements apart (q or k inside a decode
// step's fused q|k|v rows): x[n, h, :] = rmsnorm(x[n, h, :]) · weight (HS). Qwen3's q/k norm at
// inference; the arithmetic of rmsnorm_fwd over N·H rows of HS, with no rstd kept.
template <typename T>
void head_rmsnorm(T* x, const T* weight, int N, int H, int HS, int64_t stride, float eps);

// Accumulates (+=) into dinp (N, C), dweight (C); dweight nullptr: not computed (a frozen gain).
template <typename T>
void rmsnorm_bwd(T* dinp, T* dweight, const T* dout, const T* inp, const T* weight,
                 const T* rstd, int N, int C);

}  // namespace forge::cpu
