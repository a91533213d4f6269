// CUDA KV-cache decode ops (decode.h); the GPU twins of backend/cpu/decode.cpp. Every per-step
// value (tokens, positions) is read from device memory and nothing here synchronises or
// allocates, so a decode step is capturable in a CUDA graph and replays with new positions.
//
// Memory-bound ops, each a grid-stride loop with 16-byte accesses where the row length and the
// pointers allow (kN = kVec<T> elements), element by element otherwise (kN = 1):
//  - embedding_at: one warp per row, out = wte[token] + wpe[pos], added in f32 (embedding.cu's
//    forward with a position per row).
//  - rope_at: rope.cu's kernel with a position per row, built from the same pieces (rope.cuh):
//    the host passes inv_freq_i / π in double (exactly the CPU's inv_freq, scaling included) in
//    the kernel's parameter space, the kernel forms the angle in half-turns in double, reduces it
//    exactly to [−1, 1] and evaluates sincospif in f32, so the result agrees with rope_fwd at
//    t = pos bit for bit, and with the CPU to ~1e-7 at any position. One thread per (row, head,
//    chunk of kN pairs); rows may be strided (q and k slices of a fused projection).
//  - kv_append: a copy of 2·S rows of NKV·HS elements to row pos[s] % cap of the caches, raw
//    bits (no conversion), one thread per 16-byte chunk.
//  - advance_positions: one thread per slot.
//
// decode_attention, flash-decoding. The work of a step is S·NH query rows, each a dot product
// with up to cap keys: at S = 1 that is far too few rows to fill 132 SMs, and at S = 128 the
// cost is reading the cache (128 slots × 8192 rows × 3 kv heads × 64 × 2 B × 2 = 805 MB for
// SmolLM2-135M in bf16, ~170 µs at the H200's 4.8 TB/s). So:
//  - One block of 128 threads per (split, kv head, slot) handles ALL the query heads of its kv
//    head (up to kMaxHeads = 8; larger groups are cut into chunks, each its own block): each key
//    and value row is read from global memory once per group, not once per query head.
//  - The block walks its key range in tiles of kTile = 64 rows: (1) K and V tiles to shared
//    memory with coalesced 16-byte loads (a row of HS elements is contiguous; the rows are padded
//    by 16 bytes when HS·sizeof(T)/16 is even, so that eight threads reading the same 16-byte
//    column of eight consecutive rows hit eight different bank groups); (2) scores: one thread
//    per (head, key) dot product over HS against q in shared memory (f32, pre-scaled by
//    log2(e)/sqrt(HS); the 32 lanes of a warp share one head, so q reads are broadcasts);
//    (3) online softmax: one warp per head takes the tile's max, rescales the running sum, and
//    turns the scores into exp2(s − m); (4) P·V: threads over (key subgroup r, head, 16-byte
//    column chunk c) sum keys r, r + R, … of the tile, R = 128 / (heads·HS/kVec) so all 128
//    threads work, and (5) the R partials are added to the f32 accumulator in shared memory,
//    which is rescaled by exp2(m_old − m_new). All arithmetic in f32.
//  - Flash-decoding split: the slot's visible rows [0, n), n = min(pos + 1, cap), read on the
//    device, are cut into `splits` ranges of ceil(n / splits) rows rounded up to a tile. With
//    splits = 1 the block writes the normalised output itself. Otherwise each split writes its
//    running max, sum (log2 units) and unnormalised accumulator, f32, to scratch, and a second
//    kernel (one block per query row, one thread per channel) combines them:
//    out = Σ_z 2^(m_z − M)·acc_z / Σ_z 2^(m_z − M)·l_z with M = max_z m_z, skipping empty splits.
//  - The split count depends on the shape only (decode_attention_splits), so the grid of a
//    captured graph is valid at every position: enough splits that S·NKV·chunks·splits reaches
//    kTargetBlocks = 4 blocks per SM of the H200's 132 SMs, at most one split per kMinSplitRows =
//    64 rows (one tile) of cap and at most kMaxSplits = 64. (It was two tiles: ncu of the batch-1
//    SmolLM2 step at cap 131 then showed one split, 3 blocks and 13.0 µs per layer, the largest
//    kernel of the step; one tile per split puts a short context on more blocks.) SmolLM2-135M (NKV 3), cap 8192: S = 1 → 64
//    splits, S = 8 → 22, S = 128 → 2; GPT-2 (NKV 12) at S = 128 → 1. On another GPU the rule is
//    the same (correct, tuned for the H200): decode_attention_scratch_bytes takes no context.
//  - Shared memory per block (dynamic): K and V tiles 2·64·(HS + pad)·sizeof(T), q and the
//    accumulator 2·heads·HS f32, the P·V partials 128·kVec f32, the scores heads·64 f32: 25 KB
//    for HS 64, 3 heads, bf16 (8 blocks per SM); up to 82 KB for f32, HS 128, 8 heads.
//  - Measured (H200, bf16, every slot at n = cap, the DISABLED_DecodeAttentionThroughput test in
//    tests/backend/cuda/decode_test.cpp; GB/s = K and V bytes read / time):
//      SmolLM2-135M (NH 9, NKV 3, HS 64), cap 8192:  S = 8: 42.8 µs, 1176 GB/s (22 splits);
//                                                    S = 32: 115 µs, 1744 GB/s (6);
//                                                    S = 128: 342 µs, 2356 GB/s (2)
//      GPT-2 (NH = NKV = 12, HS 64, strided q), cap 1024: S = 1: 10.9 µs (8 splits);
//                                                    S = 128: 145 µs, 2781 GB/s (1)
//      NH 32, NKV 8, HS 128, cap 4096, S = 32:       374 µs, 1437 GB/s (3)
//    About half of the 4.8 TB/s peak at S = 128: each block loads a tile, then computes on it
//    behind four barriers, with no load in flight meanwhile; the next step would be to prefetch
//    tile t + 1 (cp.async into a second buffer) while tile t is computed.
//
// ptxas (sm_90a, CUDA 13.0, -Xptxas=-v): registers, spill stores, stack frame per kernel:
//   decode_attention_kernel<bf16 or f16, HS>      43-46 regs, 0 spill, 0 stack (every HS)
//   decode_attention_kernel<float, 64..128>          47 regs, 0 spill, 0 stack
//   decode_attention_kernel<float, 32>               48 regs, 4 spill, 8 stack (one word)
//   decode_attention_combine_kernel<T>               30 regs, 0 spill, 0 stack
//   embedding_at_kernel<T, kN>                    32-40 regs, 0 spill, 0 stack
//   rope_at_kernel<T, kN, style>                  28-40 regs, 0 spill, 0 stack
//   kv_append_kernel<int4 or T>                   28-30 regs, 0 spill, 0 stack
//   advance_positions_kernel                          8 regs, 0 spill, 0 stack
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "forge/backend/cuda/context.h"
#include "forge/backend/cuda/decode.h"
#include "forge/backend/cuda/kernel_utils.cuh"
#include "forge/backend/cuda/rope.cuh"
#include "forge/core/error.h"

