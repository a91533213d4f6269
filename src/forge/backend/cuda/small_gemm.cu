// Small-N linear layers (small_gemm.h): out (N, OC) = inp (N, C) · op(W) + bias for N ≤ 32, and
// the fused gate/up projection + SwiGLU. CPU twins: cpu::linear_fwd, cpu::swiglu_fwd.
//
// Why: a decode step multiplies every weight by one row per sequence. The work is reading W
// once (bytes, not FLOPs): 576 × 576 bf16 is 0.66 MB, 0.14 µs of HBM time, so what counts is
// latency — how many blocks start at once, how many loads each warp has in flight, and no
// second pass. cuBLASLt picks tiles made for large M and is latency-bound here.
//
// bf16 / f16, kOutIn (W (OC, C), Llama): tensor cores (mma.sync m16n8k16, f32 accumulators),
// with the batch rows as the MMA's M (16 rows, zero beyond N) and 8 weight rows as its N. A sum
// over k does not care in which order k is visited, so the k within each 32-column step are
// permuted such that every lane's fragments are whole 16-byte loads: lane (g = lane/4, q =
// lane%4) loads W[o + g][k + 8q .. +8) and x[n + g (+8)][k + 8q .. +8); words 0,1 are the first
// MMA's b0,b1 (a0..a3 from the same words of the x rows), words 2,3 the second MMA's. No shared
// memory and no ldmatrix: the W loads are 512 contiguous-per-8-rows bytes per warp instruction,
// streamed past L1 (ld.global.nc.L1::no_allocate); x is tiny and comes from L1/L2.
// A warp holds col_tiles 8-row weight tiles (reusing its x fragments); the block's warps split
// the 32-column k-steps round-robin (each issues the loads of kUnroll steps before its first
// MMA) and are summed through shared memory in warp order. N > 16: more 16-row tiles as extra
// blocks next to each other in launch order (blockIdx.x = column block · row_tiles + row tile),
// so the second read of a weight tile is an L2 hit.
// SwiGLU: the warp's first col_tiles/2 tiles are gate rows j.., the others the up rows FF + j..,
// so the epilogue has both products of (n, j) in one thread: each rounded to dt, then
// g·σ(g)·u in f32 with expf, rounded — the arithmetic of linear_fwd + swiglu_fwd (elementwise.cu).
//
// bf16 / f16, kInOut (W (C, OC), GPT-2's Conv1D): here 16 bytes of W are 8 consecutive output
// columns at one k, so the weight is the MMA's A operand (its M = 16 output columns) and the
// batch rows its N (8 rows per tile). Lane (g, q) loads W rows k + 2q, k + 2q + 1, k + 2q + 8,
// k + 2q + 9 at columns o + 8g .. +8 (four 16-byte loads; a warp instruction reads four rows
// × 128 contiguous bytes) and interleaves pairs of rows with byte_perm into the (k, k+1) halves
// A wants: MMA i (0..3) gets columns 8g + 2i (its row g) and 8g + 2i + 1 (row g + 8), so a warp
// covers 64 columns and 16 k per step. x fragments are 4-byte loads of x[n][k + 2q (+8)].
//
// f32 (the CPU-parity mode): CUDA cores with f32 FMAs, simple: kOutIn one warp per weight row
// (float4 over C, warp_sum), kInOut one thread per output column with 8 k-slices summed in
// shared memory in order; 8 batch rows per block.
//
// Tiling (launch_out_in): warps per block ≈ k-steps / 2, so that every warp issues all its loads
// in one go (C = 576: 18 steps, 9 warps; capped at 16); col_tiles: the widest that still gives
// >= 4 blocks per SM. Tried and dropped: thread-block clusters splitting C over 2-8 blocks with
// the partials summed through distributed shared memory were slower in every case measured
// (SmolLM2 q|k|v, N = 1: 3.13 µs at 16 warps, 3.99 with 2 blocks per cluster, 9.6 with 4).
//
// Determinism: no atomics; every sum has a fixed order given the shape and the device's SM
// count (the tiling depends on both), so reruns are bit-identical.
//
// Measured on the H200 (forge bench gemm --rows 1 8 32; bf16; µs per call, each call a node of
// a CUDA graph of calls on rotating weight copies (>= 256 MB), so W comes from HBM as in a decode
// step; cuBLASLt = what CudaBackend enqueues otherwise: one GEMM, or for the SwiGLU row two
// GEMMs + swiglu_fwd). "takes": what small_linear_eligible picks.
//   shape                     C -> OC       N=1 small/cuBLASLt  N=8          N=32         takes
//   SmolLM2 q|k|v             576 -> 960     2.89 / 3.65    2.93 / 3.31  3.16 / 3.35  small N<=16
//   SmolLM2 (3C)              576 -> 1728    3.06 / 3.44    3.14 / 3.44  3.55 / 3.49  small N<=16
//   SmolLM2 o_proj            576 -> 576     2.78 / 3.26    2.82 / 3.26  2.98 / 3.32  small N<=16
//   SmolLM2 gate|up           576 -> 3072    3.38 / 3.76    3.49 / 3.74  5.59 / 3.83  small N<=16
//   SmolLM2 gate|up + SwiGLU  576 -> 2x1536  3.70 / 8.61    3.79 / 8.43  3.99 / 8.52  small
//   SmolLM2 down_proj        1536 -> 576     3.68 / 4.67    3.79 / 4.66  4.18 / 4.76  small N<=16
//   SmolLM2 LM head           576 -> 49152   27.3 / 16.0    27.8 / 16.4  49.8 / 17.3  cuBLASLt
//   GPT-2 c_attn              768 -> 2304    5.17 / 4.06    5.32 / 4.06  7.67 / 4.14  cuBLASLt
//   GPT-2 attn c_proj         768 -> 768     4.93 / 3.71    5.06 / 3.72  5.01 / 3.77  cuBLASLt
//   GPT-2 c_fc                768 -> 3072    5.28 / 4.17    5.34 / 4.18  7.73 / 4.30  cuBLASLt
//   GPT-2 mlp c_proj         3072 -> 768    11.65 / 6.63   11.85 / 6.67 11.51 / 7.03  cuBLASLt
//   GPT-2 LM head (tied)      768 -> 50304   38.4 / 21.5    39.0 / 21.9  71.5 / 23.2  cuBLASLt
// (GPT-2's Conv1D rows are W (C, OC) with bias; its tied LM head and all SmolLM2 rows W (OC, C).
// f16 runs the same kernels with the f16 MMA and was not timed; neither was f32.)
// At N = 16: q|k|v 3.04 / 3.33, gate|up 3.58 / 3.77, down 3.89 / 4.72; at N = 24 gate|up
// 5.32 / 3.81, hence 16 rows for a plain product. The best forced tiling of the LM head (2 tiles,
// 4 warps: 20.1 µs at N = 1) still trails cuBLASLt, and so does every W (C, OC) tiling: the
// 64-column warp leaves 12-36 column tiles for GPT-2's shapes, too few to fill the GPU.
// What bounds the small rows: ~2.8 µs per graph node even for 0.66 MB (0.14 µs of HBM time), i.e.
// launch and one HBM round trip; SmolLM2's four products per layer are ~13 µs at N = 1 (cuBLASLt
// ~20 µs), so the decode target of ~8 µs per layer needs fewer nodes (fusion) or overlap of one
// kernel's weight loads with the previous kernel (programmatic dependent launch), not faster
// kernels alone.
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <type_traits>

