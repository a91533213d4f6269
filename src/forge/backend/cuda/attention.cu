// CUDA scaled dot-product attention, unfused: cuBLASLt GEMMs for the four products and two
// row kernels for the softmax and its backward. Same contract as cpu::attention_fwd/bwd
// (ops/attention.h); a fused flash-attention kernel replaces the forward in a later issue.
//
// Layout without copies. q (B, T, NH, HS) and k/v (B, T, NKV, HS) are never transposed: the
// T×HS matrix of head h in batch b starts at q + (b·T·NH + h)·HS with row stride NH·HS, which
// the GEMM wrapper takes as a strided view (lda/ldb/ldc). A strided batch needs one batch
// stride, and b has one (T·NH·HS) while the (b, h) pair has none, so every product is one
// cuBLASLt call per query head, batched over b. GQA is the same index map the CPU uses — query
// head h reads kv head h / (NH / NKV) — applied to the K/V pointer; nothing is expanded.
//
// Forward, per head h: S = scale·Q_h·K_hᵀ (B, T, T) into an f32 scratch; the softmax kernel
// turns S into att[:, h] (dt), exactly 0 where masked; out_h = att_h·V_h (dt, f32 accumulate).
// Only one head's scores exist at a time, so the scratch is B·T²·4 bytes, not NH times that.
//
// Backward, per kv head and then per query head h of its group, in head order:
//   dP = dO_h·V_hᵀ (f32 scratch); dS = att∘(dP − rowsum(dP∘att)) (dt: it is a GEMM operand
//   next to K and Q, and cuBLASLt wants both operands in one type; in f32 it overwrites dP);
//   dq_h += scale·dS·K_h;  dv += att_hᵀ·dO_h;  dk += scale·dSᵀ·Q_h.
// Every product accumulates with beta = 1 straight into the strided gradient views. The one
// exception is GQA in bf16: the NH/NKV query heads of a group would each round dk/dv to bf16,
// so their contributions are summed in f32 scratch (beta chaining, in head order) and added to
// dk/dv once, as the CPU reference does. No atomics; every sum has a fixed order, and cuBLASLt
// is deterministic for a fixed algorithm, so two runs are bit-identical.
//
// Softmax kernels: one warp per row (T up to a few thousand here), two passes over the row —
// an online max/sum-exp over the visible keys only, then the normalised write — with 16-byte
// f32 loads when T % 4 == 0. Masking is by key range [lo, hi), never by −inf: the running max
// starts at −FLT_MAX, masked entries are written as 0 and a row without visible keys gets 0.
// Segments (packed rows): lo is raised to the row's segment start (segment_starts_kernel).
// They move 6–8 (fwd) and 8–12 (bwd) bytes per score, bf16–f32, and are memory-bound; the
// GEMMs dominate. Causal rows still pay the full T×T GEMMs (a 2× waste the fused kernel removes).
//
// ptxas (sm_90a, CUDA 13.0, -O3), registers / spill bytes, all with 0 stack frame:
//   attention_softmax_fwd_kernel  <float, 4> 28 / 0   <bf16, 4> 26 / 0
//                                 <float, 1> 32 / 0   <bf16, 1> 32 / 0
//   attention_softmax_bwd_kernel  <float, 4> 40 / 0   <bf16, 4> 36 / 0
//                                 <float, 1> 40 / 0   <bf16, 1> 32 / 0
//   add_f32_to_strided_kernel     20 / 0
#include <cuda_bf16.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>

#include "forge/backend/cuda/check.h"
#include "forge/backend/cuda/context.h"
#include "forge/backend/cuda/gemm.h"
#include "forge/backend/cuda/kernel_utils.cuh"
#include "forge/backend/cuda/ops.h"
#include "forge/core/error.h"

