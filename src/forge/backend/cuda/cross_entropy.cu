// CUDA LM head + cross-entropy (contract in ops.h). The full f32 logits x·wᵀ of a real vocabulary
// (50k columns × 65k tokens = 13 GB) are never stored; each dtype has its own way around them.
//
// ---- bf16: chunks of rows (tokens), logits stored in bf16 -------------------------------------
// The tokens are cut into chunks of Nc rows; per chunk, four launches:
//  1. logits (Nc, Vp) = x[rows]·wᵀ, one cuBLASLt GEMM over the whole padded vocabulary with bf16
//     output (f32 accumulation), into a scratch of row stride ld = Vp rounded up to 64 (128-byte
//     rows, so 16-byte vector access throughout);
//  2. ce_rows_kernel, one block of 1024 threads per row: (max, Σexp) over the first V columns in
//     f32, loss = log Σ + max − logit[target]; with a gradient requested it then overwrites the
//     row IN PLACE with dlogits = dloss·(softmax − onehot) in bf16: exactly 0 on ignored rows
//     and in the padded columns [V, ld);
//  3. dx[rows] (Nc, C) += dlogits·w, bf16 output with beta = 1: cuBLASLt forms dx + Σ in f32 and
//     rounds once. Every dx row lies in exactly one chunk and K spans the whole vocabulary, so
//     each dx element is rounded once per call, as the f32 sum-then-add did before;
//  4. dw (Vp, C) += dlogitsᵀ·x[rows] in f32 (beta = 1), chunks in order.
// Each logit is computed once (the vocabulary-chunked bf16 backward this replaces recomputed every
// chunk's GEMM), and dx/dw are two long-K GEMMs per chunk instead of 2·⌈V/1024⌉ short ones that
// each read and wrote an (N, C) f32 accumulator.
//
// The GEMMs run over Vp columns, not V: with 50,257 as an extent cuBLASLt leaves its sm90 kernels
// for sm75/sm80 CUTLASS ones (H200, one 9,472-row chunk of GPT-2: logits 7.7 ms instead of 1.02,
// dx 5.7 instead of 0.98, dw 1.47 instead of 0.94). The padded rows of w only ever meet the exact
// zeros of dlogits' padded columns (they must be finite: 0·inf is NaN), so dx gains exact zeros
// and dw's padded rows receive += 0.
//
// The row kernel reads each logit from memory once: a row of up to 65,536 columns is held in
// registers (8 packs of 8 bf16 per thread, 32 registers) between the statistics and the write
// pass, so HBM sees one read and (backward) one write per logit. Longer rows go in segments of
// 65,536 columns; the write pass re-reads all but the last one. Measured (ncu, H200, GPT-2
// chunk of 9,472 × 50,304): 0.56 ms, 953 MB read + 923 MB written = 3.3 TB/s; the two-pass
// variant that re-reads the row (256 or 512 threads per row) takes 0.68–0.70 ms and reads
// 1.85–1.9 GB: the second pass mostly misses L2.
//
// Row chunk: Nc = N when the (N, ld) bf16 scratch fits in 1 GiB; otherwise the rows are split
// into the fewest equal chunks (multiples of 128 rows) that fit. GPT-2 124M (N = 65,536,
// ld = 50,304): 7 chunks of 9,472 rows (the last 8,704), a 953 MB scratch and nothing else
// (the vocabulary-chunked bf16 path used 256 MiB f32 logits + 128 MiB bf16 dlogits + an (N, C)
// f32 dx sum of 201 MB). Per GPT-2 step: 3.9 ms of row kernels + 20.3 ms of GEMMs, where the
// old path spent 18.9 ms in its two row kernels alone (and ~28 ms of GEMMs, one set recomputed);
// `forge bench train --preset gpt2-124m` went from 155.1 to 130.2 ms per step.
//
// Numerics: each logit is rounded to bf16 (relative error ≤ 2^-8) before the softmax, as llm.c
// does. A token's loss moves by at most 2^-8·(|l_target| + Σ p·|l|); the errors have random signs,
// so the mean over a batch moves far less. The statistics, exp and loss are f32; dlogits are
// rounded to bf16 once, as GEMM operands must be anyway.
// FP8 (FORGE_FP8's recipes, bf16 only; ops.h's LmHeadFp8): the logits and dx products run on
// FP8 tensor cores with per-row scales — x's E4M3 rows (the final norm writes them) times w's
// E4M3 rows for the logits (fast accumulation, K = C, as the blocks' products), and the chunk's
// FP8 dlogits times wᵀ's E4M3 rows for dx (full f32 accumulation: K = Vp is ~50k long). The row
// kernel writes the FP8 dlogits beside the bf16 ones (ce_rows_kernel says how it knows the scale
// before the first byte), one more byte an element instead of a separate cast pass (2 bytes read,
// 1 written); w is cast both ways once a call. dw stays bf16: its operand would be dlogitsᵀ.
// f16 (fp16 training) runs this same path on __half (ce_rows_kernel<T>): 11-bit logits, the
// same chunking; dloss arrives multiplied by the loss scale, so dlogits stay clear of f16's
// subnormals.
//
// ---- f32 (the parity reference): chunks of vocabulary columns, f32 logits ---------------------
// The vocabulary is cut into chunks of Vc columns and only one chunk's logits (N, Vc) exist at a
// time, in an f32 scratch. Forward, per chunk c: logits_c = x·w[c]ᵀ (cuBLASLt, f32) and one
// block per row folds the chunk into a running (max, Σexp) in f32 — the online softmax of the
// flash-attention papers — and picks up the target's logit when the target falls in the chunk.
// The last chunk's launch writes loss = log Σ + max − logit[target]. Padded columns [V, Vp) are
// outside every chunk: never computed, never in the softmax, and their dw rows receive nothing.
// Backward (dx or dw given), a second sweep in reverse chunk order: the last chunk's logits are
// still in the scratch, so that sweep skips one GEMM; every other chunk is recomputed (same
// algorithm, same bits). A kernel turns the chunk into dlogits = dloss·(exp(l − max)/Σ − onehot)
// in place, then dx += dlogits·w[c] and dw[c] += dlogitsᵀ·x (beta = 1).
// Chunk width: Vc = 8192 while the (N, Vc) f32 scratch stays under 256 MiB (N ≤ 8192 tokens),
// narrower for larger N, never below 1024 (the GEMMs are then still ≥ N×1024×C), and never wider
// than the vocabulary rounded up to 256. Multiples of 256 keep every scratch row 1 KiB-aligned,
// so the row kernels use 16-byte f32 loads throughout.
//
// ---- both -----------------------------------------------------------------------------------
// Targets: negative = ignored (loss 0, no gradient), as the CPU's −1. A target ≥ V is a caller
// bug that is not checked on the device (it would need a host sync); its loss is undefined.
// dloss is read on the device: no host sync. Determinism: fixed-order block reductions, no
// atomics, deterministic cuBLASLt algorithms, chunks accumulated in a fixed order.
//
// ptxas (sm_90a, CUDA 13.0, -O3), registers / spill bytes, all with 0 stack frame:
//   ce_rows_kernel                  63 / 0  (384 B shared; 1024 threads, so ≤ 64 registers)
//   ce_chunk_stats_kernel           32 / 0  (64 B shared)
//   ce_chunk_grad_kernel            24 / 0
#include <cuda_bf16.h>

