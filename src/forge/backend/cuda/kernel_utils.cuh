// Device helpers shared by the memory-bound kernels (elementwise, embedding, norms, RoPE,
// AdamW). Private to src/forge/backend/cuda/*.cu: it includes CUDA headers, ops.h does not.
//
//  - dtype handling: every kernel is a template over the storage type T (float, __nv_bfloat16
//    or __half) and computes in f32. load()/store() move N elements between memory and a
//    float[N] in registers; when N·sizeof(T) is a multiple of 16 they use 16-byte accesses
//    (float4 for f32, 8 × bf16 or 8 × f16 packed in an int4), otherwise element by element.
//    kVec<T> is the number of elements of one 16-byte access (4 f32, 8 bf16 or f16).
//  - dispatch_dtype(): the one place an op turns its DType into T (STYLE.md: a lambda over a
//    type tag); other dtypes are a FORGE_CHECK failure naming the op.
//  - warp_sum / block_sum: f32 butterfly reductions, fixed order, so deterministic.
//  - load_input(): the input row of a norm kernel, either a tensor or (residual-fused forward)
//    the rounded sum of two, shared by layernorm.cu and rmsnorm.cu.
//  - channel_grad(): deterministic per-channel parameter gradients, sums over rows: the weight
//    (and bias) gradient of LayerNorm and RMSNorm and the bias gradient of a linear layer,
//    shared by layernorm.cu, rmsnorm.cu and bias_grad.cu (described at its definition).
//  - philox4x32_10: bit-identical to forge::philox4x32_10 (core/rng.cpp), so a stream drawn on
//    the GPU equals the CPU's forge::Rng stream.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "forge/backend/cuda/check.h"
#include "forge/backend/cuda/context.h"
#include "forge/core/dtype.h"
#include "forge/core/error.h"

namespace forge::cuda::kernels {

using bf16 = __nv_bfloat16;
using f16 = __half;

// Elements of T per 16-byte access.
template <typename T>
inline constexpr int kVec = 16 / static_cast<int>(sizeof(T));

template <typename T>
__device__ __forceinline__ float to_f32(T x);
template <>
__device__ __forceinline__ float to_f32<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ float to_f32<bf16>(bf16 x) {
  return __bfloat162float(x);
}
template <>
__device__ __forceinline__ float to_f32<f16>(f16 x) {
  return __half2float(x);
}

// f32 → T, round to nearest even for bf16 (the CPU's f32_to_bf16) and f16 (IEEE binary16:
// above 65504 it rounds to inf, which is what f16 loss scaling detects).
template <typename T>
__device__ __forceinline__ T from_f32(float x);
template <>
__device__ __forceinline__ float from_f32<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ bf16 from_f32<bf16>(float x) {
  return __float2bfloat16_rn(x);
}
template <>
__device__ __forceinline__ f16 from_f32<f16>(float x) {
  return __float2half_rn(x);
}

// Two f32 → two bf16 (round to nearest even) packed in one word, `lo` at the lower address.
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  return static_cast<uint32_t>(__bfloat16_as_ushort(__float2bfloat16_rn(lo))) |
         (static_cast<uint32_t>(__bfloat16_as_ushort(__float2bfloat16_rn(hi))) << 16);
}

