// CPU linear layer. The three products (forward, dinp, dweight) go through forge::cpu::matmul
// (OpenBLAS), with the weight layout expressed as a transpose flag, never a copy; the backward
// products use beta = 1 so they accumulate into the caller's gradients as the header requires.
// The bias gradient (bias_grad, also the reference of the CUDA op) is a column sum of dout:
// parallel over output channels, each summed over rows in a fixed order in double (blocks of 64
// columns keep the reads contiguous), so the result does not depend on the thread count.
#include "forge/ops/linear.h"

#include <algorithm>
#include <cstdint>

#include "forge/core/error.h"
#include "forge/ops/matmul.h"

namespace forge::cpu {

template <typename T>
void linear_fwd(T* out, const T* inp, const T* weight, const T* bias, int N, int C, int OC,
                WeightLayout layout) {
  FORGE_CHECK(N >= 0 && C >= 0 && OC >= 0, "[linear_fwd] negative dims ", N, " ", C, " ", OC);
  // out (N, OC) = inp (N, C) · op(W) with op(W) (C, OC): Wᵀ for kOutIn, W itself for kInOut.
  matmul<T>(out, inp, weight, N, OC, C, false, layout == WeightLayout::kOutIn);
  if (bias == nullptr) return;
#pragma omp parallel for
  for (int n = 0; n < N; ++n) {
    T* out_n = out + static_cast<int64_t>(n) * OC;  // (OC)
    for (int o = 0; o < OC; ++o) out_n[o] += bias[o];
  }
}

template <typename T>
void linear_bwd(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight, int N,
                int C, int OC, WeightLayout layout) {
  FORGE_CHECK(N >= 0 && C >= 0 && OC >= 0, "[linear_bwd] negative dims ", N, " ", C, " ", OC);
  const bool out_in = layout == WeightLayout::kOutIn;
  if (dinp != nullptr) {
    // dinp (N, C) += dout (N, OC) · op(W)ᵀ: W (OC, C) as stored for kOutIn, Wᵀ for kInOut.
    matmul<T>(dinp, dout, weight, N, C, OC, false, !out_in, T(1), T(1));
  }
  if (dweight == nullptr) {
    // A frozen weight (LoRA's base): its gradient is not computed at all.
  } else if (out_in) {
    // dweight (OC, C) += doutᵀ (OC, N) · inp (N, C)
    matmul<T>(dweight, dout, inp, OC, C, N, true, false, T(1), T(1));
  } else {
    // dweight (C, OC) += inpᵀ (C, N) · dout (N, OC)
    matmul<T>(dweight, inp, dout, C, OC, N, true, false, T(1), T(1));
  }
  if (dbias != nullptr) bias_grad<T>(dbias, dout, N, OC);
}

template <typename T>
void bias_grad(T* dbias, const T* dout, int N, int OC, int64_t ld) {
  FORGE_CHECK(N >= 0 && OC >= 0, "[bias_grad] negative dims ", N, " ", OC);
  if (ld == 0) ld = OC;
  FORGE_CHECK(ld >= OC, "[bias_grad] row stride ", ld, " below OC = ", OC);
  // Blocks of kBlock channels keep each row read contiguous; rows are summed in order.
  constexpr int kBlock = 64;
#pragma omp parallel for
  for (int o0 = 0; o0 < OC; o0 += kBlock) {
    const int o1 = std::min(o0 + kBlock, OC);
    double acc[kBlock] = {};
    for (int n = 0; n < N; ++n) {
      const T* dout_n = dout + n * ld;  // (OC)
      for (int o = o0; o < o1; ++o) acc[o - o0] += dout_n[o];
    }
    for (int o = o0; o < o1; ++o) dbias[o] += static_cast<T>(acc[o - o0]);
  }
}

#define FORGE_INSTANTIATE(T)                                                                  \
  template void linear_fwd<T>(T*, const T*, const T*, const T*, int, int, int, WeightLayout); \
  template void linear_bwd<T>(T*, T*, T*, const T*, const T*, const T*, int, int, int,        \
                              WeightLayout);                                                  \
  template void bias_grad<T>(T*, const T*, int, int, int64_t);
FORGE_INSTANTIATE(float)
FORGE_INSTANTIATE(double)
#undef FORGE_INSTANTIATE

}  // namespace forge::cpu
