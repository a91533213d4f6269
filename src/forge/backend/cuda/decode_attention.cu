// CUDA decode attention over the KV cache (decode.h): decode_attention and the fused
// rope_decode_attention, the GPU twins of cpu::decode_attention and cpu::rope_kv_append +
// cpu::decode_attention (backend/cpu/decode.cpp). Positions are read from device memory and
// nothing synchronises or allocates, so a decode step is capturable in a CUDA graph. Launched
// with programmatic dependent launch (pdl.cuh): q may be written by the kernel before, so a
// block waits before reading it and lets the next kernel launch early. The one-pass kernel for
// short caches reads the position and the cache ahead of the wait in rope_decode_attention
// (decode.h states what that asks of the kernels before it; the reasoning is at the read).
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
//    running max, sum (log2 units) and unnormalised accumulator, f32, to scratch and counts
//    itself in (slot, kv head, chunk)'s arrival counter; the split that arrives last combines
//    them (it was a second kernel, one more graph node per layer):
//    out = Σ_z 2^(m_z − M)·acc_z / Σ_z 2^(m_z − M)·l_z with M = max_z m_z, skipping empty splits,
//    in split order whoever arrives last, and resets the counter for the next call.
//  - rope_decode_attention (a Llama decode step's RoPE + cache append + attention, one kernel):
//    the block rotates its query heads as it reads them (rope_kv_append's arithmetic: the pair
//    rotated in f32, rounded to T, so q equals the unfused path's bit for bit), and the split
//    whose rows hold the new position's row pos % cap takes that row's k (rotated) and v from
//    the projection instead of the cache, and writes them to the cache (chunk 0 of a kv head's
//    query-head chunks); no other block reads that row in this call.
//  - The split count depends on the shape only (decode_attention_splits), so the grid of a
//    captured graph is valid at every position: enough splits that S·NKV·chunks·splits reaches
//    kTargetBlocks = 4 blocks per SM of the H200's 132 SMs, at most one split per kMinSplitRows =
//    64 rows (one tile) of cap and at most kMaxSplits = 64. (It was two tiles: ncu of the batch-1
//    SmolLM2 step at cap 131 then showed one split, 3 blocks and 13.0 µs per layer, the largest
//    kernel of the step; one tile per split puts a short context on more blocks.) SmolLM2-135M (NKV 3), cap 8192: S = 1 → 64
//    splits, S = 8 → 22, S = 128 → 2; GPT-2 (NKV 12) at S = 128 → 1. On another GPU the rule is
//    the same (correct, tuned for the H200): decode_attention_scratch_bytes takes no context.
//  - Shared memory per block (dynamic): K and V tiles 2·64·(HS + pad)·sizeof(T), q and the
//    accumulator 2·heads·HS f32, the P·V partials 128·kVec f32, the scores heads·64 f32, the new
//    k and v rows 2·HS·sizeof(T): 25 KB
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
//
// ptxas (sm_90a, CUDA 13.0, -Xptxas=-v): registers, spill stores, stack frame per kernel:
//   decode_attention_kernel<bf16 or f16, HS>      43-46 regs, 0 spill, 0 stack (every HS)
//   decode_attention_kernel<float, 64..128>          47 regs, 0 spill, 0 stack
//   decode_attention_kernel<float, 32>               48 regs, 4 spill, 8 stack (one word)
//   (before the fused RoPE, new row and combine; not re-measured since)
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "forge/backend/cuda/context.h"
#include "forge/backend/cuda/decode.h"
#include "forge/backend/cuda/flash_mma.cuh"
#include "forge/backend/cuda/kernel_utils.cuh"
#include "forge/backend/cuda/pdl.cuh"
#include "forge/backend/cuda/rope.cuh"
#include "forge/core/error.h"

