// CUDA LM head + cross-entropy, fused over vocabulary chunks (contract in ops.h). The logits
// x·wᵀ of a real vocabulary (50k columns × 8k tokens = 1.6 GB in f32) are never materialised:
// the vocabulary is cut into chunks of Vc columns and only one chunk's logits (N, Vc) exist at
// a time, in an f32 scratch.
//
// Forward, per chunk c: logits_c = x·w[c]ᵀ (cuBLASLt, f32 output) and one block per row folds
// the chunk into a running (max, Σexp) in f32 — the online softmax of the flash-attention papers
// — and picks up the target's logit when the target falls in the chunk. The last chunk's launch
// writes loss = log Σ + max − logit[target]. Padded columns [V, Vp) are simply outside every
// chunk: never computed, never in the softmax, and their dw rows receive nothing (+= 0).
//
// Backward (when dx or dw is given), a second sweep in reverse chunk order: the last chunk's
// logits are still in the scratch, so that sweep skips one GEMM; every other chunk is
// recomputed (same algorithm, same bits). A kernel turns the chunk into
// dlogits = dloss·(exp(l − max)/Σ − onehot) — in place for f32; for bf16 into a bf16 copy,
// because both GEMM operands must share one type and the other operand (w or x) is bf16 —
// then dx += dlogits·w[c] and dw[c] += dlogitsᵀ·x (f32, beta = 1). dx in f32 accumulates
// directly; a bf16 dx would be rounded once per chunk, so the chunk products go to an f32
// (N, C) scratch that is added to dx once at the end. dloss is read on the device: no host sync.
//
// Chunk width: Vc = 8192 while the (N, Vc) f32 scratch stays under 256 MiB (N ≤ 8192 tokens),
// narrower for larger N, never below 1024 (the GEMMs are then still ≥ N×1024×C), and never wider
// than the vocabulary rounded up to 256. Multiples of 256 keep every scratch row 1 KiB-aligned,
// so the row kernels use 16-byte f32 loads throughout. A bf16 backward adds the (N, Vc) bf16
// dlogits copy (half the f32 scratch) and an (N, C) f32 dx sum.
//
// Targets: negative = ignored (loss 0, no gradient), as the CPU's −1. A target ≥ V is a caller
// bug that is not checked on the device (it would need a host sync); its loss is undefined.
//
// Determinism: fixed-order block reductions, no atomics, deterministic cuBLASLt algorithms.
//
// ptxas (sm_90a, CUDA 13.0, -O3), registers / spill bytes, all with 0 stack frame:
//   ce_chunk_stats_kernel           32 / 0  (64 B shared)
//   ce_chunk_grad_kernel  <float>   25 / 0   <bf16> 26 / 0
//   add_f32_kernel        <bf16>    13 / 0
#include <cuda_bf16.h>

#include <algorithm>
#include <cfloat>
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

constexpr int kThreads = 256;  // per row block
constexpr int kWarps = kThreads / 32;
constexpr size_t kScratchBytes = size_t{256} << 20;  // bound on the (N, Vc) f32 logits

// dtype conversions shared with the other kernels.
using kernels::from_f32;
using kernels::to_f32;

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

// One block per row: dlogits[n, j] = dloss·(softmax − onehot) for the chunk's real columns, 0 for
// ignored rows (and for the slack columns [width, round_up(width, 4)) of the row). dlogits may be
// the logits memory (T = float): each element is read by the thread that overwrites it.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    ce_chunk_grad_kernel(T* dlogits, const float* logits, const float* __restrict__ row_max,
                         const float* __restrict__ row_sum, const int32_t* __restrict__ targets,
                         const float* __restrict__ dloss, ChunkArgs a) {
  const int n = blockIdx.x;
  const int32_t target = targets[n];
  const bool ignored = target < 0;
  const float g = ignored ? 0.0f : *dloss;
  const float m = ignored ? 0.0f : row_max[n];
  const float inv = ignored ? 0.0f : 1.0f / row_sum[n];
  const int t = target - a.c0;  // target column within the chunk (maybe outside it)
  const float* row = logits + static_cast<int64_t>(n) * a.ld;
  T* drow = dlogits + static_cast<int64_t>(n) * a.ld;
  for (int j0 = threadIdx.x * 4; j0 < a.width; j0 += kThreads * 4) {
    Pack4<float> x{};
    if (!ignored) x = *reinterpret_cast<const Pack4<float>*>(row + j0);
    Pack4<T> d;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int j = j0 + e;
      const float p = expf(x.v[e] - m) * inv;  // 0 when ignored (inv = 0)
      d.v[e] = from_f32<T>(j < a.width ? g * (p - (j == t ? 1.0f : 0.0f)) : 0.0f);
    }
    *reinterpret_cast<Pack4<T>*>(drow + j0) = d;
  }
}

// dst[i] += src[i] (dst bf16, src f32): the once-per-call add of the f32 dx sums.
template <typename T>
__global__ void add_f32_kernel(T* __restrict__ dst, const float* __restrict__ src, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    dst[i] = from_f32<T>(to_f32(dst[i]) + src[i]);
}

