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
// Work split: rope_pos_kernel, one thread per (position, chunk of kN pairs), the chunk's angles
// once, then the position's heads four at a time. Vectorised, kN = kVec<T> pairs a chunk (two
// 16-byte accesses for kRotateHalf, one or two for interleaved); element by element, kN = 1 (HS/2
// not a multiple of kVec<T>, or x not 16-byte aligned). (Until 2026-12-07 the element path kept
// a kernel of one thread per (b, t, h, pair), an angle per head.)
//
// Packed rows: the position of row (b, t) is pos[b, t] (device (B, T)) instead of pos0 + t, read
// once per thread; the same angle method, so at pos[b, t] = t the result is bit-identical.
//
// rope_bias_bwd (Qwen2's q/k bias gradient) is the backward rotation with the column sums of its
// result kept on the way, instead of bias_grad's second pass over dq and dk: its work split is
// described at the kernel.
//
// ptxas (sm_90a, CUDA 13.0, -Xptxas=-v): registers, spill stores, stack frame per kernel
// (<T, kN, ...>: kN = 1 is the element-by-element instantiation):
//   rope_pos_kernel<bf16 / f16 / float, 1, false / true>  40 / 48 regs, 0 spill, 0 stack
//   rope_pos_kernel<bf16 / f16, 8, false / true>          126 / 128 regs, 0 spill, 0 stack
//   rope_pos_kernel<float, 4, false / true>               70 / 80 regs, 0 spill, 0 stack
//   rope_bias_bwd_kernel<bf16, 8, false / true>           94 / 100 regs, 0 spill, 16 KB shared
//   rope_bias_bwd_kernel<f16, 8, false / true>            104 / 119 regs, 0 spill, 16 KB shared
//   rope_bias_bwd_kernel<bf16 / f16, 1, false / true>     40 / 47 regs, 0 spill, 2 KB shared
//   rope_bias_bwd_kernel<float, 4, false / true>          64 / 71 regs, 0 spill, 8 KB shared
//   rope_bias_bwd_kernel<float, 1, false / true>          40 / 47 regs, 0 spill, 2 KB shared
// (rope_bias_bwd two rows a step; one row a step was 64 / 71 for bf16 kN 8: 3 blocks a SM with a
// third of the bytes in flight less; capping it at 3 blocks spills 40 bytes.)
#include <cuda_runtime.h>

#include <type_traits>

#include "forge/backend/cuda/context.h"
#include "forge/backend/cuda/kernel_utils.cuh"
#include "forge/backend/cuda/ops.h"
#include "forge/backend/cuda/rope.cuh"