namespace forge::cuda {
namespace {

using namespace kernels;

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

HeadChunks head_chunks(int group, int max_heads = kMaxHeads) {
  const int chunks = (group + max_heads - 1) / max_heads;
  return {chunks, (group + chunks - 1) / chunks};
}

// Shared-memory layout of one block, in bytes from the start; the same on host and device.
struct AttnSmem {
  int k, v, q, acc, part, p, stat, knew, bytes;
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
  m.knew = m.stat + 4 * kMaxHeads * 4;
  m.bytes = m.knew + 2 * HS * static_cast<int>(sizeof(T));
  return m;
}

template <typename T>
struct AttnArgs {
  T* out;              // (S, NH, HS)
  const T* q;          // (S, q_stride), heads at h·HS
  T* cache_k;          // (S, cap, NKV, HS)
  T* cache_v;          // (S, cap, NKV, HS)
  const int32_t* pos;  // (S)
  float* part_ml;      // (S, NH, splits, 2) running max (log2 units) and sum per split
  float* part_acc;     // (S, NH, splits, HS) unnormalised output per split
  int* arrivals;       // (S, NKV·chunks) splits done, zero between calls
  // rope_decode_attention: the step's k and v rows (S, q_stride) at kv head h·HS (k before
  // RoPE), null for decode_attention (the cache already holds row pos % cap).
  const T* k_new;
  const T* v_new;
  bool rope;         // rotate q and k_new (freqs in the kernel's second parameter)
  bool rotate_half;  // pairs (i, i + HS/2); else (2i, 2i + 1)
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
// Channel d of head x (HS) rotated to the angle of pair p's (sn, cs), rounded to T: rope_kv_append's
// arithmetic (f32, the pair (x0, x1) → (x0·c − x1·s, x0·s + x1·c)).
template <typename T, int HS>
__device__ __forceinline__ T rope_channel(const T* x, int d, bool rotate_half,
                                          const RopeFreqs& f, double at) {
  constexpr int kHalf = HS / 2;
  const int p = rotate_half ? d % kHalf : d / 2;
  const int i0 = rotate_half ? p : 2 * p, i1 = rotate_half ? p + kHalf : 2 * p + 1;
  float sn, cs;
  rope_sincos(at, f.inv_freq_over_pi[p], &sn, &cs);
  const float x0 = to_f32(x[i0]), x1 = to_f32(x[i1]);
  return from_f32<T>(d == i0 ? x0 * cs - x1 * sn : x0 * sn + x1 * cs);
}

template <typename T, int HS>
__global__ void __launch_bounds__(kAttnThreads)
    decode_attention_kernel(const AttnArgs<T> a, const __grid_constant__ RopeFreqs f) {
  pdl_launch_dependents();
  pdl_wait();  // q, the positions and the cache are the step's own data
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
  int* last_s = reinterpret_cast<int*>(alpha_s + kMaxHeads);  // this block combines the splits
  T* knew_s = reinterpret_cast<T*>(smem + L.knew);          // (HS) the new row's k (rotated)
  T* vnew_s = knew_s + HS;                                  // (HS) and v

  // Visible rows [0, n) and this split's share [r0, r1).
  const int n = max(0, min(a.pos[slot] + 1, a.cap));
  const int len = ((n + a.splits - 1) / a.splits + kTile - 1) / kTile * kTile;
  const int r0 = z * len, r1 = min(n, r0 + len);

  const double at = static_cast<double>(a.pos[slot]);
  const T* qrow = a.q + slot * a.q_stride + static_cast<int64_t>(h0) * HS;
  for (int i = tid; i < G * HS; i += kAttnThreads) {
    const T qv = a.rope ? rope_channel<T, HS>(qrow + i / HS * HS, i % HS, a.rotate_half, f, at)
                        : qrow[i];
    q_s[i] = to_f32(qv) * a.scale_log2;
    acc_s[i] = 0.0f;
  }
  // The new position's row: taken from the projection by the split that holds it.
  const int rnew = a.pos[slot] % a.cap;
  const bool owner = a.k_new != nullptr && rnew >= r0 && rnew < r1;
  if (owner) {
    const int64_t off = slot * a.q_stride + static_cast<int64_t>(kvh) * HS;
    const int64_t crow = ((static_cast<int64_t>(slot) * a.cap + rnew) * a.NKV + kvh) * HS;
    for (int d = tid; d < HS; d += kAttnThreads) {
      const T kv = a.rope ? rope_channel<T, HS>(a.k_new + off, d, a.rotate_half, f, at)
                          : a.k_new[off + d];
      const T vv = a.v_new[off + d];
      knew_s[d] = kv;
      vnew_s[d] = vv;
      if (chunk == 0) {
        a.cache_k[crow + d] = kv;
        a.cache_v[crow + d] = vv;
      }
    }
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
      const bool fresh = owner && t0 + j == rnew;
      const int64_t g = base + (t0 + j) * row_elems + c * kE;
      *reinterpret_cast<int4*>(k_s + j * kRow + c * kE) =
          fresh ? *reinterpret_cast<const int4*>(knew_s + c * kE)
                : *reinterpret_cast<const int4*>(a.cache_k + g);
      *reinterpret_cast<int4*>(v_s + j * kRow + c * kE) =
          fresh ? *reinterpret_cast<const int4*>(vnew_s + c * kE)
                : *reinterpret_cast<const int4*>(a.cache_v + g);
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
      __syncwarp();  // every lane has read m_s[g] before lane 0 writes it (racecheck's hazard)
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
    // Count this split in; the last to arrive combines (the partials of the others are visible
    // to it: each writer fences before its block's count, the reader loads past L1).
    __threadfence();
    __syncthreads();
    int* arrivals = a.arrivals + static_cast<int64_t>(slot) * gridDim.y + blockIdx.y;
    if (tid == 0) *last_s = atomicAdd(arrivals, 1) == a.splits - 1;
    __syncthreads();
    if (!*last_s) return;
    __threadfence();
    const int64_t row_h0 = static_cast<int64_t>(slot) * a.NH + h0;  // query row of head h0
    for (int i = tid; i < G * HS; i += kAttnThreads) {
      const int64_t row = row_h0 + i / HS;
      const int d = i % HS;
      const float* ml = a.part_ml + row * a.splits * 2;
      const float* acc = a.part_acc + row * a.splits * HS;
      float M = -INFINITY;
      for (int z = 0; z < a.splits; ++z)
        if (__ldcg(ml + 2 * z + 1) > 0.0f) M = fmaxf(M, __ldcg(ml + 2 * z));
      float l = 0.0f, o = 0.0f;
      for (int z = 0; z < a.splits; ++z) {
        const float lz = __ldcg(ml + 2 * z + 1);
        if (lz > 0.0f) {  // an empty split (no rows) adds nothing
          const float w = exp2f(__ldcg(ml + 2 * z) - M);
          l += w * lz;
          o += w * __ldcg(acc + static_cast<int64_t>(z) * HS + d);
        }
      }
      a.out[row * HS + d] = from_f32<T>(l > 0.0f ? o / l : 0.0f);
    }
    if (tid == 0) *arrivals = 0;  // ready for the next call
  }
}

// ---- short caches: one block per (kv head chunk, slot), a warp per 32 rows ---------------------
//
// The split kernel above walks its rows as a chain of dependent steps (tile load, barrier,
// scores, barrier, softmax, barrier, P·V, barrier, then the partials through global memory and
// the last split's combine): 11–12 µs a layer at a 130–380-row cache (dev/decode_timeline.cpp,
// H200, batch 1), half of a SmolLM2 decode step's kernel time. This kernel is for caches of up
// to kRowsMaxCap rows and grids of at most one wave (rows_kernel_takes): warp w copies the
// cache rows 32·c … 32·c + 31 of chunk c = w, w + 16, … into its key and value tiles in shared
// memory (cp.async, whole 128-byte rows), and the first chunk's copies do not depend on the
// position: one HBM round trip for the block, before the PDL wait where it can be. Lane l
// scores row 32·c + l against q (broadcast from shared memory), the softmax and the P·V
// broadcasts are warp shuffles, and the 16 warps' (max, sum, accumulator) are combined in
// shared memory once. No scratch, no second pass. Each warp rotates its own copy of q (no
// block barrier before the rows), and the warp whose chunk holds the new row rotates its key,
// puts it in its tiles and appends it to the cache (docs/perf-notes.md has each step's figures).
// ptxas (sm_90a, CUDA 13.0): 70 registers with one head a block, 80 with four; 0 spill, 0 stack.
// Rows at or past n are loaded (inside the cache) but
// masked: their score is −inf and their value row is skipped, so stale or NaN contents cannot
// leak in.
// The code is kept small on purpose (rolled P·V loop): a kernel that runs for
// a few µs once per layer pays for every instruction-cache miss, and the first, fully unrolled
// version of this kernel (~4k instructions) took as long as the split kernel.
constexpr int kRowsWarps = 16;
// Caches up to 2,048 rows (the serving default: each slot a model context's rows, of which a
// request uses its length; the loop stops there). Up to 1,024 until 2026-12-04, when `forge
// serve`'s 2,048-row slots still ran the split kernel (README, serving).
constexpr int kRowsMaxCap = 2048;
constexpr int kRowsHS = 64;
constexpr int kRowsMaxHeads = 4;  // query heads per block: keeps a lane's registers under 128
// At most one wave of blocks (the H200's 132 SMs, one 512-thread block each with ~100 KB of
// shared memory): more slots than that run the split kernel, whose 128-thread blocks pack better
// (batch 128: 2,141 µs a step with this kernel, 1,657 with the split kernel).
constexpr int kRowsMaxBlocks = 132;

// Dynamic shared memory of decode_attention_rows_kernel<T, kH> (kH query heads per block), bytes.
template <int kH>
struct RowsSmem {
  static constexpr int kK = 0;                                        // (16, 32, 8) 16 B, swizzled
  static constexpr int kV = kK + kRowsWarps * 32 * kRowsHS * 2;       // (16, 32, HS) T
  static constexpr int kQ = kV + kRowsWarps * 32 * kRowsHS * 2;       // (16, kH, HS) f32
  static constexpr int kAcc = kQ + kRowsWarps * kH * kRowsHS * 4;     // (16, kH, HS) f32
  static constexpr int kStat = kAcc + kRowsWarps * kH * kRowsHS * 4;  // (2, 16, kH) f32
  static constexpr int kWt = kStat + 2 * kRowsWarps * kH * 4;         // (kH, 16) f32
  static constexpr int kBytes = kWt + kH * kRowsWarps * 4;
};

template <typename T, int kH>
__global__ void __launch_bounds__(32 * kRowsWarps)
    decode_attention_rows_kernel(const AttnArgs<T> a, const __grid_constant__ RopeFreqs f) {
  pdl_launch_dependents();
  constexpr int HS = kRowsHS, kKV = HS * static_cast<int>(sizeof(T)) / 16;  // 16 B chunks a row
  static_assert(sizeof(T) == 2 && kKV == 8, "16-bit storage, HS 64: a row is 8 chunks of 16 B");
  const int slot = blockIdx.y, lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int kvh = blockIdx.x / a.chunks, chunk = blockIdx.x - kvh * a.chunks;
  const int h0 = kvh * a.group + chunk * a.chunk_heads;               // first query head
  const int G = min(a.chunk_heads, a.group - chunk * a.chunk_heads);  // its query heads
  extern __shared__ __align__(16) unsigned char smem[];
  using L = RowsSmem<kH>;
  int4* k_t = reinterpret_cast<int4*>(smem + L::kK) + warp * 32 * kKV;  // (32, 8) this warp's
  T* v_s = reinterpret_cast<T*>(smem + L::kV) + warp * 32 * HS;         // (32, HS) this warp's
  float* q_s = reinterpret_cast<float*>(smem + L::kQ) + warp * kH * HS;  // (G, HS) this warp's
  float* acc_w = reinterpret_cast<float*>(smem + L::kAcc);  // (16, kH, HS)
  float* m_w = reinterpret_cast<float*>(smem + L::kStat);   // (16, kH)
  float* l_w = m_w + kRowsWarps * kH;                       // (16, kH)
  float* wt_s = reinterpret_cast<float*>(smem + L::kWt);    // (kH, 16) the combine's weights

  const int64_t row_elems = static_cast<int64_t>(a.NKV) * HS;  // between cache rows
  const int64_t base = (static_cast<int64_t>(slot) * a.cap * a.NKV + kvh) * HS;
  // Rows 32·c … 32·c + 31 (those inside the cache, whatever the position; zeros past it) into the
  // warp's tiles with cp.async: instruction i has lane l copy chunk l % 8 of row 4·i + l / 8, so
  // each moves 4 whole 128-byte rows. (Each lane loading its own row into registers — 32 rows a
  // warp instruction — made every instruction touch 32 lines: ~8k L1 wavefronts a block, ~4 µs
  // of a ~8 µs kernel by clock64 probes, H200.) The key tile's chunk e of row r sits at
  // 8·r + (e ^ (r & 7)), so lane r reading chunk e of its own row is conflict-free; the value
  // tile is plain rows (the P·V loop reads one row across the lanes). A later chunk's keys are
  // copied as soon as the scores are done with the key tile, its values after P·V.
  auto copy_chunk = [&](int c, bool keys, bool values) {
#pragma unroll
    for (int i = 0; i < 32 / 4; ++i) {
      const int r = 4 * i + lane / 8, e = lane % 8, j = c * 32 + r;
      const bool in = j < a.cap;
      const int64_t off = base + static_cast<int64_t>(in ? j : 0) * row_elems + e * 8;
      if (keys)
        flash::cp_async16(flash::smem_addr(k_t + kKV * r + (e ^ (r & 7))), a.cache_k + off, in ? 16 : 0);
      if (values) flash::cp_async16(flash::smem_addr(v_s + r * HS + e * 8), a.cache_v + off, in ? 16 : 0);
    }
    flash::cp_async_commit();
  };
  // rope_decode_attention (k_new set) reads what does not come from the kernel before it ahead
  // of the PDL wait (one query head a block, below), so those loads overlap that kernel (the
  // q|k|v product): the position, its sin/cos, and the block's first cache rows. In that call
  // the only row of this layer's cache the step writes is row pos % cap, written by this kernel
  // and replaced in the tiles by k_new/v_new below, never read from the cache; the positions
  // change only in the step's last kernel (advance_positions, no PDL) or by a copy from the
  // host. Everything an earlier step wrote is complete: a copy (the ids to the host, a prompt's
  // positions) sits between two steps, which PDL does not reach across, and within eager steps
  // a kernel starts early only once every block of the one before it is resident, so the ~150
  // kernels between this kernel and its previous step's call would have to be resident
  // together. decode_attention (GPT-2: the row was appended by the kernel before) reads
  // everything after the wait.
  // Every warp rotates its own copy of the block's query heads, and no block barrier comes
  // before the rows: lane l takes pair l of each head (HS = 64: 32 pairs, one sin/cos per lane
  // for all heads and the new key), so a warp waits only for its own loads and arithmetic.
  // (It was one shared copy, written by the first G·HS threads — two warps that also rotated
  // the new key — and a __syncthreads every warp waited at: ncu's stall samples put the
  // kernel's largest share at that barrier, behind pos → angle → sin/cos → q.)
  // rope_kv_append's arithmetic: the pair in f32, rounded to T, so q is the unfused path's.
  // Only with one query head a block (S·NH <= 132: batch 1 +15%, batch 8 +12%, H200): with
  // four (batch 32) the early reads measured 2% slower in two GPU runs.
  const bool fresh = a.k_new != nullptr, early = fresh && kH == 1;
  const int i0 = a.rotate_half ? lane : 2 * lane, i1 = a.rotate_half ? lane + HS / 2 : 2 * lane + 1;
  int pos = 0;
  float sn = 0.0f, cs = 1.0f;
  auto prologue = [&] {  // the position, the first rows (in flight together), sin/cos
    pos = a.pos[slot];
    copy_chunk(warp, true, true);
    if (a.rope) rope_sincos(static_cast<double>(pos), f.inv_freq_over_pi[lane], &sn, &cs);
  };
  if (early) prologue();
  pdl_wait();  // q (and otherwise the cache and positions) are the step's own data
  if (!early) prologue();
  const int n = max(0, min(pos + 1, a.cap)), rnew = pos % a.cap;
  auto rotated = [&](const T* head, float* y0, float* y1) {  // channels i0, i1 of one head
    const T x0 = head[i0], x1 = head[i1];
    if (a.rope) {
      const float f0 = to_f32(x0), f1 = to_f32(x1);
      *y0 = to_f32(from_f32<T>(f0 * cs - f1 * sn));
      *y1 = to_f32(from_f32<T>(f0 * sn + f1 * cs));
    } else {
      *y0 = to_f32(x0), *y1 = to_f32(x1);
    }
  };
  const T* qrow = a.q + slot * a.q_stride + static_cast<int64_t>(h0) * HS;
#pragma unroll
  for (int g = 0; g < kH; ++g) {
    if (g >= G) break;
    float y0, y1;
    rotated(qrow + g * HS, &y0, &y1);
    q_s[g * HS + i0] = y0 * a.scale_log2;
    q_s[g * HS + i1] = y1 * a.scale_log2;
  }
  // rope_decode_attention: row rnew comes from qkv, taken by the warp whose chunk holds it (it
  // replaces the row in its tiles below); chunk 0 of the kv head writes it to the cache (the
  // other chunks replace the row, never read it).
  const bool owner = fresh && warp == (rnew / 32) % kRowsWarps;
  T k0{}, k1{}, v0{}, v1{};
  if (owner) {
    const int64_t off = slot * a.q_stride + static_cast<int64_t>(kvh) * HS;
    float y0, y1;
    rotated(a.k_new + off, &y0, &y1);
    k0 = from_f32<T>(y0), k1 = from_f32<T>(y1);  // exact: y0, y1 are T values
    v0 = a.v_new[off + lane], v1 = a.v_new[off + lane + HS / 2];
    if (chunk == 0) {
      const int64_t crow = base + static_cast<int64_t>(rnew) * row_elems;
      a.cache_k[crow + i0] = k0, a.cache_k[crow + i1] = k1;
      a.cache_v[crow + lane] = v0, a.cache_v[crow + lane + HS / 2] = v1;
    }
  }
  __syncwarp();

  float m_run[kH], l_run[kH], acc[kH][2];
#pragma unroll
  for (int g = 0; g < kH; ++g)
    m_run[g] = -INFINITY, l_run[g] = 0.0f, acc[g][0] = acc[g][1] = 0.0f;
  for (int c = warp; c * 32 < n; c += kRowsWarps) {
    flash::cp_async_wait<0>();
    __syncwarp();  // every lane's copies of the chunk are in
    if (owner && c == rnew / 32) {  // the new row replaces the cache's (warp-uniform)
      const int r = rnew % 32;
      T* kr = reinterpret_cast<T*>(k_t + kKV * r);
      kr[8 * ((i0 / 8) ^ (r & 7)) + i0 % 8] = k0;
      kr[8 * ((i1 / 8) ^ (r & 7)) + i1 % 8] = k1;
      v_s[r * HS + lane] = v0, v_s[r * HS + lane + HS / 2] = v1;
      __syncwarp();
    }
    const int j = c * 32 + lane;
    const bool more = c + kRowsWarps < (n + 31) / 32;  // this warp has another chunk
    float p[kH] = {};  // scores, then probabilities
#pragma unroll
    for (int e = 0; e < kKV; ++e) {  // 8 channels at a time
      float kf[8];
      unpack16(k_t[kKV * lane + (e ^ (lane & 7))], kf, T{});
#pragma unroll
      for (int g = 0; g < kH; ++g) {
        const float4 qa = *reinterpret_cast<const float4*>(q_s + g * HS + 8 * e);
        const float4 qb = *reinterpret_cast<const float4*>(q_s + g * HS + 8 * e + 4);
        p[g] += kf[0] * qa.x + kf[1] * qa.y + kf[2] * qa.z + kf[3] * qa.w + kf[4] * qb.x +
                kf[5] * qb.y + kf[6] * qb.z + kf[7] * qb.w;
      }
    }
    if (more) {  // the key tile is free
      __syncwarp();
      copy_chunk(c + kRowsWarps, true, false);
    }
#pragma unroll
    for (int g = 0; g < kH; ++g) {
      const float s = j < n && g < G ? p[g] : -INFINITY;
      const float m_new = fmaxf(m_run[g], warp_max(s));  // −inf only for heads g ≥ G
      p[g] = m_new == -INFINITY ? 0.0f : exp2f(s - m_new);
      const float alpha = m_new == -INFINITY ? 1.0f : exp2f(m_run[g] - m_new);  // 0 first time
      l_run[g] = l_run[g] * alpha + warp_sum(p[g]);
      acc[g][0] *= alpha;
      acc[g][1] *= alpha;
      m_run[g] = m_new;
    }
    const int rows = min(32, n - c * 32);
#pragma unroll 2
    for (int r = 0; r < rows; ++r) {
      float v[2];
      unpack_pair(*reinterpret_cast<const uint32_t*>(v_s + r * HS + 2 * lane), v, T{});
#pragma unroll
      for (int g = 0; g < kH; ++g) {
        const float pr = __shfl_sync(0xffffffffu, p[g], r);
        acc[g][0] += pr * v[0];
        acc[g][1] += pr * v[1];
      }
    }
    __syncwarp();  // the value tile is rewritten by the next chunk
    if (more) copy_chunk(c + kRowsWarps, false, true);
  }
#pragma unroll
  for (int g = 0; g < kH; ++g) {
    if (lane == 0) m_w[warp * kH + g] = m_run[g], l_w[warp * kH + g] = l_run[g];
    acc_w[(warp * kH + g) * HS + 2 * lane] = acc[g][0];
    acc_w[(warp * kH + g) * HS + 2 * lane + 1] = acc[g][1];
  }
  __syncthreads();
  // out = Σ_w 2^(m_w − M)·acc_w / Σ_w 2^(m_w − M)·l_w over the warps that saw rows: warp g turns
  // head g's 16 (max, sum) pairs into the weights 2^(m_w − M) / Σ, then every output channel is
  // 16 independent products (a serial walk over the warps here was ~2k cycles of shared-memory
  // latency per thread, measured with ncu).
  if (warp < G) {
    const int g = warp;
    const float lw = lane < kRowsWarps ? l_w[lane * kH + g] : 0.0f;
    const float mw = lw > 0.0f ? m_w[lane * kH + g] : -INFINITY;
    const float M = warp_max(mw);
    const float wt = lw > 0.0f ? exp2f(mw - M) : 0.0f;
    const float l = warp_sum(wt * lw);
    if (lane < kRowsWarps) wt_s[g * kRowsWarps + lane] = l > 0.0f ? wt / l : 0.0f;
  }
  __syncthreads();
  T* orow = a.out + (static_cast<int64_t>(slot) * a.NH + h0) * HS;
  for (int i = threadIdx.x; i < G * HS; i += blockDim.x) {
    const int g = i / HS, d = i % HS;
    float o = 0.0f;
#pragma unroll
    for (int w = 0; w < kRowsWarps; ++w) o += wt_s[g * kRowsWarps + w] * acc_w[(w * kH + g) * HS + d];
    orow[i] = from_f32<T>(o);
  }
}

template <typename T, int HS>
void launch_decode_attention(Context& ctx, const AttnArgs<T>& a, const RopeFreqs& f, int S) {
  const AttnSmem L = attn_smem<T, HS>(a.chunk_heads);
  auto kernel = decode_attention_kernel<T, HS>;
  if (L.bytes > 48 * 1024)
    FORGE_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, L.bytes));
  const dim3 grid(a.splits, a.NKV * a.chunks, S);
  launch_pdl(ctx, kernel, grid, dim3(kAttnThreads), L.bytes, a, f);
}

}  // namespace

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
  const size_t counters = static_cast<size_t>(s.S) * s.NKV * head_chunks(s.NH / s.NKV).chunks;
  return rows * (2 + static_cast<size_t>(s.HS)) * sizeof(float) + counters * sizeof(int);
}

