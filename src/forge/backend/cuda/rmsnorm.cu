// CUDA RMSNorm (Llama), forward and backward; the GPU twin of backend/cpu/rmsnorm.cpp.
//
// Forward: one warp per row, 8 rows per 256-thread block; rows of at most 16 vectors (attention
// heads under Qwen3's q/k norm, C = 64..128) take 8 or 16 lanes each, 4 or 2 rows per warp
// (lanes_for), so a head-norm launch does not leave 3/4 of every warp idle. Σx² → rstd = 1/sqrt(mean(x²) + eps)
// in f32, then y = (x·rstd)·w (Hugging Face's order: normalise, then scale); the second sweep
// re-reads the row from L1 (a bf16 row of C = 576..2048 is 1–4 KB). rstd (N) is saved as f32.
// 16-byte accesses (kN = kVec<T> elements per lane) when C % kVec<T> == 0 and all pointers are
// 16-byte aligned, else the element-by-element instantiation kN = 1.
//
// Residual-fused forward (residual_rmsnorm_fwd): the same kernel with kResidual = true forms
// res = a + b rounded to T exactly as residual_fwd does (kernels::load_input), stores it in the
// first sweep and normalises the rounded values; the second sweep recomputes the sum from a and
// b (L1 hits) rather than re-reading res, which the read-only input path would not see
// coherently. Bit-identical to residual_fwd + rmsnorm_fwd when both take the same (vector or
// element) path; 2 reads + 2 writes per element instead of 3 + 2. No fused backward op is
// needed: rmsnorm_bwd already accumulates (+=) dinp into the residual stream's gradient.
//
// Backward, with norm = x·rstd and dnorm = dout·w:
//   dinp += rstd·(dnorm − norm·mean(dnorm·norm)),   dweight += Σ_rows dout·norm
// Model-width rows with 16-byte lanes (C ≤ 1,024) take norm_bwd_fused.cuh's kernel: the row
// arithmetic of the one-warp-per-row kernel below, each block keeping its rows' dweight sums (and,
// when asked, dres += Σ_rows of the updated dinp: a residual bias's gradient), then a fixed-order
// finishing pass. Otherwise (and for other rows) the row kernel (two sweeps) and dweight through
// kernels::channel_grad (kernel_utils.cuh): fixed row ranges → per-block partials in allocator
// scratch → fixed-order reduction; dres then by bias_grad over dinp. No atomics; two runs are
// bit-identical.
//
// ptxas (sm_90a, CUDA 13.0, -Xptxas=-v): registers, spill stores, stack frame per kernel
// (<T, kN, ...>: kN = 1 is the element-by-element instantiation; the fwd kernel's last
// parameter is kResidual):
//   rmsnorm_bwd_kernel<bf16, 1>                         24 regs, 0 spill, 0 stack
//   rmsnorm_bwd_kernel<bf16, 8>                         48 regs, 0 spill, 0 stack
//   rmsnorm_bwd_kernel<float, 1>                        24 regs, 0 spill, 0 stack
//   rmsnorm_bwd_kernel<float, 4>                        32 regs, 0 spill, 0 stack
//   rmsnorm_fwd_kernel<bf16, 1, false>                  21 regs, 0 spill, 0 stack
//   rmsnorm_fwd_kernel<bf16, 8, false>                  32 regs, 0 spill, 0 stack
//   rmsnorm_fwd_kernel<float, 1, false>                 22 regs, 0 spill, 0 stack
//   rmsnorm_fwd_kernel<float, 4, false>                 31 regs, 0 spill, 0 stack
//   rmsnorm_fwd_kernel<bf16, 1, true>                   25 regs, 0 spill, 0 stack
//   rmsnorm_fwd_kernel<bf16, 8, true>                   38 regs, 0 spill, 0 stack
//   rmsnorm_fwd_kernel<float, 1, true>                  23 regs, 0 spill, 0 stack
//   rmsnorm_fwd_kernel<float, 4, true>                  32 regs, 0 spill, 0 stack
//   rmsnorm_fwd_kernel<bf16, 8, true, 32, 3>            40 regs, 0 spill, 0 stack (row in registers)
//   rmsnorm_fwd_kernel<*, *, *, 32, 1..8>               all instantiations 22–74 regs, 0 spill
//   channel_grad_partial_kernel<bf16, 1, kRmsNorm>      29 regs, 0 spill, 0 stack
//   channel_grad_partial_kernel<bf16, 8, kRmsNorm>      40 regs, 0 spill, 0 stack
//   channel_grad_partial_kernel<float, 1, kRmsNorm>     26 regs, 0 spill, 0 stack
//   channel_grad_partial_kernel<float, 4, kRmsNorm>     32 regs, 0 spill, 0 stack
//   channel_grad_finish_wide_kernel<1>                  48 regs, 0 spill, 0 stack
//   norm_bwd_fused_kernel<bf16, 8, kRmsNorm, 3, false>   79 regs, 0 spill, 0 stack (C ≤ 768)
//   norm_bwd_fused_kernel<bf16, 8, kRmsNorm, 3, true>   109 regs, 0 spill, 0 stack (with dres)
//   norm_bwd_fused_kernel<*, *, kRmsNorm, 1..8, *>       all instantiations 48–127 regs, 0 spill
//   (the fused kernel is bounded to 128 registers for 2 blocks a SM; 73.7 KB of row stages a
//   block at 3 chunks, 98 KB at 4)
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