int chunk_columns(int N, int V) {
  const int64_t by_budget = static_cast<int64_t>(kScratchBytes / sizeof(float)) / N / 256 * 256;
  const int64_t vc = std::clamp<int64_t>(by_budget, 1024, 8192);
  return static_cast<int>(std::min<int64_t>(vc, (static_cast<int64_t>(V) + 255) / 256 * 256));
}

// logits (N, width; row stride ld) f32 = x (N, C) · w[c0 : c0 + width]ᵀ.
void chunk_logits(Context& ctx, DType dt, float* logits, const void* x, const void* w, int N, int C,
                  const ChunkArgs& a) {
  GemmArgs g;
  g.M = N, g.N = a.width, g.K = C, g.trans_b = true;
  g.ab_type = dt, g.c_type = DType::kF32;
  g.ldc = a.ld;
  const char* w_c = static_cast<const char*>(w) + static_cast<int64_t>(a.c0) * C * dtype_size(dt);
  gemm(ctx, g, x, w_c, logits);
}

}  // namespace

void lm_head_cross_entropy(Context& ctx, DType dt, float* losses, void* dx, float* dw,
                           const void* x, const void* w, const int32_t* targets, const float* dloss,
                           int N, int C, int V, int Vp) {
  FORGE_CHECK(dt == DType::kF32 || dt == DType::kBF16, "[lm_head_cross_entropy] unsupported dtype ",
              dtype_name(dt));
  FORGE_CHECK(N >= 0 && C > 0 && V > 0 && Vp >= V, "[lm_head_cross_entropy] bad shape N=", N,
              " C=", C, " V=", V, " Vp=", Vp);
  const bool backward = dx != nullptr || dw != nullptr;
  FORGE_CHECK(!backward || dloss != nullptr, "[lm_head_cross_entropy] backward without dloss");
  if (N == 0) return;
  const size_t es = dtype_size(dt);
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
    chunk_logits(ctx, dt, logits.data(), x, w, N, C, a);
    ce_chunk_stats_kernel<<<N, kThreads, 0, ctx.stream()>>>(
        losses, row_max.data(), row_sum.data(), target_logit.data(), logits.data(), targets, a);
    FORGE_CUDA_CHECK_LAUNCH();
  }
  if (!backward) return;

  const bool low_precision = dt == DType::kBF16;
  DeviceBuffer<bf16> dlogits_bf16;  // (N, Vc) the chunk's gradient as a bf16 GEMM operand
  DeviceBuffer<float> dx_acc;       // (N, C) f32 sums for a bf16 dx
  if (low_precision) dlogits_bf16 = DeviceBuffer<bf16>(alloc, static_cast<size_t>(N) * Vc);
  if (low_precision && dx) dx_acc = DeviceBuffer<float>(alloc, static_cast<size_t>(N) * C);
  void* dlogits = low_precision ? static_cast<void*>(dlogits_bf16.data()) : logits.data();

  for (int c = chunks - 1; c >= 0; --c) {
    const ChunkArgs a = chunk(c);
    if (c != chunks - 1) chunk_logits(ctx, dt, logits.data(), x, w, N, C, a);
    if (low_precision)
      ce_chunk_grad_kernel<bf16><<<N, kThreads, 0, ctx.stream()>>>(
          dlogits_bf16.data(), logits.data(), row_max.data(), row_sum.data(), targets, dloss, a);
    else
      ce_chunk_grad_kernel<float><<<N, kThreads, 0, ctx.stream()>>>(
          logits.data(), logits.data(), row_max.data(), row_sum.data(), targets, dloss, a);
    FORGE_CUDA_CHECK_LAUNCH();
    const char* w_c = static_cast<const char*>(w) + static_cast<int64_t>(a.c0) * C * es;

    if (dx) {  // dx (N, C) += dlogits (N, width) · w[c] (width, C)
      GemmArgs g;
      g.M = N, g.N = C, g.K = a.width;
      g.ab_type = dt, g.c_type = low_precision ? DType::kF32 : dt;
      g.beta = low_precision && c == chunks - 1 ? 0.0f : 1.0f;
      g.lda = Vc;
      gemm(ctx, g, dlogits, w_c, low_precision ? static_cast<void*>(dx_acc.data()) : dx);
    }
    if (dw) {  // dw[c] (width, C) += dlogitsᵀ (width, N) · x (N, C), f32
      GemmArgs g;
      g.M = a.width, g.N = C, g.K = N, g.trans_a = true;
      g.ab_type = dt, g.c_type = DType::kF32, g.beta = 1.0f;
      g.lda = Vc;
      gemm(ctx, g, dlogits, x, dw + static_cast<int64_t>(a.c0) * C);
    }
  }
  if (low_precision && dx) {
    const int64_t n = static_cast<int64_t>(N) * C;
    const int grid = static_cast<int>(std::min<int64_t>((n + 255) / 256, 8 * 1024));
    add_f32_kernel<bf16><<<grid, 256, 0, ctx.stream()>>>(static_cast<bf16*>(dx), dx_acc.data(), n);
    FORGE_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace forge::cuda