#include <algorithm>
#include <cfloat>
#include <cstdint>
#include <optional>
#include <type_traits>

#include "forge/backend/cuda/check.h"
#include "forge/backend/cuda/context.h"
#include "forge/backend/cuda/cross_entropy.h"
#include "forge/backend/cuda/fp8_row.cuh"
#include "forge/backend/cuda/gemm.h"
#include "forge/backend/cuda/kernel_utils.cuh"
#include "forge/backend/cuda/ops.h"
#include "forge/core/error.h"

namespace forge::cuda {
namespace {

using bf16 = __nv_bfloat16;

// ---- bf16: row chunks -----------------------------------------------------------------------

constexpr int kRowThreads = 1024;                     // one block per row
constexpr int kRowWarps = kRowThreads / 32;           // 32: one final warp merges them all
constexpr int kRowPacks = 8;                          // 16-byte packs per thread per segment
constexpr int kSegPacks = kRowThreads * kRowPacks;    // 8192 packs = 65,536 columns
constexpr size_t kRowScratchBytes = size_t{1} << 30;  // bound on the (Nc, ld) bf16 logits
constexpr int kRowGranule = 128;                      // Nc is a multiple (GEMM tile rows)
constexpr float kLog2e = 1.4426950408889634f;

struct RowArgs {
  void* logits;            // (rows, ld) of T: logits in, dlogits out when dloss is given
  float* losses;           // (rows)
  const int32_t* targets;  // (rows)
  const float* dloss;      // one f32, or null for the forward only
  int V, ld;               // real columns; row stride (a multiple of 8)
  // With dloss: the dlogits' FP8 rows too (T = bf16 only), (rows, ld) bytes and (rows) descales,
  // E4M3 or (e5m2) E5M2; null: none.
  uint8_t* d8 = nullptr;
  float* d_descale = nullptr;
  bool e5m2 = false;
};

// 2^x on the SFU, subnormal results flushed to 0: the softmax sums terms ≤ 1 of which one is
// exactly 1, so a term below 2^-126 changes nothing, and the non-flushing exp2f costs three
// more instructions per element.
__device__ __forceinline__ float exp2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// Merges (m2, s2) into (m, s), pairs of (max, Σ 2^((x − max)·log2e)); finite throughout (empty =
// (−FLT_MAX, 0)) and commutative bit for bit, so both lanes of a butterfly get the same result.
__device__ __forceinline__ void merge_max_sum2(float& m, float& s, float m2, float s2) {
  const float mn = fmaxf(m, m2);
  s = s * exp2_ftz((m - mn) * kLog2e) + s2 * exp2_ftz((m2 - mn) * kLog2e);
  m = mn;
}

// Eight f32 → eight bf16 (round to nearest even) in one 16-byte pack, two per cvt instruction.
__device__ __forceinline__ int4 pack8_bf16(const float (&v)[8]) {
  int4 r;
  int* w = reinterpret_cast<int*>(&r);
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(v[2 * k], v[2 * k + 1]);
    w[k] = *reinterpret_cast<const int*>(&h);
  }
  return r;
}

// v rounded to bf16 (as pack8_bf16 rounds it), back in f32.
__device__ __forceinline__ float bf16_rounded(float v) {
  return __bfloat162float(__float2bfloat16_rn(v));
}

// The FP8 bytes of a pack of eight bf16 (cast_fp8_rows's products) at y (8 bytes).
__device__ __forceinline__ void store_fp8_pack(uint8_t* y, const int4& pack, float s, bool e5m2) {
  float v[8];
  kernels::unpack16(pack, v, bf16{});
  *reinterpret_cast<uint2*>(y) =
      e5m2 ? kernels::fp8_pack8<false>(v, s) : kernels::fp8_pack8<true>(v, s);
}

// Loads segment `seg` of a row into the thread's packs (pack i of the row is row16[i]).
__device__ __forceinline__ void load_segment(int4 (&pack)[kRowPacks], const int4* row16, int seg,
                                             int packs) {
#pragma unroll
  for (int p = 0; p < kRowPacks; ++p) {
    const int i = seg * kSegPacks + p * kRowThreads + static_cast<int>(threadIdx.x);
    if (i < packs) pack[p] = row16[i];
  }
}

// One block per row n of the chunk. Pass 1 folds the row into a per-thread (max, Σexp), merged
// over the block in a fixed order; pass 2 (when dloss is given) writes dlogits over the row.
// Thread 0 reads the target's logit before the block's barrier, hence before any write. Only
// the pack holding column V − 1 (and packs beyond it) pays for the column mask, and only the
// pack holding the target for the onehot.
// T: bf16, or f16 (fp16 training; f16 logits keep 11 bits, and |logit| < 65504 in practice).
//
// FP8 rows of dlogits (a.d8, bf16 only; FORGE_FP8's LM head): the scale must come from the row's
// amax before the first byte is written, and a third sweep computing every exp2 again would
// make the kernel SFU-bound (pass 1 and 2 already take ~half its time in ex2). So the amax comes
// from the statistics: every dlogit off the target is dloss·2^(l·log2e − max·log2e)/Σ, rounded
// to bf16 — non-decreasing in l, so the largest is the one at the largest logit off the target
// (m2, kept in pass 1 beside m) — and the target's own is computed as pass 2 computes it. The
// same instructions on the same values give the same bits, so the amax, hence the scale and the
// bytes, are what cast_fp8_rows gives for the bf16 row (CrossEntropyFp8Test checks it bit for
// bit). One caveat: ex2.approx is not documented as monotone; a non-monotone last ulp could put
// the true amax one f32 ulp above m2's, which changes the scale only if that ulp also crosses a
// bf16 rounding boundary and a power-of-two scale boundary at once (values stay ≤ the format's
// maximum either way: the conversion saturates).
template <typename T>
__global__ void __launch_bounds__(kRowThreads, 1) ce_rows_kernel(RowArgs a) {
  __shared__ float s_m[kRowWarps], s_s[kRowWarps], s_m2[kRowWarps];
  const int n = blockIdx.x;
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int32_t target = a.targets[n];
  T* row = static_cast<T*>(a.logits) + static_cast<int64_t>(n) * a.ld;  // (ld)
  int4* row16 = reinterpret_cast<int4*>(row);
  const int packs = a.ld / 8;
  const int segs = (packs + kSegPacks - 1) / kSegPacks;

  if (target < 0) {  // ignored: loss 0, zero gradient (whole block returns)
    if (tid == 0) a.losses[n] = 0.0f;
    if (a.dloss) {
      for (int i = tid; i < packs; i += kRowThreads) row16[i] = make_int4(0, 0, 0, 0);
      if (a.d8) {  // zero bytes, descale 1 (cast_fp8_rows of a zero row)
        uint2* row8 = reinterpret_cast<uint2*>(a.d8 + static_cast<int64_t>(n) * a.ld);
        for (int i = tid; i < packs; i += kRowThreads) row8[i] = make_uint2(0u, 0u);
        if (tid == 0) a.d_descale[n] = 1.0f;
      }
    }
    return;
  }
  // NaN for a target ≥ V (a caller bug): a visible wrong loss, and no read past the row.
  const float l_target = target < a.V ? kernels::to_f32(row[target]) : __int_as_float(0x7fc00000);

  // Pass 1. Masked columns (≥ V) count as −inf: exp2 gives 0 and they never raise the max.
  int4 pack[kRowPacks];
  float m = -FLT_MAX, s = 0.0f;
  float m2 = -FLT_MAX;  // the largest logit off the target (the FP8 rows' amax, above)
  for (int seg = 0; seg < segs; ++seg) {
    load_segment(pack, row16, seg, packs);
#pragma unroll
    for (int p = 0; p < kRowPacks; ++p) {
      const int i = seg * kSegPacks + p * kRowThreads + tid;
      if (i >= packs || i * 8 >= a.V) break;  // (a pack all in [V, ld) could make m·log2e −inf)
      float v[8];
      kernels::unpack16(pack[p], v, T{});
      if (i * 8 + 8 > a.V) {
#pragma unroll
        for (int e = 0; e < 8; ++e)
          if (i * 8 + e >= a.V) v[e] = -INFINITY;
      }
      float pm = v[0];
#pragma unroll
      for (int e = 1; e < 8; ++e) pm = fmaxf(pm, v[e]);
      const int t = target - i * 8;
      if (t >= 0 && t < 8) {  // the target's pack: its max without the target
        float pm2 = -INFINITY;
#pragma unroll
        for (int e = 0; e < 8; ++e)
          if (e != t) pm2 = fmaxf(pm2, v[e]);
        m2 = fmaxf(m2, pm2);
      } else {
        m2 = fmaxf(m2, pm);
      }
      if (pm > m) {
        s *= exp2_ftz((m - pm) * kLog2e);
        m = pm;
      }
      const float ml = m * kLog2e;
#pragma unroll
      for (int e = 0; e < 8; ++e) s += exp2_ftz(fmaf(v[e], kLog2e, -ml));
    }
  }
  // Block merge: butterfly within each warp, then every warp merges the 32 warp results the same
  // way, so all threads hold the same (m, s) without a second barrier.
#pragma unroll
  for (int off = 16; off > 0; off /= 2) {
    merge_max_sum2(m, s, __shfl_xor_sync(0xffffffffu, m, off),
                   __shfl_xor_sync(0xffffffffu, s, off));
    m2 = fmaxf(m2, __shfl_xor_sync(0xffffffffu, m2, off));
  }
  if (lane == 0) s_m[warp] = m, s_s[warp] = s, s_m2[warp] = m2;
  __syncthreads();
  m = s_m[lane], s = s_s[lane], m2 = s_m2[lane];
#pragma unroll
  for (int off = 16; off > 0; off /= 2) {
    merge_max_sum2(m, s, __shfl_xor_sync(0xffffffffu, m, off),
                   __shfl_xor_sync(0xffffffffu, s, off));
    m2 = fmaxf(m2, __shfl_xor_sync(0xffffffffu, m2, off));
  }
  if (tid == 0) a.losses[n] = logf(s) + m - l_target;
  if (!a.dloss) return;

  // Pass 2, last segment first: it is still in registers (for GPT-2 sizes, the whole row).
  // dlogit = dloss·softmax, minus dloss at the target; exactly 0 in [V, ld).
  const float g = *a.dloss, g_inv = g / s, ml = m * kLog2e;
  float s8 = 1.0f;  // the FP8 rows' scale (a.d8)
  if (a.d8) {
    const float off_target = bf16_rounded(exp2_ftz(fmaf(m2, kLog2e, -ml)) * g_inv);
    const float at_target = bf16_rounded(exp2_ftz(fmaf(l_target, kLog2e, -ml)) * g_inv - g);
    const float amax = fp8_rows::fold_abs(fp8_rows::fold_abs(0.0f, off_target), at_target);
    const int e =
        a.e5m2 ? kernels::fp8_scale_exponent<false>(amax) : kernels::fp8_scale_exponent<true>(amax);
    s8 = fp8_rows::pow2(e);
    if (tid == 0) a.d_descale[n] = fp8_rows::pow2(-e);
  }
  for (int seg = segs - 1; seg >= 0; --seg) {
    if (seg != segs - 1) load_segment(pack, row16, seg, packs);
#pragma unroll
    for (int p = 0; p < kRowPacks; ++p) {
      const int i = seg * kSegPacks + p * kRowThreads + tid;
      if (i >= packs) break;
      float v[8];
      kernels::unpack16(pack[p], v, T{});
#pragma unroll
      for (int e = 0; e < 8; ++e) v[e] = exp2_ftz(fmaf(v[e], kLog2e, -ml)) * g_inv;
      const int t = target - i * 8;
      if (t >= 0 && t < 8) {
#pragma unroll
        for (int e = 0; e < 8; ++e)
          if (e == t) v[e] -= g;
      }
      if (i * 8 + 8 > a.V) {
#pragma unroll
        for (int e = 0; e < 8; ++e)
          if (i * 8 + e >= a.V) v[e] = 0.0f;
      }
      if constexpr (std::is_same_v<T, bf16>) {
        const int4 out = pack8_bf16(v);
        row16[i] = out;
        if (a.d8) store_fp8_pack(a.d8 + static_cast<int64_t>(n) * a.ld + i * 8, out, s8, a.e5m2);
      } else {
        row16[i] = kernels::pack16(v, T{});
      }
    }
  }
}

// Row stride of the bf16 logits scratch: Vp rounded up to 64 columns (128-byte rows).
int row_stride(int Vp) {
  return (Vp + 63) / 64 * 64;
}

// Rows per chunk: all N if the (N, ld) scratch fits the budget, else the fewest equal chunks of
// a multiple of kRowGranule rows that fit.
int chunk_rows(int N, int ld) {
  const int64_t row_bytes = static_cast<int64_t>(ld) * sizeof(bf16);
  const int64_t cap = std::max<int64_t>(
      kRowGranule, static_cast<int64_t>(kRowScratchBytes) / row_bytes / kRowGranule * kRowGranule);
  if (N <= cap) return N;
  const int64_t chunks = (N + cap - 1) / cap;
  const int64_t rows = (N + chunks - 1) / chunks;
  return static_cast<int>((rows + kRowGranule - 1) / kRowGranule * kRowGranule);
}

}  // namespace