namespace forge::cuda {
namespace {

using bf16 = __nv_bfloat16;

constexpr int kRowsPerBlock = 4;  // warps per block, one row each

// dtype conversions shared with the other kernels.
using kernels::from_f32;
using kernels::to_f32;

// kVec consecutive elements in one access (16 bytes for 4 floats, 8 for 4 bf16).
template <typename T, int kVec>
struct alignas(sizeof(T) * kVec) Pack {
  T v[kVec];
};

template <typename T, int kVec>
__device__ __forceinline__ void load(const T* p, float (&x)[kVec]) {
  const Pack<T, kVec> pk = *reinterpret_cast<const Pack<T, kVec>*>(p);
#pragma unroll
  for (int e = 0; e < kVec; ++e) x[e] = to_f32(pk.v[e]);
}

template <typename T, int kVec>
__device__ __forceinline__ void store(T* p, const float (&x)[kVec]) {
  Pack<T, kVec> pk;
#pragma unroll
  for (int e = 0; e < kVec; ++e) pk.v[e] = from_f32<T>(x[e]);
  *reinterpret_cast<Pack<T, kVec>*>(p) = pk;
}

// Merges two (max, Σexp(x − max)) pairs. Finite throughout: an empty pair is (−FLT_MAX, 0) and
// contributes 0·exp(≤ 0). Commutative bit for bit, so a butterfly leaves all lanes equal.
__device__ __forceinline__ void merge_max_sum(float& m, float& s, float m2, float s2) {
  const float mn = fmaxf(m, m2);
  s = s * expf(m - mn) + s2 * expf(m2 - mn);
  m = mn;
}

// Keys visible from query i: [lo, hi) (ops/attention.h).
struct KeyRange {
  int lo, hi;
};

__device__ __forceinline__ KeyRange visible_keys(int i, int T_, bool causal, int window) {
  return {window > 0 ? max(0, i - window + 1) : 0, causal ? i + 1 : T_};
}

struct SoftmaxArgs {
  int rows;    // B·T rows of the per-head (B, T, T) scratch
  int T_, NH;  // att is (B, NH, T, T); this launch covers head h
  int h;
  bool causal;
  int window;
  const int32_t* seg_start = nullptr;  // (B, T) first token of each token's segment, or none
};

// The keys row b·T + i of the scores sees: the shape's range, raised to its segment's start.
__device__ __forceinline__ KeyRange row_keys(const SoftmaxArgs& a, int row) {
  KeyRange r = visible_keys(row % a.T_, a.T_, a.causal, a.window);
  if (a.seg_start != nullptr) r.lo = max(r.lo, a.seg_start[row]);
  return r;
}

// start[b, t] = the first token of t's run of equal seg ids in row b: an inclusive max-scan of
// (t where a run begins, else 0) along the row. One block per row, kScanThreads tokens per step
// (Hillis–Steele in shared memory), the running maximum carried across steps.
constexpr int kScanThreads = 1024;
__global__ void __launch_bounds__(kScanThreads)
    segment_starts_kernel(int32_t* __restrict__ start, const int32_t* __restrict__ seg, int T_) {
  __shared__ int buf[kScanThreads];
  const int32_t* s = seg + static_cast<int64_t>(blockIdx.x) * T_;
  int32_t* out = start + static_cast<int64_t>(blockIdx.x) * T_;
  const int x = threadIdx.x;
  int carry = 0;  // the last run start before this step
  for (int t0 = 0; t0 < T_; t0 += kScanThreads) {
    const int t = t0 + x;
    buf[x] = t < T_ && t > 0 && s[t] != s[t - 1] ? t : 0;
    __syncthreads();
    for (int off = 1; off < kScanThreads; off *= 2) {
      const int y = x >= off ? buf[x - off] : 0;
      __syncthreads();
      buf[x] = max(buf[x], y);
      __syncthreads();
    }
    if (t < T_) out[t] = max(carry, buf[x]);
    carry = max(carry, buf[kScanThreads - 1]);
    __syncthreads();  // every thread has read buf before the next step writes it
  }
}

// att[b, h, i, :] = softmax of scores[b, i, :] over the visible keys, 0 elsewhere.
// scores (B, T, T) f32 for head h; one warp per row.
template <typename T, int kVec>
__global__ void __launch_bounds__(kRowsPerBlock * 32)
    attention_softmax_fwd_kernel(T* __restrict__ att, const float* __restrict__ scores,
                                 SoftmaxArgs a) {
  const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= a.rows) return;  // whole warp
  const int b = row / a.T_, i = row % a.T_;
  const float* s_row = scores + static_cast<int64_t>(row) * a.T_;               // (T)
  T* p_row = att + ((static_cast<int64_t>(b) * a.NH + a.h) * a.T_ + i) * a.T_;  // (T)
  const KeyRange r = row_keys(a, row);