// 16 bytes ↔ f32 registers. A bf16 is the top half of an f32, so widening is a shift or a mask.
__device__ __forceinline__ void unpack16(const int4& r, float* o, float) {
  o[0] = __int_as_float(r.x), o[1] = __int_as_float(r.y);
  o[2] = __int_as_float(r.z), o[3] = __int_as_float(r.w);
}
__device__ __forceinline__ void unpack16(const int4& r, float* o, bf16) {
  const uint32_t w[4] = {static_cast<uint32_t>(r.x), static_cast<uint32_t>(r.y),
                         static_cast<uint32_t>(r.z), static_cast<uint32_t>(r.w)};
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    o[2 * k] = __uint_as_float(w[k] << 16);
    o[2 * k + 1] = __uint_as_float(w[k] & 0xffff0000u);
  }
}
// f16 has its own exponent, so widening is a conversion (cvt, two per instruction).
__device__ __forceinline__ void unpack16(const int4& r, float* o, f16) {
  const int w[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&w[k]));
    o[2 * k] = f.x, o[2 * k + 1] = f.y;
  }
}
// One 32-bit word of two 16-bit values → two f32, the lower address first.
__device__ __forceinline__ void unpack_pair(uint32_t w, float* o, bf16) {
  o[0] = __uint_as_float(w << 16);
  o[1] = __uint_as_float(w & 0xffff0000u);
}
__device__ __forceinline__ void unpack_pair(uint32_t w, float* o, f16) {
  const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&w));
  o[0] = f.x, o[1] = f.y;
}
__device__ __forceinline__ int4 pack16(const float* v, float) {
  return make_int4(__float_as_int(v[0]), __float_as_int(v[1]), __float_as_int(v[2]),
                   __float_as_int(v[3]));
}
__device__ __forceinline__ int4 pack16(const float* v, bf16) {
  return make_int4(
      static_cast<int>(pack_bf16x2(v[0], v[1])), static_cast<int>(pack_bf16x2(v[2], v[3])),
      static_cast<int>(pack_bf16x2(v[4], v[5])), static_cast<int>(pack_bf16x2(v[6], v[7])));
}
__device__ __forceinline__ int4 pack16(const float* v, f16) {
  int w[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const __half2 h = __floats2half2_rn(v[2 * k], v[2 * k + 1]);  // .x (v[2k]) at the lower address
    w[k] = *reinterpret_cast<const int*>(&h);
  }
  return make_int4(w[0], w[1], w[2], w[3]);
}

// Loads N consecutive elements at p into f32. With N·sizeof(T) % 16 == 0, p must be 16-byte
// aligned and the loads are 16 bytes wide (all issued before any is used).
template <typename T, int N>
__device__ __forceinline__ void load(const T* p, float (&out)[N]) {
  if constexpr ((N * sizeof(T)) % 16 == 0) {
    constexpr int kQ = N / kVec<T>;
    int4 raw[kQ];
#pragma unroll
    for (int q = 0; q < kQ; ++q) raw[q] = reinterpret_cast<const int4*>(p)[q];
#pragma unroll
    for (int q = 0; q < kQ; ++q) unpack16(raw[q], out + q * kVec<T>, T{});
  } else {
#pragma unroll
    for (int k = 0; k < N; ++k) out[k] = to_f32(p[k]);
  }
}

// Stores N f32 values to p as T (same alignment rule as load()).
template <typename T, int N>
__device__ __forceinline__ void store(T* p, const float (&v)[N]) {
  if constexpr ((N * sizeof(T)) % 16 == 0) {
    constexpr int kQ = N / kVec<T>;
#pragma unroll
    for (int q = 0; q < kQ; ++q) reinterpret_cast<int4*>(p)[q] = pack16(v + q * kVec<T>, T{});
  } else {
#pragma unroll
    for (int k = 0; k < N; ++k) p[k] = from_f32<T>(v[k]);
  }
}

// The input of a norm row kernel, N elements at `inp` into f32. kResidual: the residual sum
// inp + inp2 instead, added in f32 and rounded to T, i.e. exactly the value residual_fwd stores
// (same f32 add, same round to nearest even), so a norm of it matches the unfused pair bit for
// bit.
template <typename T, int N, bool kResidual>
__device__ __forceinline__ void load_input(const T* inp, const T* inp2, float (&out)[N]) {
  load<T, N>(inp, out);
  if constexpr (kResidual) {
    float v[N];
    load<T, N>(inp2, v);
#pragma unroll
    for (int k = 0; k < N; ++k) out[k] = to_f32(from_f32<T>(out[k] + v[k]));
  }
}

// The widest row a warp keeps in registers in the norm forwards: 32 values a lane (C ≤ 1,024:
// 4 chunks of 8 in bf16/f16, 8 of 4 in f32).
template <typename T>
inline constexpr int kRowMaxChunks = 32 / kVec<T>;

// Where lane `lane`'s chunk j of a row starts: the row's 16-byte pieces dealt round the warp.
template <int kN>
__device__ __forceinline__ int row_chunk(int lane, int j) {
  return (lane + 32 * j) * kN;
}

// Lane `lane`'s chunks of a row of C values (C ≤ 32·kN·kChunks) into v: every load issued before
// any value is used. kResidual: the values are the residual sum (load_input) and are also stored
// to res (the row's start). Chunks at or past C are left unset; callers skip them by the same
// test, row_chunk(lane, j) >= C.