namespace forge::cuda {
namespace {

using namespace kernels;

constexpr int kThreads = 256;

// One thread per (position, chunk of kN pairs: kVec<T> on the vectorised path, 1 element by
// element), walking the position's H
// heads kHG at a time (every head's loads of a group issued before its stores): the kN angles of
// a chunk are the same for every head of a position, so they are computed once instead of once
// a head. The per-head kernel spent ~25 instructions an element on them by the PTX count (8
// sincos for 16 elements), the cost that made the head norm's kernel issue-bound ("The head
// norm's angles once per position" in docs/perf/training-llama.md; this kernel was not profiled).
// The same helpers compute the angles and the rotation as the head-norm kernel's, so each element
// gets the per-head kernel's arithmetic; the two were not compared bit for bit on a GPU.
constexpr int kHG = 4;
template <typename T, int kN, bool kRotateHalf>
__global__ void __launch_bounds__(kThreads)
    rope_pos_kernel(T* x, const __grid_constant__ RopeFreqs freqs, const int32_t* __restrict__ pos,
                    int positions, int T_, int H, int HS, int pos0, float sign, int64_t ld) {
  const int half = HS / 2;
  const int chunks = half / kN;
  const int total = positions * chunks;  // < 2^31: checked on the host
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
    const int bt = i / chunks;      // b·T + t
    const int c = i - bt * chunks;  // this thread's chunk: pairs c·kN … c·kN + kN − 1
    const double at = static_cast<double>(pos != nullptr ? pos[bt] : pos0 + bt % T_);
    float cs[kN], sn[kN];
    chunk_angles<kN>(cs, sn, c, at, freqs, sign);
    T* xr = x + bt * ld;
    for (int h0 = 0; h0 < H; h0 += kHG) {
      float u[kHG][2 * kN];
#pragma unroll
      for (int g = 0; g < kHG; ++g)
        if (h0 + g < H) load_chunk<T, kN, kRotateHalf>(xr + (h0 + g) * HS, c, half, u[g]);
#pragma unroll
      for (int g = 0; g < kHG; ++g) {
        if (h0 + g >= H) continue;
        rotate_chunk_by<kN, kRotateHalf>(u[g], cs, sn);
        store_chunk<T, kN, kRotateHalf>(xr + (h0 + g) * HS, c, half, u[g]);
      }
    }
  }
}

template <typename T, int kN>
void launch_rope(Context& ctx, T* x, const RopeFreqs& f, const int32_t* pos, int rows, int T_,
                 int H, int HS, int pos0, float sign, RopeStyle style, int64_t ld) {
  const int positions = rows / H;
  const int grid = grid_for(int64_t{positions} * (HS / 2 / kN), kThreads, ctx.num_sms());
  if (style == RopeStyle::kRotateHalf) {
    rope_pos_kernel<T, kN, true>
        <<<grid, kThreads, 0, ctx.stream()>>>(x, f, pos, positions, T_, H, HS, pos0, sign, ld);
  } else {
    rope_pos_kernel<T, kN, false>
        <<<grid, kThreads, 0, ctx.stream()>>>(x, f, pos, positions, T_, H, HS, pos0, sign, ld);
  }
  FORGE_CUDA_CHECK_LAUNCH();
}

void rope_rotate(Context& ctx, DType dt, void* x, int B, int T_, int H, int HS, const Rope& rope,
                 int pos0, const int32_t* pos, float sign, const char* op, int64_t ld = 0) {
  check_rope_shape(B, T_, H, HS, op, /*min_heads=*/0);
  FORGE_CHECK(pos0 >= 0, "[", op, "] negative pos0 ", pos0);
  if (ld == 0) ld = int64_t{H} * HS;
  FORGE_CHECK(ld >= int64_t{H} * HS, "[", op, "] row stride ", ld, " below H·HS = ", H * HS);
  const RopeFreqs f = rope_freqs(rope, HS);  // exactly the CPU's inv_freq, then / π
  const int rows = B * T_ * H;
  if (rows == 0) return;
  const int half = HS / 2;
  dispatch_dtype(dt, op, [&](auto tag) {
    using T = decltype(tag);
    T* xt = static_cast<T*>(x);
    if (half % kVec<T> == 0 && ld % kVec<T> == 0 && aligned16(x)) {
      launch_rope<T, kVec<T>>(ctx, xt, f, pos, rows, T_, H, HS, pos0, sign, rope.style, ld);
    } else {
      launch_rope<T, 1>(ctx, xt, f, pos, rows, T_, H, HS, pos0, sign, rope.style, ld);
    }
  });
}

// rope_bias_bwd: the backward rotation of dx (N = B·T rows of H·HS) in place, and the column
// sums of the result (the bias gradient of the projection that produced it). The row is cut into
// P = H·HS/(2·kN) chunks of kN pairs (load_chunk: both members of each pair in one thread); a
// block of 256 threads takes a strip of Ps ≤ 256 chunks and rows_per_step = 256 / Ps rows at a
// time (q of llama-100m: P = 48, 5 rows a step; k: P = 16, 16 rows), over the fixed row range of
// its split (blockIdx.y). Each thread sums its chunk's channels over its rows; the row-threads of
// a chunk are then added in order through shared memory into partial (splits, H·HS), which
// channel_grad_finish_wide_kernel reduces in a fixed order. No atomics: bit-identical reruns.
template <typename T, int kN, bool kRotateHalf>
__global__ void __launch_bounds__(kThreads)
    rope_bias_bwd_kernel(T* dx, float* __restrict__ partial,
                         const __grid_constant__ RopeFreqs freqs, const int32_t* __restrict__ pos,
                         int N, int T_, int H, int HS, int strip, int rows_per_split, int64_t ld) {
  constexpr int kE = 2 * kN;                         // elements per chunk
  __shared__ __align__(16) float sh[kThreads * kE];  // (rows_per_step, strip·kE)
  const int half = HS / 2, head_chunks = half / kN, P = H * head_chunks;
  const int rows_per_step = kThreads / strip;
  const int ro = threadIdx.x / strip, cl = threadIdx.x % strip;
  const int chunk = blockIdx.x * strip + cl;  // over (h, c)
  const bool active = ro < rows_per_step && chunk < P;
  const int h = chunk / head_chunks, c = chunk % head_chunks;
  const int r0 = blockIdx.y * rows_per_split, r1 = min(N, r0 + rows_per_split);
  float acc[kE];
#pragma unroll
  for (int i = 0; i < kE; ++i) acc[i] = 0.0f;
  if (active) {
    // Two rows a step (rows_per_step apart), both loaded before either is used: twice the bytes
    // in flight per thread (the timeline measured one row a step at 52.7 µs a call against plain
    // RoPE's 46.6). The sums take the rows in the same order as one row a step did.
    constexpr int kRows = 2;
    for (int r = r0 + ro; r < r1; r += kRows * rows_per_step) {
      float u[kRows][kE];
      T* head[kRows];
#pragma unroll
      for (int k = 0; k < kRows; ++k) {
        const int rk = r + k * rows_per_step;
        head[k] = dx + (rk < r1 ? rk : r) * ld + h * HS;  // (HS)
        load_chunk<T, kN, kRotateHalf>(head[k], c, half, u[k]);
      }
#pragma unroll
      for (int k = 0; k < kRows; ++k) {
        const int rk = r + k * rows_per_step;
        if (rk >= r1) break;
        const double at = static_cast<double>(pos != nullptr ? pos[rk] : rk % T_);
        rotate_chunk<kN, kRotateHalf>(u[k], c, at, freqs, -1.0f);
        store_chunk<T, kN, kRotateHalf>(head[k], c, half, u[k]);
#pragma unroll
        for (int i = 0; i < kE; ++i) acc[i] += u[k][i];
      }
    }
#pragma unroll
    for (int i = 0; i < kE; ++i) sh[(ro * strip + cl) * kE + i] = acc[i];
  }
  __syncthreads();
  for (int e = threadIdx.x; e < strip * kE; e += kThreads) {
    const int cl2 = e / kE, i = e % kE, chunk2 = blockIdx.x * strip + cl2;
    if (chunk2 >= P) continue;
    float t = 0.0f;
    for (int y = 0; y < rows_per_step; ++y) t += sh[(y * strip + cl2) * kE + i];
    const int h2 = chunk2 / head_chunks, c2 = chunk2 % head_chunks;
    const int ch =
        kRotateHalf ? (i < kN ? c2 * kN + i : half + c2 * kN + (i - kN)) : 2 * c2 * kN + i;
    partial[static_cast<int64_t>(blockIdx.y) * H * HS + h2 * HS + ch] = t;
  }
}

}  // namespace