  float m = -FLT_MAX, sum = 0.0f;
  for (int j0 = r.lo - r.lo % kVec + lane * kVec; j0 < r.hi; j0 += 32 * kVec) {
    float x[kVec];
    load<float, kVec>(s_row + j0, x);
#pragma unroll
    for (int e = 0; e < kVec; ++e) {
      const int j = j0 + e;
      if (j < r.lo || j >= r.hi) continue;
      if (x[e] > m) {
        sum = sum * expf(m - x[e]) + 1.0f;
        m = x[e];
      } else {
        sum += expf(x[e] - m);
      }
    }
  }
#pragma unroll
  for (int off = 16; off > 0; off /= 2)
    merge_max_sum(m, sum, __shfl_xor_sync(0xffffffffu, m, off),
                  __shfl_xor_sync(0xffffffffu, sum, off));
  const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;  // sum ≥ 1 unless no key is visible

  for (int j0 = lane * kVec; j0 < a.T_; j0 += 32 * kVec) {
    float x[kVec] = {};
    if (j0 + kVec > r.lo && j0 < r.hi) load<float, kVec>(s_row + j0, x);
#pragma unroll
    for (int e = 0; e < kVec; ++e) {
      const int j = j0 + e;
      x[e] = (j >= r.lo && j < r.hi) ? expf(x[e] - m) * inv : 0.0f;
    }
    store<T, kVec>(p_row + j0, x);
  }
}

// ds[b, i, :] = att∘(dp − Σ_j dp·att) over the visible keys, 0 elsewhere. dp (B, T, T) f32 for
// head h; ds (B, T, T) may be the same memory as dp (f32): each lane reads an element before it
// overwrites it, and the row sum is complete before the first write.
template <typename T, int kVec>
__global__ void __launch_bounds__(kRowsPerBlock * 32)
    attention_softmax_bwd_kernel(T* ds, const float* dp, const T* __restrict__ att, SoftmaxArgs a) {
  const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= a.rows) return;
  const int b = row / a.T_, i = row % a.T_;
  const float* dp_row = dp + static_cast<int64_t>(row) * a.T_;                        // (T)
  T* ds_row = ds + static_cast<int64_t>(row) * a.T_;                                  // (T)
  const T* p_row = att + ((static_cast<int64_t>(b) * a.NH + a.h) * a.T_ + i) * a.T_;  // (T)
  const KeyRange r = row_keys(a, row);

  float dot = 0.0f;
  for (int j0 = r.lo - r.lo % kVec + lane * kVec; j0 < r.hi; j0 += 32 * kVec) {
    float g[kVec], p[kVec];
    load<float, kVec>(dp_row + j0, g);
    load<T, kVec>(p_row + j0, p);
#pragma unroll
    for (int e = 0; e < kVec; ++e) {
      const int j = j0 + e;
      if (j >= r.lo && j < r.hi) dot += g[e] * p[e];
    }
  }
#pragma unroll
  for (int off = 16; off > 0; off /= 2) dot += __shfl_xor_sync(0xffffffffu, dot, off);

  for (int j0 = lane * kVec; j0 < a.T_; j0 += 32 * kVec) {
    float g[kVec] = {}, p[kVec] = {};
    if (j0 + kVec > r.lo && j0 < r.hi) {
      load<float, kVec>(dp_row + j0, g);
      load<T, kVec>(p_row + j0, p);
    }
#pragma unroll
    for (int e = 0; e < kVec; ++e) {
      const int j = j0 + e;
      g[e] = (j >= r.lo && j < r.hi) ? p[e] * (g[e] - dot) : 0.0f;
    }
    store<T, kVec>(ds_row + j0, g);
  }
}

// dst[r, c] += src[r, c] for a (rows, cols) f32 src and a strided dst (row stride ld). Runs once
// per kv head in the 16-bit (bf16 or f16) GQA backward over B·T·HS elements — 1/T of the GEMM
// traffic — so it stays scalar.
template <typename T>
__global__ void add_f32_to_strided_kernel(T* __restrict__ dst, int64_t ld,
                                          const float* __restrict__ src, int64_t rows, int cols) {
  const int64_t n = rows * cols;
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < n;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    T* d = dst + (idx / cols) * ld + idx % cols;
    *d = from_f32<T>(to_f32(*d) + src[idx]);
  }
}