template <typename T, int kN, bool kResidual, int kChunks>
__device__ __forceinline__ void load_row_chunks(float (&v)[kChunks][kN], T* res, const T* x,
                                                const T* x2, int lane, int C) {
#pragma unroll
  for (int j = 0; j < kChunks; ++j) {
    const int c = row_chunk<kN>(lane, j);
    if (c < C) load_input<T, kN, kResidual>(x + c, x2 + c, v[j]);
  }
  if constexpr (kResidual) {
#pragma unroll
    for (int j = 0; j < kChunks; ++j) {
      const int c = row_chunk<kN>(lane, j);
      if (c < C) store<T, kN>(res + c, v[j]);
    }
  }
}

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

// Sum over aligned groups of kLanes lanes (a power of two ≤ 32), returned to each lane of the
// group; every lane of the warp must call it. kLanes = 32 is warp_sum, in the same order.
template <int kLanes>
__device__ __forceinline__ float lane_group_sum(float x) {
#pragma unroll
  for (int o = kLanes / 2; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

// Sum over the block (blockDim.x a multiple of 32, ≤ 1024), returned to every thread. `scratch`
// is 32 floats of shared memory; the function may be called repeatedly with the same scratch.
__device__ __forceinline__ float block_sum(float x, float* scratch) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  x = warp_sum(x);
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) scratch[warp] = x;
  __syncthreads();
  x = lane < warps ? scratch[lane] : 0.0f;
  return warp_sum(x);
}

// Philox4x32-10, the same rounds as forge::philox4x32_10 (core/rng.cpp), word for word.
__device__ __forceinline__ uint4 philox4x32_10(uint4 c, uint2 k) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
#pragma unroll
  for (int round = 0; round < 10; ++round) {
    const uint32_t hi0 = __umulhi(kM0, c.x), lo0 = kM0 * c.x;
    const uint32_t hi1 = __umulhi(kM1, c.z), lo1 = kM1 * c.z;
    c = make_uint4(hi1 ^ c.y ^ k.x, lo1, hi0 ^ c.w ^ k.y, lo0);
    k.x += kW0;
    k.y += kW1;
  }
  return c;
}

// Block `block` of forge::Rng(seed, stream): words 4·block … 4·block + 3 of that stream.
__device__ __forceinline__ uint4 philox_block(uint64_t seed, uint32_t stream, uint64_t block) {
  return philox4x32_10(
      make_uint4(static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32), stream, 0u),
      make_uint2(static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)));
}

// f32 → bf16 bits by stochastic rounding: add 16 uniform random bits below the kept half, then
// truncate. The result rounds up with probability (dropped bits)/2^16, so E[result] = x for
// every x between two bf16 neighbours. NaN stays a quiet NaN; values that round past the
// largest finite bf16 become inf, as with round to nearest.
__device__ __forceinline__ uint16_t bf16_bits_stochastic(float x, uint32_t rand16) {
  const uint32_t bits = __float_as_uint(x);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  return static_cast<uint16_t>((bits + (rand16 & 0xffffu)) >> 16);
}

// ---- host side ------------------------------------------------------------------------------

// Calls f(T{}) with T = float for kF32, __nv_bfloat16 for kBF16 and __half for kF16; anything
// else is a broken invariant reported with the op's name.
template <typename F>
void dispatch_dtype(DType dt, const char* op, F&& f) {
  switch (dt) {
    case DType::kF32:
      f(float{});
      return;
    case DType::kBF16:
      f(bf16{});
      return;
    case DType::kF16:
      f(f16{});
      return;
    default:
      FORGE_CHECK(false, "[", op, "] unsupported dtype ", dtype_name(dt),
                  " (want f32, bf16 or f16)");
  }
}

inline bool aligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15u) == 0;
}

// Blocks for a grid-stride loop over `work` items with `threads` per block: enough to cover the
// work, at most `per_sm` resident blocks' worth per SM (beyond that a block would only start
// after another finished, and the stride loop does the same with less launch overhead).
inline int grid_for(int64_t work, int threads, int num_sms, int per_sm = 8) {
  const int64_t need = (work + threads - 1) / threads;
  const int64_t cap = static_cast<int64_t>(num_sms) * per_sm;
  return static_cast<int>(need < cap ? (need > 0 ? need : 1) : cap);
}

