// RMSNorm over the last dimension (Llama): y = x · rstd · weight, rstd = 1/sqrt(mean(x²) + eps).
#pragma once

namespace forge::cpu {

// out (N, C); saves rstd (N).
template <typename T>
void rmsnorm_fwd(T* out, T* rstd, const T* inp, const T* weight, int N, int C, float eps);

// res (N, C) = a + b (residual_fwd), then out, rstd = rmsnorm_fwd of res.
template <typename T>
void residual_rmsnorm_fwd(T* res, T* out, T* rstd, const T* a, const T* b, const T* weight, int N,
                          int C, float eps);

// Accumulates (+=) into dinp (N, C), dweight (C).
template <typename T>
void rmsnorm_bwd(T* dinp, T* dweight, const T* dout, const T* inp, const T* weight,
                 const T* rstd, int N, int C);

}  // namespace forge::cpu