#include "forge/backend/cuda/flash_mma.cuh"
#include "forge/backend/cuda/kernel_utils.cuh"
#include "forge/backend/cuda/pdl.cuh"
#include "forge/backend/cuda/small_gemm.h"

namespace forge::cuda {
namespace {

using namespace kernels;
using flash::mma;

// kBias: out = sum + bias. kSwiglu: the fused gate/up. kResidual: out += (sum + bias) rounded
// to T first (linear_fwd into a temporary, then the residual add: the unfused arithmetic).
enum class Epilogue { kBias, kSwiglu, kResidual };

struct SmallParams {
  void* out;           // (N, OC); kResidual: also the residual read
  const void* inp;     // (N, C)
  const void* w;       // (OC, C) kOutIn, (C, OC) kInOut; SwiGLU (2·OC, C)
  const void* bias;    // (OC) or null
  const void* norm_w;  // (C) RMSNorm prologue's weight: the product's input is rmsnorm(inp)
  float eps;           // its epsilon
  int N, C, OC;        // SwiGLU: OC = FF, the outputs per row
  int row_tiles;       // batch-row tiles per column block
  int x_stride;        // elements between the staged rows in shared memory (norm prologue)
};

constexpr int kMaxWarps = 16;
constexpr int kUnroll = 2;        // k-steps whose loads a warp issues before its first MMA
constexpr int kStepsPerWarp = 2;  // default split: about this many k-steps per warp

// 16 bytes of a weight, read once: not allocated in L1 (x, read by every warp, stays there).
__device__ __forceinline__ int4 load_weight16(const void* p) {
  int4 r;
  asm("ld.global.nc.L1::no_allocate.v4.s32 {%0, %1, %2, %3}, [%4];\n"
      : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
      : "l"(p));
  return r;
}

__device__ __forceinline__ uint32_t word(const int4& v, int i) {
  return static_cast<uint32_t>(i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w);
}

__device__ __forceinline__ float sigmoid(float z) {
  return 1.0f / (1.0f + expf(-z));
}

// SwiGLU of the two f32 sums as the unfused path computes it: both rounded to T by linear_fwd,
// then swiglu_fwd's g·σ(g)·u in f32, rounded.
template <typename T>
__device__ __forceinline__ T swiglu_value(float gate, float up) {
  const float g = to_f32(from_f32<T>(gate)), u = to_f32(from_f32<T>(up));
  return from_f32<T>(g * sigmoid(g) * u);
}

// Sum over the nw warps' partials red (nw, V, 32) of entry i (= v·32 + lane), in warp order.
__device__ __forceinline__ float sum_partials(const float* red, int nw, int V, int i) {
  float s = 0.0f;
  for (int w = 0; w < nw; ++w) s += red[w * V * 32 + i];
  return s;
}

// Elements between staged rows: C plus padding so that the row stride is 16 words modulo the 32
// banks — the 8 lanes of a 16-byte load phase (2 rows × 4 chunks) then hit distinct banks.
template <typename T>
__host__ __device__ int staged_stride(int C) {
  const int words = C * static_cast<int>(sizeof(T)) / 4;
  const int pad = ((16 - words % 32) + 32) % 32;
  return C + pad * 4 / static_cast<int>(sizeof(T));
}

// Shared memory of out_in_mma_kernel, in bytes from the start (host and device agree):
//   red (warps, V, 32) f32   the warps' partial sums
//   xs  (rows, x_stride) T   kNorm: the normalised input rows
//   gs  (C) T                kNorm: the norm's weight, copied before the PDL wait
//   bs  (cols) f32           the bias of the block's columns, copied before the wait (if any)
//   rs  (rows, cols) f32     kResidual: the residual, loaded right after the wait
struct SmallSmem {
  int xs, gs, bs, rs, bytes;
};
__host__ __device__ inline SmallSmem small_smem(int warps, int V, int cols, int rows, int C,
                                                int x_stride, int es, bool norm, bool residual) {
  auto up16 = [](int b) { return (b + 15) / 16 * 16; };
  SmallSmem m{};
  m.xs = warps * V * 32 * 4;
  m.gs = m.xs + (norm ? up16(rows * x_stride * es) : 0);
  m.bs = m.gs + (norm ? up16(C * es) : 0);
  m.rs = m.bs + up16(cols * 4);
  m.bytes = m.rs + (residual ? rows * cols * 4 : 0);
  return m;
}

// The norm prologue: rows n0 .. n0 + 15 (those < N) of rmsnorm(inp)·norm_w into xs (16,
// x_stride), one warp per row with rmsnorm_fwd_kernel's arithmetic (Σx² over 32 lanes in the
// same order, s = 1/sqrt(Σ/C + eps), y = x·s·w rounded), so the staged rows equal what the
// unfused rmsnorm_fwd writes for rows of C ≥ 256.
template <typename T>
__device__ void stage_rmsnorm_rows(T* xs, const T* g, const SmallParams& p, int n0) {
  constexpr int kN = kVec<T>;
  const int lane = threadIdx.x % 32, nw = blockDim.x / 32, C = p.C;
  const int rows = min(16, p.N - n0);
  for (int r = threadIdx.x / 32; r < rows; r += nw) {
    const T* x = static_cast<const T*>(p.inp) + static_cast<int64_t>(n0 + r) * C;
    T* y = xs + r * p.x_stride;
    // Four chunks' loads issued before their stores: x (global) and y (shared) are both generic
    // pointers here, so the compiler may not move a load above the store before it, and the
    // row's chunks were one L2 round trip each. Same order of the sum.
    float sq = 0.0f;
    constexpr int kBatch = 4;
    for (int c0 = lane * kN; c0 < C; c0 += kBatch * 32 * kN) {
      int4 raw[kBatch];
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const int c = c0 + u * 32 * kN;
        raw[u] = c < C ? *reinterpret_cast<const int4*>(x + c) : make_int4(0, 0, 0, 0);
      }
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const int c = c0 + u * 32 * kN;
        if (c >= C) break;
        *reinterpret_cast<int4*>(y + c) = raw[u];
        float v[kN];
        unpack16(raw[u], v, T{});
#pragma unroll
        for (int k = 0; k < kN; ++k) sq += v[k] * v[k];
      }
    }
    const float s = 1.0f / sqrtf(warp_sum(sq) / C + p.eps);
    for (int c = lane * kN; c < C; c += 32 * kN) {  // the chunks this lane staged
      float v[kN], w[kN];
      load<T, kN>(y + c, v);
      load<T, kN>(g + c, w);
#pragma unroll
      for (int k = 0; k < kN; ++k) v[k] = v[k] * s * w[k];
      store<T, kN>(y + c, v);
    }
  }
}