int lm_head_chunk_rows(int N, int Vp) { return chunk_rows(N, row_stride(Vp)); }

namespace {

// ---- f32: vocabulary chunks -----------------------------------------------------------------

constexpr int kThreads = 256;  // per row block
constexpr int kWarps = kThreads / 32;
constexpr size_t kScratchBytes = size_t{256} << 20;  // bound on the (N, Vc) f32 logits

template <typename T>
struct alignas(sizeof(T) * 4) Pack4 {
  T v[4];
};

// Merges two (max, Σexp(x − max)) pairs; finite throughout (empty = (−FLT_MAX, 0)) and
// commutative bit for bit.
__device__ __forceinline__ void merge_max_sum(float& m, float& s, float m2, float s2) {
  const float mn = fmaxf(m, m2);
  s = s * expf(m - mn) + s2 * expf(m2 - mn);
  m = mn;
}

struct ChunkArgs {
  int width;  // real columns in this chunk
  int ld;     // row stride of the scratch (Vc, a multiple of 4)
  int c0;     // first vocabulary column of the chunk
  bool first, last;
};

// One block per row n of logits (N, ld): folds the chunk into row_max/row_sum (N), records the
// target's logit, and in the last chunk writes losses (N). Ignored rows (target < 0) only get
// loss 0.
__global__ void __launch_bounds__(kThreads)
    ce_chunk_stats_kernel(float* __restrict__ losses, float* __restrict__ row_max,
                          float* __restrict__ row_sum, float* __restrict__ target_logit,
                          const float* __restrict__ logits, const int32_t* __restrict__ targets,
                          ChunkArgs a) {
  __shared__ float s_m[kWarps], s_s[kWarps];
  const int n = blockIdx.x;
  const int32_t target = targets[n];
  if (target < 0) {
    if (a.last && threadIdx.x == 0) losses[n] = 0.0f;
    return;  // whole block
  }
  const float* row = logits + static_cast<int64_t>(n) * a.ld;  // (width) of (ld)
  float m = -FLT_MAX, s = 0.0f;
  for (int j0 = threadIdx.x * 4; j0 < a.width; j0 += kThreads * 4) {
    const Pack4<float> x = *reinterpret_cast<const Pack4<float>*>(row + j0);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      if (j0 + e >= a.width) break;
      if (x.v[e] > m) {
        s = s * expf(m - x.v[e]) + 1.0f;
        m = x.v[e];
      } else {
        s += expf(x.v[e] - m);
      }
    }
  }
#pragma unroll
  for (int off = 16; off > 0; off /= 2)
    merge_max_sum(m, s, __shfl_xor_sync(0xffffffffu, m, off), __shfl_xor_sync(0xffffffffu, s, off));
  if (threadIdx.x % 32 == 0) s_m[threadIdx.x / 32] = m, s_s[threadIdx.x / 32] = s;
  __syncthreads();
  if (threadIdx.x != 0) return;
  m = s_m[0], s = s_s[0];
  for (int w = 1; w < kWarps; ++w) merge_max_sum(m, s, s_m[w], s_s[w]);  // fixed order
  if (!a.first) merge_max_sum(m, s, row_max[n], row_sum[n]);
  row_max[n] = m, row_sum[n] = s;
  if (target >= a.c0 && target < a.c0 + a.width) target_logit[n] = row[target - a.c0];
  if (a.last) losses[n] = logf(s) + m - target_logit[n];
}