namespace forge::cuda {
namespace {

using namespace kernels;

constexpr int kThreads = 256;  // memory-bound kernels

// ---- embedding_at ---------------------------------------------------------------------------

// One warp per row n, grid-stride over rows; lane l moves chunks l, l + 32, ... of kN.
template <typename T, int kN>
__global__ void __launch_bounds__(kThreads)
    embedding_at_kernel(T* __restrict__ out, const int32_t* __restrict__ tokens,
                        const int32_t* __restrict__ pos, const T* __restrict__ wte,
                        const T* __restrict__ wpe, int N, int C) {
  const int lane = threadIdx.x % 32, warps_per_block = blockDim.x / 32;
  for (int n = blockIdx.x * warps_per_block + threadIdx.x / 32; n < N;
       n += gridDim.x * warps_per_block) {
    const T* e = wte + static_cast<int64_t>(tokens[n]) * C;                          // (C)
    const T* p = wpe != nullptr ? wpe + static_cast<int64_t>(pos[n]) * C : nullptr;  // (C)
    T* o = out + static_cast<int64_t>(n) * C;                                        // (C)
    for (int c = lane * kN; c < C; c += 32 * kN) {
      float v[kN];
      load<T, kN>(e + c, v);
      if (p != nullptr) {
        float q[kN];
        load<T, kN>(p + c, q);
#pragma unroll
        for (int k = 0; k < kN; ++k) v[k] += q[k];
      }
      store<T, kN>(o + c, v);
    }
  }
}

// ---- rope_at --------------------------------------------------------------------------------

// One thread per (row = n·H + h, chunk of kN pairs); row n of x starts at x + n·stride.
template <typename T, int kN, bool kRotateHalf>
__global__ void __launch_bounds__(kThreads)
    rope_at_kernel(T* x, const int32_t* __restrict__ pos, const __grid_constant__ RopeFreqs freqs,
                   int rows, int H, int HS, int64_t stride) {
  const int half = HS / 2;
  const int chunks = half / kN;
  const int total = rows * chunks;  // < 2^31: checked on the host
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
    const int row = i / chunks;              // n·H + h
    const int p0 = (i - row * chunks) * kN;  // first pair of this thread
    const int n = row / H, h = row - n * H;
    const double at = static_cast<double>(pos[n]);
    float cs[kN], sn[kN];
#pragma unroll
    for (int k = 0; k < kN; ++k) rope_sincos(at, freqs.inv_freq_over_pi[p0 + k], &sn[k], &cs[k]);
    T* xh = x + n * stride + static_cast<int64_t>(h) * HS;  // (HS)
    rope_rotate_pairs<T, kN, kRotateHalf>(xh, p0, half, cs, sn);
  }
}

// ---- kv_append ------------------------------------------------------------------------------

// One thread per (slot, k or v, chunk of one Word): Word = int4 (16 bytes) or T.
template <typename Word>
__global__ void __launch_bounds__(kThreads)
    kv_append_kernel(Word* __restrict__ cache_k, Word* __restrict__ cache_v,
                     const Word* __restrict__ k, const Word* __restrict__ v,
                     const int32_t* __restrict__ pos, int S, int cap, int width, int64_t k_stride,
                     int64_t v_stride) {  // width, strides in Words
  const int total = 2 * S * width;        // < 2^31: checked on the host
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
    const int row = i / width, c = i - row * width;  // row = 2·slot + (0: k, 1: v)
    const int slot = row / 2;
    const int64_t dst = (static_cast<int64_t>(slot) * cap + pos[slot] % cap) * width + c;
    if (row % 2 == 0) {
      cache_k[dst] = k[slot * k_stride + c];
    } else {
      cache_v[dst] = v[slot * v_stride + c];
    }
  }
}