// ---- bf16 / f16, W (OC, C) ---------------------------------------------------------------------

// kNorm: the input rows are rmsnorm(inp)·norm_w, staged in shared memory after the partials.
// Launched with PDL (pdl.cuh): the weights of the warp's first k-steps are loaded before
// pdl_wait(), so they are in flight while the kernel before finishes.
template <typename T, int kCT, Epilogue kEpi, bool kNorm>
__global__ void __launch_bounds__(32 * kMaxWarps) out_in_mma_kernel(SmallParams p) {
  pdl_launch_dependents();
  constexpr bool kGlu = kEpi == Epilogue::kSwiglu;
  constexpr int V = 4 * kCT;                   // accumulators per lane
  constexpr int kHalf = kGlu ? kCT / 2 : kCT;  // tiles per set of output columns
  constexpr int kCols = 8 * kHalf;             // output columns per block
  extern __shared__ __align__(16) float red[];  // (warps, V, 32), then small_smem's regions
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nw = blockDim.x / 32;
  const int g = lane / 4, q = lane % 4;
  const int n0 = (blockIdx.x % p.row_tiles) * 16, o0 = (blockIdx.x / p.row_tiles) * kCols;
  const int C = p.C;
  const T* w = static_cast<const T*>(p.w);
  const T* wrow[kCT];  // this lane's weight row of each tile
  bool wok[kCT];
#pragma unroll
  for (int t = 0; t < kCT; ++t) {
    const int o = o0 + 8 * (t % kHalf) + g;
    wok[t] = o < p.OC;
    const int row = kGlu && t >= kHalf ? p.OC + o : o;
    wrow[t] = w + static_cast<int64_t>(wok[t] ? row : 0) * C;
  }
  const int4 zero = make_int4(0, 0, 0, 0);
  const int steps = (C + 31) / 32;
  auto load_w = [&](int4 (&wv)[kUnroll][kCT], int s0) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int k = (s0 + u * nw) * 32 + 8 * q;
      const bool in = k < C;  // C % 8 == 0: a 16-byte chunk is wholly inside or outside
#pragma unroll
      for (int t = 0; t < kCT; ++t) wv[u][t] = in && wok[t] ? load_weight16(wrow[t] + k) : zero;
    }
  };
  int4 wv[kUnroll][kCT];
  load_w(wv, warp);  // constant data: before the wait
  // The warp's later k-steps (past its first kUnroll: the down projection's C = 1536 is 48 steps
  // for 16 warps × 2) are loaded after the wait; ask L2 for them now, so those loads are L2 hits.
  for (int s0 = warp + nw * kUnroll; s0 < steps; s0 += nw) {
    const int k = s0 * 32 + 8 * q;
#pragma unroll
    for (int t = 0; t < kCT; ++t)
      if (wok[t] && k < C) asm volatile("prefetch.global.L2 [%0];" ::"l"(wrow[t] + k));
  }
  constexpr bool kRes = kEpi == Epilogue::kResidual;
  const int rows = min(16, p.N - n0);
  const SmallSmem sm = small_smem(nw, V, kCols, min(16, p.N), C, p.x_stride, sizeof(T), kNorm, kRes);
  unsigned char* smem = reinterpret_cast<unsigned char*>(red);
  T* gs = reinterpret_cast<T*>(smem + sm.gs);
  float* bs = reinterpret_cast<float*>(smem + sm.bs);
  float* rs = reinterpret_cast<float*>(smem + sm.rs);
  if constexpr (kNorm) {  // the norm's weight: constant, before the wait
    for (int c = threadIdx.x * kVec<T>; c < C; c += blockDim.x * kVec<T>)
      *reinterpret_cast<int4*>(gs + c) = __ldg(reinterpret_cast<const int4*>(static_cast<const T*>(p.norm_w) + c));
  }
  const T* bias = static_cast<const T*>(p.bias);
  if (bias != nullptr && !kGlu) {
    for (int i = threadIdx.x; i < kCols; i += blockDim.x) {
      const int o = o0 + i;
      bs[i] = o < p.OC ? to_f32(bias[o]) : 0.0f;
    }
  }
  pdl_wait();
  if constexpr (kRes) {  // the residual rows, in flight with the input's loads
    const T* res = static_cast<const T*>(p.out);
    for (int i = threadIdx.x; i < rows * kCols; i += blockDim.x) {
      const int r = i / kCols, o = o0 + i % kCols;
      rs[i] = o < p.OC ? to_f32(res[static_cast<int64_t>(n0 + r) * p.OC + o]) : 0.0f;
    }
  }

  const bool xok0 = n0 + g < p.N, xok1 = n0 + g + 8 < p.N;
  const T* x0;
  const T* x1;
  if constexpr (kNorm) {
    // gs was copied by every thread of the block, and a row's warp reads all of it: the barrier
    // orders the two. (Without it a warp could read a chunk of the norm's weight before its
    // copy landed: under compute-sanitizer's timing, 16 outputs of one block came out wrong —
    // SmallLinearFusedTest, and Qwen3's decode test beside a loaded GPU.)
    __syncthreads();
    T* xs = reinterpret_cast<T*>(smem + sm.xs);
    stage_rmsnorm_rows<T>(xs, gs, p, n0);
    __syncthreads();
    x0 = xs + (xok0 ? g : 0) * p.x_stride;
    x1 = xs + (xok1 ? g + 8 : 0) * p.x_stride;
  } else {
    const T* x = static_cast<const T*>(p.inp);
    x0 = x + static_cast<int64_t>(xok0 ? n0 + g : 0) * C;
    x1 = x + static_cast<int64_t>(xok1 ? n0 + g + 8 : 0) * C;
  }

  auto load_x = [&](int4 (&xv)[kUnroll][2], int s0) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int k = (s0 + u * nw) * 32 + 8 * q;
      const bool in = k < C;
      if constexpr (kNorm) {
        xv[u][0] = in && xok0 ? *reinterpret_cast<const int4*>(x0 + k) : zero;
        xv[u][1] = in && xok1 ? *reinterpret_cast<const int4*>(x1 + k) : zero;
      } else {
        xv[u][0] = in && xok0 ? __ldg(reinterpret_cast<const int4*>(x0 + k)) : zero;
        xv[u][1] = in && xok1 ? __ldg(reinterpret_cast<const int4*>(x1 + k)) : zero;
      }
    }
  };
  // Two stages where registers allow (kCT <= 2): the next k-steps' loads are issued before this
  // step's MMAs, so a product with more k-steps than one pass of the warps (C = 1536: 48 steps,
  // 16 warps × 2) waits for memory once, not once per pass.
  constexpr bool kTwoStage = kCT <= 2;
  const int stride = nw * kUnroll;
  float acc[kCT][4] = {};
  int4 xv[kUnroll][2];
  load_x(xv, warp);
  for (int s0 = warp; s0 < steps; s0 += stride) {
    const bool more = s0 + stride < steps;
    int4 wn[kUnroll][kCT], xn[kUnroll][2];
    if constexpr (kTwoStage) {
      if (more) load_w(wn, s0 + stride), load_x(xn, s0 + stride);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {  // words 2h, 2h + 1: one MMA's 16 k
        const uint32_t a[4] = {word(xv[u][0], 2 * h), word(xv[u][1], 2 * h),
                               word(xv[u][0], 2 * h + 1), word(xv[u][1], 2 * h + 1)};
#pragma unroll
        for (int t = 0; t < kCT; ++t)
          mma<T>(acc[t], a, word(wv[u][t], 2 * h), word(wv[u][t], 2 * h + 1));
      }
    }
    if (more) {
      if constexpr (kTwoStage) {
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
#pragma unroll
          for (int t = 0; t < kCT; ++t) wv[u][t] = wn[u][t];
          xv[u][0] = xn[u][0], xv[u][1] = xn[u][1];
        }
      } else {
        load_w(wv, s0 + stride), load_x(xv, s0 + stride);
      }
    }
  }