template <typename T>
void launch_softmax_fwd(Context& ctx, void* att, const float* scores, const SoftmaxArgs& a) {
  const dim3 grid((a.rows + kRowsPerBlock - 1) / kRowsPerBlock), block(kRowsPerBlock * 32);
  if (a.T_ % 4 == 0)
    attention_softmax_fwd_kernel<T, 4>
        <<<grid, block, 0, ctx.stream()>>>(static_cast<T*>(att), scores, a);
  else
    attention_softmax_fwd_kernel<T, 1>
        <<<grid, block, 0, ctx.stream()>>>(static_cast<T*>(att), scores, a);
  FORGE_CUDA_CHECK_LAUNCH();
}

template <typename T>
void launch_softmax_bwd(Context& ctx, void* ds, const float* dp, const void* att,
                        const SoftmaxArgs& a) {
  const dim3 grid((a.rows + kRowsPerBlock - 1) / kRowsPerBlock), block(kRowsPerBlock * 32);
  if (a.T_ % 4 == 0)
    attention_softmax_bwd_kernel<T, 4>
        <<<grid, block, 0, ctx.stream()>>>(static_cast<T*>(ds), dp, static_cast<const T*>(att), a);
  else
    attention_softmax_bwd_kernel<T, 1>
        <<<grid, block, 0, ctx.stream()>>>(static_cast<T*>(ds), dp, static_cast<const T*>(att), a);
  FORGE_CUDA_CHECK_LAUNCH();
}

template <typename T>
void launch_add_f32_to_strided(Context& ctx, void* dst, int64_t ld, const float* src, int64_t rows,
                               int cols) {
  const int64_t n = rows * cols;
  const int block = 256;
  const int grid = static_cast<int>(std::min<int64_t>((n + block - 1) / block, 8 * 1024));
  add_f32_to_strided_kernel<T><<<grid, block, 0, ctx.stream()>>>(static_cast<T*>(dst), ld, src,
                                                                 rows, cols);
  FORGE_CUDA_CHECK_LAUNCH();
}

void check_args(DType dt, const AttentionShape& s, const char* op) {
  FORGE_CHECK(dt == DType::kF32 || dt == DType::kBF16 || dt == DType::kF16, "[", op,
              "] unsupported dtype ", dtype_name(dt));
  FORGE_CHECK(s.B >= 0 && s.T >= 0 && s.NH > 0 && s.NKV > 0 && s.HS > 0, "[", op,
              "] bad shape B=", s.B, " T=", s.T, " NH=", s.NH, " NKV=", s.NKV, " HS=", s.HS);
  FORGE_CHECK(s.NH % s.NKV == 0, "[", op, "] NH=", s.NH, " is not a multiple of NKV=", s.NKV);
  FORGE_CHECK(s.window >= 0, "[", op, "] negative window ", s.window);
}

// Per-head strided views as GEMM operands: element offsets of head h's (T, HS) matrix in a
// (B, T, H, HS) tensor, its row stride and its batch (b) stride; and of head h's (T, T) matrix
// in att (B, NH, T, T).
struct Views {
  const AttentionShape& s;
  int64_t head(int h) const { return static_cast<int64_t>(h) * s.HS; }
  int64_t ld(int H) const { return static_cast<int64_t>(H) * s.HS; }
  int64_t batch_stride(int H) const { return static_cast<int64_t>(s.T) * H * s.HS; }
  int64_t att_head(int h) const { return static_cast<int64_t>(h) * s.T * s.T; }
  int64_t att_batch_stride() const { return static_cast<int64_t>(s.NH) * s.T * s.T; }
};

const char* at(const void* p, int64_t elems, size_t es) {
  return static_cast<const char*>(p) + elems * static_cast<int64_t>(es);
}
char* at(void* p, int64_t elems, size_t es) {
  return static_cast<char*>(p) + elems * static_cast<int64_t>(es);
}

}  // namespace

void segment_starts(Context& ctx, int32_t* start, const int32_t* seg, int B, int T_) {
  FORGE_CHECK(B >= 0 && T_ >= 0, "segment_starts: bad shape B=", B, " T=", T_);
  if (B == 0 || T_ == 0) return;
  segment_starts_kernel<<<B, kScanThreads, 0, ctx.stream()>>>(start, seg, T_);
  FORGE_CUDA_CHECK_LAUNCH();
}