// Lanes per row: a warp per row for model-width rows; narrow rows (q/k heads under Qwen3's head
// norm: C = 64 or 128, i.e. 8 or 16 lanes of 16 bytes) share a warp, 32 / kLanes rows each, so
// lanes do not idle. Rows past N (the last warp of a narrow launch) compute on row N − 1 and
// store nothing: every lane must reach the group shuffles.
template <typename T, int kN>
int lanes_for(int C) {
  if (kN == 1) return 32;
  const int per = (C + kN - 1) / kN;
  return per <= 8 ? 8 : per <= 16 ? 16 : 32;
}

// kResidual: the row is res = inp + inp2 rounded to T (load_input); sweep 1 also stores it.
// kChunks > 0 (a warp a row): the row fits kChunks 16-byte pieces a lane and is loaded once into
// registers, all its loads issued together (as layernorm_fwd_kernel; the same arithmetic in the
// same order as the two sweeps, so the same result); kChunks = 0: the second sweep re-reads it.
template <typename T, int kN, bool kResidual, int kLanes = 32, int kChunks = 0, bool kFp8 = false>
__global__ void __launch_bounds__(kThreads)
    rmsnorm_fwd_kernel(T* __restrict__ out, float* __restrict__ rstd, T* __restrict__ res,
                       const T* __restrict__ inp, const T* __restrict__ inp2,
                       const T* __restrict__ weight, int N, int C, float eps, uint8_t* __restrict__ y8,
                       float* __restrict__ d8) {
  static_assert(!kFp8 || kChunks > 0, "the E4M3 copy needs the row in registers");
  static_assert(kChunks == 0 || kLanes == 32, "a cached row takes a whole warp");
  const int lane = threadIdx.x % kLanes;
  const int row_id = blockIdx.x * (kThreads / kLanes) + threadIdx.x / kLanes;
  if (kLanes == 32 && row_id >= N) return;  // the whole warp exits together
  const bool valid = row_id < N;
  const int row = valid ? row_id : N - 1;
  const int64_t off = static_cast<int64_t>(row) * C;
  const T* x = inp + off;                    // (C)
  const T* x2 = kResidual ? inp2 + off : x;  // (C), read only when kResidual
  T* y = out + off;                          // (C)

  if constexpr (kChunks > 0) {
    float v[kChunks][kN];
    load_row_chunks<T, kN, kResidual, kChunks>(v, kResidual ? res + off : nullptr, x, x2, lane, C);
    float sq = 0.0f;
#pragma unroll
    for (int j = 0; j < kChunks; ++j) {
      if (row_chunk<kN>(lane, j) >= C) continue;
#pragma unroll
      for (int k = 0; k < kN; ++k) sq += v[j][k] * v[j][k];
    }
    const float s = 1.0f / sqrtf(warp_sum(sq) / C + eps);
#pragma unroll
    for (int j = 0; j < kChunks; ++j) {
      const int c = row_chunk<kN>(lane, j);
      if (c >= C) continue;
      float w[kN];
      load<T, kN>(weight + c, w);
#pragma unroll
      for (int k = 0; k < kN; ++k) v[j][k] = v[j][k] * s * w[k];
      store<T, kN>(y + c, v[j]);
      if constexpr (kFp8) {
#pragma unroll
        for (int k = 0; k < kN; ++k) v[j][k] = to_f32(from_f32<T>(v[j][k]));  // what y holds
      }
    }
    if constexpr (kFp8) store_e4m3_row<kN, kChunks>(y8 + off, d8 + row, v, lane, C);
    if (lane == 0) rstd[row] = s;
    return;
  }

  float sq = 0.0f;
#pragma unroll 4
  for (int c = lane * kN; c < C; c += kLanes * kN) {
    float v[kN];
    load_input<T, kN, kResidual>(x + c, x2 + c, v);
    if constexpr (kResidual) store<T, kN>(res + off + c, v);
#pragma unroll
    for (int k = 0; k < kN; ++k) sq += v[k] * v[k];
  }
  const float s = 1.0f / sqrtf(lane_group_sum<kLanes>(sq) / C + eps);
  if (!valid) return;  // after the last shuffle

#pragma unroll 2
  for (int c = lane * kN; c < C; c += kLanes * kN) {
    float v[kN], w[kN], o[kN];
    load_input<T, kN, kResidual>(x + c, x2 + c, v);
    load<T, kN>(weight + c, w);
#pragma unroll
    for (int k = 0; k < kN; ++k) o[k] = v[k] * s * w[k];
    store<T, kN>(y + c, o);
  }
  if (lane == 0) rstd[row] = s;
}