// One block per row, in place over the chunk's f32 logits: dloss·(softmax − onehot) for the
// chunk's real columns, 0 for ignored rows (and for the slack columns [width, round_up(width, 4))
// of the row). Each element is read by the thread that overwrites it.
__global__ void __launch_bounds__(kThreads)
    ce_chunk_grad_kernel(float* logits, const float* __restrict__ row_max,
                         const float* __restrict__ row_sum, const int32_t* __restrict__ targets,
                         const float* __restrict__ dloss, ChunkArgs a) {
  const int n = blockIdx.x;
  const int32_t target = targets[n];
  const bool ignored = target < 0;
  const float g = ignored ? 0.0f : *dloss;
  const float m = ignored ? 0.0f : row_max[n];
  const float inv = ignored ? 0.0f : 1.0f / row_sum[n];
  const int t = target - a.c0;  // target column within the chunk (maybe outside it)
  float* row = logits + static_cast<int64_t>(n) * a.ld;
  for (int j0 = threadIdx.x * 4; j0 < a.width; j0 += kThreads * 4) {
    Pack4<float> x{};
    if (!ignored) x = *reinterpret_cast<const Pack4<float>*>(row + j0);
    Pack4<float> d;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int j = j0 + e;
      const float p = expf(x.v[e] - m) * inv;  // 0 when ignored (inv = 0)
      d.v[e] = j < a.width ? g * (p - (j == t ? 1.0f : 0.0f)) : 0.0f;
    }
    *reinterpret_cast<Pack4<float>*>(row + j0) = d;
  }
}