void attention_fwd(Context& ctx, DType dt, void* out, void* att, const void* q, const void* k,
                   const void* v, const AttentionShape& s, const int32_t* seg) {
  check_args(dt, s, "attention_fwd");
  if (s.B == 0 || s.T == 0) return;
  const size_t es = dtype_size(dt);
  const int group = s.NH / s.NKV;
  const Views view{s};
  const int64_t tt = static_cast<int64_t>(s.T) * s.T;
  DeviceBuffer<float> scores(ctx.allocator(), static_cast<size_t>(s.B) * tt);  // (B, T, T)
  SoftmaxArgs base{s.B * s.T, s.T, s.NH, 0, s.causal, s.window};
  DeviceBuffer<int32_t> starts;  // (B, T) with segments
  if (seg != nullptr) {
    starts = DeviceBuffer<int32_t>(ctx.allocator(), static_cast<size_t>(s.B) * s.T);
    segment_starts(ctx, starts.data(), seg, s.B, s.T);
    base.seg_start = starts.data();
  }

  for (int h = 0; h < s.NH; ++h) {
    const int kvh = h / group;
    GemmArgs qk;  // scores (T, T) = scale · Q_h (T, HS) · K_hᵀ, per b
    qk.M = s.T, qk.N = s.T, qk.K = s.HS, qk.trans_b = true;
    qk.ab_type = dt, qk.c_type = DType::kF32, qk.alpha = 1.0f / std::sqrt(float(s.HS));
    qk.batch = s.B;
    qk.lda = view.ld(s.NH), qk.stride_a = view.batch_stride(s.NH);
    qk.ldb = view.ld(s.NKV), qk.stride_b = view.batch_stride(s.NKV);
    qk.stride_c = tt;
    gemm(ctx, qk, at(q, view.head(h), es), at(k, view.head(kvh), es), scores.data());

    SoftmaxArgs sa = base;
    sa.h = h;
    kernels::dispatch_dtype(dt, "attention_fwd", [&](auto tag) {
      launch_softmax_fwd<decltype(tag)>(ctx, att, scores.data(), sa);
    });

    GemmArgs pv;  // out_h (T, HS) = att_h (T, T) · V_h (T, HS), per b
    pv.M = s.T, pv.N = s.HS, pv.K = s.T;
    pv.ab_type = pv.c_type = dt;
    pv.batch = s.B;
    pv.stride_a = view.att_batch_stride();
    pv.ldb = view.ld(s.NKV), pv.stride_b = view.batch_stride(s.NKV);
    pv.ldc = view.ld(s.NH), pv.stride_c = view.batch_stride(s.NH);
    gemm(ctx, pv, at(att, view.att_head(h), es), at(v, view.head(kvh), es),
         at(out, view.head(h), es));
  }
}