// ---- per-channel parameter gradients, deterministic ----------------------------------------
// Sums over the N rows of (N, C) tensors, per channel c, with no atomics, bit-identical run to
// run. Three kinds (ChannelGrad), with dy = dout[n, c] and x = inp[n, c]:
//   kLayerNorm   dweight[c] += Σ_n dy·(x − mean[n])·rstd[n]   and   dbias[c] += Σ_n dy
//   kRmsNorm     dweight[c] += Σ_n dy·x·rstd[n]
//   kBias        dbias[c] += Σ_n dy   (a linear layer's bias: no inp, mean or rstd)
//
// Pass 1 (channel_grad_partial_kernel): the rows are cut into `splits` fixed ranges of
// rows_per_split rows and the channels into strips of 32·kN; one block of 32 × 8 threads per
// (strip, split). Thread (x, y) owns kN consecutive channels for the whole split, so its
// accumulators are kN registers whatever C is (no shared-memory budget that grows with C); the 8
// row-threads y take rows y, y + 8, ... and are then summed in y order through shared memory.
// Each warp reads 32 · 16 contiguous bytes of one row per step, fully coalesced. Result:
// partial (splits, kAcc, C) f32, scratch from the context's allocator.
// Pass 2 (channel_grad_finish_wide_kernel, below): 32 channels × 32 split-groups per block,
// each group's terms loaded in one batch, the groups added by a fixed shuffle tree, the total
// added (+=) to the outputs.
// The split sizes depend only on N, so the summation order (and result) is a function of the
// inputs alone. For the norms, pass 1 re-reads dout and inp after the row kernel that computed
// dinp: at a training step's sizes (100 MB a tensor) from DRAM, which is why model-width rows
// take norm_bwd_fused.cuh instead. For kBias, dout is the
// (N, OC) output gradient of a linear layer, up to 400 MB at GPT-2 sizes (N = 65536, OC = 3072,
// bf16), read once from DRAM: 512 splits × OC/(32·kN) strips is ≥ 1536 blocks of 256 threads,
// and its row loop is unrolled 4 deep (one tensor to load instead of two) so each thread keeps
// four 16-byte loads in flight. Measured numbers are in bias_grad.cu.

enum class ChannelGrad { kLayerNorm, kRmsNorm, kBias };

inline constexpr int kWgradRows = 8;  // row-threads per block (blockDim.y)

// Rows of f32 partial sums per split: [dweight, dbias] for LayerNorm, [dweight] for RMSNorm,
// [dbias] for a linear bias.
template <ChannelGrad kKind>
inline constexpr int kChannelAcc = kKind == ChannelGrad::kLayerNorm ? 2 : 1;

template <typename T, int kN, ChannelGrad kKind>
__global__ void __launch_bounds__(32 * kWgradRows)
    channel_grad_partial_kernel(float* __restrict__ partial, const T* __restrict__ dout,
                                const T* __restrict__ inp, const float* __restrict__ mean,
                                const float* __restrict__ rstd, int N, int C, int rows_per_split,
                                int group, int c_real, int64_t ld) {
  constexpr bool kHasWeight = kKind != ChannelGrad::kBias;   // accumulates dout·norm
  constexpr bool kHasBias = kKind != ChannelGrad::kRmsNorm;  // accumulates dout
  constexpr int kAcc = kChannelAcc<kKind>;
  constexpr int kStrip = 32 * kN;
  constexpr int kUnroll = kHasWeight ? 2 : 4;     // rows in flight per thread (see above)
  __shared__ float sh[kAcc][kWgradRows][kStrip];  // [acc][y][k·32 + x]: conflict-free
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int c0 = (blockIdx.x * 32 + tx) * kN;  // first channel of this thread (C % kN == 0)
  const int r0 = blockIdx.y * rows_per_split;
  const int r1 = min(N, r0 + rows_per_split);
  float dw[kN], db[kN];
#pragma unroll
  for (int k = 0; k < kN; ++k) dw[k] = 0.0f, db[k] = 0.0f;
  if (c0 < C) {
#pragma unroll kUnroll
    for (int r = r0 + ty; r < r1; r += kWgradRows) {
      const int64_t off = r * ld + c0;  // ld = C but for a strided kBias view (group 1)
      float dy[kN], x[kN];
      load<T, kN>(dout + off, dy);
      if constexpr (kHasWeight) load<T, kN>(inp + off, x);
      // Grouped rows (see channel_grad): this thread's kN channels lie in real row
      // r·group + c0 / c_real (c0 / c_real = 0 when group = 1).
      const int64_t rr = static_cast<int64_t>(r) * group + c0 / c_real;
      const float m = kKind == ChannelGrad::kLayerNorm ? mean[rr] : 0.0f;
      const float s = kHasWeight ? rstd[rr] : 0.0f;
#pragma unroll
      for (int k = 0; k < kN; ++k) {
        if constexpr (kHasWeight) dw[k] += dy[k] * ((x[k] - m) * s);
        if constexpr (kHasBias) db[k] += dy[k];
      }
    }
  }
#pragma unroll
  for (int k = 0; k < kN; ++k) {
    if constexpr (kHasWeight) sh[0][ty][k * 32 + tx] = dw[k];
    if constexpr (kHasBias) sh[kAcc - 1][ty][k * 32 + tx] = db[k];
  }
  __syncthreads();
  if (ty == 0 && c0 < C) {
#pragma unroll
    for (int a = 0; a < kAcc; ++a) {
      float* out = partial + (static_cast<int64_t>(blockIdx.y) * kAcc + a) * C + c0;
#pragma unroll
      for (int k = 0; k < kN; ++k) {
        float t = 0.0f;
#pragma unroll
        for (int y = 0; y < kWgradRows; ++y) t += sh[a][y][k * 32 + tx];
        out[k] = t;
      }
    }
  }
}