#pragma unroll
  for (int t = 0; t < kCT; ++t)
#pragma unroll
    for (int e = 0; e < 4; ++e) red[(warp * V + 4 * t + e) * 32 + lane] = acc[t][e];
  __syncthreads();
  // Entry i = v·32 + l of the partials: tile t = v / 4, element e = v % 4 of lane l's C fragment
  // (c0, c1: batch row l/4, columns 2(l%4) + 0, 1; c2, c3: batch row l/4 + 8).
  T* out = static_cast<T*>(p.out);
  for (int i = threadIdx.x; i < 4 * kHalf * 32; i += blockDim.x) {
    const int v = i / 32, l = i % 32, t = v / 4, e = v % 4;
    const int n = n0 + l / 4 + (e >= 2 ? 8 : 0);
    const int oc = 8 * t + 2 * (l % 4) + (e & 1), o = o0 + oc;  // oc: column within the block
    if (n >= p.N || o >= p.OC) continue;
    const float s = sum_partials(red, nw, V, i);
    T* dst = out + static_cast<int64_t>(n) * p.OC + o;
    if constexpr (kGlu) {
      *dst = swiglu_value<T>(s, sum_partials(red, nw, V, i + 4 * kHalf * 32));
    } else if constexpr (kRes) {
      const float y = to_f32(from_f32<T>(bias ? s + bs[oc] : s));
      *dst = from_f32<T>(rs[(n - n0) * kCols + oc] + y);
    } else {
      *dst = from_f32<T>(bias ? s + bs[oc] : s);
    }
  }
}