namespace {

// Whether decode_attention_rows_kernel takes a call (a function of the shape, so a captured
// graph keeps its kernel at every position).
bool rows_kernel_takes(DType dt, const DecodeShape& s) {
  const int64_t blocks = static_cast<int64_t>(s.S) * s.NKV * head_chunks(s.NH / s.NKV, kRowsMaxHeads).chunks;
  return (dt == DType::kBF16 || dt == DType::kF16) && s.HS == kRowsHS && s.cap <= kRowsMaxCap &&
         blocks <= kRowsMaxBlocks;
}

// decode_attention (k_new = v_new = null, rope null) and rope_decode_attention.
void run_decode_attention(Context& ctx, DType dt, void* out, const void* q, const void* k_new,
                          const void* v_new, void* cache_k, void* cache_v, const int32_t* pos,
                          const DecodeShape& s, int64_t qs, const Rope* rope, void* scratch,
                          const char* op) {
  const int splits = decode_attention_splits(s);
  FORGE_CHECK(aligned16(cache_k) && aligned16(cache_v), "[", op, "] caches not 16-byte aligned");
  FORGE_CHECK(splits == 1 || scratch != nullptr, "[", op, "] no scratch for ", splits, " splits");
  if (s.S == 0) return;
  const HeadChunks hc = head_chunks(s.NH / s.NKV);
  const size_t rows = static_cast<size_t>(s.S) * s.NH * splits;
  float* ml = static_cast<float*>(scratch);
  float* acc = ml != nullptr ? ml + rows * 2 : nullptr;
  int* arrivals = acc != nullptr ? reinterpret_cast<int*>(acc + rows * s.HS) : nullptr;
  RopeFreqs f{};
  if (rope != nullptr) {
    FORGE_CHECK(s.HS / 2 <= kRopeMaxHalf, "[", op, "] HS ", s.HS, " above ", 2 * kRopeMaxHalf);
    f = rope_freqs(*rope, s.HS);  // exactly the CPU's inv_freq, then / π
  }
  dispatch_dtype(dt, op, [&](auto tag) {
    using T = decltype(tag);
    AttnArgs<T> a{};
    a.out = static_cast<T*>(out);
    a.q = static_cast<const T*>(q);
    a.cache_k = static_cast<T*>(cache_k);
    a.cache_v = static_cast<T*>(cache_v);
    a.pos = pos;
    a.part_ml = ml;
    a.part_acc = acc;
    a.arrivals = arrivals;
    a.k_new = static_cast<const T*>(k_new);
    a.v_new = static_cast<const T*>(v_new);
    a.rope = rope != nullptr;
    a.rotate_half = rope != nullptr && rope->style == RopeStyle::kRotateHalf;
    a.q_stride = qs;
    a.NH = s.NH;
    a.NKV = s.NKV;
    a.cap = s.cap;
    a.group = s.NH / s.NKV;
    a.chunk_heads = hc.heads;
    a.chunks = hc.chunks;
    a.splits = splits;
    a.scale_log2 = static_cast<float>(M_LOG2E / std::sqrt(static_cast<double>(s.HS)));
    if (rows_kernel_takes(dt, s)) {
      if constexpr (sizeof(T) == 2) {
        // One query head per block while that fits in one wave (batch 1: 9 blocks for SmolLM2
        // rather than 3): a warp's chunk then costs one head's dot products and P·V, not four
        // (the four-head kernel is a chain of ~770 instructions per warp at ~19 cycles each, ncu).
        auto go = [&](auto heads) {
          constexpr int kH = decltype(heads)::value;
          const HeadChunks rc = head_chunks(a.group, kH);
          a.chunk_heads = rc.heads;
          a.chunks = rc.chunks;
          auto kernel = decode_attention_rows_kernel<T, kH>;
          FORGE_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                RowsSmem<kH>::kBytes));
          launch_pdl(ctx, kernel, dim3(s.NKV * rc.chunks, s.S), dim3(32 * kRowsWarps),
                     RowsSmem<kH>::kBytes, a, f);
        };
        if (static_cast<int64_t>(s.S) * s.NH <= kRowsMaxBlocks)
          go(std::integral_constant<int, 1>{});
        else
          go(std::integral_constant<int, kRowsMaxHeads>{});
        return;
      }
    }
    switch (s.HS) {
      case 32:
        launch_decode_attention<T, 32>(ctx, a, f, s.S);
        break;
      case 64:
        launch_decode_attention<T, 64>(ctx, a, f, s.S);
        break;
      case 80:
        launch_decode_attention<T, 80>(ctx, a, f, s.S);
        break;
      case 96:
        launch_decode_attention<T, 96>(ctx, a, f, s.S);
        break;
      default:
        launch_decode_attention<T, 128>(ctx, a, f, s.S);
        break;
    }
  });
}

