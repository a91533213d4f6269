// CUDA rotary position embedding, in place on (B, T, H, HS); the GPU twin of
// backend/cpu/rope.cpp (both pairings: kRotateHalf, i ↔ i + HS/2, and kInterleaved, 2i ↔ 2i + 1;
// each pair (x0, x1) → (x0·cos − x1·sin, x0·sin + x1·cos); the backward rotates by −θ).
//
// Angles. The CPU builds cos/sin in double, so its f32 result is exact to the last rotation
// rounding even at t = 8k, where an f32 angle would be off by ~1e-3 rad. We keep that accuracy
// without double trigonometry: the host takes inv_freq_i from rope_inv_freq (ops/rope.cpp: the
// CPU's table, base^(−2i/HS) in double with the Hugging Face scaling applied) and passes
// inv_freq_i / π (at most 256 doubles, 2 KB) in the kernel's parameter space, so no copy or
// allocation is needed per call (rope.cuh, shared with decode.cu). The kernel forms the angle in
// half-turns in double, x = pos · inv_freq_i / π (one DMUL), reduces it exactly to
// r = x − 2·rint(x/2) ∈ [−1, 1], and evaluates sincospif(r) in f32: sinpi needs no large-argument
// reduction (so no local-memory Payne–Hanek path), and the error is ~1 ulp of f32 plus π·2^-25
// from rounding r — ~1e-7, at any position.
//
// Work split: one thread per (row = (b, t, h), chunk of kN pairs): for kRotateHalf it loads kN
// consecutive elements from each half (two 16-byte accesses for kN = kVec<T>), for kInterleaved
// 2·kN consecutive elements (two 16-byte accesses). The trig is recomputed per head (~4 DP and
// ~25 f32 instructions per pair) rather than shared across heads: that keeps every thread
// independent and the grid B·T·H wide, and the kernel stays memory-bound. kN = 1 (element by
// element) when HS/2 is not a multiple of kVec<T> or x is not 16-byte aligned.
//
// Packed rows: the position of row (b, t) is pos[b, t] (device (B, T)) instead of pos0 + t, read
// once per thread; the same angle method, so at pos[b, t] = t the result is bit-identical.
//
// ptxas (sm_90a, CUDA 13.0, -Xptxas=-v): registers, spill stores, stack frame per kernel
// (<T, kN, ...>: kN = 1 is the element-by-element instantiation):
//   rope_kernel<bf16, 1, false>                           29 regs, 0 spill, 0 stack
//   rope_kernel<bf16, 1, true>                            31 regs, 0 spill, 0 stack
//   rope_kernel<bf16, 8, false>                           32 regs, 0 spill, 0 stack
//   rope_kernel<bf16, 8, true>                            32 regs, 0 spill, 0 stack
//   rope_kernel<float, 1, false>                          28 regs, 0 spill, 0 stack
//   rope_kernel<float, 1, true>                           30 regs, 0 spill, 0 stack
//   rope_kernel<float, 4, false>                          32 regs, 0 spill, 0 stack
//   rope_kernel<float, 4, true>                           32 regs, 0 spill, 0 stack
#include <cuda_runtime.h>

#include "forge/backend/cuda/context.h"
#include "forge/backend/cuda/kernel_utils.cuh"
#include "forge/backend/cuda/ops.h"
#include "forge/backend/cuda/rope.cuh"