int chunk_columns(int N, int V) {
  const int64_t by_budget = static_cast<int64_t>(kScratchBytes / sizeof(float)) / N / 256 * 256;
  const int64_t vc = std::clamp<int64_t>(by_budget, 1024, 8192);
  return static_cast<int>(std::min<int64_t>(vc, (static_cast<int64_t>(V) + 255) / 256 * 256));
}

// logits (N, width; row stride ld) f32 = x (N, C) · w[c0 : c0 + width]ᵀ.
void chunk_logits(Context& ctx, float* logits, const float* x, const float* w, int N, int C,
                  const ChunkArgs& a) {
  GemmArgs g;
  g.M = N, g.N = a.width, g.K = C, g.trans_b = true;
  g.ab_type = DType::kF32, g.c_type = DType::kF32;
  g.ldc = a.ld;
  gemm(ctx, g, x, w + static_cast<int64_t>(a.c0) * C, logits);
}

void lm_head_cross_entropy_f32(Context& ctx, float* losses, float* dx, float* dw, const float* x,
                               const float* w, const int32_t* targets, const float* dloss, int N,
                               int C, int V) {
  const bool backward = dx != nullptr || dw != nullptr;
  const int Vc = chunk_columns(N, V);
  const int chunks = (V + Vc - 1) / Vc;
  auto chunk = [&](int c) {
    return ChunkArgs{std::min(Vc, V - c * Vc), Vc, c * Vc, c == 0, c == chunks - 1};
  };
  Allocator& alloc = ctx.allocator();
  DeviceBuffer<float> logits(alloc, static_cast<size_t>(N) * Vc);  // (N, Vc) one chunk
  DeviceBuffer<float> row_max(alloc, N), row_sum(alloc, N), target_logit(alloc, N);  // (N)

  for (int c = 0; c < chunks; ++c) {
    const ChunkArgs a = chunk(c);
    chunk_logits(ctx, logits.data(), x, w, N, C, a);
    ce_chunk_stats_kernel<<<N, kThreads, 0, ctx.stream()>>>(
        losses, row_max.data(), row_sum.data(), target_logit.data(), logits.data(), targets, a);
    FORGE_CUDA_CHECK_LAUNCH();
  }
  if (!backward) return;

  for (int c = chunks - 1; c >= 0; --c) {
    const ChunkArgs a = chunk(c);
    if (c != chunks - 1) chunk_logits(ctx, logits.data(), x, w, N, C, a);
    ce_chunk_grad_kernel<<<N, kThreads, 0, ctx.stream()>>>(logits.data(), row_max.data(),
                                                           row_sum.data(), targets, dloss, a);
    FORGE_CUDA_CHECK_LAUNCH();
    const float* w_c = w + static_cast<int64_t>(a.c0) * C;
    if (dx) {  // dx (N, C) += dlogits (N, width) · w[c] (width, C)
      GemmArgs g;
      g.M = N, g.N = C, g.K = a.width;
      g.ab_type = DType::kF32, g.c_type = DType::kF32, g.beta = 1.0f;
      g.lda = Vc;
      gemm(ctx, g, logits.data(), w_c, dx);
    }
    if (dw) {  // dw[c] (width, C) += dlogitsᵀ (width, N) · x (N, C)
      GemmArgs g;
      g.M = a.width, g.N = C, g.K = N, g.trans_a = true;
      g.ab_type = DType::kF32, g.c_type = DType::kF32, g.beta = 1.0f;
      g.lda = Vc;
      gemm(ctx, g, logits.data(), x, dw + static_cast<int64_t>(a.c0) * C);
    }
  }
}

}  // namespace

