// CPU LayerNorm (GPT-2), forward and backward side by side.
// Row statistics are computed in double with two passes (mean, then Σ(x − mean)²), which avoids
// the cancellation of E[x²] − E[x]² on rows with a large mean; the normalised output itself is
// computed in T. Rows are independent, so dinp is parallel over rows. dweight and dbias are sums
// over rows: parallel over blocks of channels, rows summed serially in double inside each block,
// so the result is identical for any thread count. The backward recomputes norm = (x − mean)·rstd
// from the saved mean and rstd rather than keeping an (N, C) buffer.
#include "forge/ops/layernorm.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "forge/core/error.h"
#include "forge/ops/activation.h"

namespace forge::cpu {

template <typename T>
void layernorm_fwd(T* out, T* mean, T* rstd, const T* inp, const T* weight, const T* bias, int N,
                   int C, float eps) {
  FORGE_CHECK(N >= 0 && C > 0, "[layernorm_fwd] bad dims N=", N, " C=", C);
#pragma omp parallel for
  for (int n = 0; n < N; ++n) {
    const T* x = inp + static_cast<int64_t>(n) * C;  // (C)
    T* y = out + static_cast<int64_t>(n) * C;        // (C)
    double sum = 0;
    for (int c = 0; c < C; ++c) sum += x[c];
    const double m = sum / C;
    double sq = 0;
    for (int c = 0; c < C; ++c) sq += (x[c] - m) * (x[c] - m);
    const double var = sq / C;  // biased, as torch.nn.LayerNorm
    const T m_t = static_cast<T>(m);
    const T s_t = static_cast<T>(1.0 / std::sqrt(var + static_cast<double>(eps)));
    for (int c = 0; c < C; ++c) y[c] = (x[c] - m_t) * s_t * weight[c] + bias[c];
    mean[n] = m_t;
    rstd[n] = s_t;
  }
}

// The reference for the CUDA fused op: the two ops it fuses, in order.
template <typename T>
void residual_layernorm_fwd(T* res, T* out, T* mean, T* rstd, const T* a, const T* b,
                            const T* weight, const T* bias, int N, int C, float eps) {
  residual_fwd<T>(res, a, b, static_cast<int64_t>(N) * C);
  layernorm_fwd<T>(out, mean, rstd, res, weight, bias, N, C, eps);
}

template <typename T>
void layernorm_bwd(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight,
                   const T* mean, const T* rstd, int N, int C) {
  FORGE_CHECK(N >= 0 && C > 0, "[layernorm_bwd] bad dims N=", N, " C=", C);
  // dinp = rstd · (dnorm − mean(dnorm) − norm · mean(dnorm · norm)), dnorm = dout · weight.
#pragma omp parallel for
  for (int n = 0; n < N; ++n) {
    const int64_t row = static_cast<int64_t>(n) * C;
    const T* x = inp + row;    // (C)
    const T* dy = dout + row;  // (C)
    T* dx = dinp + row;        // (C)
    const T m = mean[n], s = rstd[n];
    double dnorm_sum = 0, dnorm_norm_sum = 0;
    for (int c = 0; c < C; ++c) {
      const T norm = (x[c] - m) * s;
      const T dnorm = dy[c] * weight[c];
      dnorm_sum += dnorm;
      dnorm_norm_sum += static_cast<double>(dnorm) * norm;
    }
    const T dnorm_mean = static_cast<T>(dnorm_sum / C);
    const T dnorm_norm_mean = static_cast<T>(dnorm_norm_sum / C);
    for (int c = 0; c < C; ++c) {
      const T norm = (x[c] - m) * s;
      const T dnorm = dy[c] * weight[c];
      dx[c] += (dnorm - dnorm_mean - norm * dnorm_norm_mean) * s;
    }
  }

  // dweight (C) += Σ_n dout · norm;  dbias (C) += Σ_n dout. Fixed row order per channel.
  constexpr int kBlock = 64;
#pragma omp parallel for
  for (int c0 = 0; c0 < C; c0 += kBlock) {
    const int c1 = std::min(c0 + kBlock, C);
    double dw[kBlock] = {}, db[kBlock] = {};
    for (int n = 0; n < N; ++n) {
      const int64_t row = static_cast<int64_t>(n) * C;
      const T m = mean[n], s = rstd[n];
      for (int c = c0; c < c1; ++c) {
        const T norm = (inp[row + c] - m) * s;
        dw[c - c0] += static_cast<double>(dout[row + c]) * norm;
        db[c - c0] += dout[row + c];
      }
    }
    for (int c = c0; c < c1; ++c) {
      dweight[c] += static_cast<T>(dw[c - c0]);
      dbias[c] += static_cast<T>(db[c - c0]);
    }
  }
}

#define FORGE_INSTANTIATE(T)                                                                      \
  template void layernorm_fwd<T>(T*, T*, T*, const T*, const T*, const T*, int, int, float);      \
  template void residual_layernorm_fwd<T>(T*, T*, T*, T*, const T*, const T*, const T*, const T*, \
                                          int, int, float);                                       \
  template void layernorm_bwd<T>(T*, T*, T*, const T*, const T*, const T*, const T*, const T*,    \
                                 int, int);
FORGE_INSTANTIATE(float)
FORGE_INSTANTIATE(double)
#undef FORGE_INSTANTIATE

}  // namespace forge::cpu