void rope_bias_bwd(Context& ctx, DType dt, void* dx, float* dbias, int B, int T_, int H, int HS,
                   const Rope& rope, const int32_t* pos, int64_t ld) {
  constexpr char kOp[] = "rope_bias_bwd";
  check_rope_shape(B, T_, H, HS, kOp);
  if (ld == 0) ld = int64_t{H} * HS;
  FORGE_CHECK(ld >= int64_t{H} * HS, "[", kOp, "] row stride ", ld, " below H·HS = ", H * HS);
  const int N = B * T_;
  if (N == 0) return;
  if (dbias == nullptr) {  // a frozen bias: the rotation alone
    rope_rotate(ctx, dt, dx, B, T_, H, HS, rope, 0, pos, -1.0f, kOp, ld);
    return;
  }
  const RopeFreqs f = rope_freqs(rope, HS);
  constexpr int kMaxSplits = 512, kMinRows = 64;  // channel_grad's split rule
  int splits = (N + kMinRows - 1) / kMinRows;
  if (splits > kMaxSplits) splits = kMaxSplits;
  const int rows_per_split = (N + splits - 1) / splits;
  splits = (N + rows_per_split - 1) / rows_per_split;
  DeviceBuffer<float> partial(ctx.allocator(), static_cast<size_t>(splits) * H * HS);
  dispatch_dtype(dt, kOp, [&](auto tag) {
    using T = decltype(tag);
    T* xt = static_cast<T*>(dx);
    auto go = [&](auto kn, auto rotate_half) {
      constexpr int kN = decltype(kn)::value;
      const int P = H * (HS / 2 / kN);
      const int strip = P < kThreads ? P : kThreads;
      const dim3 grid((P + strip - 1) / strip, splits);
      rope_bias_bwd_kernel<T, kN, decltype(rotate_half)::value>
          <<<grid, kThreads, 0, ctx.stream()>>>(xt, partial.data(), f, pos, N, T_, H, HS, strip,
                                                rows_per_split, ld);
    };
    using Vec = std::integral_constant<int, kVec<T>>;
    using One = std::integral_constant<int, 1>;
    const bool vec = (HS / 2) % kVec<T> == 0 && ld % kVec<T> == 0 && aligned16(dx);
    if (rope.style == RopeStyle::kRotateHalf) {
      vec ? go(Vec{}, std::true_type{}) : go(One{}, std::true_type{});
    } else {
      vec ? go(Vec{}, std::false_type{}) : go(One{}, std::false_type{});
    }
    FORGE_CUDA_CHECK_LAUNCH();
  });
  channel_grad_finish<1>(ctx, FinishOuts{{dbias, nullptr, nullptr}}, partial.data(), splits, H * HS, 1);
  // `partial` goes back to the allocator here; only work enqueued later on the stream reuses it.
}

void rope_fwd(Context& ctx, DType dt, void* x, int B, int T_, int H, int HS, const Rope& rope,
              int pos0, const int32_t* pos, int64_t ld) {
  rope_rotate(ctx, dt, x, B, T_, H, HS, rope, pos0, pos, 1.0f, "rope_fwd", ld);
}

void rope_bwd(Context& ctx, DType dt, void* dx, int B, int T_, int H, int HS, const Rope& rope,
              int pos0, const int32_t* pos, int64_t ld) {
  rope_rotate(ctx, dt, dx, B, T_, H, HS, rope, pos0, pos, -1.0f, "rope_bwd", ld);
}

}  // namespace forge::cuda