template <typename T, int kN, int kLanes = 32>
__global__ void __launch_bounds__(kThreads)
    rmsnorm_bwd_kernel(T* __restrict__ dinp, const T* __restrict__ dout, const T* __restrict__ inp,
                       const T* __restrict__ weight, const float* __restrict__ rstd, int N, int C) {
  const int lane = threadIdx.x % kLanes;
  const int row_id = blockIdx.x * (kThreads / kLanes) + threadIdx.x / kLanes;
  if (kLanes == 32 && row_id >= N) return;
  const bool valid = row_id < N;
  const int row = valid ? row_id : N - 1;
  const int64_t off = static_cast<int64_t>(row) * C;
  const T* x = inp + off;    // (C)
  const T* dy = dout + off;  // (C)
  T* dx = dinp + off;        // (C)
  const float s = rstd[row];

  float dnorm_norm_sum = 0.0f;
#pragma unroll 2
  for (int c = lane * kN; c < C; c += kLanes * kN) {
    float v[kN], g[kN], w[kN];
    load<T, kN>(x + c, v);
    load<T, kN>(dy + c, g);
    load<T, kN>(weight + c, w);
#pragma unroll
    for (int k = 0; k < kN; ++k) dnorm_norm_sum += (g[k] * w[k]) * (v[k] * s);
  }
  const float dnorm_norm_mean = lane_group_sum<kLanes>(dnorm_norm_sum) / C;
  if (!valid) return;  // after the last shuffle

#pragma unroll 2
  for (int c = lane * kN; c < C; c += kLanes * kN) {
    float v[kN], g[kN], w[kN], d[kN];
    load<T, kN>(x + c, v);
    load<T, kN>(dy + c, g);
    load<T, kN>(weight + c, w);
    load<T, kN>(dx + c, d);
#pragma unroll
    for (int k = 0; k < kN; ++k) d[k] += (g[k] * w[k] - v[k] * s * dnorm_norm_mean) * s;
    store<T, kN>(dx + c, d);
  }
}

// head_rmsnorm: one warp per (row, head), in place. Each lane reads its elements for Σx² and
// later rewrites exactly those, so the in-place update needs no barrier. The same f32 arithmetic
// as rmsnorm_fwd_kernel (Σx² per warp, s = 1/sqrt(Σx²/HS + eps), y = x·s·w).
template <typename T, int kN>
__global__ void __launch_bounds__(kThreads)
    head_rmsnorm_kernel(T* x, const T* __restrict__ weight, int rows, int H, int HS,
                        int64_t stride, float eps) {
  const int lane = threadIdx.x % 32;
  const int r = blockIdx.x * kRowsPerBlock + threadIdx.x / 32;
  if (r >= rows) return;
  T* v = x + static_cast<int64_t>(r / H) * stride + static_cast<int64_t>(r % H) * HS;  // (HS)
  float sq = 0.0f;
  for (int c = lane * kN; c < HS; c += 32 * kN) {
    float a[kN];
    load<T, kN>(v + c, a);
#pragma unroll
    for (int k = 0; k < kN; ++k) sq += a[k] * a[k];
  }
  const float s = 1.0f / sqrtf(warp_sum(sq) / HS + eps);
  for (int c = lane * kN; c < HS; c += 32 * kN) {
    float a[kN], w[kN], o[kN];
    load<T, kN>(v + c, a);
    load<T, kN>(weight + c, w);
#pragma unroll
    for (int k = 0; k < kN; ++k) o[k] = a[k] * s * w[k];
    store<T, kN>(v + c, o);
  }
}