void check_head_size(const DecodeShape& s, const char* op) {
  if (!decode_attention_supported(s.HS))
    throw Error(str("[", op, "] head size ", s.HS, " is not supported (want 32, 64, 80, 96 or 128)"));
}

}  // namespace

void decode_attention(Context& ctx, DType dt, void* out, const void* q, const void* cache_k,
                      const void* cache_v, const int32_t* pos, const DecodeShape& s,
                      int64_t q_stride, void* scratch) {
  check_decode_shape(s, "decode_attention");
  check_head_size(s, "decode_attention");
  const int64_t qs =
      decode_row_stride(q_stride, static_cast<int64_t>(s.NH) * s.HS, "decode_attention", "q");
  // The kernel writes the caches only for rope_decode_attention (k_new non-null).
  run_decode_attention(ctx, dt, out, q, nullptr, nullptr, const_cast<void*>(cache_k),
                       const_cast<void*>(cache_v), pos, s, qs, nullptr, scratch,
                       "decode_attention");
}

void rope_decode_attention(Context& ctx, DType dt, void* out, void* qkv, int64_t stride,
                           void* cache_k, void* cache_v, const int32_t* pos, const DecodeShape& s,
                           const Rope* rope, void* scratch) {
  check_decode_shape(s, "rope_decode_attention");
  const int64_t width = static_cast<int64_t>(s.NH + 2 * s.NKV) * s.HS;
  FORGE_CHECK(stride >= width, "[rope_decode_attention] row stride ", stride, " < ", width);
  FORGE_CHECK(rope == nullptr || s.HS % 2 == 0, "[rope_decode_attention] odd head size ", s.HS);
  if (!decode_attention_supported(s.HS)) {  // the three ops (decode_generic.cu's attention)
    const int64_t es = static_cast<int64_t>(dtype_size(dt));
    uint8_t* base = static_cast<uint8_t*>(qkv);
    void* k = base + static_cast<int64_t>(s.NH) * s.HS * es;
    void* v = base + static_cast<int64_t>(s.NH + s.NKV) * s.HS * es;
    if (rope != nullptr)
      rope_kv_append(ctx, dt, qkv, stride, cache_k, cache_v, pos, s, *rope);
    else
      kv_append(ctx, dt, cache_k, cache_v, k, v, pos, s, stride, stride);
    decode_attention_generic(ctx, dt, out, qkv, cache_k, cache_v, pos, s, stride);
    return;
  }
  const int64_t es = static_cast<int64_t>(dtype_size(dt));
  const uint8_t* base = static_cast<const uint8_t*>(qkv);
  run_decode_attention(ctx, dt, out, qkv, base + static_cast<int64_t>(s.NH) * s.HS * es,
                       base + static_cast<int64_t>(s.NH + s.NKV) * s.HS * es, cache_k, cache_v,
                       pos, s, stride, rope, scratch, "rope_decode_attention");
}

}  // namespace forge::cuda