namespace forge::cuda {
namespace {

using namespace kernels;

constexpr int kThreads = 256;

template <typename T, int kN, bool kRotateHalf>
__global__ void __launch_bounds__(kThreads)
    rope_kernel(T* x, const __grid_constant__ RopeFreqs freqs, const int32_t* __restrict__ pos,
                int rows, int T_, int H, int HS, int pos0, float sign) {
  const int half = HS / 2;
  const int chunks = half / kN;
  const int total = rows * chunks;  // < 2^31: checked on the host
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
    const int row = i / chunks;              // (b·T + t)·H + h
    const int p0 = (i - row * chunks) * kN;  // first pair of this thread
    const int bt = row / H;                  // b·T + t
    const double at = static_cast<double>(pos != nullptr ? pos[bt] : pos0 + bt % T_);
    float cs[kN], sn[kN];
#pragma unroll
    for (int k = 0; k < kN; ++k) {
      float s, c;
      rope_sincos(at, freqs.inv_freq_over_pi[p0 + k], &s, &c);
      cs[k] = c, sn[k] = sign * s;
    }
    rope_rotate_pairs<T, kN, kRotateHalf>(x + static_cast<int64_t>(row) * HS, p0, half, cs, sn);
  }
}

template <typename T, int kN>
void launch_rope(Context& ctx, T* x, const RopeFreqs& f, const int32_t* pos, int rows, int T_,
                 int H, int HS, int pos0, float sign, RopeStyle style) {
  const int total = rows * (HS / 2 / kN);
  const int grid = grid_for(total, kThreads, ctx.num_sms());
  if (style == RopeStyle::kRotateHalf) {
    rope_kernel<T, kN, true>
        <<<grid, kThreads, 0, ctx.stream()>>>(x, f, pos, rows, T_, H, HS, pos0, sign);
  } else {
    rope_kernel<T, kN, false>
        <<<grid, kThreads, 0, ctx.stream()>>>(x, f, pos, rows, T_, H, HS, pos0, sign);
  }
  FORGE_CUDA_CHECK_LAUNCH();
}

void rope_rotate(Context& ctx, DType dt, void* x, int B, int T_, int H, int HS, const Rope& rope,
                 int pos0, const int32_t* pos, float sign, const char* op) {
  FORGE_CHECK(B >= 0 && T_ >= 0 && H >= 0 && HS > 0, "[", op, "] bad shape B=", B, " T=", T_,
              " H=", H, " HS=", HS);
  FORGE_CHECK(HS % 2 == 0, "[", op, "] head size must be even, got HS=", HS);
  FORGE_CHECK(HS / 2 <= kRopeMaxHalf, "[", op, "] head size ", HS, " above the supported ",
              2 * kRopeMaxHalf);
  FORGE_CHECK(pos0 >= 0, "[", op, "] negative pos0 ", pos0);
  FORGE_CHECK(static_cast<int64_t>(B) * T_ * H * HS < (int64_t{1} << 31), "[", op,
              "] B·T·H·HS = ", static_cast<int64_t>(B) * T_ * H * HS, " exceeds int32 indexing");
  const RopeFreqs f = rope_freqs(rope, HS);  // exactly the CPU's inv_freq, then / π
  const int rows = B * T_ * H;
  if (rows == 0) return;
  const int half = HS / 2;
  dispatch_dtype(dt, op, [&](auto tag) {
    using T = decltype(tag);
    T* xt = static_cast<T*>(x);
    if (half % kVec<T> == 0 && aligned16(x)) {
      launch_rope<T, kVec<T>>(ctx, xt, f, pos, rows, T_, H, HS, pos0, sign, rope.style);
    } else {
      launch_rope<T, 1>(ctx, xt, f, pos, rows, T_, H, HS, pos0, sign, rope.style);
    }
  });
}

}  // namespace

void rope_fwd(Context& ctx, DType dt, void* x, int B, int T_, int H, int HS, const Rope& rope,
              int pos0, const int32_t* pos) {
  rope_rotate(ctx, dt, x, B, T_, H, HS, rope, pos0, pos, 1.0f, "rope_fwd");
}

void rope_bwd(Context& ctx, DType dt, void* dx, int B, int T_, int H, int HS, const Rope& rope,
              int pos0, const int32_t* pos) {
  rope_rotate(ctx, dt, dx, B, T_, H, HS, rope, pos0, pos, -1.0f, "rope_bwd");
}

}  // namespace forge::cuda