// ---- advance_positions ----------------------------------------------------------------------

__global__ void advance_positions_kernel(int32_t* pos, int S, int32_t limit) {
  const int s = blockIdx.x * blockDim.x + threadIdx.x;
  if (s < S) pos[s] = min(pos[s] + 1, limit);
}

// ---- decode_attention -----------------------------------------------------------------------

constexpr int kAttnThreads = 128;
constexpr int kTile = 64;     // key rows per shared-memory tile
constexpr int kMaxHeads = 8;  // query heads per block
constexpr int kTargetBlocks = 4 * 132;
constexpr int kMinSplitRows = kTile;
constexpr int kMaxSplits = 64;

struct HeadChunks {
  int chunks;  // blocks per kv head
  int heads;   // query heads per block (the last chunk may have fewer)
};

HeadChunks head_chunks(int group) {
  const int chunks = (group + kMaxHeads - 1) / kMaxHeads;
  return {chunks, (group + chunks - 1) / chunks};
}

// Shared-memory layout of one block, in bytes from the start; the same on host and device.
struct AttnSmem {
  int k, v, q, acc, part, p, stat, bytes;
};

template <typename T, int HS>
__host__ __device__ constexpr int padded_row() {  // elements per K/V row in shared memory
  constexpr int kE = kVec<T>, kNC = HS / kE;
  return HS + (kNC % 2 == 0 ? kE : 0);
}

template <typename T, int HS>
__host__ __device__ AttnSmem attn_smem(int heads) {
  constexpr int kE = kVec<T>, kNC = HS / kE;
  const int units = heads * kNC > kAttnThreads ? heads * kNC : kAttnThreads;
  AttnSmem m{};
  m.k = 0;
  m.v = m.k + kTile * padded_row<T, HS>() * static_cast<int>(sizeof(T));
  m.q = m.v + kTile * padded_row<T, HS>() * static_cast<int>(sizeof(T));
  m.acc = m.q + heads * HS * 4;
  m.part = m.acc + heads * HS * 4;
  m.p = m.part + units * kE * 4;
  m.stat = m.p + heads * kTile * 4;
  m.bytes = m.stat + 3 * kMaxHeads * 4;
  return m;
}

