// CUDA decode attention over the KV cache (decode.h): decode_attention and the fused
// rope_decode_attention, the GPU twins of cpu::decode_attention and cpu::rope_kv_append +
// cpu::decode_attention (backend/cpu/decode.cpp). Positions are read from device memory and
// nothing synchronises or allocates, so a decode step is capturable in a CUDA graph. Launched
// with programmatic dependent launch (pdl.cuh): q may be written by the kernel before, so a
// block waits before reading it and lets the next kernel launch early. The one-pass kernel for
// short caches (decode_attention_rows.cu, picked by rows_kernel_takes) reads the position and the
// cache ahead of the wait in rope_decode_attention (decode.h states what that asks of the
// kernels before it; the reasoning is at the read).
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
#include "forge/backend/cuda/decode_attention.cuh"
#include "forge/backend/cuda/kernel_utils.cuh"
#include "forge/backend/cuda/pdl.cuh"
#include "forge/backend/cuda/rope.cuh"
#include "forge/core/error.h"

namespace forge::cuda {
namespace {

using namespace kernels;
using namespace decode_attn;

// ---- decode_attention -----------------------------------------------------------------------

constexpr int kAttnThreads = 128;
constexpr int kTile = 64;     // key rows per shared-memory tile
constexpr int kTargetBlocks = 4 * 132;
constexpr int kMinSplitRows = kTile;
constexpr int kMaxSplits = 64;

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
        launch_rows<T>(ctx, a, f, s.S);
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
