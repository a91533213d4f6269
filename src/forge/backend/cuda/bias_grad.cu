// CUDA bias gradient of a linear layer: dbias (OC) += Σ_n dout[n, :]; the GPU twin of
// cpu::bias_grad (backend/cpu/linear.cpp). The weight and input gradients are GEMMs (gemm.cu).
//
// Why not a GEMM: onesᵀ (1, N) · dout (N, OC) through cuBLASLt is an M = 1 product that ncu
// measured at 5.8 ms per GPT-2 step on the H200 (48 launches), against a bandwidth floor of
// ~2.5 ms for the ~11 GB of dout it reads. The reduction is kernels::channel_grad
// (kernel_utils.cuh) with ChannelGrad::kBias, the machinery of the norm weight gradients without
// inp/mean/rstd: fixed row splits with 16-byte loads and 8 row-threads per channel strip summed
// in a fixed order, then a fixed-order reduction of the splits into dbias. No atomics, so two
// runs are bit-identical; scratch comes from the context's allocator.
//
// Measured on the H200 (BiasGradTest.LargeNConstantInput: 20 back-to-back calls timed with CUDA
// events, N = 65536, both passes), bf16: OC = 768 39.5 µs (2.5 TB/s of dout), OC = 2304 87.7 µs
// (3.4 TB/s), OC = 3072 107.8 µs (3.7 TB/s); f32: 59.1, 149.6, 195.3 µs (3.4–4.1 TB/s). For
// GPT-2's 12 × {768, 2304, 3072, 768} bias gradients that is ~3.3 ms per step in bf16, against
// the 5.8 ms of the GEMM. The narrow OC = 768 case is furthest from the floor: only 1536
// blocks of short (128-row) splits, so launch and tail time weigh more.
//
// ptxas (sm_90a, CUDA 13.0, -Xptxas=-v): registers, spill stores, stack frame per kernel
// (<T, kN, kind>: kN = 1 is the element-by-element instantiation):
//   channel_grad_partial_kernel<bf16, 1, kBias>         24 regs, 0 spill, 0 stack
//   channel_grad_partial_kernel<bf16, 8, kBias>         36 regs, 0 spill, 0 stack
//   channel_grad_partial_kernel<float, 1, kBias>        24 regs, 0 spill, 0 stack
//   channel_grad_partial_kernel<float, 4, kBias>        32 regs, 0 spill, 0 stack
//   channel_grad_finish_wide_kernel<1>                  48 regs, 0 spill, 0 stack
#include <cuda_runtime.h>

#include "forge/backend/cuda/context.h"
#include "forge/backend/cuda/kernel_utils.cuh"
#include "forge/backend/cuda/ops.h"

namespace forge::cuda {

using namespace kernels;

void bias_grad(Context& ctx, DType dt, float* dbias, const void* dout, int N, int OC, int64_t ld) {
  FORGE_CHECK(N >= 0 && OC > 0, "[bias_grad] bad dims N=", N, " OC=", OC);
  if (ld == 0) ld = OC;
  FORGE_CHECK(ld >= OC, "[bias_grad] row stride ", ld, " below OC = ", OC);
  if (N == 0) return;
  dispatch_dtype(dt, "bias_grad", [&](auto tag) {
    using T = decltype(tag);
    channel_grad<T, ChannelGrad::kBias>(ctx, nullptr, dbias, static_cast<const T*>(dout), nullptr,
                                        nullptr, nullptr, N, OC,
                                        OC % kVec<T> == 0 && ld % kVec<T> == 0 && aligned16(dout), ld);
  });
}

}  // namespace forge::cuda