// ---- bf16 / f16, W (C, OC) ---------------------------------------------------------------------

template <typename T>
__global__ void __launch_bounds__(32 * kMaxWarps) in_out_mma_kernel(SmallParams p) {
  constexpr int V = 16;           // 4 MMAs (column groups) × 4 accumulators
  extern __shared__ float red[];  // (warps, V, 32)
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nw = blockDim.x / 32;
  const int g = lane / 4, q = lane % 4;
  const int n0 = (blockIdx.x % p.row_tiles) * 8, o0 = (blockIdx.x / p.row_tiles) * 64;
  const int C = p.C, OC = p.OC;
  const bool wok = o0 + 8 * g < OC;  // OC % 8 == 0: 8 columns are wholly inside or outside
  const T* wcol = static_cast<const T*>(p.w) + (wok ? o0 + 8 * g : 0);
  const bool xok = n0 + g < p.N;
  const T* xr = static_cast<const T*>(p.inp) + static_cast<int64_t>(xok ? n0 + g : 0) * C;
  const int4 zero = make_int4(0, 0, 0, 0);

  float acc[4][4] = {};
  const int steps = (C + 15) / 16;
  for (int s0 = warp; s0 < steps; s0 += nw * kUnroll) {
    int4 r[kUnroll][4];  // W rows k + 2q, + 1, + 8, + 9
    uint32_t b[kUnroll][2];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int k = (s0 + u * nw) * 16 + 2 * q;  // C even: k < C means k + 1 < C
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int kk = k + (j & 1) + 8 * (j >> 1);
        r[u][j] = wok && kk < C ? load_weight16(wcol + static_cast<int64_t>(kk) * OC) : zero;
      }
      b[u][0] = xok && k < C ? __ldg(reinterpret_cast<const unsigned int*>(xr + k)) : 0u;
      b[u][1] = xok && k + 8 < C ? __ldg(reinterpret_cast<const unsigned int*>(xr + k + 8)) : 0u;
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {  // columns 8g + 2i (A row g) and 8g + 2i + 1 (A row g + 8)
        const uint32_t r0 = word(r[u][0], i), r1 = word(r[u][1], i);
        const uint32_t r8 = word(r[u][2], i), r9 = word(r[u][3], i);
        const uint32_t a[4] = {__byte_perm(r0, r1, 0x5410), __byte_perm(r0, r1, 0x7632),
                               __byte_perm(r8, r9, 0x5410), __byte_perm(r8, r9, 0x7632)};
        mma<T>(acc[i], a, b[u][0], b[u][1]);
      }
    }
  }