void attention_bwd(Context& ctx, DType dt, void* dq, void* dk, void* dv, const void* dout,
                   const void* q, const void* k, const void* v, const void* att,
                   const AttentionShape& s, const int32_t* seg) {
  check_args(dt, s, "attention_bwd");
  if (s.B == 0 || s.T == 0) return;
  const size_t es = dtype_size(dt);
  const int group = s.NH / s.NKV;
  const float scale = 1.0f / std::sqrt(float(s.HS));
  const Views view{s};
  const int64_t tt = static_cast<int64_t>(s.T) * s.T;
  const size_t bt = static_cast<size_t>(s.B) * s.T;
  DeviceBuffer<float> dp(ctx.allocator(), bt * s.T);  // (B, T, T) f32
  DeviceBuffer<uint8_t> ds_16;                        // (B, T, T) when dt is bf16 or f16
  if (dt != DType::kF32) ds_16 = DeviceBuffer<uint8_t>(ctx.allocator(), bt * s.T * es);
  void* ds = dt == DType::kF32 ? static_cast<void*>(dp.data()) : ds_16.data();
  // 16-bit GQA: the group's dk/dv contributions summed in f32, (B, T, HS) each.
  const bool staged = dt != DType::kF32 && group > 1;
  DeviceBuffer<float> dk_acc, dv_acc;
  if (staged) {
    dk_acc = DeviceBuffer<float>(ctx.allocator(), bt * s.HS);
    dv_acc = DeviceBuffer<float>(ctx.allocator(), bt * s.HS);
  }
  // att is exactly 0 outside each row's keys, so the segment bound only narrows the loops; it is
  // applied anyway, so the backward's rows are the forward's.
  SoftmaxArgs base{s.B * s.T, s.T, s.NH, 0, s.causal, s.window};
  DeviceBuffer<int32_t> starts;  // (B, T) with segments
  if (seg != nullptr) {
    starts = DeviceBuffer<int32_t>(ctx.allocator(), static_cast<size_t>(s.B) * s.T);
    segment_starts(ctx, starts.data(), seg, s.B, s.T);
    base.seg_start = starts.data();
  }

  for (int kvh = 0; kvh < s.NKV; ++kvh) {
    const char* k_h = at(k, view.head(kvh), es);
    const char* v_h = at(v, view.head(kvh), es);
    for (int g = 0; g < group; ++g) {
      const int h = kvh * group + g;
      const char* q_h = at(q, view.head(h), es);
      const char* dout_h = at(dout, view.head(h), es);
      const char* att_h = at(att, view.att_head(h), es);

      GemmArgs dov;  // dP (T, T) = dO_h (T, HS) · V_hᵀ, f32
      dov.M = s.T, dov.N = s.T, dov.K = s.HS, dov.trans_b = true;
      dov.ab_type = dt, dov.c_type = DType::kF32;
      dov.batch = s.B;
      dov.lda = view.ld(s.NH), dov.stride_a = view.batch_stride(s.NH);
      dov.ldb = view.ld(s.NKV), dov.stride_b = view.batch_stride(s.NKV);
      dov.stride_c = tt;
      gemm(ctx, dov, dout_h, v_h, dp.data());

      SoftmaxArgs sa = base;
      sa.h = h;
      kernels::dispatch_dtype(dt, "attention_bwd", [&](auto tag) {
        launch_softmax_bwd<decltype(tag)>(ctx, ds, dp.data(), att, sa);
      });

      GemmArgs dsk;  // dq_h (T, HS) += scale · dS (T, T) · K_h (T, HS)
      dsk.M = s.T, dsk.N = s.HS, dsk.K = s.T;
      dsk.ab_type = dsk.c_type = dt;
      dsk.alpha = scale, dsk.beta = 1.0f;
      dsk.batch = s.B;
      dsk.stride_a = tt;
      dsk.ldb = view.ld(s.NKV), dsk.stride_b = view.batch_stride(s.NKV);
      dsk.ldc = view.ld(s.NH), dsk.stride_c = view.batch_stride(s.NH);
      gemm(ctx, dsk, ds, k_h, at(dq, view.head(h), es));

      // dv (T, HS) += att_hᵀ · dO_h and dk (T, HS) += scale · dSᵀ · Q_h, into the strided kv
      // head of dk/dv, or into the f32 group sums.
      GemmArgs tr;
      tr.M = s.T, tr.N = s.HS, tr.K = s.T, tr.trans_a = true;
      tr.ab_type = dt;
      tr.batch = s.B;
      tr.ldb = view.ld(s.NH), tr.stride_b = view.batch_stride(s.NH);
      if (staged) {
        tr.c_type = DType::kF32, tr.beta = g > 0 ? 1.0f : 0.0f;
        tr.stride_c = static_cast<int64_t>(s.T) * s.HS;
      } else {
        tr.c_type = dt, tr.beta = 1.0f;
        tr.ldc = view.ld(s.NKV), tr.stride_c = view.batch_stride(s.NKV);
      }
      void* dv_dst = staged ? static_cast<void*>(dv_acc.data()) : at(dv, view.head(kvh), es);
      void* dk_dst = staged ? static_cast<void*>(dk_acc.data()) : at(dk, view.head(kvh), es);
      GemmArgs tv = tr;
      tv.stride_a = view.att_batch_stride();
      gemm(ctx, tv, att_h, dout_h, dv_dst);
      GemmArgs tk = tr;
      tk.alpha = scale, tk.stride_a = tt;
      gemm(ctx, tk, ds, q_h, dk_dst);
    }
    if (staged) {
      kernels::dispatch_dtype(dt, "attention_bwd", [&](auto tag) {
        using T = decltype(tag);
        launch_add_f32_to_strided<T>(ctx, at(dk, view.head(kvh), es), view.ld(s.NKV),
                                     dk_acc.data(), static_cast<int64_t>(bt), s.HS);
        launch_add_f32_to_strided<T>(ctx, at(dv, view.head(kvh), es), view.ld(s.NKV),
                                     dv_acc.data(), static_cast<int64_t>(bt), s.HS);
      });
    }
  }
}

}  // namespace forge::cuda