// Shared by rmsnorm_fwd (kResidual = false: res and inp2 null) and residual_rmsnorm_fwd.
template <bool kResidual>
bool launch_fwd(Context& ctx, DType dt, void* res, void* out, float* rstd, const void* inp,
                const void* inp2, const void* weight, int N, int C, float eps, const char* op,
                uint8_t* y8 = nullptr, float* d8 = nullptr) {
  bool fp8 = false;
  dispatch_dtype(dt, op, [&](auto tag) {
    using T = decltype(tag);
    const bool vec = C % kVec<T> == 0 && aligned16(out) && aligned16(inp) && aligned16(weight) &&
                     aligned16(res) && aligned16(inp2);
    // Narrow rows (lanes_for) only without the residual: the fused op runs on model-width rows.
    const int lanes = vec && !kResidual ? lanes_for<T, kVec<T>>(C) : 32;
    const int rows_per_block = kThreads / lanes;
    const int grid = (N + rows_per_block - 1) / rows_per_block;
    const int chunks = (C + 32 * kVec<T> - 1) / (32 * kVec<T>);
    auto args = [&](auto kernel) {
      kernel<<<grid, kThreads, 0, ctx.stream()>>>(
          static_cast<T*>(out), rstd, static_cast<T*>(res), static_cast<const T*>(inp),
          static_cast<const T*>(inp2), static_cast<const T*>(weight), N, C, eps, y8, d8);
    };
    // The E4M3 copy (bf16 rows held in registers, lanes == 32): the same kernels with kFp8.
    if constexpr (std::is_same_v<T, bf16>) {
      if (y8 != nullptr && vec && lanes == 32 && chunks <= kRowMaxChunks<T> && aligned16(y8)) {
        switch (chunks) {
          case 1: args(rmsnorm_fwd_kernel<T, kVec<T>, kResidual, 32, 1, true>); break;
          case 2: args(rmsnorm_fwd_kernel<T, kVec<T>, kResidual, 32, 2, true>); break;
          case 3: args(rmsnorm_fwd_kernel<T, kVec<T>, kResidual, 32, 3, true>); break;
          default: args(rmsnorm_fwd_kernel<T, kVec<T>, kResidual, 32, kRowMaxChunks<T>, true>); break;
        }
        FORGE_CUDA_CHECK_LAUNCH();
        fp8 = true;
        return;
      }
    }
    if (vec && lanes == 8) {
      args(rmsnorm_fwd_kernel<T, kVec<T>, false, 8>);
    } else if (vec && lanes == 16) {
      args(rmsnorm_fwd_kernel<T, kVec<T>, false, 16>);
    } else if (vec && chunks <= kRowMaxChunks<T>) {
      switch (chunks) {  // the row in registers
        case 1: args(rmsnorm_fwd_kernel<T, kVec<T>, kResidual, 32, 1>); break;
        case 2: args(rmsnorm_fwd_kernel<T, kVec<T>, kResidual, 32, 2>); break;
        case 3: args(rmsnorm_fwd_kernel<T, kVec<T>, kResidual, 32, 3>); break;
        default: args(rmsnorm_fwd_kernel<T, kVec<T>, kResidual, 32, kRowMaxChunks<T>>); break;
      }
    } else if (vec) {
      args(rmsnorm_fwd_kernel<T, kVec<T>, kResidual>);
    } else {
      args(rmsnorm_fwd_kernel<T, 1, kResidual>);
    }
    FORGE_CUDA_CHECK_LAUNCH();
  });
  return fp8;
}

}  // namespace

bool rmsnorm_fwd(Context& ctx, DType dt, void* out, float* rstd, const void* inp,
                 const void* weight, int N, int C, float eps, uint8_t* out8, float* descale8) {
  FORGE_CHECK(N >= 0 && C > 0, "[rmsnorm_fwd] bad dims N=", N, " C=", C);
  if (N == 0) return false;
  return launch_fwd<false>(ctx, dt, nullptr, out, rstd, inp, nullptr, weight, N, C, eps, "rmsnorm_fwd", out8,
                           descale8);
}

