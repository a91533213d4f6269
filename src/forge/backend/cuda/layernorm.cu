// CUDA LayerNorm (GPT-2), forward and backward; the GPU twin of backend/cpu/layernorm.cpp.
//
// Forward: one warp per row, 8 rows per 256-thread block. Three sweeps over the row: Σx → mean,
// Σ(x − mean)² → rstd (two passes, as the CPU, so a large row mean does not cancel), then
// y = (x − mean)·rstd·w + b. Only the first sweep comes from DRAM: a bf16 row of C = 768 is
// 1.5 KB and the block's 8 rows stay in L1 for the next two. Statistics in f32, saved as f32
// mean/rstd (N) for the backward. Each lane moves 16 bytes per access (kN = kVec<T> elements)
// when C is a multiple of kVec<T> and every pointer is 16-byte aligned; otherwise the kN = 1
// instantiation walks the row element by element (still coalesced across the warp).
//
// Residual-fused forward (residual_layernorm_fwd): the same kernel with kResidual = true reads
// a and b instead of inp, forms res = a + b rounded to T exactly as residual_fwd does
// (kernels::load_input), stores res in the first sweep and normalises the rounded values. The
// later sweeps recompute the rounded sum from a and b (L1 hits, as inp is in the plain kernel)
// instead of re-reading res: the inputs go through the read-only path, which is not coherent
// with the kernel's own stores. Same statistics in the same order, so the result equals
// residual_fwd + layernorm_fwd bit for bit whenever both pick the same (vector or element)
// path, and the step moves 2 reads + 2 writes per element instead of 3 + 2. There is no fused
// backward op: the backward of "residual, then norm" is already one pass, since layernorm_bwd
// accumulates (+=) dinp straight into the residual stream's gradient.
//
// Backward:
//   dinp += rstd·(dnorm − mean(dnorm) − norm·mean(dnorm·norm)),  dnorm = dout·w,
//   dweight += Σ_rows dout·norm,  dbias += Σ_rows dout.
// Rows of C ≤ 1,024 with 16-byte lanes take norm_bwd_fused.cuh's kernel (the row kernel's
// arithmetic, the sums kept per block, optionally dres += Σ_rows of the updated dinp — GPT-2's
// attention and MLP output biases — then a fixed-order finishing pass). Otherwise: the row kernel
// (one warp per row, two sweeps), dweight/dbias through kernels::channel_grad (kernel_utils.cuh),
// dres by bias_grad over dinp. No atomics: two runs are bit-identical.
//
// ptxas (sm_90a, CUDA 13.0, -Xptxas=-v): registers, spill stores, stack frame per kernel
// (<T, kN, ...>: kN = 1 is the element-by-element instantiation; the fwd kernel's last
// parameter is kResidual):
//   layernorm_bwd_kernel<bf16, 1>                       27 regs, 0 spill, 0 stack
//   layernorm_bwd_kernel<bf16, 8>                       40 regs, 0 spill, 0 stack
//   layernorm_bwd_kernel<float, 1>                      27 regs, 0 spill, 0 stack
//   layernorm_bwd_kernel<float, 4>                      40 regs, 0 spill, 0 stack
//   layernorm_fwd_kernel<bf16, 1, false>                24 regs, 0 spill, 0 stack
//   layernorm_fwd_kernel<bf16, 8, false>                32 regs, 0 spill, 0 stack
//   layernorm_fwd_kernel<float, 1, false>               29 regs, 0 spill, 0 stack
//   layernorm_fwd_kernel<float, 4, false>               32 regs, 0 spill, 0 stack
//   layernorm_fwd_kernel<bf16, 1, true>                 29 regs, 0 spill, 0 stack
//   layernorm_fwd_kernel<bf16, 8, true>                 40 regs, 0 spill, 0 stack
//   layernorm_fwd_kernel<float, 1, true>                27 regs, 0 spill, 0 stack
//   layernorm_fwd_kernel<float, 4, true>                40 regs, 0 spill, 0 stack
//   layernorm_fwd_kernel<bf16, 8, true, 3>              48 regs, 0 spill, 0 stack (row in registers)
//   layernorm_fwd_kernel<*, *, *, 1..8>                 all instantiations 26–70 regs; f32 with
//                                                       3 chunks and the residual: 4 B spilled
//   channel_grad_partial_kernel<bf16, 1, kLayerNorm>    32 regs, 0 spill, 0 stack
//   channel_grad_partial_kernel<bf16, 8, kLayerNorm>    48 regs, 0 spill, 0 stack
//   channel_grad_partial_kernel<float, 1, kLayerNorm>   30 regs, 0 spill, 0 stack
//   channel_grad_partial_kernel<float, 4, kLayerNorm>   40 regs, 0 spill, 0 stack
//   channel_grad_finish_wide_kernel<2>                  64 regs, 0 spill, 0 stack
//   norm_bwd_fused_kernel<bf16, 8, kLayerNorm, 3, false> 114 regs, 0 spill, 0 stack (C ≤ 768)
//   norm_bwd_fused_kernel<bf16, 8, kLayerNorm, 3, true>  127 regs, 0 spill, 0 stack (with dres)
//   norm_bwd_fused_kernel<bf16, 8, kLayerNorm, 4, true>  128 regs, 76 B spill (C ≤ 1024, dres)
//   norm_bwd_fused_kernel<float, 4, kLayerNorm, 8, true> 128 regs, 200 B spill
//   norm_bwd_fused_kernel<*, *, kLayerNorm, 1..8, *>     the others 53–125 regs, 0 spill
//   (bounded to 128 registers for 2 blocks a SM: 96 sum registers a lane at 4 chunks with dres)
#include <cuda_runtime.h>