template <typename T>
struct AttnArgs {
  T* out;              // (S, NH, HS)
  const T* q;          // (S, q_stride), heads at h·HS
  const T* cache_k;    // (S, cap, NKV, HS)
  const T* cache_v;    // (S, cap, NKV, HS)
  const int32_t* pos;  // (S)
  float* part_ml;      // (S, NH, splits, 2) running max (log2 units) and sum per split
  float* part_acc;     // (S, NH, splits, HS) unnormalised output per split
  int64_t q_stride;
  int NH, NKV, cap;
  int group;        // NH / NKV
  int chunk_heads;  // query heads per block (HeadChunks::heads)
  int chunks;       // blocks per kv head
  int splits;
  float scale_log2;  // log2(e) / sqrt(HS)
};

__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}

// grid (splits, NKV·chunks, S), kAttnThreads threads: the design is at the top of the file.
template <typename T, int HS>
__global__ void __launch_bounds__(kAttnThreads) decode_attention_kernel(const AttnArgs<T> a) {
  constexpr int kE = kVec<T>, kNC = HS / kE, kRow = padded_row<T, HS>();
  const int z = blockIdx.x, slot = blockIdx.z, tid = threadIdx.x;
  const int kvh = blockIdx.y / a.chunks, chunk = blockIdx.y - kvh * a.chunks;
  const int h0 = kvh * a.group + chunk * a.chunk_heads;  // first query head of the block
  const int G = min(a.chunk_heads, a.group - chunk * a.chunk_heads);  // its query heads
  const AttnSmem L = attn_smem<T, HS>(a.chunk_heads);
  extern __shared__ __align__(16) unsigned char smem[];
  T* k_s = reinterpret_cast<T*>(smem + L.k);              // (kTile, kRow)
  T* v_s = reinterpret_cast<T*>(smem + L.v);              // (kTile, kRow)
  float* q_s = reinterpret_cast<float*>(smem + L.q);      // (G, HS) scaled query
  float* acc_s = reinterpret_cast<float*>(smem + L.acc);  // (G, HS) running output
  float* part = reinterpret_cast<float*>(smem + L.part);  // (units, kE) P·V partials
  float* p_s = reinterpret_cast<float*>(smem + L.p);      // (G, kTile) scores, then probabilities
  float* m_s = reinterpret_cast<float*>(smem + L.stat);   // (G) running max
  float* l_s = m_s + kMaxHeads;                           // (G) running sum
  float* alpha_s = l_s + kMaxHeads;                       // (G) this tile's rescale factor

  // Visible rows [0, n) and this split's share [r0, r1).
  const int n = max(0, min(a.pos[slot] + 1, a.cap));
  const int len = ((n + a.splits - 1) / a.splits + kTile - 1) / kTile * kTile;
  const int r0 = z * len, r1 = min(n, r0 + len);

  const T* qrow = a.q + slot * a.q_stride + static_cast<int64_t>(h0) * HS;
  for (int i = tid; i < G * HS; i += kAttnThreads) {
    q_s[i] = to_f32(qrow[i]) * a.scale_log2;
    acc_s[i] = 0.0f;
  }
  if (tid < G) {
    m_s[tid] = -INFINITY;
    l_s[tid] = 0.0f;
  }
  const int64_t row_elems = static_cast<int64_t>(a.NKV) * HS;  // between consecutive cache rows
  const int64_t base = (static_cast<int64_t>(slot) * a.cap * a.NKV + kvh) * HS;
  const int gnc = G * kNC;                                    // (head, chunk) pairs
  const int R = gnc < kAttnThreads ? kAttnThreads / gnc : 1;  // key subgroups in P·V
  __syncthreads();

  for (int t0 = r0; t0 < r1; t0 += kTile) {
    const int nt = min(kTile, r1 - t0);
    // (1) K and V tiles, 16 bytes per thread per access, a row's chunks by consecutive threads.
    for (int i = tid; i < nt * kNC; i += kAttnThreads) {
      const int j = i / kNC, c = i - j * kNC;
      const int64_t g = base + (t0 + j) * row_elems + c * kE;
      *reinterpret_cast<int4*>(k_s + j * kRow + c * kE) =
          *reinterpret_cast<const int4*>(a.cache_k + g);
      *reinterpret_cast<int4*>(v_s + j * kRow + c * kE) =
          *reinterpret_cast<const int4*>(a.cache_v + g);
    }
    __syncthreads();
    // (2) scores s = q·k (log2 units), −inf past the end of the range.
    for (int i = tid; i < G * kTile; i += kAttnThreads) {
      const int g = i / kTile, j = i - g * kTile;
      float s = -INFINITY;
      if (j < nt) {
        s = 0.0f;
        const float* qg = q_s + g * HS;
#pragma unroll
        for (int c = 0; c < kNC; ++c) {
          float kf[kE];
          unpack16(*reinterpret_cast<const int4*>(k_s + j * kRow + c * kE), kf, T{});
#pragma unroll
          for (int e = 0; e < kE; e += 4) {
            const float4 qq = *reinterpret_cast<const float4*>(qg + c * kE + e);
            s += kf[e] * qq.x + kf[e + 1] * qq.y + kf[e + 2] * qq.z + kf[e + 3] * qq.w;
          }
        }
      }
      p_s[i] = s;
    }
    __syncthreads();
    // (3) online softmax, one warp per head.
    for (int g = tid / 32; g < G; g += kAttnThreads / 32) {
      const int lane = tid % 32;
      float s[kTile / 32];
      float mx = -INFINITY;
#pragma unroll
      for (int k = 0; k < kTile / 32; ++k) mx = fmaxf(mx, s[k] = p_s[g * kTile + lane + 32 * k]);
      mx = warp_max(mx);  // finite: nt ≥ 1
      const float m_old = m_s[g], m_new = fmaxf(m_old, mx);
      float sum = 0.0f;
#pragma unroll
      for (int k = 0; k < kTile / 32; ++k) {
        const float p = exp2f(s[k] - m_new);  // 0 past the end
        p_s[g * kTile + lane + 32 * k] = p;
        sum += p;
      }
      sum = warp_sum(sum);
      if (lane == 0) {
        const float alpha = exp2f(m_old - m_new);  // 0 on the first tile (m_old = −inf)
        alpha_s[g] = alpha;
        l_s[g] = l_s[g] * alpha + sum;
        m_s[g] = m_new;
      }
    }
    __syncthreads();
    // (4) P·V partials: unit u = (r, g, c) sums keys r, r + R, ... of column chunk c for head g.
    for (int u = tid; u < R * gnc; u += kAttnThreads) {
      const int r = u / gnc, g = (u - r * gnc) / kNC, c = u % kNC;
      float o[kE];
#pragma unroll
      for (int e = 0; e < kE; ++e) o[e] = 0.0f;
      for (int j = r; j < nt; j += R) {
        const float p = p_s[g * kTile + j];
        float vf[kE];
        unpack16(*reinterpret_cast<const int4*>(v_s + j * kRow + c * kE), vf, T{});
#pragma unroll
        for (int e = 0; e < kE; ++e) o[e] += p * vf[e];
      }
#pragma unroll
      for (int e = 0; e < kE; e += 4)
        *reinterpret_cast<float4*>(part + u * kE + e) =
            make_float4(o[e], o[e + 1], o[e + 2], o[e + 3]);
    }
    __syncthreads();
    // (5) acc = acc·alpha + Σ_r partials (the next tile's writes of part and alpha_s come after
    // two more barriers; acc_s[i] is only ever touched by thread i mod kAttnThreads).
    for (int i = tid; i < G * HS; i += kAttnThreads) {
      const int g = i / HS, d = i - g * HS;
      const int idx = (g * kNC + d / kE) * kE + d % kE;  // unit (0, g, d / kE), element d % kE
      float t = 0.0f;
      for (int r = 0; r < R; ++r) t += part[r * gnc * kE + idx];
      acc_s[i] = acc_s[i] * alpha_s[g] + t;
    }
  }
  __syncthreads();

  if (a.splits == 1) {
    T* orow = a.out + (static_cast<int64_t>(slot) * a.NH + h0) * HS;  // (G, HS)
    for (int i = tid; i < G * HS; i += kAttnThreads) {
      const float l = l_s[i / HS];
      orow[i] = from_f32<T>(l > 0.0f ? acc_s[i] / l : 0.0f);
    }
  } else {
    const int64_t row0 = (static_cast<int64_t>(slot) * a.NH + h0) * a.splits + z;  // head h0
    for (int i = tid; i < G * HS; i += kAttnThreads) {
      const int g = i / HS, d = i - g * HS;
      a.part_acc[(row0 + static_cast<int64_t>(g) * a.splits) * HS + d] = acc_s[i];
    }
    if (tid < G) {
      a.part_ml[2 * (row0 + static_cast<int64_t>(tid) * a.splits)] = m_s[tid];
      a.part_ml[2 * (row0 + static_cast<int64_t>(tid) * a.splits) + 1] = l_s[tid];
    }
  }
}

