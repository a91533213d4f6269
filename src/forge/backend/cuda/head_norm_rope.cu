// CUDA per-head RMSNorm + RoPE (Qwen3's q/k norm in the training step), forward and backward; the
// GPU twin of backend/cpu/head_norm_rope.cpp (ops/head_norm_rope.h), in one pass each way.
//
// Why fused: unfused, the forward was rmsnorm_fwd (read x_raw, write x) then rope_fwd (read and
// write x again), and the backward rope_bwd (read/write dx), a memset of d(x_raw), rmsnorm_bwd
// (read dx, x_raw, d(x_raw); write d(x_raw)) and the weight gradient's channel_grad pass (read dx
// and x_raw once more) — per element of q and k, 4 forward and 9 backward 16-bit accesses, and
// 2 forward and 5 backward launches per tensor. Here the forward reads x_raw and writes x (2
// accesses, 1 launch), the backward reads dx and x_raw and writes d(x_raw) in place over dx (3),
// and the weight gradient's per-block partial sums come out of the same kernel, followed by one
// small fixed-order finishing kernel (2 launches).
//
// Work split: a group of G lanes per position (b, t) (G = the power of two ≥ a head's chunk
// count, ≤ 32; HS 128 bf16: 8 lanes, 4 positions a warp; HS 64: 4 lanes, 8), walking the
// position's H heads in order; each lane owns up to kJ chunks of kN pairs of every head: for
// kRotateHalf, kN elements from each half (pair i is (i, i + HS/2)), for interleaved 2·kN
// consecutive elements (pair i is (2i, 2i + 1)), so both members of every pair are in the lane's
// registers and the rotation needs no shuffle. A lane computes its pairs' RoPE angles once per
// position, not once per head: the angles (rope_sincos: a DMUL, an exact reduction, sincospif)
// were ~490 of the ~710 PTX instructions of a lane-step in the kernels that took a head row per
// group, which ran issue-bound at ~2.3 TB/s; measured in one GPU run (2026-12-05, llama-100m
// shape, qwen3), the forward went from 58.8 to 49.4 µs a call and the backward from 83.9 to 65.9
// (docs/perf-notes.md). Σx² (forward) and Σ dnorm·norm (backward) are summed over the group with
// xor shuffles. 16-byte accesses (kN = kVec<T>) when HS/2 is a multiple of kVec<T> and the
// pointers are 16-byte aligned, else kN = 1.
// Arithmetic: as rmsnorm.cu (f32, s = 1/sqrt(Σx²/HS + eps), y = x·s·w) and rope.cu (rope_sincos's
// angles, (x0, x1) → (x0·c − x1·s, x0·s + x1·c)), except that the normalised value is rotated in
// f32 instead of being rounded to T in between: one rounding of the output instead of two.
// Backward, with g = the inverse rotation of dx, norm = x·s:
//   d(x_raw) = (g·w − norm·mean(g·w·norm))·s,   dweight += Σ_rows g·norm.
//
// Two groups (H0 > 0, the model's q and k: adjacent heads of one fused q|k|v row, gains adjacent
// too): heads [0, H0) take weight row 0, [H0, H) row 1, and the walk over a position's heads
// crosses from one to the other once, so a lane reloads its gain chunks there (L1-resident) and,
// backward, swaps its dweight sums with the other group's, kept lane-private in shared memory
// (`stash`). One call instead of two computes each position's angles once (two calls did it
// twice, k's with only NKV heads to spread it over) and launches one finishing kernel over the
// (splits, 2·HS) partials instead of two. Per head the arithmetic is the one-group kernel's, so x,
// rstd and d(x_raw) have the bits of two calls (tested); dweight's splits differ (they follow
// the row count), so its sums take another fixed order.
//
// Determinism of dweight: the backward's grid is `splits` blocks over fixed position ranges (a
// function of the shape only); within a block each lane accumulates its channels over the heads
// its group visits, in order; the groups are then summed in group order through shared memory
// into partial (splits, HS), and kernels::channel_grad_finish_wide_kernel adds the splits in a fixed
// order to dweight. Two runs are bit-identical.
//
// ptxas (sm_90a, CUDA 13.0, -Xptxas=-v): registers per kernel, 0 spill and 0 stack for all
// (<T, kN, kRotateHalf>; kN = 1 is the element-by-element instantiation, 8 chunks a lane):
//   head_norm_rope_fwd_kernel   71–79 (3 blocks a SM; capped at 64 registers it spills)
//   head_norm_rope_bwd_kernel   118–128; 32 KB static shared memory (the partial sums' 16 KB and
//                               the second group's stash), 2 blocks a SM as before the stash
#include <cuda_runtime.h>