#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) red[(warp * V + 4 * i + e) * 32 + lane] = acc[i][e];
  __syncthreads();
  // Entry v·32 + l: MMA i = v / 4, element e = v % 4: column 8(l/4) + 2i + e/2 (A row l/4 or
  // l/4 + 8), batch row 2(l%4) + e%2.
  T* out = static_cast<T*>(p.out);
  const T* bias = static_cast<const T*>(p.bias);
  for (int idx = threadIdx.x; idx < V * 32; idx += blockDim.x) {
    const int v = idx / 32, l = idx % 32, i = v / 4, e = v % 4;
    const int o = o0 + 8 * (l / 4) + 2 * i + (e >> 1);
    const int n = n0 + 2 * (l % 4) + (e & 1);
    if (n >= p.N || o >= OC) continue;
    const float s = sum_partials(red, nw, V, idx);
    out[static_cast<int64_t>(n) * OC + o] = from_f32<T>(bias ? s + to_f32(bias[o]) : s);
  }
}

// ---- f32 -------------------------------------------------------------------------------------

constexpr int kF32Rows = 8;  // batch rows per block

// One warp per output column o (SwiGLU: gate row o and up row OC + o); 8 warps per block.
template <Epilogue kEpi>
__global__ void __launch_bounds__(256) out_in_f32_kernel(SmallParams p) {
  constexpr bool kGlu = kEpi == Epilogue::kSwiglu;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int n0 = (blockIdx.x % p.row_tiles) * kF32Rows, o = (blockIdx.x / p.row_tiles) * 8 + warp;
  if (o >= p.OC) return;
  const int C = p.C;
  const float* x = static_cast<const float*>(p.inp);
  const float* wg = static_cast<const float*>(p.w) + static_cast<int64_t>(o) * C;
  const float* wu = kGlu ? wg + static_cast<int64_t>(p.OC) * C : wg;
  float acc[kF32Rows] = {}, accu[kF32Rows] = {};
  for (int k = 4 * lane; k < C; k += 128) {
    float wv[4], uv[4];
    load<float, 4>(wg + k, wv);
    if constexpr (kGlu) load<float, 4>(wu + k, uv);
#pragma unroll
    for (int r = 0; r < kF32Rows; ++r) {
      if (n0 + r >= p.N) break;
      float xv[4];
      load<float, 4>(x + static_cast<int64_t>(n0 + r) * C + k, xv);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        acc[r] += wv[j] * xv[j];
        if constexpr (kGlu) accu[r] += uv[j] * xv[j];
      }
    }
  }
  float* out = static_cast<float*>(p.out);
  const float* bias = static_cast<const float*>(p.bias);
#pragma unroll
  for (int r = 0; r < kF32Rows; ++r) {
    const float s = warp_sum(acc[r]);
    const float su = kGlu ? warp_sum(accu[r]) : 0.0f;
    if (lane != r || n0 + r >= p.N) continue;
    float* dst = out + static_cast<int64_t>(n0 + r) * p.OC + o;
    if constexpr (kGlu)
      *dst = s * sigmoid(s) * su;
    else
      *dst = bias ? s + bias[o] : s;
  }
}

// 32 output columns × 8 k-slices per block, the slices summed in order through shared memory.
__global__ void __launch_bounds__(256) in_out_f32_kernel(SmallParams p) {
  __shared__ float sh[8][kF32Rows][32];  // [k-slice][row][column]
  const int tx = threadIdx.x % 32, ty = threadIdx.x / 32;
  const int n0 = (blockIdx.x % p.row_tiles) * kF32Rows, o = (blockIdx.x / p.row_tiles) * 32 + tx;
  const int C = p.C, OC = p.OC, rows = min(kF32Rows, p.N - n0);
  const float* x = static_cast<const float*>(p.inp) + static_cast<int64_t>(n0) * C;
  const float* w = static_cast<const float*>(p.w);
  float acc[kF32Rows] = {};
  if (o < OC) {
    for (int k = ty; k < C; k += 8) {
      const float wk = w[static_cast<int64_t>(k) * OC + o];
#pragma unroll
      for (int r = 0; r < kF32Rows; ++r)
        if (r < rows) acc[r] += x[static_cast<int64_t>(r) * C + k] * wk;
    }
  }
#pragma unroll
  for (int r = 0; r < kF32Rows; ++r) sh[ty][r][tx] = acc[r];
  __syncthreads();
  if (ty != 0 || o >= OC) return;
  float* out = static_cast<float*>(p.out);
  const float* bias = static_cast<const float*>(p.bias);
  for (int r = 0; r < rows; ++r) {
    float s = 0.0f;
#pragma unroll
    for (int y = 0; y < 8; ++y) s += sh[y][r][tx];
    out[static_cast<int64_t>(n0 + r) * OC + o] = bias ? s + bias[o] : s;
  }
}