// One block per query row (slot, head), one thread per channel: combines the splits' partials.
template <typename T>
__global__ void __launch_bounds__(kAttnThreads)
    decode_attention_combine_kernel(T* __restrict__ out, const float* __restrict__ part_ml,
                                    const float* __restrict__ part_acc, int splits, int HS) {
  const int64_t row = blockIdx.x;  // slot·NH + head
  const float* ml = part_ml + row * splits * 2;
  const float* acc = part_acc + row * splits * HS;
  float M = -INFINITY;
  for (int z = 0; z < splits; ++z)
    if (ml[2 * z + 1] > 0.0f) M = fmaxf(M, ml[2 * z]);
  for (int d = threadIdx.x; d < HS; d += blockDim.x) {
    float l = 0.0f, o = 0.0f;
    for (int z = 0; z < splits; ++z) {
      if (ml[2 * z + 1] > 0.0f) {  // an empty split (no rows) adds nothing
        const float w = exp2f(ml[2 * z] - M);
        l += w * ml[2 * z + 1];
        o += w * acc[static_cast<int64_t>(z) * HS + d];
      }
    }
    out[row * HS + d] = from_f32<T>(l > 0.0f ? o / l : 0.0f);
  }
}

void check_decode_shape(const DecodeShape& s, const char* op) {
  if (s.S < 0 || s.NH <= 0 || s.NKV <= 0 || s.HS <= 0 || s.cap <= 0 || s.NH % s.NKV != 0)
    throw Error(str("[", op, "] bad shape S=", s.S, " NH=", s.NH, " NKV=", s.NKV, " HS=", s.HS,
                    " cap=", s.cap, " (want S >= 0, NH, NKV, HS, cap > 0, NH % NKV == 0)"));
}