namespace {

// FP8 operands of the bf16 path (ops.h's LmHeadFp8): E4M3 rows of x and w, w's transposed
// rows (the dx product's B), and a chunk's FP8 dlogits, cast or allocated once a call.
struct HeadFp8 {
  DeviceBuffer<uint8_t> x8, w8, wt8, d8;
  DeviceBuffer<float> xs, ws, wts, ds;
  const uint8_t* x = nullptr;  // x8's or the caller's rows
  const float* x_descale = nullptr;
  DType grad_type = DType::kF8E4M3;

  HeadFp8(Context& ctx, const LmHeadFp8& f, const void* xin, const void* w, int N, int C, int Vp,
          int Nc, int ld, bool dx) {
    FORGE_CHECK(N % 16 == 0 && C % 16 == 0 && Vp % 16 == 0,
                "[lm_head_cross_entropy] FP8 needs N, C and Vp multiples of 16, not N=", N,
                " C=", C, " Vp=", Vp);
    FORGE_CHECK(f.grad_type == DType::kF8E4M3 || f.grad_type == DType::kF8E5M2,
                "[lm_head_cross_entropy] FP8 dlogits must be f8e4m3 or f8e5m2, not ",
                dtype_name(f.grad_type));
    Allocator& alloc = ctx.allocator();
    grad_type = f.grad_type;
    x = f.x8, x_descale = f.x_descale;
    if (x == nullptr) {
      x8 = DeviceBuffer<uint8_t>(alloc, static_cast<size_t>(N) * C);
      xs = DeviceBuffer<float>(alloc, N);
      cast_fp8_rows(ctx, DType::kF8E4M3, x8.data(), xs.data(), DType::kBF16, xin, N, C);
      x = x8.data(), x_descale = xs.data();
    }
    w8 = DeviceBuffer<uint8_t>(alloc, static_cast<size_t>(Vp) * C);
    ws = DeviceBuffer<float>(alloc, Vp);
    cast_fp8_rows(ctx, DType::kF8E4M3, w8.data(), ws.data(), DType::kBF16, w, Vp, C);
    if (!dx) return;
    wt8 = DeviceBuffer<uint8_t>(alloc, static_cast<size_t>(C) * Vp);  // (C, Vp) rows of wᵀ
    wts = DeviceBuffer<float>(alloc, C);
    cast_transpose_fp8_rows(ctx, DType::kF8E4M3, wt8.data(), wts.data(), DType::kBF16, w, Vp, C);
    d8 = DeviceBuffer<uint8_t>(alloc, static_cast<size_t>(Nc) * ld);
    ds = DeviceBuffer<float>(alloc, Nc);
  }
};

// The row-chunk path for a 16-bit T (bf16, or f16 in fp16 training); dt is T's DType. fp8: bf16
// only (lm_head_cross_entropy_bf16).
template <typename T>
void lm_head_cross_entropy_16(Context& ctx, DType dt, float* losses, void* dx, float* dw,
                              const void* x, const void* w, const int32_t* targets,
                              const float* dloss, int N, int C, int V, int Vp, int chunk_rows,
                              const LmHeadFp8* fp8) {
  FORGE_CHECK(N >= 0 && C > 0 && V > 0 && Vp >= V && chunk_rows > 0,
              "[lm_head_cross_entropy] bad shape N=", N, " C=", C, " V=", V, " Vp=", Vp,
              " chunk_rows=", chunk_rows);
  const bool backward = dx != nullptr || dw != nullptr;
  FORGE_CHECK(!backward || dloss != nullptr, "[lm_head_cross_entropy] backward without dloss");
  if (N == 0) return;
  const int ld = row_stride(Vp);
  const int Nc = std::min(N, chunk_rows);
  FORGE_CHECK(fp8 == nullptr || Nc % 16 == 0 || Nc == N,
              "[lm_head_cross_entropy] FP8 row chunks must be multiples of 16, not ", Nc);
  DeviceBuffer<T> logits(ctx.allocator(), static_cast<size_t>(Nc) * ld);  // (Nc, ld)
  std::optional<HeadFp8> f8;
  if (fp8) f8.emplace(ctx, *fp8, x, w, N, C, Vp, Nc, ld, dx != nullptr);
  // Columns Vp..ld are never written by the GEMM but are read (and masked) by the row kernel's
  // 16-byte loads: zero them once, so nothing reads uninitialized memory (compute-sanitizer
  // initcheck). At most 63 columns a row.
  if (ld > Vp)
    FORGE_CUDA_CHECK(cudaMemset2DAsync(logits.data() + Vp, static_cast<size_t>(ld) * sizeof(T), 0,
                                       static_cast<size_t>(ld - Vp) * sizeof(T), Nc, ctx.stream()));
  const T* xb = static_cast<const T*>(x);
  for (int r0 = 0; r0 < N; r0 += Nc) {
    const int rows = std::min(Nc, N - r0);
    const T* x_rows = xb + static_cast<int64_t>(r0) * C;  // (rows, C)
    {  // logits (rows, Vp; stride ld) = x[rows] · wᵀ
      GemmArgs g;
      g.M = rows, g.N = Vp, g.K = C, g.trans_b = true;
      g.ab_type = dt, g.c_type = dt;
      g.ldc = ld;
      if (f8) {  // E4M3 rows of both, fast accumulation (K = C, as the blocks' FP8 products)
        g.ab_type = g.b_type = DType::kF8E4M3;
        g.a_scale = f8->x_descale + r0, g.b_scale = f8->ws.data();
        g.row_scales = true, g.fast_accum = true;
        gemm(ctx, g, f8->x + static_cast<int64_t>(r0) * C, f8->w8.data(), logits.data());
      } else {
        gemm(ctx, g, x_rows, w, logits.data());
      }
    }
    RowArgs a{logits.data(), losses + r0, targets + r0, backward ? dloss : nullptr, V, ld};
    if (f8 && dx) {
      a.d8 = f8->d8.data(), a.d_descale = f8->ds.data();
      a.e5m2 = f8->grad_type == DType::kF8E5M2;
    }
    ce_rows_kernel<T><<<rows, kRowThreads, 0, ctx.stream()>>>(a);
    FORGE_CUDA_CHECK_LAUNCH();
    if (dx) {  // dx[rows] (rows, C) += dlogits (rows, Vp) · w (Vp, C), bf16, rounded once
      GemmArgs g;
      g.M = rows, g.N = C, g.K = Vp;
      g.ab_type = dt, g.c_type = dt, g.beta = 1.0f;
      g.lda = ld;
      T* dx_rows = static_cast<T*>(dx) + static_cast<int64_t>(r0) * C;
      if (f8) {  // FP8 dlogits · (C, Vp) rows of wᵀ; K = Vp is long: full f32 accumulation
        g.trans_b = true;
        g.ab_type = f8->grad_type, g.b_type = DType::kF8E4M3;
        g.a_scale = f8->ds.data(), g.b_scale = f8->wts.data();
        g.row_scales = true;
        gemm(ctx, g, f8->d8.data(), f8->wt8.data(), dx_rows);
      } else {
        gemm(ctx, g, logits.data(), w, dx_rows);
      }
    }
    if (dw) {  // dw (Vp, C) += dlogitsᵀ (Vp, rows) · x[rows] (rows, C), f32
      GemmArgs g;
      g.M = Vp, g.N = C, g.K = rows, g.trans_a = true;
      g.ab_type = dt, g.c_type = DType::kF32, g.beta = 1.0f;
      g.lda = ld;
      gemm(ctx, g, logits.data(), x_rows, dw);
    }
  }
}

}  // namespace