#include "forge/backend/cuda/context.h"
#include "forge/backend/cuda/fp8_row.cuh"
#include "forge/backend/cuda/kernel_utils.cuh"
#include "forge/backend/cuda/norm_bwd_fused.cuh"
#include "forge/backend/cuda/ops.h"

namespace forge::cuda {
namespace {

using namespace kernels;

constexpr int kRowsPerBlock = 8;  // one warp per row
constexpr int kThreads = 32 * kRowsPerBlock;

// kResidual: the row is res = inp + inp2 rounded to T (load_input); sweep 1 also stores it.
// kChunks > 0: the row fits kChunks 16-byte pieces a lane (C ≤ 32·kN·kChunks) and is loaded once
// into registers, every load of the row issued before the first sum; kChunks = 0: any C, the
// second and third sweeps re-read the row (from L1). The arithmetic, and so the result, is the
// same either way: lane l's values in the same order, the same shuffle sums.
template <typename T, int kN, bool kResidual, int kChunks, bool kFp8 = false>
__global__ void __launch_bounds__(kThreads)
    layernorm_fwd_kernel(T* __restrict__ out, float* __restrict__ mean, float* __restrict__ rstd,
                         T* __restrict__ res, const T* __restrict__ inp, const T* __restrict__ inp2,
                         const T* __restrict__ weight, const T* __restrict__ bias, int N, int C,
                         float eps, uint8_t* __restrict__ y8, float* __restrict__ d8) {
  static_assert(!kFp8 || kChunks > 0, "the E4M3 copy needs the row in registers");
  const int lane = threadIdx.x % 32;
  const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / 32;
  if (row >= N) return;  // whole warp exits together: no shuffles are left half-empty
  const int64_t off = static_cast<int64_t>(row) * C;
  const T* x = inp + off;                    // (C)
  const T* x2 = kResidual ? inp2 + off : x;  // (C), read only when kResidual
  T* y = out + off;                          // (C)

  if constexpr (kChunks > 0) {
    float v[kChunks][kN];
    load_row_chunks<T, kN, kResidual, kChunks>(v, kResidual ? res + off : nullptr, x, x2, lane, C);
    float sum = 0.0f;
#pragma unroll
    for (int j = 0; j < kChunks; ++j) {
      if (row_chunk<kN>(lane, j) >= C) continue;
#pragma unroll
      for (int k = 0; k < kN; ++k) sum += v[j][k];
    }
    const float m = warp_sum(sum) / C;
    float sq = 0.0f;
#pragma unroll
    for (int j = 0; j < kChunks; ++j) {
      if (row_chunk<kN>(lane, j) >= C) continue;
#pragma unroll
      for (int k = 0; k < kN; ++k) sq += (v[j][k] - m) * (v[j][k] - m);
    }
    const float s = 1.0f / sqrtf(warp_sum(sq) / C + eps);  // biased variance, as torch
#pragma unroll
    for (int j = 0; j < kChunks; ++j) {
      const int c = row_chunk<kN>(lane, j);
      if (c >= C) continue;
      float w[kN], b[kN];
      load<T, kN>(weight + c, w);
      load<T, kN>(bias + c, b);
#pragma unroll
      for (int k = 0; k < kN; ++k) v[j][k] = (v[j][k] - m) * s * w[k] + b[k];
      store<T, kN>(y + c, v[j]);
      if constexpr (kFp8) {
#pragma unroll
        for (int k = 0; k < kN; ++k) v[j][k] = to_f32(from_f32<T>(v[j][k]));  // what y holds
      }
    }
    if constexpr (kFp8) store_e4m3_row<kN, kChunks>(y8 + off, d8 + row, v, lane, C);
    if (lane == 0) mean[row] = m, rstd[row] = s;
    return;
  }

  float sum = 0.0f;
#pragma unroll 4
  for (int c = lane * kN; c < C; c += 32 * kN) {
    float v[kN];
    load_input<T, kN, kResidual>(x + c, x2 + c, v);
    if constexpr (kResidual) store<T, kN>(res + off + c, v);
#pragma unroll
    for (int k = 0; k < kN; ++k) sum += v[k];
  }
  const float m = warp_sum(sum) / C;

  float sq = 0.0f;
#pragma unroll 4
  for (int c = lane * kN; c < C; c += 32 * kN) {
    float v[kN];
    load_input<T, kN, kResidual>(x + c, x2 + c, v);
#pragma unroll
    for (int k = 0; k < kN; ++k) sq += (v[k] - m) * (v[k] - m);
  }
  const float s = 1.0f / sqrtf(warp_sum(sq) / C + eps);  // biased variance, as torch

#pragma unroll 2
  for (int c = lane * kN; c < C; c += 32 * kN) {
    float v[kN], w[kN], b[kN], o[kN];
    load_input<T, kN, kResidual>(x + c, x2 + c, v);
    load<T, kN>(weight + c, w);
    load<T, kN>(bias + c, b);
#pragma unroll
    for (int k = 0; k < kN; ++k) o[k] = (v[k] - m) * s * w[k] + b[k];
    store<T, kN>(y + c, o);
  }
  if (lane == 0) mean[row] = m, rstd[row] = s;
}

template <typename T, int kN>
__global__ void __launch_bounds__(kThreads)
    layernorm_bwd_kernel(T* __restrict__ dinp, const T* __restrict__ dout,
                         const T* __restrict__ inp, const T* __restrict__ weight,
                         const float* __restrict__ mean, const float* __restrict__ rstd, int N,
                         int C) {
  const int lane = threadIdx.x % 32;
  const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / 32;
  if (row >= N) return;
  const int64_t off = static_cast<int64_t>(row) * C;
  const T* x = inp + off;    // (C)
  const T* dy = dout + off;  // (C)
  T* dx = dinp + off;        // (C)
  const float m = mean[row], s = rstd[row];

  float dnorm_sum = 0.0f, dnorm_norm_sum = 0.0f;
#pragma unroll 2
  for (int c = lane * kN; c < C; c += 32 * kN) {
    float v[kN], g[kN], w[kN];
    load<T, kN>(x + c, v);
    load<T, kN>(dy + c, g);
    load<T, kN>(weight + c, w);
#pragma unroll
    for (int k = 0; k < kN; ++k) {
      const float dnorm = g[k] * w[k];
      dnorm_sum += dnorm;
      dnorm_norm_sum += dnorm * ((v[k] - m) * s);
    }
  }
  const float dnorm_mean = warp_sum(dnorm_sum) / C;
  const float dnorm_norm_mean = warp_sum(dnorm_norm_sum) / C;

#pragma unroll 2
  for (int c = lane * kN; c < C; c += 32 * kN) {
    float v[kN], g[kN], w[kN], d[kN];
    load<T, kN>(x + c, v);
    load<T, kN>(dy + c, g);
    load<T, kN>(weight + c, w);
    load<T, kN>(dx + c, d);
#pragma unroll
    for (int k = 0; k < kN; ++k) {
      const float norm = (v[k] - m) * s;
      d[k] += (g[k] * w[k] - dnorm_mean - norm * dnorm_norm_mean) * s;
    }
    store<T, kN>(dx + c, d);
  }
}

// Shared by layernorm_fwd (kResidual = false: res and inp2 null) and residual_layernorm_fwd.
// y8, d8 (bf16 rows held in registers only): the output's E4M3 copy too (fp8_row.cuh); returns
// whether it was written.
template <bool kResidual>
bool launch_fwd(Context& ctx, DType dt, void* res, void* out, float* mean, float* rstd,
                const void* inp, const void* inp2, const void* weight, const void* bias, int N,
                int C, float eps, const char* op, uint8_t* y8, float* d8) {
  bool fp8 = false;
  dispatch_dtype(dt, op, [&](auto tag) {
    using T = decltype(tag);
    const bool vec = C % kVec<T> == 0 && aligned16(out) && aligned16(inp) && aligned16(weight) &&
                     aligned16(bias) && aligned16(res) && aligned16(inp2);
    const int grid = (N + kRowsPerBlock - 1) / kRowsPerBlock;
    auto args = [&](auto kernel) {
      kernel<<<grid, kThreads, 0, ctx.stream()>>>(
          static_cast<T*>(out), mean, rstd, static_cast<T*>(res), static_cast<const T*>(inp),
          static_cast<const T*>(inp2), static_cast<const T*>(weight), static_cast<const T*>(bias),
          N, C, eps, y8, d8);
    };
    const int chunks = (C + 32 * kVec<T> - 1) / (32 * kVec<T>);
    if constexpr (std::is_same_v<T, bf16>) {
      if (y8 != nullptr && vec && chunks <= kRowMaxChunks<T> && aligned16(y8)) {
        switch (chunks) {
          case 1: args(layernorm_fwd_kernel<T, kVec<T>, kResidual, 1, true>); break;
          case 2: args(layernorm_fwd_kernel<T, kVec<T>, kResidual, 2, true>); break;
          case 3: args(layernorm_fwd_kernel<T, kVec<T>, kResidual, 3, true>); break;
          default: args(layernorm_fwd_kernel<T, kVec<T>, kResidual, kRowMaxChunks<T>, true>); break;
        }
        FORGE_CUDA_CHECK_LAUNCH();
        fp8 = true;
        return;
      }
    }
    if (vec && chunks <= kRowMaxChunks<T>) {
      switch (chunks) {  // the row in registers
        case 1: args(layernorm_fwd_kernel<T, kVec<T>, kResidual, 1>); break;
        case 2: args(layernorm_fwd_kernel<T, kVec<T>, kResidual, 2>); break;
        case 3: args(layernorm_fwd_kernel<T, kVec<T>, kResidual, 3>); break;
        default: args(layernorm_fwd_kernel<T, kVec<T>, kResidual, kRowMaxChunks<T>>); break;
      }
    } else if (vec) {
      args(layernorm_fwd_kernel<T, kVec<T>, kResidual, 0>);
    } else {
      args(layernorm_fwd_kernel<T, 1, kResidual, 0>);
    }
    FORGE_CUDA_CHECK_LAUNCH();
  });
  return fp8;
}

}  // namespace

bool layernorm_fwd(Context& ctx, DType dt, void* out, float* mean, float* rstd, const void* inp,
                   const void* weight, const void* bias, int N, int C, float eps, uint8_t* out8,
                   float* descale8) {
  FORGE_CHECK(N >= 0 && C > 0, "[layernorm_fwd] bad dims N=", N, " C=", C);
  if (N == 0) return false;
  return launch_fwd<false>(ctx, dt, nullptr, out, mean, rstd, inp, nullptr, weight, bias, N, C, eps,
                           "layernorm_fwd", out8, descale8);
}

bool residual_layernorm_fwd(Context& ctx, DType dt, void* res, void* out, float* mean, float* rstd,
                            const void* a, const void* b, const void* weight, const void* bias,
                            int N, int C, float eps, uint8_t* out8, float* descale8) {
  FORGE_CHECK(N >= 0 && C > 0, "[residual_layernorm_fwd] bad dims N=", N, " C=", C);
  FORGE_CHECK(res != a && res != b && res != out,
              "[residual_layernorm_fwd] res must be its own buffer (not a, b or out)");
  if (N == 0) return false;
  return launch_fwd<true>(ctx, dt, res, out, mean, rstd, a, b, weight, bias, N, C, eps,
                          "residual_layernorm_fwd", out8, descale8);
}

void layernorm_bwd(Context& ctx, DType dt, void* dinp, float* dweight, float* dbias,
                   const void* dout, const void* inp, const void* weight, const float* mean,
                   const float* rstd, int N, int C, float* dres) {
  FORGE_CHECK(N >= 0 && C > 0, "[layernorm_bwd] bad dims N=", N, " C=", C);
  if (N == 0) return;
  dispatch_dtype(dt, "layernorm_bwd", [&](auto tag) {
    using T = decltype(tag);
    const bool vec = C % kVec<T> == 0 && aligned16(dinp) && aligned16(dout) && aligned16(inp) &&
                     aligned16(weight);
    if (norm_bwd_fused<T, ChannelGrad::kLayerNorm>(
            ctx, static_cast<T*>(dinp), dweight, dbias, dres, static_cast<const T*>(dout),
            static_cast<const T*>(inp), static_cast<const T*>(weight), mean, rstd, N, C, vec))
      return;
    const int grid = (N + kRowsPerBlock - 1) / kRowsPerBlock;
    auto args = [&](auto kernel) {
      kernel<<<grid, kThreads, 0, ctx.stream()>>>(
          static_cast<T*>(dinp), static_cast<const T*>(dout), static_cast<const T*>(inp),
          static_cast<const T*>(weight), mean, rstd, N, C);
    };
    if (vec) {
      args(layernorm_bwd_kernel<T, kVec<T>>);
    } else {
      args(layernorm_bwd_kernel<T, 1>);
    }
    FORGE_CUDA_CHECK_LAUNCH();
    if (dweight && dbias)  // null: frozen (as rmsnorm_bwd; no model freezes a LayerNorm today)
      channel_grad<T, ChannelGrad::kLayerNorm>(ctx, dweight, dbias, static_cast<const T*>(dout),
                                               static_cast<const T*>(inp), mean, rstd, N, C,
                                               C % kVec<T> == 0 && aligned16(dout) && aligned16(inp));
    if (dres) bias_grad(ctx, dt, dres, dinp, N, C);
  });
}

}  // namespace forge::cuda
