// sum_in_order: Σ x in f64 over a short f32 vector, in index order: the GPU twin of
// cpu::sum_in_order (backend/cpu/reduce.cpp), bit for bit.
//
// Why one thread: the training loss is the sum of the step's (B·T) per-position losses, and the
// host used to add them in index order in double. Any parallel order gives a different last bit,
// so the logged loss would change with where it is summed; one thread keeps it exactly the
// host's. The cost is one dependent f64 add per element (DADD latency, a few cycles): for
// B·T = 65,536 a fraction of a millisecond against a step of ~200 ms. Loads go four float4s at a
// time (when x is 16-byte aligned) so they stay ahead of the add chain.
//
// ptxas (sm_90a, CUDA 13.0): sum_in_order_kernel 62 regs, 0 spill, 0 stack.
#include <cuda_runtime.h>

#include "forge/backend/cuda/kernel_utils.cuh"
#include "forge/backend/cuda/ops.h"

namespace forge::cuda {
namespace {

__global__ void __launch_bounds__(32)
    sum_in_order_kernel(double* __restrict__ out, const float* __restrict__ x, int64_t n,
                        bool vec) {
  if (threadIdx.x != 0) return;
  double sum = 0;
  int64_t i = 0;
  if (vec) {
    const float4* x4 = reinterpret_cast<const float4*>(x);
    for (; i + 16 <= n; i += 16) {
      float4 v[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) v[k] = x4[i / 4 + k];
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        sum = __dadd_rn(sum, static_cast<double>(v[k].x));
        sum = __dadd_rn(sum, static_cast<double>(v[k].y));
        sum = __dadd_rn(sum, static_cast<double>(v[k].z));
        sum = __dadd_rn(sum, static_cast<double>(v[k].w));
      }
    }
  }
  for (; i < n; ++i) sum = __dadd_rn(sum, static_cast<double>(x[i]));
  out[0] = sum;
}

}  // namespace

void sum_in_order(CUstream_st* stream, double* out, const float* x, int64_t n) {
  FORGE_CHECK(n >= 0, "[sum_in_order] negative size ", n);
  FORGE_CHECK(n == 0 || x != nullptr, "[sum_in_order] null input of ", n, " elements");
  sum_in_order_kernel<<<1, 32, 0, stream>>>(out, x, n, kernels::aligned16(x));
  FORGE_CUDA_CHECK_LAUNCH();
}

void sum_in_order(Context& ctx, double* out, const float* x, int64_t n) {
  sum_in_order(ctx.stream(), out, x, n);
}

}  // namespace forge::cuda
