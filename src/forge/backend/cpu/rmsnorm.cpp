// CPU RMSNorm (Llama), forward and backward side by side.
// mean(x²) is accumulated in double per row; the normalised output is computed in T as
// x · rstd · weight (the order Hugging Face's LlamaRMSNorm uses: normalise, then scale). Rows
// are independent, so dinp is parallel over rows. dweight is a sum over rows: parallel over
// blocks of channels, rows summed serially in double inside each block, so the result is
// identical for any thread count.
//
// Backward, with norm = x · rstd and dnorm = dout · weight:
//   dinp = rstd · (dnorm − norm · mean(dnorm · norm))
// (the second term is the gradient through rstd, which depends on every element of the row).
#include "forge/ops/rmsnorm.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "forge/core/error.h"
#include "forge/ops/activation.h"

namespace forge::cpu {

template <typename T>
void rmsnorm_fwd(T* out, T* rstd, const T* inp, const T* weight, int N, int C, float eps) {
  FORGE_CHECK(N >= 0 && C > 0, "[rmsnorm_fwd] bad dims N=", N, " C=", C);
#pragma omp parallel for
  for (int n = 0; n < N; ++n) {
    const T* x = inp + static_cast<int64_t>(n) * C;  // (C)
    T* y = out + static_cast<int64_t>(n) * C;        // (C)
    double sq = 0;
    for (int c = 0; c < C; ++c) sq += static_cast<double>(x[c]) * x[c];
    const T s = static_cast<T>(1.0 / std::sqrt(sq / C + static_cast<double>(eps)));
    for (int c = 0; c < C; ++c) y[c] = x[c] * s * weight[c];
    rstd[n] = s;
  }
}

// The reference for the CUDA fused op: the two ops it fuses, in order.
template <typename T>
void residual_rmsnorm_fwd(T* res, T* out, T* rstd, const T* a, const T* b, const T* weight, int N,
                          int C, float eps) {
  residual_fwd<T>(res, a, b, static_cast<int64_t>(N) * C);
  rmsnorm_fwd<T>(out, rstd, res, weight, N, C, eps);
}

template <typename T>
void head_rmsnorm(T* x, const T* weight, int N, int H, int HS, int64_t stride, float eps) {
  FORGE_CHECK(N >= 0 && H > 0 && HS > 0 && stride >= static_cast<int64_t>(H) * HS,
              "[head_rmsnorm] bad dims N=", N, " H=", H, " HS=", HS, " stride=", stride);
  std::vector<T> rstd(H);  // rmsnorm_fwd reads each element before it writes it: in place is safe
  for (int n = 0; n < N; ++n) {
    T* row = x + static_cast<int64_t>(n) * stride;  // (H, HS)
    rmsnorm_fwd<T>(row, rstd.data(), row, weight, H, HS, eps);
  }
}

template <typename T>
void rmsnorm_bwd(T* dinp, T* dweight, const T* dout, const T* inp, const T* weight, const T* rstd,
                 int N, int C) {
  FORGE_CHECK(N >= 0 && C > 0, "[rmsnorm_bwd] bad dims N=", N, " C=", C);
#pragma omp parallel for
  for (int n = 0; n < N; ++n) {
    const int64_t row = static_cast<int64_t>(n) * C;
    const T* x = inp + row;    // (C)
    const T* dy = dout + row;  // (C)
    T* dx = dinp + row;        // (C)
    const T s = rstd[n];
    double dnorm_norm_sum = 0;
    for (int c = 0; c < C; ++c)
      dnorm_norm_sum += static_cast<double>(dy[c] * weight[c]) * (x[c] * s);
    const T dnorm_norm_mean = static_cast<T>(dnorm_norm_sum / C);
    for (int c = 0; c < C; ++c) dx[c] += (dy[c] * weight[c] - x[c] * s * dnorm_norm_mean) * s;
  }

  // dweight (C) += Σ_n dout · norm. Fixed row order per channel. None for a frozen gain.
  if (dweight == nullptr) return;
  constexpr int kBlock = 64;
#pragma omp parallel for
  for (int c0 = 0; c0 < C; c0 += kBlock) {
    const int c1 = std::min(c0 + kBlock, C);
    double dw[kBlock] = {};
    for (int n = 0; n < N; ++n) {
      const int64_t row = static_cast<int64_t>(n) * C;
      const T s = rstd[n];
      for (int c = c0; c < c1; ++c)
        dw[c - c0] += static_cast<double>(dout[row + c]) * (inp[row + c] * s);
    }
    for (int c = c0; c < c1; ++c) dweight[c] += static_cast<T>(dw[c - c0]);
  }
}

#define FORGE_INSTANTIATE(T)                                                                \
  template void rmsnorm_fwd<T>(T*, T*, const T*, const T*, int, int, float);                \
  template void residual_rmsnorm_fwd<T>(T*, T*, T*, const T*, const T*, const T*, int, int, \
                                        float);                                             \
  template void rmsnorm_bwd<T>(T*, T*, const T*, const T*, const T*, const T*, int, int);    \
  template void head_rmsnorm<T>(T*, const T*, int, int, int, int64_t, float);
FORGE_INSTANTIATE(float)
FORGE_INSTANTIATE(double)
#undef FORGE_INSTANTIATE

}  // namespace forge::cpu
