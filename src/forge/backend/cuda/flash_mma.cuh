// Tensor-core building blocks of the flash-attention kernels (sm_80+ instructions, run on the
// H200 as mma.sync): cp.async tile loads into swizzled shared memory, ldmatrix fragment loads
// and the m16n8k16 MMA with f32 accumulators, for bf16 and f16.
//
// Shared-memory tiles are R rows × D columns of 16-bit elements, stored row by row with the
// 16-byte chunks of a row permuted by XOR with (row mod 8). ldmatrix reads eight rows at the
// same logical chunk; the swizzle puts them in eight different bank groups, so neither the
// cp.async writes nor the ldmatrix reads conflict (D·2 bytes is a multiple of 128 for D ≥ 64).
//
// Fragment layouts (PTX ISA, "mma.m16n8k16", lane = threadIdx.x % 32, g = lane / 4,
// c = 2·(lane % 4)):
//   A 16×16 (row-major):   a0 = A[g][c..c+1]  a1 = A[g+8][c..]  a2 = A[g][c+8..]  a3 = A[g+8][c+8..]
//   B 16×8  (k × n):       b0 = B[c..c+1][g]  b1 = B[c+8..c+9][g]
//   C 16×8  (f32):         c0,c1 = C[g][c..c+1]   c2,c3 = C[g+8][c..c+1]
// The three loaders below produce them from a tile:
//   load_a     A = tile[m0.., k0..]                     (rows are m)
//   load_b     B[k][n] = tile[n0 + n][k0 + k]  (no trans: rows are n; Q·Kᵀ, dO·Vᵀ, K·Qᵀ)
//   load_b_t   B[k][n] = tile[k0 + k][n0 + n]  (.trans:  rows are k; P·V, dS·K, Pᵀ·dO)
// each load_b* giving two adjacent 8-column n-tiles (b[0..1] and b[2..3]).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>

#include "forge/backend/cuda/check.h"
#include "forge/backend/cuda/context.h"
#include "forge/core/dtype.h"
#include "forge/core/error.h"
#include "forge/ops/attention.h"
#include "forge/ops/attention_mask.h"

namespace forge::cuda {
enum class FlashKernels;  // ops.h
}