void lm_head_cross_entropy_bf16(Context& ctx, float* losses, void* dx, float* dw, const void* x,
                                const void* w, const int32_t* targets, const float* dloss, int N,
                                int C, int V, int Vp, int chunk_rows, const LmHeadFp8* fp8) {
  lm_head_cross_entropy_16<bf16>(ctx, DType::kBF16, losses, dx, dw, x, w, targets, dloss, N, C, V,
                                 Vp, chunk_rows, fp8);
}

void ce_rows_bf16(Context& ctx, void* logits, int ld, float* losses, const int32_t* targets,
                  const float* dloss, int rows, int V, uint8_t* d8, float* d_descale,
                  DType grad_type) {
  FORGE_CHECK(rows >= 0 && V > 0 && ld >= V && ld % 8 == 0, "[ce_rows_bf16] bad shape rows=", rows,
              " V=", V, " ld=", ld);
  FORGE_CHECK(d8 == nullptr || (dloss != nullptr && d_descale != nullptr),
              "[ce_rows_bf16] FP8 rows need dloss and descales");
  FORGE_CHECK(grad_type == DType::kF8E4M3 || grad_type == DType::kF8E5M2,
              "[ce_rows_bf16] FP8 rows must be f8e4m3 or f8e5m2, not ", dtype_name(grad_type));
  if (rows == 0) return;
  RowArgs a{logits, losses, targets, dloss, V, ld};
  a.d8 = d8, a.d_descale = d_descale, a.e5m2 = grad_type == DType::kF8E5M2;
  ce_rows_kernel<bf16><<<rows, kRowThreads, 0, ctx.stream()>>>(a);
  FORGE_CUDA_CHECK_LAUNCH();
}