bool residual_rmsnorm_fwd(Context& ctx, DType dt, void* res, void* out, float* rstd, const void* a,
                          const void* b, const void* weight, int N, int C, float eps, uint8_t* out8,
                          float* descale8) {
  FORGE_CHECK(N >= 0 && C > 0, "[residual_rmsnorm_fwd] bad dims N=", N, " C=", C);
  FORGE_CHECK(res != a && res != b && res != out,
              "[residual_rmsnorm_fwd] res must be its own buffer (not a, b or out)");
  if (N == 0) return false;
  return launch_fwd<true>(ctx, dt, res, out, rstd, a, b, weight, N, C, eps, "residual_rmsnorm_fwd", out8,
                          descale8);
}

void head_rmsnorm(Context& ctx, DType dt, void* x, const void* weight, int N, int H, int HS,
                  int64_t stride, float eps) {
  FORGE_CHECK(N >= 0 && H > 0 && HS > 0 && stride >= static_cast<int64_t>(H) * HS,
              "[head_rmsnorm] bad dims N=", N, " H=", H, " HS=", HS, " stride=", stride);
  const int64_t rows = static_cast<int64_t>(N) * H;
  FORGE_CHECK(rows < (int64_t{1} << 31), "[head_rmsnorm] too many rows");
  if (rows == 0) return;
  dispatch_dtype(dt, "head_rmsnorm", [&](auto tag) {
    using T = decltype(tag);
    // 16-byte lanes need every head start aligned: HS and the row stride multiples of kVec.
    const bool vec = HS % kVec<T> == 0 && stride % kVec<T> == 0 && aligned16(x) && aligned16(weight);
    const int grid = static_cast<int>((rows + kRowsPerBlock - 1) / kRowsPerBlock);
    auto args = [&](auto kernel) {
      kernel<<<grid, kThreads, 0, ctx.stream()>>>(static_cast<T*>(x), static_cast<const T*>(weight),
                                                  static_cast<int>(rows), H, HS, stride, eps);
    };
    if (vec) {
      args(head_rmsnorm_kernel<T, kVec<T>>);
    } else {
      args(head_rmsnorm_kernel<T, 1>);
    }
    FORGE_CUDA_CHECK_LAUNCH();
  });
}

void rmsnorm_bwd(Context& ctx, DType dt, void* dinp, float* dweight, const void* dout,
                 const void* inp, const void* weight, const float* rstd, int N, int C, float* dres) {
  FORGE_CHECK(N >= 0 && C > 0, "[rmsnorm_bwd] bad dims N=", N, " C=", C);
  if (N == 0) return;
  dispatch_dtype(dt, "rmsnorm_bwd", [&](auto tag) {
    using T = decltype(tag);
    const bool vec = C % kVec<T> == 0 && aligned16(dinp) && aligned16(dout) && aligned16(inp) &&
                     aligned16(weight);
    const int lanes = vec ? lanes_for<T, kVec<T>>(C) : 32;
    if (lanes == 32 &&
        norm_bwd_fused<T, ChannelGrad::kRmsNorm>(
                           ctx, static_cast<T*>(dinp), dweight, nullptr, dres,
                           static_cast<const T*>(dout), static_cast<const T*>(inp),
                           static_cast<const T*>(weight), nullptr, rstd, N, C, vec))
      return;
    const int rows_per_block = kThreads / lanes;
    const int grid = (N + rows_per_block - 1) / rows_per_block;
    auto args = [&](auto kernel) {
      kernel<<<grid, kThreads, 0, ctx.stream()>>>(
          static_cast<T*>(dinp), static_cast<const T*>(dout), static_cast<const T*>(inp),
          static_cast<const T*>(weight), rstd, N, C);
    };
    if (vec && lanes == 8) {
      args(rmsnorm_bwd_kernel<T, kVec<T>, 8>);
    } else if (vec && lanes == 16) {
      args(rmsnorm_bwd_kernel<T, kVec<T>, 16>);
    } else if (vec) {
      args(rmsnorm_bwd_kernel<T, kVec<T>>);
    } else {
      args(rmsnorm_bwd_kernel<T, 1>);
    }
    FORGE_CUDA_CHECK_LAUNCH();
    if (dweight)  // null: a frozen gain (LoRA's base)
      channel_grad<T, ChannelGrad::kRmsNorm>(ctx, dweight, nullptr, static_cast<const T*>(dout),
                                             static_cast<const T*>(inp), nullptr, rstd, N, C,
                                             C % kVec<T> == 0 && aligned16(dout) && aligned16(inp));
    if (dres) bias_grad(ctx, dt, dres, dinp, N, C);
  });
}

}  // namespace forge::cuda