namespace forge::cuda::flash {

using bf16 = __nv_bfloat16;
using f16 = __half;

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Row layout of a tile with D 16-bit columns. When a row is a multiple of 128 bytes (D = 64, 128)
// the 16-byte chunks are XOR-swizzled as above; otherwise (D = 32, 80, 96) rows are padded by 16
// bytes instead: 80, 176 and 208 bytes are 20, 44 and 52 four-byte banks, so the eight rows an
// ldmatrix reads start in eight different 16-byte bank groups (20·r, 44·r, 52·r mod 32 are
// distinct multiples of 4 for r = 0..7) and no access conflicts either way.
template <int D>
struct TileLayout {
  static constexpr bool kSwizzle = (D * 2) % 128 == 0;
  static constexpr int kRowBytes = kSwizzle ? D * 2 : D * 2 + 16;
  static_assert(D % 16 == 0, "head size must be a multiple of 16 (one MMA k-step)");
};

// Byte address of element (row, col) of a tile with D columns; col % 8 == 0.
template <int D>
__device__ __forceinline__ uint32_t swz(uint32_t base, int row, int col) {
  if constexpr (TileLayout<D>::kSwizzle) return base + row * (D * 2) + ((((col >> 3) ^ (row & 7))) << 4);
  else return base + row * TileLayout<D>::kRowBytes + col * 2;
}

// 16 bytes global → shared, asynchronously; src_bytes 0 zero-fills (rows past the end).
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// Rows [row0, row0 + R) of a (T, ·) matrix with token stride `ld` (elements) into an R × D tile
// (TileLayout); rows ≥ T are zero-filled. All kThreads threads of the block take part.
template <int R, int D, int kThreads, typename T>
__device__ __forceinline__ void load_tile(uint32_t tile, const T* __restrict__ src, int64_t ld, int row0,
                                          int T_) {
  constexpr int kChunks = R * D / 8;
#pragma unroll
  for (int it = 0; it < (kChunks + kThreads - 1) / kThreads; ++it) {
    const int idx = it * kThreads + static_cast<int>(threadIdx.x);
    if (kChunks % kThreads != 0 && idx >= kChunks) break;
    const int r = idx / (D / 8), ch = idx % (D / 8);
    const bool in = row0 + r < T_;
    const T* p = in ? src + static_cast<int64_t>(row0 + r) * ld + ch * 8 : src;
    cp_async16(swz<D>(tile, r, ch * 8), p, in ? 16 : 0);
  }
}

// One K/V stage of the mma.sync forward and dQ kernels: key rows [row0, row0 + BK) of k, then
// of v, as two BK × D tiles from `stage`.
template <int BK, int D, int kThreads, typename T>
__device__ __forceinline__ void load_kv(uint32_t stage, const T* __restrict__ k, const T* __restrict__ v,
                                        int64_t ld_k, int64_t ld_v, int row0, int T_) {
  load_tile<BK, D, kThreads>(stage, k, ld_k, row0, T_);
  load_tile<BK, D, kThreads>(stage + BK * TileLayout<D>::kRowBytes, v, ld_v, row0, T_);
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

template <int D>
__device__ __forceinline__ void load_a(uint32_t (&a)[4], uint32_t tile, int m0, int k0, int lane) {
  ldmatrix_x4(a, swz<D>(tile, m0 + (lane & 15), k0 + (lane >> 4) * 8));
}
template <int D>
__device__ __forceinline__ void load_b(uint32_t (&b)[4], uint32_t tile, int n0, int k0, int lane) {
  ldmatrix_x4(b, swz<D>(tile, n0 + (lane & 7) + ((lane >> 4) << 3), k0 + ((lane >> 3) & 1) * 8));
}
template <int D>
__device__ __forceinline__ void load_b_t(uint32_t (&b)[4], uint32_t tile, int k0, int n0, int lane) {
  ldmatrix_x4_trans(b, swz<D>(tile, k0 + (lane & 7) + ((lane >> 3) & 1) * 8, n0 + (lane >> 4) * 8));
}

// d += a·b, 16×8×16, f32 accumulate.
template <typename T>
__device__ __forceinline__ void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1);

template <>
__device__ __forceinline__ void mma<bf16>(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <>
__device__ __forceinline__ void mma<f16>(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// 2^x on the SFU (ex2.approx, ~2 ulp): the arguments are ≤ 0 (scores minus their running max) and
// the masked ones about −6e37, which gives +0. kFtz selects the .ftz form (denormal results
// flushed to 0), one instruction instead of a short sequence: 3–9% faster forwards at head size
// 64 on the H200, but at head size 128 it made ptxas spill 16–20 bytes (255 registers either
// way), so the kernels use it only where D ≤ 64.
template <bool kFtz>
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  if constexpr (kFtz) asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  else asm("ex2.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// Two f32 → one register of two 16-bit values (x in the low half), rounded to nearest.
template <typename T>
__device__ __forceinline__ uint32_t pack2(float x, float y);
template <>
__device__ __forceinline__ uint32_t pack2<bf16>(float x, float y) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(x, y);
  return *reinterpret_cast<const uint32_t*>(&v);
}
template <>
__device__ __forceinline__ uint32_t pack2<f16>(float x, float y) {
  const __half2 v = __floats2half2_rn(x, y);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// The A fragment of k-step kk of a product whose left operand is a 16 × N f32 accumulator
// tile c[N/8][4] (P in P·V, dS in dS·K): columns 16kk..16kk+15 are n-tiles 2kk and 2kk+1.
template <typename T, int NT>
__device__ __forceinline__ void acc_to_a(uint32_t (&a)[4], const float (&c)[NT][4], int kk) {
  a[0] = pack2<T>(c[2 * kk][0], c[2 * kk][1]);
  a[1] = pack2<T>(c[2 * kk][2], c[2 * kk][3]);
  a[2] = pack2<T>(c[2 * kk + 1][0], c[2 * kk + 1][1]);
  a[3] = pack2<T>(c[2 * kk + 1][2], c[2 * kk + 1][3]);
}

template <int NT>
__device__ __forceinline__ void zero_acc(float (&acc)[NT][4]) {
#pragma unroll
  for (int i = 0; i < NT; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.0f;
}

// acc (16 × 8·NT, f32) += A·Bᵀ over all D columns, where A = rows m0 .. m0 + 15 of tile `a` and
// B = rows 0 .. 8·NT − 1 of tile `b`: the backward's Q·Kᵀ, dO·Vᵀ, K·Qᵀ and V·dOᵀ.
template <typename T, int D, int NT>
__device__ __forceinline__ void mma_abt(float (&acc)[NT][4], uint32_t a, int m0, uint32_t b, int lane) {
#pragma unroll
  for (int ks = 0; ks < D / 16; ++ks) {
    uint32_t fa[4];
    load_a<D>(fa, a, m0, ks * 16, lane);
#pragma unroll
    for (int np = 0; np < NT / 2; ++np) {
      uint32_t fb[4];
      load_b<D>(fb, b, np * 16, ks * 16, lane);
      mma<T>(acc[2 * np], fa, fb[0], fb[1]);
      mma<T>(acc[2 * np + 1], fa, fb[2], fb[3]);
    }
  }
}

// acc (16 × D, f32) += P·B, where P is the 16 × 8·NT accumulator tile `pt` rounded to T and B =
// rows 0 .. 8·NT − 1 of tile `b`: the backward's dS·K, Pᵀ·dO and dSᵀ·Q.
template <typename T, int D, int NT>
__device__ __forceinline__ void mma_pb(float (&acc)[D / 8][4], const float (&pt)[NT][4], uint32_t b, int lane) {
#pragma unroll
  for (int kk = 0; kk < NT / 2; ++kk) {
    uint32_t fa[4];
    acc_to_a<T, NT>(fa, pt, kk);
#pragma unroll
    for (int dp = 0; dp < D / 16; ++dp) {
      uint32_t fb[4];
      load_b_t<D>(fb, b, kk * 16, dp * 16, lane);
      mma<T>(acc[2 * dp], fa, fb[0], fb[1]);
      mma<T>(acc[2 * dp + 1], fa, fb[2], fb[3]);
    }
  }
}

// The backward kernels' stores: rows row0 and row0 + 8 (those < T) of a warp's 16-row f32
// accumulator tiles — this lane's part, columns 8·dt + c and c + 1 — rounded to T into rows of
// token stride ld (row0 = the warp's first row + g). store_rows: dq, times `scale`;
// store_kv_rows: dk times `scale` and dv as is, row by row.
template <typename T, int DT>
__device__ __forceinline__ void store_rows(T* dst, int64_t ld, const float (&acc)[DT][4], float scale, int row0,
                                           int T_, int c) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int i = row0 + 8 * r;
    if (i >= T_) continue;
    T* row = dst + static_cast<int64_t>(i) * ld;
#pragma unroll
    for (int dt = 0; dt < DT; ++dt)
      *reinterpret_cast<uint32_t*>(row + dt * 8 + c) = pack2<T>(acc[dt][2 * r] * scale, acc[dt][2 * r + 1] * scale);
  }
}
template <typename T, int DT>
__device__ __forceinline__ void store_kv_rows(T* dk, int64_t ld_k, const float (&k)[DT][4], float scale, T* dv,
                                              int64_t ld_v, const float (&v)[DT][4], int row0, int T_, int c) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int j = row0 + 8 * r;
    if (j >= T_) continue;
    T* krow = dk + static_cast<int64_t>(j) * ld_k;
    T* vrow = dv + static_cast<int64_t>(j) * ld_v;
#pragma unroll
    for (int dt = 0; dt < DT; ++dt) {
      *reinterpret_cast<uint32_t*>(krow + dt * 8 + c) = pack2<T>(k[dt][2 * r] * scale, k[dt][2 * r + 1] * scale);
      *reinterpret_cast<uint32_t*>(vrow + dt * 8 + c) = pack2<T>(v[dt][2 * r], v[dt][2 * r + 1]);
    }
  }
}

// Keys visible from query i: [lo, hi) (ops/attention.h).
struct Visibility {
  int T_;
  bool causal;
  int window;
  __device__ __forceinline__ bool operator()(int i, int j) const {
    return j < T_ && i < T_ && (!causal || j <= i) && (window <= 0 || j > i - window);
  }
  // The same rule as intervals (ops/attention_mask.h), for the wgmma kernels' masked tiles: an
  // element is then two compares of a compile-time column offset against its row's bounds,
  // where operator() cost ~11 predicate and integer instructions an element (the PTX of the
  // head-size-64 forward).
  __device__ __forceinline__ IndexRange keys_of(int i) const {
    return keys_seen_by(i, T_, causal, window);
  }
  __device__ __forceinline__ IndexRange queries_of(int j) const {
    return queries_seeing(j, T_, causal, window);
  }
};

// Kernel arguments shared by the three passes. Pointers are to element 0 of the tensors;
// token strides are in elements (see ops.h, AttentionStrides).
struct FlashParams {
  const void* q;
  const void* k;
  const void* v;
  void* o;            // forward: output (written); backward: the forward's output (read)
  const void* dout;
  void* dq;
  void* dk;
  void* dv;
  float* lse;         // (B, NH, T)
  float* delta;       // (B, NH, T)
  int64_t ld_q, ld_k, ld_v, ld_o;
  int B, T_, NH, NKV, HS;
  bool causal;
  int window;
  float scale_log2;   // log2(e) / sqrt(HS)
  float scale;        // 1 / sqrt(HS)
  // Packed rows: (B, T) first token of each token's segment (segment_starts in ops.h), or
  // nullptr. Read only by the kernels instantiated with kSeg = true.
  const int32_t* seg_start;
  // The backward's one-kernel dQ (flash_attention_bwd_wgmma.cu): f32 partial sums of dQ by
  // (b, h, query tile, warpgroup) and, after a tile ticket, one ordering counter per such tile.
  // nullptr where the kernels do not use them.
  float* dq_acc;
  uint32_t* dq_sem;
  // The wgmma forward's tile counter (persistent blocks take their next tile from it), zeroed
  // before the launch; nullptr elsewhere.
  uint32_t* tile_ctr;
};

// Segments. Query i of batch row b also sees only keys j >= seg_lo(i), the first token of its
// segment. seg_lo is nondecreasing in i within a row (segments are runs), so over query rows
// [i0, i1] its minimum is seg_lo(i0) and its maximum seg_lo(i1): the tile tests need two loads.
// Rows past the end (i >= T, never stored) read row T - 1, rows before the start (the wgmma
// forward's partial first tile, never stored) row 0. Without kSeg every bound is 0 and each use
// below is written `kSeg && ...`, so those kernels compile to the code without segments.
template <bool kSeg>
__device__ __forceinline__ int seg_lo(const FlashParams& p, int b, int i) {
  if constexpr (kSeg) return __ldg(p.seg_start + static_cast<int64_t>(b) * p.T_ + min(max(i, 0), p.T_ - 1));
  else return 0;
}

// The backward over key tiles: the first query row of batch row b whose segment starts after
// key kl (0 <= kl < T), i.e. the end of kl's segment; it and every later row see no key <= kl.
// T when kl's segment runs to the end. Binary search on the nondecreasing seg_lo; rows <= kl
// have seg_lo <= kl, so the answer is in [kl + 1, T].
__device__ __forceinline__ int seg_rows_end(const FlashParams& p, int b, int kl) {
  const int32_t* start = p.seg_start + static_cast<int64_t>(b) * p.T_;
  int lo = kl + 1, hi = p.T_;
  while (lo < hi) {
    const int mid = lo + (hi - lo) / 2;
    if (__ldg(start + mid) > kl) hi = mid;
    else lo = mid + 1;
  }
  return lo;
}

// The key tiles [begin, end) of BK keys that query rows [q0, q0 + BQ) can see.
struct TileRange {
  int begin, end;
};
template <int BQ, int BK>
__device__ __forceinline__ TileRange key_tiles(const FlashParams& p, int q0) {
  const int k_end = p.causal ? min(p.T_, q0 + BQ) : p.T_;
  const int k_begin = p.window > 0 ? max(0, q0 - p.window + 1) : 0;
  return {k_begin / BK, (k_end + BK - 1) / BK};
}

// Shape, strides and alignment checks shared by the forward and backward launchers; fills the
// shape fields of p (pointers are set by the caller). `what` names the op in errors.
inline void fill_shape(FlashParams& p, DType dt, const AttentionShape& s, int64_t ld_q, int64_t ld_k,
                       int64_t ld_v, int64_t ld_o, const char* what) {
  FORGE_CHECK(dt == DType::kBF16 || dt == DType::kF16, what, ": dtype ", dtype_name(dt),
              " is not supported (bf16 or f16)");
  FORGE_CHECK(s.HS == 32 || s.HS == 64 || s.HS == 80 || s.HS == 96 || s.HS == 128, what, ": head size ", s.HS,
              " is not supported (32, 64, 80, 96 or 128)");
  FORGE_CHECK(s.B >= 0 && s.T >= 0 && s.NH > 0 && s.NKV > 0 && s.NH % s.NKV == 0, what, ": bad shape B=", s.B,
              " T=", s.T, " NH=", s.NH, " NKV=", s.NKV);
  FORGE_CHECK(s.window >= 0, what, ": negative window ", s.window);
  p.ld_q = ld_q ? ld_q : static_cast<int64_t>(s.NH) * s.HS;
  p.ld_k = ld_k ? ld_k : static_cast<int64_t>(s.NKV) * s.HS;
  p.ld_v = ld_v ? ld_v : static_cast<int64_t>(s.NKV) * s.HS;
  p.ld_o = ld_o ? ld_o : static_cast<int64_t>(s.NH) * s.HS;
  FORGE_CHECK(p.ld_q % 8 == 0 && p.ld_k % 8 == 0 && p.ld_v % 8 == 0 && p.ld_o % 8 == 0, what,
              ": token strides must be multiples of 8 elements (16 bytes)");
  FORGE_CHECK(p.ld_q >= static_cast<int64_t>(s.NH) * s.HS && p.ld_o >= static_cast<int64_t>(s.NH) * s.HS &&
                  p.ld_k >= static_cast<int64_t>(s.NKV) * s.HS && p.ld_v >= static_cast<int64_t>(s.NKV) * s.HS,
              what, ": a token stride is smaller than the row it holds");
  p.B = s.B;
  p.T_ = s.T;
  p.NH = s.NH;
  p.NKV = s.NKV;
  p.HS = s.HS;
  p.causal = s.causal;
  p.window = s.window;
  p.scale = 1.0f / std::sqrt(static_cast<float>(s.HS));
  p.scale_log2 = p.scale * 1.4426950408889634f;
}

// The Hopper kernels (flash_attention_wgmma.cu, flash_attention_bwd_wgmma.cu), and whether a call
// uses them (FlashKernels in ops.h; `what` names the op in errors). bwd_wgmma runs after the D
// preprocess (launch_delta), like the mma.sync backward; split: head size 64 as two kernels too
// (FlashKernels::kWgmmaSplit).
void fwd_wgmma(Context& ctx, DType dt, const FlashParams& p);
void bwd_wgmma(Context& ctx, DType dt, const FlashParams& p, bool split);
bool use_wgmma(const Context& ctx, FlashKernels kernels, int HS, const char* what);

// Launches Kernel on ctx's stream with `smem` bytes of dynamic shared memory; the first launch
// of each kernel (the static is per template instance) raises its limit past the default 48 KB.
template <auto Kernel, typename... Args>
void launch_with_smem(Context& ctx, dim3 grid, int threads, int smem, const Args&... args) {
  static const bool limit_set = [smem] {
    FORGE_CUDA_CHECK(cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    return true;
  }();
  (void)limit_set;
  Kernel<<<grid, threads, smem, ctx.stream()>>>(args...);
  FORGE_CUDA_CHECK(cudaGetLastError());
}

inline void check_aligned(const void* ptr, const char* what, const char* name) {
  FORGE_CHECK(reinterpret_cast<uintptr_t>(ptr) % 16 == 0, what, ": ", name, " is not 16-byte aligned");
}

}  // namespace forge::cuda::flash