int64_t row_stride(int64_t stride, int64_t width, const char* op, const char* what) {
  if (stride == 0) return width;
  if (stride < width)
    throw Error(
        str("[", op, "] ", what, " stride ", stride, " is shorter than the row (", width, ")"));
  return stride;
}

template <typename T, int HS>
void launch_decode_attention(Context& ctx, const AttnArgs<T>& a, int S) {
  const AttnSmem L = attn_smem<T, HS>(a.chunk_heads);
  auto kernel = decode_attention_kernel<T, HS>;
  if (L.bytes > 48 * 1024)
    FORGE_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, L.bytes));
  const dim3 grid(a.splits, a.NKV * a.chunks, S);
  kernel<<<grid, kAttnThreads, L.bytes, ctx.stream()>>>(a);
  FORGE_CUDA_CHECK_LAUNCH();
  if (a.splits > 1) {
    decode_attention_combine_kernel<T>
        <<<S * a.NH, kAttnThreads, 0, ctx.stream()>>>(a.out, a.part_ml, a.part_acc, a.splits, HS);
    FORGE_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace

void embedding_at(Context& ctx, DType dt, void* out, const int32_t* tokens, const int32_t* pos,
                  const void* wte, const void* wpe, int N, int C) {
  if (N < 0 || C < 0) throw Error(str("[embedding_at] negative dims N=", N, " C=", C));
  if (N == 0 || C == 0) return;
  dispatch_dtype(dt, "embedding_at", [&](auto tag) {
    using T = decltype(tag);
    T* o = static_cast<T*>(out);
    const T* e = static_cast<const T*>(wte);
    const T* p = static_cast<const T*>(wpe);
    const int grid = grid_for(static_cast<int64_t>(N) * 32, kThreads, ctx.num_sms());
    if (C % kVec<T> == 0 && aligned16(out) && aligned16(wte) &&
        (wpe == nullptr || aligned16(wpe))) {
      embedding_at_kernel<T, kVec<T>>
          <<<grid, kThreads, 0, ctx.stream()>>>(o, tokens, pos, e, p, N, C);
    } else {
      embedding_at_kernel<T, 1><<<grid, kThreads, 0, ctx.stream()>>>(o, tokens, pos, e, p, N, C);
    }
    FORGE_CUDA_CHECK_LAUNCH();
  });
}

void rope_at(Context& ctx, DType dt, void* x, const int32_t* pos, int N, int H, int HS,
             const Rope& rope, int64_t stride) {
  if (N < 0 || H < 0 || HS <= 0 || HS % 2 != 0 || HS / 2 > kRopeMaxHalf)
    throw Error(str("[rope_at] bad shape N=", N, " H=", H, " HS=", HS,
                    " (want an even HS <= ", 2 * kRopeMaxHalf, ")"));
  const int64_t rs = row_stride(stride, static_cast<int64_t>(H) * HS, "rope_at", "row");
  if (static_cast<int64_t>(N) * H * HS >= (int64_t{1} << 31))
    throw Error(
        str("[rope_at] N·H·HS = ", static_cast<int64_t>(N) * H * HS, " exceeds int32 indexing"));
  const RopeFreqs f = rope_freqs(rope, HS);  // exactly the CPU's inv_freq, then / π
  const int rows = N * H;
  if (rows == 0) return;
  const int half = HS / 2;
  dispatch_dtype(dt, "rope_at", [&](auto tag) {
    using T = decltype(tag);
    T* xt = static_cast<T*>(x);
    auto run = [&](auto kn) {
      constexpr int kN = decltype(kn)::value;
      const int grid = grid_for(static_cast<int64_t>(rows) * (half / kN), kThreads, ctx.num_sms());
      if (rope.style == RopeStyle::kRotateHalf)
        rope_at_kernel<T, kN, true>
            <<<grid, kThreads, 0, ctx.stream()>>>(xt, pos, f, rows, H, HS, rs);
      else
        rope_at_kernel<T, kN, false>
            <<<grid, kThreads, 0, ctx.stream()>>>(xt, pos, f, rows, H, HS, rs);
      FORGE_CUDA_CHECK_LAUNCH();
    };
    if (half % kVec<T> == 0 && aligned16(x) && (rs * sizeof(T)) % 16 == 0)
      run(std::integral_constant<int, kVec<T>>{});
    else
      run(std::integral_constant<int, 1>{});
  });
}

void kv_append(Context& ctx, DType dt, void* cache_k, void* cache_v, const void* k, const void* v,
               const int32_t* pos, const DecodeShape& s, int64_t k_stride, int64_t v_stride) {
  check_decode_shape(s, "kv_append");
  const int64_t width = static_cast<int64_t>(s.NKV) * s.HS;
  const int64_t ks = row_stride(k_stride, width, "kv_append", "k");
  const int64_t vs = row_stride(v_stride, width, "kv_append", "v");
  if (2 * s.S * width >= (int64_t{1} << 31))
    throw Error(str("[kv_append] 2·S·NKV·HS = ", 2 * s.S * width, " exceeds int32 indexing"));
  if (s.S == 0) return;
  const int64_t es = static_cast<int64_t>(dtype_size(dt));
  const bool vec = (width * es) % 16 == 0 && (ks * es) % 16 == 0 && (vs * es) % 16 == 0 &&
                   aligned16(cache_k) && aligned16(cache_v) && aligned16(k) && aligned16(v);
  auto run = [&](auto word) {
    using Word = decltype(word);
    const int64_t per = static_cast<int64_t>(sizeof(Word)) / es;  // elements per Word
    const int w = static_cast<int>(width / per);
    const int grid = grid_for(2 * s.S * static_cast<int64_t>(w), kThreads, ctx.num_sms());
    kv_append_kernel<Word><<<grid, kThreads, 0, ctx.stream()>>>(
        static_cast<Word*>(cache_k), static_cast<Word*>(cache_v), static_cast<const Word*>(k),
        static_cast<const Word*>(v), pos, s.S, s.cap, w, ks / per, vs / per);
    FORGE_CUDA_CHECK_LAUNCH();
  };
  if (vec) {
    run(int4{});
  } else {
    dispatch_dtype(dt, "kv_append", [&](auto tag) { run(tag); });
  }
}

bool decode_attention_supported(int HS) {
  return HS == 32 || HS == 64 || HS == 80 || HS == 96 || HS == 128;
}

int decode_attention_splits(const DecodeShape& s) {
  check_decode_shape(s, "decode_attention");
  const int64_t blocks = static_cast<int64_t>(s.S) * s.NKV * head_chunks(s.NH / s.NKV).chunks;
  if (blocks == 0) return 1;
  int64_t splits = (kTargetBlocks + blocks - 1) / blocks;
  splits = std::min<int64_t>({splits, std::max(1, s.cap / kMinSplitRows), kMaxSplits});
  return static_cast<int>(std::max<int64_t>(1, splits));
}

size_t decode_attention_scratch_bytes(const DecodeShape& s) {
  const int splits = decode_attention_splits(s);
  if (splits == 1) return 0;
  const size_t rows = static_cast<size_t>(s.S) * s.NH * splits;
  return rows * (2 + static_cast<size_t>(s.HS)) * sizeof(float);
}

void decode_attention(Context& ctx, DType dt, void* out, const void* q, const void* cache_k,
                      const void* cache_v, const int32_t* pos, const DecodeShape& s,
                      int64_t q_stride, void* scratch) {
  check_decode_shape(s, "decode_attention");
  if (!decode_attention_supported(s.HS))
    throw Error(str("[decode_attention] head size ", s.HS,
                    " is not supported (want 32, 64, 80, 96 or 128)"));
  const int64_t qs =
      row_stride(q_stride, static_cast<int64_t>(s.NH) * s.HS, "decode_attention", "q");
  const int splits = decode_attention_splits(s);
  FORGE_CHECK(aligned16(cache_k) && aligned16(cache_v),
              "[decode_attention] caches not 16-byte aligned");
  FORGE_CHECK(splits == 1 || scratch != nullptr, "[decode_attention] no scratch for ", splits,
              " splits");
  if (s.S == 0) return;
  const HeadChunks hc = head_chunks(s.NH / s.NKV);
  float* ml = static_cast<float*>(scratch);
  float* acc = ml != nullptr ? ml + static_cast<size_t>(s.S) * s.NH * splits * 2 : nullptr;
  dispatch_dtype(dt, "decode_attention", [&](auto tag) {
    using T = decltype(tag);
    const AttnArgs<T> a{static_cast<T*>(out),
                        static_cast<const T*>(q),
                        static_cast<const T*>(cache_k),
                        static_cast<const T*>(cache_v),
                        pos,
                        ml,
                        acc,
                        qs,
                        s.NH,
                        s.NKV,
                        s.cap,
                        s.NH / s.NKV,
                        hc.heads,
                        hc.chunks,
                        splits,
                        static_cast<float>(M_LOG2E / std::sqrt(static_cast<double>(s.HS)))};
    switch (s.HS) {
      case 32:
        launch_decode_attention<T, 32>(ctx, a, s.S);
        break;
      case 64:
        launch_decode_attention<T, 64>(ctx, a, s.S);
        break;
      case 80:
        launch_decode_attention<T, 80>(ctx, a, s.S);
        break;
      case 96:
        launch_decode_attention<T, 96>(ctx, a, s.S);
        break;
      default:
        launch_decode_attention<T, 128>(ctx, a, s.S);
        break;
    }
  });
}

void advance_positions(Context& ctx, int32_t* pos, int S, int32_t limit) {
  if (S <= 0) return;
  advance_positions_kernel<<<(S + 127) / 128, 128, 0, ctx.stream()>>>(pos, S, limit);
  FORGE_CUDA_CHECK_LAUNCH();
}

}  // namespace forge::cuda