// outs.p[a][c] += Σ_splits Σ_g partial[s, a, g·C + c] for a < kAcc (1 to 3 sums) and c < C; the
// partials are `group` real rows side by side (group = 1: one real row of C).
//
// channel_grad_finish_wide_kernel, every channel sum's finishing pass: a block
// is 32 channels × kFinishRows split-groups (1,024 threads). Group y sums splits y,
// y + 32, ... in order, their loads issued 16 at a time (8 for three sums) before any is added:
// at channel_grad's 512 splits that is 16 terms a thread, one batch of L2 loads, where 8 groups of
// 64 terms were four dependent batches (12.3 µs a call for one sum, 24.5 µs for LayerNorm's two
// in the timelines of 2026-12-03). Then warp w adds channel w's 32 group sums with a fixed
// shuffle tree and lane 0 adds (+=) the total to the output. Fixed order throughout: the same
// bits run to run.
inline constexpr int kFinishRows = 32;  // split-groups per finishing block (blockDim.y)

struct FinishOuts {
  float* p[3];  // the outputs of sums 0, 1, 2 (those past kAcc unused)
};

template <int kAcc>
__global__ void __launch_bounds__(32 * kFinishRows)
    channel_grad_finish_wide_kernel(FinishOuts outs, const float* __restrict__ partial, int splits, int C,
                               int group) {
  static_assert(kAcc >= 1 && kAcc <= 3, "one to three sums");
  __shared__ float sh[kAcc][kFinishRows][33];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int c = blockIdx.x * 32 + tx;
  const int width = C * group;  // partial row length
  float acc[kAcc];
#pragma unroll
  for (int a = 0; a < kAcc; ++a) acc[a] = 0.0f;
  if (c < C) {
    // 32-bit offsets from this thread's column (channel_grad_finish checks the partials fit):
    // 64-bit addresses for 16 loads spilled at the 64 registers 1,024 threads get.
    constexpr int kLoads = kAcc == 3 ? 8 : 16;  // loads in flight per sum
    const float* col = partial + c;
    const int terms = (ty < splits ? (splits - 1 - ty) / kFinishRows + 1 : 0) * group;
    for (int t0 = 0; t0 < terms; t0 += kLoads) {
      float v[kAcc][kLoads];
#pragma unroll
      for (int u = 0; u < kLoads; ++u) {
        const int t = t0 + u, s = ty + (t / group) * kFinishRows, g = t % group;
        const int off = s * kAcc * width + g * C;
#pragma unroll
        for (int a = 0; a < kAcc; ++a) v[a][u] = t < terms ? col[off + a * width] : 0.0f;
      }
#pragma unroll
      for (int a = 0; a < kAcc; ++a)
#pragma unroll
        for (int u = 0; u < kLoads; ++u)
          if (t0 + u < terms) acc[a] += v[a][u];
    }
  }
#pragma unroll
  for (int a = 0; a < kAcc; ++a) sh[a][ty][tx] = acc[a];
  __syncthreads();
  const int cw = blockIdx.x * 32 + ty;  // warp ty finishes channel cw; lane tx holds group tx
#pragma unroll
  for (int a = 0; a < kAcc; ++a) {
    float t = sh[a][tx][ty];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
    if (tx == 0 && cw < C) outs.p[a][cw] += t;
  }
}