void lm_head_cross_entropy(Context& ctx, DType dt, float* losses, void* dx, float* dw,
                           const void* x, const void* w, const int32_t* targets, const float* dloss,
                           int N, int C, int V, int Vp, const LmHeadFp8* fp8) {
  FORGE_CHECK(dt == DType::kF32 || dt == DType::kBF16 || dt == DType::kF16,
              "[lm_head_cross_entropy] unsupported dtype ", dtype_name(dt));
  FORGE_CHECK(N >= 0 && C > 0 && V > 0 && Vp >= V, "[lm_head_cross_entropy] bad shape N=", N,
              " C=", C, " V=", V, " Vp=", Vp);
  const bool backward = dx != nullptr || dw != nullptr;
  FORGE_CHECK(!backward || dloss != nullptr, "[lm_head_cross_entropy] backward without dloss");
  if (N == 0) return;
  FORGE_CHECK(fp8 == nullptr || dt == DType::kBF16, "[lm_head_cross_entropy] FP8 needs bf16, not ",
              dtype_name(dt));
  if (dt == DType::kBF16)
    lm_head_cross_entropy_bf16(ctx, losses, dx, dw, x, w, targets, dloss, N, C, V, Vp,
                               chunk_rows(N, row_stride(Vp)), fp8);
  else if (dt == DType::kF16)  // f16 is as wide as bf16: the same chunking
    lm_head_cross_entropy_16<kernels::f16>(ctx, dt, losses, dx, dw, x, w, targets, dloss, N, C, V,
                                           Vp, chunk_rows(N, row_stride(Vp)), nullptr);
  else
    lm_head_cross_entropy_f32(ctx, losses, static_cast<float*>(dx), dw,
                              static_cast<const float*>(x), static_cast<const float*>(w), targets,
                              dloss, N, C, V);
}

}  // namespace forge::cuda