#include <algorithm>
#include <type_traits>

#include "forge/backend/cuda/context.h"
#include "forge/backend/cuda/kernel_utils.cuh"
#include "forge/backend/cuda/ops.h"
#include "forge/backend/cuda/rope.cuh"

namespace forge::cuda {
namespace {

using namespace kernels;

constexpr int kThreads = 256;
// Backward blocks (dweight partial rows): channel_grad's rule, so the finishing kernel's serial
// sum over splits (2 blocks for HS 64, each thread adding splits/8 partials) costs what the
// unfused weight gradient's did; 512 blocks of 256 threads are ~2 waves on an H200 at 2 a SM.
constexpr int kMaxSplits = 512, kMinRowsPerSplit = 64;

// Chunks per lane the registers hold: HS/2 ≤ kRopeMaxHalf pairs over ≤ 32 lanes of kN pairs.
template <int kN>
inline constexpr int kChunksPerLane = kRopeMaxHalf / (32 * kN) > 0 ? kRopeMaxHalf / (32 * kN) : 1;

struct Params {
  void* out;          // forward: x; backward: dx_raw (may alias in)
  const void* in;     // forward: x_raw; backward: dx
  const void* x_raw;  // backward
  const void* weight;
  float* rstd;     // forward: written; backward: read
  float* partial;  // backward: (splits, HS) per-block weight-gradient sums, or null
  const int32_t* pos;
  RopeFreqs freqs;
  int rows, T_, H, HS, lanes, rows_per_split;  // rows_per_split: positions a backward block takes
  int H0;  // > 0: heads [0, H0) take weight row 0, [H0, H) row 1 (q's and k's gains); 0: one row
  int64_t rstd1;  // H0 > 0: where the second group's rstd starts (B·T·H0)
  // Elements from one position's heads to the next: in (and x_raw, the backward's) and out. H·HS
  // dense; wider for a view into a fused q|k|v row.
  int64_t ld_in, ld_out;
  float eps, sign;  // sign: +1 forward rotation, −1 backward
  bool rope;
};

// Sum over aligned groups of `lanes` lanes (a power of two ≤ 32); every lane of the warp calls it.
__device__ __forceinline__ float group_sum(float v, int lanes) {
  for (int o = lanes / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// The RoPE position of b·T + t (pos[b, t], or t).
__device__ __forceinline__ double position(const Params& p, int bt) {
  return static_cast<double>(p.pos != nullptr ? p.pos[bt] : bt % p.T_);
}

// Where head h of position bt keeps its rstd: (B·T, H) dense, or with two groups (B·T, H0) then
// (B·T, H − H0).
__device__ __forceinline__ int64_t rstd_index(const Params& p, int bt, int h) {
  if (p.H0 == 0) return int64_t{bt} * p.H + h;
  if (h < p.H0) return int64_t{bt} * p.H0 + h;
  return p.rstd1 + int64_t{bt} * (p.H - p.H0) + (h - p.H0);
}

// ---- the pieces of a head row ----------------------------------------------------------------
// A lane's place: `lane` of a group of `lanes`, owning chunks lane, lane + lanes, ... < chunks.
// The rotation is passed in as rotate(u, j, c) (the lane's j-th chunk, chunk c of the row, in
// place): the kernels apply the position's precomputed angles (rotate_chunk_by).
struct Lane {
  int lane, lanes, chunks, half;
};

// This lane's chunks of weight row `group` (0, or 1 for the second group of heads), the same for
// every head of the group.
template <typename T, int kN, bool kRotateHalf>
__device__ __forceinline__ void load_weight(const Params& p, const Lane& l, int group,
                                            float (&w)[kChunksPerLane<kN>][2 * kN]) {
#pragma unroll
  for (int j = 0; j < kChunksPerLane<kN>; ++j)
    if (l.lane + j * l.lanes < l.chunks)
      load_chunk<T, kN, kRotateHalf>(static_cast<const T*>(p.weight) + group * p.HS,
                                     l.lane + j * l.lanes, l.half, w[j]);
}

// With two groups, the backward's weight-gradient sums of the group not being walked wait in
// shared memory, lane-private (element e of thread t at e · kThreads + t: no bank conflicts, no
// barrier): swapped with the registers' when the walk crosses from one group to the other.
template <int kN>
__device__ __forceinline__ void swap_sums(float (&dw)[kChunksPerLane<kN>][2 * kN], float* stash) {
#pragma unroll
  for (int j = 0; j < kChunksPerLane<kN>; ++j)
#pragma unroll
    for (int i = 0; i < 2 * kN; ++i) {
      float& s = stash[(j * 2 * kN + i) * kThreads + threadIdx.x];
      const float t = s;
      s = dw[j][i];
      dw[j][i] = t;
    }
}

// Forward, first half: the row at `off` of x_raw into u; returns s = 1/sqrt(Σx²/HS + eps). Every
// lane of the warp calls it (the shuffle).
template <typename T, int kN, bool kRotateHalf>
__device__ __forceinline__ float fwd_load(const Params& p, const Lane& l, int64_t off,
                                          float (&u)[kChunksPerLane<kN>][2 * kN]) {
  float sq = 0.0f;
#pragma unroll
  for (int j = 0; j < kChunksPerLane<kN>; ++j) {
    if (l.lane + j * l.lanes >= l.chunks) continue;
    load_chunk<T, kN, kRotateHalf>(static_cast<const T*>(p.in) + off, l.lane + j * l.lanes, l.half,
                                   u[j]);
#pragma unroll
    for (int i = 0; i < 2 * kN; ++i) sq += u[j][i] * u[j][i];
  }
  return 1.0f / sqrtf(group_sum(sq, l.lanes) / p.HS + p.eps);
}

// Forward, second half: x's row at `off` = rotate(u·s·w).
template <typename T, int kN, bool kRotateHalf, class Rotate>
__device__ __forceinline__ void fwd_store(const Params& p, const Lane& l, int64_t off, float s,
                                          const float (&w)[kChunksPerLane<kN>][2 * kN],
                                          float (&u)[kChunksPerLane<kN>][2 * kN], Rotate rotate) {
#pragma unroll
  for (int j = 0; j < kChunksPerLane<kN>; ++j) {
    const int c = l.lane + j * l.lanes;
    if (c >= l.chunks) continue;
#pragma unroll
    for (int i = 0; i < 2 * kN; ++i) u[j][i] = u[j][i] * s * w[j][i];
    if (p.rope) rotate(u[j], j, c);
    store_chunk<T, kN, kRotateHalf>(static_cast<T*>(p.out) + off, c, l.half, u[j]);
  }
}

// Backward, first half: g = the inverse rotation of dx's row at `off`, x = x_raw's; returns
// mean = Σ (g·w)·(x·s) / HS over the group (every lane of the warp calls it).
template <typename T, int kN, bool kRotateHalf, class Rotate>
__device__ __forceinline__ float bwd_load(const Params& p, const Lane& l, int64_t off, float s,
                                          const float (&w)[kChunksPerLane<kN>][2 * kN],
                                          float (&g)[kChunksPerLane<kN>][2 * kN],
                                          float (&x)[kChunksPerLane<kN>][2 * kN], Rotate rotate) {
  float dot = 0.0f;  // Σ (g·w)·(x·s) over this lane's channels
#pragma unroll
  for (int j = 0; j < kChunksPerLane<kN>; ++j) {
    const int c = l.lane + j * l.lanes;
    if (c >= l.chunks) continue;
    load_chunk<T, kN, kRotateHalf>(static_cast<const T*>(p.in) + off, c, l.half, g[j]);
    load_chunk<T, kN, kRotateHalf>(static_cast<const T*>(p.x_raw) + off, c, l.half, x[j]);
    if (p.rope) rotate(g[j], j, c);
#pragma unroll
    for (int i = 0; i < 2 * kN; ++i) dot += (g[j][i] * w[j][i]) * (x[j][i] * s);
  }
  return group_sum(dot, l.lanes) / p.HS;
}

// Backward, second half: d(x_raw)'s row at `off` written, dw += g·norm.
template <typename T, int kN, bool kRotateHalf>
__device__ __forceinline__ void bwd_store(const Params& p, const Lane& l, int64_t off, float s,
                                          float mean, const float (&w)[kChunksPerLane<kN>][2 * kN],
                                          const float (&g)[kChunksPerLane<kN>][2 * kN],
                                          const float (&x)[kChunksPerLane<kN>][2 * kN],
                                          float (&dw)[kChunksPerLane<kN>][2 * kN]) {
#pragma unroll
  for (int j = 0; j < kChunksPerLane<kN>; ++j) {
    const int c = l.lane + j * l.lanes;
    if (c >= l.chunks) continue;
    float d[2 * kN];
#pragma unroll
    for (int i = 0; i < 2 * kN; ++i) {
      const float norm = x[j][i] * s;
      d[i] = (g[j][i] * w[j][i] - norm * mean) * s;
      dw[j][i] += g[j][i] * norm;
    }
    store_chunk<T, kN, kRotateHalf>(static_cast<T*>(p.out) + off, c, l.half, d);
  }
}

// The block's dweight sums into `out` (HS floats of its partial row): each (group, channel) has
// one owner lane, whose sums go to sh[group·HS + channel]; then the groups are added in group
// order. Not called for a frozen gain (no partial; the kernels return before it, uniformly for
// the whole block). Ends with sh still being read: a second call needs a barrier first.
template <int kN, bool kRotateHalf>
__device__ __forceinline__ void write_partial(const Params& p, const Lane& l, int group, int groups,
                                              const float (&dw)[kChunksPerLane<kN>][2 * kN],
                                              float* sh, float* out) {
#pragma unroll
  for (int j = 0; j < kChunksPerLane<kN>; ++j) {
    const int c = l.lane + j * l.lanes;
    if (c >= l.chunks) continue;
    store_chunk<float, kN, kRotateHalf>(sh + group * p.HS, c, l.half, dw[j]);
  }
  __syncthreads();
  for (int ch = threadIdx.x; ch < p.HS; ch += kThreads) {
    float t = 0.0f;
    for (int gr = 0; gr < groups; ++gr) t += sh[gr * p.HS + ch];
    out[ch] = t;
  }
}

// ---- the kernels ------------------------------------------------------------------------------
// The angles of this lane's chunks at position bt (rope only).
template <int kN>
__device__ __forceinline__ void lane_angles(const Params& p, const Lane& l, int bt,
                                            float (&cs)[kChunksPerLane<kN>][kN],
                                            float (&sn)[kChunksPerLane<kN>][kN]) {
  const double at = position(p, bt);
#pragma unroll
  for (int j = 0; j < kChunksPerLane<kN>; ++j)
    if (l.lane + j * l.lanes < l.chunks)
      chunk_angles<kN>(cs[j], sn[j], l.lane + j * l.lanes, at, p.freqs, p.sign);
}

// Grid-stride over positions, kThreads / lanes positions per block step. The loop bound is
// uniform per block, so every lane reaches the shuffles; positions past the end compute on the
// last one and store nothing.
template <typename T, int kN, bool kRotateHalf>
__global__ void __launch_bounds__(kThreads)
    head_norm_rope_fwd_kernel(const __grid_constant__ Params p) {
  constexpr int kJ = kChunksPerLane<kN>;
  const Lane l{static_cast<int>(threadIdx.x) & (p.lanes - 1), p.lanes, p.HS / 2 / kN, p.HS / 2};
  const int group = threadIdx.x / p.lanes, groups = kThreads / p.lanes;
  const int positions = p.rows / p.H;
  float w[kJ][2 * kN];
  load_weight<T, kN, kRotateHalf>(p, l, 0, w);
  for (int base = blockIdx.x * groups; base < positions; base += gridDim.x * groups) {
    const bool valid = base + group < positions;
    const int bt = valid ? base + group : positions - 1;
    float cs[kJ][kN], sn[kJ][kN];
    if (p.rope) lane_angles<kN>(p, l, bt, cs, sn);
    for (int h = 0; h < p.H; ++h) {  // uniform bound: every lane reaches the shuffle
      if (p.H0 > 0 && h == p.H0) load_weight<T, kN, kRotateHalf>(p, l, 1, w);  // k's gain (L1)
      const int64_t off_in = bt * p.ld_in + h * p.HS, off_out = bt * p.ld_out + h * p.HS;
      float u[kJ][2 * kN];
      const float s = fwd_load<T, kN, kRotateHalf>(p, l, off_in, u);
      if (!valid) continue;  // after the shuffle
      fwd_store<T, kN, kRotateHalf>(p, l, off_out, s, w, u, [&](float(&v)[2 * kN], int j, int) {
        rotate_chunk_by<kN, kRotateHalf>(v, cs[j], sn[j]);
      });
      if (l.lane == 0) p.rstd[rstd_index(p, bt, h)] = s;
    }
    if (p.H0 > 0) load_weight<T, kN, kRotateHalf>(p, l, 0, w);  // q's again, for the next position
  }
}

// Block b takes positions [b·rows_per_split, (b + 1)·rows_per_split), all H heads of each; see
// the header for dweight. dx_raw may alias dx: each lane reads its elements of a head before it
// writes them, and no other lane touches them.
template <typename T, int kN, bool kRotateHalf>
__global__ void __launch_bounds__(kThreads)
    head_norm_rope_bwd_kernel(const __grid_constant__ Params p) {
  constexpr int kJ = kChunksPerLane<kN>;
  __shared__ __align__(16) float sh[kThreads * 2 * kN * kJ];
  __shared__ float stash[kThreads * 2 * kN * kJ];  // the other group's sums (two groups only)
  const Lane l{static_cast<int>(threadIdx.x) & (p.lanes - 1), p.lanes, p.HS / 2 / kN, p.HS / 2};
  const int group = threadIdx.x / p.lanes, groups = kThreads / p.lanes;
  const int positions = p.rows / p.H;
  float w[kJ][2 * kN], dw[kJ][2 * kN];
  load_weight<T, kN, kRotateHalf>(p, l, 0, w);
#pragma unroll
  for (int j = 0; j < kJ; ++j)
#pragma unroll
    for (int i = 0; i < 2 * kN; ++i) {
      dw[j][i] = 0.0f;
      if (p.H0 > 0) stash[(j * 2 * kN + i) * kThreads + threadIdx.x] = 0.0f;
    }
  const int q0 = blockIdx.x * p.rows_per_split;
  const int q1 = min(positions, q0 + p.rows_per_split);
  for (int base = q0; base < q1; base += groups) {
    const bool valid = base + group < q1;
    const int bt = valid ? base + group : q1 - 1;
    float cs[kJ][kN], sn[kJ][kN];
    if (p.rope) lane_angles<kN>(p, l, bt, cs, sn);
    for (int h = 0; h < p.H; ++h) {
      if (p.H0 > 0 && h == p.H0) {  // into the second group: its gain and its sums
        load_weight<T, kN, kRotateHalf>(p, l, 1, w);
        swap_sums<kN>(dw, stash);
      }
      const int64_t off_in = bt * p.ld_in + h * p.HS, off_out = bt * p.ld_out + h * p.HS;
      const float s = p.rstd[rstd_index(p, bt, h)];
      float g[kJ][2 * kN], x[kJ][2 * kN];
      const float mean =
          bwd_load<T, kN, kRotateHalf>(p, l, off_in, s, w, g, x, [&](float(&v)[2 * kN], int j, int) {
            rotate_chunk_by<kN, kRotateHalf>(v, cs[j], sn[j]);
          });
      if (!valid) continue;  // after the shuffle
      bwd_store<T, kN, kRotateHalf>(p, l, off_out, s, mean, w, g, x, dw);
    }
    if (p.H0 > 0) {  // back to the first group for the next position
      load_weight<T, kN, kRotateHalf>(p, l, 0, w);
      swap_sums<kN>(dw, stash);
    }
  }
  if (p.partial == nullptr) return;  // a frozen gain
  const int width = p.H0 > 0 ? 2 * p.HS : p.HS;  // the partial row: one or two groups' sums
  float* out = p.partial + static_cast<int64_t>(blockIdx.x) * width;
  write_partial<kN, kRotateHalf>(p, l, group, groups, dw, sh, out);
  if (p.H0 == 0) return;
  __syncthreads();  // sh is read to its end by the first call
  swap_sums<kN>(dw, stash);
  write_partial<kN, kRotateHalf>(p, l, group, groups, dw, sh, out + p.HS);
}

// Lanes per head: the power of two ≥ the chunk count, at most 32.
int lanes_for(int chunks) {
  int lanes = 1;
  while (lanes < chunks && lanes < 32) lanes *= 2;
  return lanes;
}

// Picks the instantiation (vector or element path, rope style) and launches it.
template <bool kForward>
void launch(Context& ctx, DType dt, Params& p, RopeStyle style, bool vec_ptrs, int grid, const char* op) {
  dispatch_dtype(dt, op, [&](auto tag) {
    using T = decltype(tag);
    const int half = p.HS / 2;
    const bool vec = half % kVec<T> == 0 && vec_ptrs && p.ld_in % kVec<T> == 0 && p.ld_out % kVec<T> == 0;
    auto go = [&](auto kn, auto rotate_half) {
      constexpr int kN = decltype(kn)::value;
      constexpr bool kRh = decltype(rotate_half)::value;
      p.lanes = lanes_for(half / kN);
      FORGE_CHECK((half / kN + p.lanes - 1) / p.lanes <= kChunksPerLane<kN>, "[", op, "] HS ", p.HS,
                  " needs more chunks per lane than compiled");
      if constexpr (kForward) {
        const int g = grid > 0 ? grid : grid_for(p.rows / p.H, kThreads / p.lanes, ctx.num_sms());
        head_norm_rope_fwd_kernel<T, kN, kRh><<<g, kThreads, 0, ctx.stream()>>>(p);
      } else {
        head_norm_rope_bwd_kernel<T, kN, kRh><<<grid, kThreads, 0, ctx.stream()>>>(p);
      }
    };
    using Vec = std::integral_constant<int, kVec<T>>;
    using One = std::integral_constant<int, 1>;
    using Rh = std::true_type;
    using Il = std::false_type;
    if (style == RopeStyle::kRotateHalf) {
      vec ? go(Vec{}, Rh{}) : go(One{}, Rh{});
    } else {
      vec ? go(Vec{}, Il{}) : go(One{}, Il{});
    }
    FORGE_CUDA_CHECK_LAUNCH();
  });
}

Params make_params(int B, int T_, int H, int HS, const Rope* rope, const int32_t* pos, float sign,
                   int64_t ld_in, int64_t ld_out, int H0, const char* op) {
  FORGE_CHECK(H0 >= 0 && H0 < H, "[", op, "] first group of ", H0, " heads outside [0, ", H, ")");
  Params p{};
  p.rows = B * T_ * H;
  p.T_ = T_, p.H = H, p.HS = HS, p.H0 = H0;
  p.rstd1 = int64_t{B} * T_ * H0;
  p.ld_in = ld_in > 0 ? ld_in : int64_t{H} * HS, p.ld_out = ld_out > 0 ? ld_out : int64_t{H} * HS;
  FORGE_CHECK(p.ld_in >= int64_t{H} * HS && p.ld_out >= int64_t{H} * HS, "[", op, "] row stride ",
              std::min(p.ld_in, p.ld_out), " below H·HS = ", H * HS);
  p.pos = pos;
  p.sign = sign;
  p.rope = rope != nullptr;
  if (rope != nullptr) p.freqs = rope_freqs(*rope, HS);  // exactly the CPU's inv_freq, then / π
  return p;
}

}  // namespace

void head_norm_rope_fwd(Context& ctx, DType dt, void* x, float* rstd, const void* x_raw,
                        const void* weight, int B, int T_, int H, int HS, float eps,
                        const Rope* rope, const int32_t* pos, int64_t ld, int H0) {
  check_rope_shape(B, T_, H, HS, "head_norm_rope_fwd");
  FORGE_CHECK(x != x_raw, "[head_norm_rope_fwd] x must not alias x_raw (the backward reads x_raw)");
  Params p = make_params(B, T_, H, HS, rope, pos, 1.0f, ld, ld, H0, "head_norm_rope_fwd");
  if (p.rows == 0) return;
  p.out = x, p.in = x_raw, p.weight = weight, p.rstd = rstd, p.eps = eps;
  const bool vec_ptrs = aligned16(x) && aligned16(x_raw) && aligned16(weight);
  launch<true>(ctx, dt, p, rope ? rope->style : RopeStyle::kRotateHalf, vec_ptrs, 0, "head_norm_rope_fwd");
}

void head_norm_rope_bwd(Context& ctx, DType dt, void* dx_raw, float* dweight, const void* dx,
                        const void* x_raw, const void* weight, const float* rstd, int B, int T_,
                        int H, int HS, const Rope* rope, const int32_t* pos, int64_t ld, int H0) {
  check_rope_shape(B, T_, H, HS, "head_norm_rope_bwd");
  Params p = make_params(B, T_, H, HS, rope, pos, -1.0f, ld, ld, H0, "head_norm_rope_bwd");
  if (p.rows == 0) return;
  int splits = (p.rows + kMinRowsPerSplit - 1) / kMinRowsPerSplit;
  if (splits > kMaxSplits) splits = kMaxSplits;
  // As many ranges of the B·T positions (H rows each) as channel_grad's rule gives the rows.
  const int positions = B * T_;
  p.rows_per_split = (positions + splits - 1) / splits;
  splits = (positions + p.rows_per_split - 1) / p.rows_per_split;  // no empty block
  const int width = H0 > 0 ? 2 * HS : HS;  // a block's partial row: one or two groups' sums
  DeviceBuffer<float> partial;
  if (dweight) partial = DeviceBuffer<float>(ctx.allocator(), static_cast<size_t>(splits) * width);
  p.out = dx_raw, p.in = dx, p.x_raw = x_raw, p.weight = weight;
  p.rstd = const_cast<float*>(rstd);  // read only in the backward
  p.partial = dweight ? partial.data() : nullptr;
  const bool vec_ptrs = aligned16(dx_raw) && aligned16(dx) && aligned16(x_raw) && aligned16(weight);
  launch<false>(ctx, dt, p, rope ? rope->style : RopeStyle::kRotateHalf, vec_ptrs, splits, "head_norm_rope_bwd");
  if (dweight == nullptr) return;  // a frozen gain
  channel_grad_finish<1>(ctx, FinishOuts{{dweight, nullptr, nullptr}}, partial.data(), splits, width, 1);
  // `partial` goes back to the allocator here; only work enqueued later on the stream reuses it.
}

}  // namespace forge::cuda