// Enqueues the finishing pass over `splits` rows of kAcc (one to three) partial sums.
template <int kAcc>
void channel_grad_finish(Context& ctx, FinishOuts outs, const float* partial, int splits, int C, int group) {
  FORGE_CHECK(static_cast<int64_t>(splits) * kAcc * C * group < (int64_t{1} << 31),
              "channel_grad_finish: ", splits, " × ", kAcc, " rows of ", C, " × ", group,
              " partials exceed the kernel's 32-bit offsets");
  channel_grad_finish_wide_kernel<kAcc><<<(C + 31) / 32, dim3(32, kFinishRows), 0, ctx.stream()>>>(
      outs, partial, splits, C, group);
  FORGE_CUDA_CHECK_LAUNCH();
}

// Enqueues both passes. dweight is used by the norms, dbias by kLayerNorm and kBias; inp and
// rstd by the norms, mean by kLayerNorm (pass null for what a kind does not use). `vec`:
// C % kVec<T> == 0 and dout, inp 16-byte aligned.
//
// Narrow rows (attention heads as rows: C = 64 with 16-byte lanes) would leave most of a warp
// idle, since a warp covers 32·kN channels of one row. With vec, `group` consecutive rows — one
// contiguous row of group·C elements — are taken as one, each thread finding its real row's
// statistics (C % kN == 0, so a thread's kN channels lie in one real row), and the finish pass
// folds the group back onto C channels. group = 1 for rows of ≥ 32·kN/2 channels: the kernels
// then sum in exactly the order they always did. ld (kBias only: a column slice of a wider
// gradient): dout's row stride, 0 = C; strided rows are never grouped.
template <typename T, ChannelGrad kKind>
void channel_grad(Context& ctx, float* dweight, float* dbias, const T* dout, const T* inp,
                  const float* mean, const float* rstd, int N, int C, bool vec, int64_t ld = 0) {
  constexpr int kAcc = kChannelAcc<kKind>;
  constexpr int kMaxSplits = 512, kMinRows = 64;
  FORGE_CHECK(ld == 0 || ld == C || kKind == ChannelGrad::kBias, "channel_grad: a row stride is for kBias only");
  const bool strided = ld != 0 && ld != C;
  int group = 1;
  if (vec && !strided)
    while (2 * group * C <= 32 * kVec<T> && N % (2 * group) == 0) group *= 2;
  const int C_real = C;
  N /= group;
  C *= group;
  int splits = (N + kMinRows - 1) / kMinRows;
  if (splits > kMaxSplits) splits = kMaxSplits;
  const int rows_per_split = (N + splits - 1) / splits;
  DeviceBuffer<float> partial(ctx.allocator(), static_cast<size_t>(splits) * kAcc * C);
  const dim3 block(32, kWgradRows);
  if (vec) {
    constexpr int kN = kVec<T>;
    const dim3 grid((C + 32 * kN - 1) / (32 * kN), splits);
    channel_grad_partial_kernel<T, kN, kKind><<<grid, block, 0, ctx.stream()>>>(
        partial.data(), dout, inp, mean, rstd, N, C, rows_per_split, group, C_real, strided ? ld : C);
  } else {
    const dim3 grid((C + 31) / 32, splits);
    channel_grad_partial_kernel<T, 1, kKind><<<grid, block, 0, ctx.stream()>>>(
        partial.data(), dout, inp, mean, rstd, N, C, rows_per_split, 1, C, strided ? ld : C);
  }
  FORGE_CUDA_CHECK_LAUNCH();
  // Partial row 0 is dweight for the norms, dbias for a linear bias; row 1 (LayerNorm) dbias.
  float* out0 = kKind == ChannelGrad::kBias ? dbias : dweight;
  channel_grad_finish<kAcc>(ctx, FinishOuts{{out0, dbias, nullptr}}, partial.data(), splits, C_real, group);
  // `partial` goes back to the allocator here; it is reused only by work enqueued later on the
  // same stream, i.e. after these kernels.
}

}  // namespace forge::cuda::kernels