// ---- launchers ---------------------------------------------------------------------------------

int ceil_div(int a, int b) {
  return (a + b - 1) / b;
}

// Warps splitting `steps` k-steps: about kStepsPerWarp each, or the forced count.
int split_warps(int steps, int forced) {
  if (forced) return forced;
  return std::clamp(ceil_div(steps, kStepsPerWarp), 1, kMaxWarps);
}

template <typename T, Epilogue kEpi>
void launch_out_in(Context& ctx, SmallParams p, SmallLinearTiling tiling) {
  constexpr bool kGlu = kEpi == Epilogue::kSwiglu;
  p.row_tiles = ceil_div(p.N, 16);
  int ct = tiling.col_tiles;
  if (ct == 0) {  // the widest weight tile per warp that still gives ≥ 4 blocks per SM
    for (ct = 4; ct > (kGlu ? 2 : 1); ct /= 2)
      if (static_cast<int64_t>(ceil_div(p.OC, kGlu ? 4 * ct : 8 * ct)) * p.row_tiles >=
          4 * ctx.num_sms())
        break;
  }
  const int warps = split_warps(ceil_div(p.C, 32), tiling.warps);
  const int blocks = ceil_div(p.OC, kGlu ? 4 * ct : 8 * ct) * p.row_tiles;
  const bool norm = p.norm_w != nullptr;
  p.x_stride = norm ? staged_stride<T>(p.C) : 0;
  const int cols = kGlu ? 4 * ct : 8 * ct;
  const size_t smem = small_smem(warps, 4 * ct, cols, std::min(16, p.N), p.C, p.x_stride, sizeof(T),
                                 norm, kEpi == Epilogue::kResidual)
                          .bytes;
  auto go = [&](auto kernel) {
    if (smem > 48 * 1024)
      FORGE_CUDA_CHECK(
          cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    launch_pdl(ctx, kernel, blocks, 32 * warps, smem, p);
  };
  auto pick = [&](auto norm_tag) {
    constexpr bool kNorm = decltype(norm_tag)::value;
    if (ct == 4)
      go(out_in_mma_kernel<T, 4, kEpi, kNorm>);
    else if (ct == 2)
      go(out_in_mma_kernel<T, 2, kEpi, kNorm>);
    else if constexpr (!kGlu)
      go(out_in_mma_kernel<T, 1, kEpi, kNorm>);
  };
  if (norm)
    pick(std::true_type{});
  else
    pick(std::false_type{});
}

template <typename T>
void launch_in_out(Context& ctx, SmallParams p, SmallLinearTiling tiling) {
  p.row_tiles = ceil_div(p.N, 8);
  const int warps = split_warps(ceil_div(p.C, 16), tiling.warps);
  const int blocks = ceil_div(p.OC, 64) * p.row_tiles;
  const size_t smem = static_cast<size_t>(warps) * 16 * 32 * sizeof(float);
  in_out_mma_kernel<T><<<blocks, 32 * warps, smem, ctx.stream()>>>(p);
  FORGE_CUDA_CHECK_LAUNCH();
}

template <Epilogue kEpi>
void launch_f32(Context& ctx, SmallParams p, WeightLayout layout) {
  p.row_tiles = ceil_div(p.N, kF32Rows);
  if (layout == WeightLayout::kOutIn) {
    out_in_f32_kernel<kEpi><<<ceil_div(p.OC, 8) * p.row_tiles, 256, 0, ctx.stream()>>>(p);
  } else {
    in_out_f32_kernel<<<ceil_div(p.OC, 32) * p.row_tiles, 256, 0, ctx.stream()>>>(p);
  }
  FORGE_CUDA_CHECK_LAUNCH();
}

void check_tiling(SmallLinearTiling t, bool glu) {
  FORGE_CHECK(
      t.col_tiles == 0 || t.col_tiles == 2 || t.col_tiles == 4 || (!glu && t.col_tiles == 1),
      "[small_linear] col_tiles ", t.col_tiles, " (want 1, 2 or 4; SwiGLU 2 or 4)");
  FORGE_CHECK(t.warps >= 0 && t.warps <= kMaxWarps, "[small_linear] warps ", t.warps, " (want 1..",
              kMaxWarps, ")");
}

}  // namespace

bool small_linear_supported(DType dt, int N, int C, int OC, WeightLayout layout) {
  if (dt != DType::kF32 && dt != DType::kBF16 && dt != DType::kF16) return false;
  if (N < 1 || N > kSmallLinearMaxRows || C < 1 || OC < 1) return false;
  const int v = 16 / static_cast<int>(dtype_size(dt));
  if (layout == WeightLayout::kOutIn) return C % v == 0;
  return OC % v == 0 && (dt == DType::kF32 || C % 2 == 0);
}

bool small_linear_swiglu_supported(DType dt, int N, int C, int FF) {
  return FF >= 1 && FF <= INT_MAX / 2 &&
         small_linear_supported(dt, N, C, 2 * FF, WeightLayout::kOutIn);
}

bool small_linear_eligible(DType dt, int N, int C, int OC, WeightLayout layout) {
  return small_linear_supported(dt, N, C, OC, layout) && dt != DType::kF32 &&
         layout == WeightLayout::kOutIn && N <= kSmallLinearEligibleRows &&
         static_cast<int64_t>(C) * OC <= kSmallLinearMaxWeights;
}

bool small_linear_swiglu_eligible(DType dt, int N, int C, int FF) {
  return small_linear_swiglu_supported(dt, N, C, FF) && dt != DType::kF32 &&
         2 * static_cast<int64_t>(FF) * C <= kSmallLinearMaxWeights;
}

bool small_linear_aligned(const void* out, const void* inp, const void* w) {
  return aligned16(out) && aligned16(inp) && aligned16(w);
}

bool small_linear_fusion_supported(DType dt, int N, int C, int OC, WeightLayout layout,
                                   const SmallLinearFusion& f) {
  if (!small_linear_supported(dt, N, C, OC, layout)) return false;
  if (f.norm_w == nullptr && !f.residual) return true;
  return dt != DType::kF32 && layout == WeightLayout::kOutIn && C <= kSmallLinearMaxNormC;
}

namespace {

void check_fusion(const SmallLinearFusion& f, bool supported, const char* op, DType dt, int N,
                  int C, int OC) {
  FORGE_CHECK(supported, "[", op, "] fusion not supported: ", dtype_name(dt), " N=", N, " C=", C,
              " OC=", OC, f.norm_w ? " +rmsnorm" : "", f.residual ? " +residual" : "");
  FORGE_CHECK(f.norm_w == nullptr || aligned16(f.norm_w), "[", op,
              "] norm weight not 16-byte aligned");
}

}  // namespace

void small_linear_fwd(Context& ctx, DType dt, void* out, const void* inp, const void* w,
                      const void* bias, int N, int C, int OC, WeightLayout layout,
                      SmallLinearTiling tiling, const SmallLinearFusion& fusion) {
  FORGE_CHECK(small_linear_supported(dt, N, C, OC, layout),
              "[small_linear_fwd] not supported: ", dtype_name(dt), " N=", N, " C=", C, " OC=", OC,
              layout == WeightLayout::kOutIn ? " (OC, C)" : " (C, OC)");
  FORGE_CHECK(small_linear_aligned(out, inp, w), "[small_linear_fwd] operands not 16-byte aligned");
  check_tiling(tiling, false);
  check_fusion(fusion, small_linear_fusion_supported(dt, N, C, OC, layout, fusion),
               "small_linear_fwd", dt, N, C, OC);
  const SmallParams p{out, inp, w, bias, fusion.norm_w, fusion.eps, N, C, OC, 0, 0};
  dispatch_dtype(dt, "small_linear_fwd", [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, float>)
      launch_f32<Epilogue::kBias>(ctx, p, layout);
    else if (layout == WeightLayout::kInOut)
      launch_in_out<T>(ctx, p, tiling);
    else if (fusion.residual)
      launch_out_in<T, Epilogue::kResidual>(ctx, p, tiling);
    else
      launch_out_in<T, Epilogue::kBias>(ctx, p, tiling);
  });
}

void small_linear_swiglu_fwd(Context& ctx, DType dt, void* hidden, const void* inp,
                             const void* w_gate_up, int N, int C, int FF,
                             SmallLinearTiling tiling, const SmallLinearFusion& fusion) {
  FORGE_CHECK(small_linear_swiglu_supported(dt, N, C, FF),
              "[small_linear_swiglu_fwd] not supported: ", dtype_name(dt), " N=", N, " C=", C,
              " FF=", FF);
  FORGE_CHECK(small_linear_aligned(hidden, inp, w_gate_up),
              "[small_linear_swiglu_fwd] operands not 16-byte aligned");
  check_tiling(tiling, true);
  check_fusion(fusion,
               !fusion.residual && small_linear_fusion_supported(dt, N, C, 2 * FF,
                                                                 WeightLayout::kOutIn, fusion),
               "small_linear_swiglu_fwd", dt, N, C, FF);
  const SmallParams p{hidden, inp, w_gate_up, nullptr, fusion.norm_w, fusion.eps, N, C, FF, 0, 0};
  dispatch_dtype(dt, "small_linear_swiglu_fwd", [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, float>)
      launch_f32<Epilogue::kSwiglu>(ctx, p, WeightLayout::kOutIn);
    else
      launch_out_in<T, Epilogue::kSwiglu>(ctx, p, tiling);
  });
}

}  // namespace forge::cuda
