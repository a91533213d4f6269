// CUDA optimizer kernels: sum_squares (Σ g², for the global gradient norm) and the fused AdamW
// update; the GPU twins of backend/cpu/grad_norm.cpp and backend/cpu/adamw.cpp.
//
// sum_squares: two passes, no atomics. Pass 1 runs a fixed grid of min(1024, ⌈n/4096⌉) blocks
// of 256 threads (a function of n only, never of the device), each thread accumulating float4
// loads into four independent f32 lanes (ILP, and four shorter summation chains), then a block
// tree into partial[block]. Pass 2 is one block that adds the partials in a fixed tree and
// writes out[0] (not +=). The order depends only on n and on g's alignment, so repeated calls
// on one buffer are bit-identical. f32 throughout, as the contract says; for n = 1e8 each
// thread sums ~100 float4s, a relative error of ~1e-6 at worst.
//
// adamw_update: one pass over (param, m, v, grad) f32, four elements per thread per step as
// float4 loads/stores (16 B each); the working copy `work` (bf16, f16 or f32) is written in the same
// pass, so the weights are read once per step. The clip factor is computed on the device from
// *global_sq (no host sync): scale = grad_scale · min(1, max_norm / (sqrt(sq) + 1e-6)) in
// double, rounded once to f32, as the CPU trainer forms its grad_scale. The element update uses
// __fmul_rn/__fadd_rn/__fdiv_rn/__fsqrt_rn so nvcc cannot contract it into FMAs: it is the CPU
// formula in PyTorch's order, bit for bit, with the host-side factors (1 − lr·wd, step size,
// sqrt(1 − β2ᵗ), …) computed in double exactly as the CPU does (adamw_factors). The factors
// sit in device memory and every thread loads them (one 40-byte broadcast, from L2 after the
// first block): a CUDA graph that captured the launch then replays with each step's lr and t.
// Parameter tensors sit at arbitrary offsets of one flat buffer, so a tensor may start off a
// 16-byte boundary: the first `head` (< 4) elements are done one by one, then the aligned body
// in float4s, then the tail. If the four f32 arrays are not equally misaligned, or `work` is
// not aligned for 4-element stores after the head, everything goes element by element.
//
// f16 loss scaling (loss_scale non-null, ops/loss_scale.h): the gradients carry S = state.scale
// (a power of two), so Σ g² is S² times the true one. Every thread reads *global_sq first; if it
// is inf or NaN the kernel returns before touching anything (the step is skipped, weights, m, v
// and the working copy stay bit for bit). Otherwise the norm is unscaled before clipping,
// norm = sqrt(sq) / S, and the gradient multiplier is grad_scale · clip / S in double, rounded
// once. After skipped steps (state.skipped_total = k > 0) Adam's bias corrections use t − k, as
// PyTorch does when GradScaler skips optimizer.step(): recomputed here in double from the
// factors' lr, β1, β2 and t. (Device pow may differ from the host's in the last bit of a double;
// after the f32 rounding that is at most 1 ulp of the step size, and only once a step was
// skipped.) loss_scale_step() updates the state after the last AdamW launch of the step.
//
// The numerical guard (guard non-null, ops/step_guard.h): step_guard_check() has written
// guard->skipped for this step before the launch; when it is set every thread returns before
// touching anything, as for an f16 overflow. Adam's t subtracts guard->skipped_total as it
// does loss_scale->skipped_total (the two count disjoint steps), through the same recomputation.
//
// Stochastic rounding (sr_seed = factors->sr_seed + sr_offset when factors->sr_seed != 0, bf16
// work copy): element i takes the 32-bit word i of the counter-based stream
// forge::Rng(sr_seed, /*stream=*/0) — word i % 4 of Philox4x32-10 block
// (counter {i / 4, 0, 0} as (lo, hi, stream, 0), key = sr_seed) — and adds its low 16 bits to
// the f32 bit pattern before truncating to bf16 (kernels::bf16_bits_stochastic): the result is
// one of the two neighbouring bf16 values, rounding up with probability equal to the dropped
// fraction, so it is unbiased. One Philox block serves four elements. The CPU can reproduce any
// element with forge::philox4x32_10. sr_seed == 0: round to nearest even.
//
// ptxas (sm_90a, CUDA 13.0, -Xptxas=-v): registers, spill stores, stack frame per kernel
// (<T, kN, ...>: kN = 1 is the element-by-element instantiation):
//   adamw_kernel<bf16, false>                             32 regs, 0 spill, 0 stack
//   adamw_kernel<bf16, true>                              48 regs, 0 spill, 0 stack
//   adamw_kernel<float, false>                            36 regs, 0 spill, 0 stack
//   adamw_kernel<float, true>                             54 regs, 0 spill, 0 stack
//   sum_squares_final_kernel                              16 regs, 0 spill, 0 stack
//   sum_squares_partial_kernel                            32 regs, 0 spill, 0 stack
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "forge/backend/cuda/context.h"
#include "forge/backend/cuda/kernel_utils.cuh"
#include "forge/backend/cuda/ops.h"

namespace forge::cuda {
namespace {

using namespace kernels;

// ---- sum_squares ------------------------------------------------------------------------------

constexpr int kSqThreads = 256;
constexpr int kSqMaxBlocks = 1024;  // pass 2 is one block of this many threads

__global__ void __launch_bounds__(kSqThreads)
    sum_squares_partial_kernel(float* __restrict__ partial, const float* __restrict__ g, int64_t n,
                               bool vec) {
  __shared__ float scratch[32];
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  const int64_t n4 = vec ? n / 4 : 0;
  const float4* g4 = reinterpret_cast<const float4*>(g);
#pragma unroll 4
  for (int64_t i = tid; i < n4; i += stride) {
    const float4 v = g4[i];
    acc.x += v.x * v.x, acc.y += v.y * v.y, acc.z += v.z * v.z, acc.w += v.w * v.w;
  }
  for (int64_t i = n4 * 4 + tid; i < n; i += stride) acc.x += g[i] * g[i];
  const float total = block_sum((acc.x + acc.y) + (acc.z + acc.w), scratch);
  if (threadIdx.x == 0) partial[blockIdx.x] = total;
}

__global__ void __launch_bounds__(kSqMaxBlocks)
    sum_squares_final_kernel(float* __restrict__ out, const float* __restrict__ partial,
                             int blocks) {
  __shared__ float scratch[32];
  const float x = threadIdx.x < blocks ? partial[threadIdx.x] : 0.0f;
  const float total = block_sum(x, scratch);
  if (threadIdx.x == 0) out[0] = total;
}

// ---- AdamW ------------------------------------------------------------------------------------

struct AdamWArgs {
  float* param;       // (n) f32 master weights
  float* m;           // (n)
  float* v;           // (n)
  const float* grad;  // (n)
  void* work;         // (n) of the work dtype, or null
  int64_t n;
  int head;                          // elements before the aligned body (vector path only)
  const AdamWFactors* factors;  // (1) device: the step's scalars
  uint64_t sr_offset;                // added to factors->sr_seed when that is non-zero
  const float* global_sq;            // (1) Σ g² over all gradients
  float max_norm;                    // <= 0: no clipping
  const LossScaleState* loss_scale;  // (1) device, f16 training; null: no loss scaling
  const StepGuardState* guard;       // (1) device; null: no guard
};

// What one thread reads from AdamWArgs::factors: the step's scalars and its rounding key.
struct AdamWStep : AdamWFactors {
  __device__ explicit AdamWStep(const AdamWArgs& a) : AdamWFactors(*a.factors) {
    sr_seed = sr_seed != 0 ? sr_seed + a.sr_offset : 0;
    const int64_t skipped = (a.loss_scale != nullptr ? a.loss_scale->skipped_total : 0) +
                            (a.guard != nullptr ? a.guard->skipped_total : 0);
    if (skipped > 0) {
      // Adam's t counts only the steps taken (see the header).
      const double t = static_cast<double>(step - skipped);
      const double bc1 = 1.0 - pow(static_cast<double>(beta1), t);
      const double bc2 = 1.0 - pow(static_cast<double>(beta2), t);
      step_size = static_cast<float>(static_cast<double>(lr) / bc1);
      bias_correction2_sqrt = static_cast<float>(sqrt(bc2));
    }
  }
};

// The CPU update for one element, without FMA contraction. g is already scaled.
__device__ __forceinline__ float adamw_element(float g, float& p, float& m, float& v,
                                               const AdamWStep& a) {
  const float pi = __fmul_rn(p, a.decay);
  const float mi = __fadd_rn(m, __fmul_rn(a.one_minus_beta1, __fsub_rn(g, m)));
  const float vi = __fadd_rn(__fmul_rn(v, a.beta2), __fmul_rn(__fmul_rn(a.one_minus_beta2, g), g));
  const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), a.bias_correction2_sqrt), a.eps);
  p = __fsub_rn(pi, __fdiv_rn(__fmul_rn(a.step_size, mi), denom));
  m = mi, v = vi;
  return p;
}

__device__ __forceinline__ uint32_t word_of(const uint4& b, int k) {
  return k == 0 ? b.x : k == 1 ? b.y : k == 2 ? b.z : b.w;
}

// Word i of forge::Rng(seed, 0) for i = e0 … e0 + 3 (one or two Philox blocks).
__device__ __forceinline__ uint4 sr_words4(uint64_t seed, int64_t e0) {
  const uint4 b0 = philox_block(seed, 0, static_cast<uint64_t>(e0) / 4);
  const int r = static_cast<int>(e0 & 3);
  if (r == 0) return b0;
  const uint4 b1 = philox_block(seed, 0, static_cast<uint64_t>(e0) / 4 + 1);
  uint32_t w[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) w[k] = k + r < 4 ? word_of(b0, k + r) : word_of(b1, k + r - 4);
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// Four f32 → four TW (round to nearest) in one 8-byte (16-bit types) or 16-byte (f32) store.
template <typename TW>
__device__ __forceinline__ void store_work4(TW* w, const float4& p) {
  if constexpr (std::is_same_v<TW, float>) {
    *reinterpret_cast<float4*>(w) = p;
  } else if constexpr (std::is_same_v<TW, bf16>) {
    *reinterpret_cast<uint2*>(w) = make_uint2(pack_bf16x2(p.x, p.y), pack_bf16x2(p.z, p.w));
  } else {
    const __half2 lo = __floats2half2_rn(p.x, p.y), hi = __floats2half2_rn(p.z, p.w);
    *reinterpret_cast<uint2*>(w) = make_uint2(*reinterpret_cast<const uint32_t*>(&lo),
                                              *reinterpret_cast<const uint32_t*>(&hi));
  }
}

template <typename TW>
__device__ __forceinline__ void store_work1(TW* w, int64_t i, float p, uint64_t seed) {
  if constexpr (std::is_same_v<TW, bf16>) {
    if (seed != 0) {
      const uint32_t r = word_of(philox_block(seed, 0, static_cast<uint64_t>(i) / 4), i & 3);
      w[i] = __ushort_as_bfloat16(bf16_bits_stochastic(p, r));
      return;
    }
  }
  w[i] = from_f32<TW>(p);
}

template <typename TW>
__device__ __forceinline__ void adamw_scalar(const AdamWArgs& a, const AdamWStep& f, int64_t i,
                                             float scale) {
  float p = a.param[i], m = a.m[i], v = a.v[i];
  const float g = __fmul_rn(a.grad[i], scale);
  adamw_element(g, p, m, v, f);
  a.param[i] = p, a.m[i] = m, a.v[i] = v;
  if (a.work != nullptr) store_work1(static_cast<TW*>(a.work), i, p, f.sr_seed);
}

template <typename TW, bool kVecPath>
__global__ void __launch_bounds__(256) adamw_kernel(const AdamWArgs a) {
  // The clip factor, from the device-side Σ g²: every thread computes the same value.
  double clip = 1.0;
  double unscale = 1.0;  // 1 / loss scale
  if (a.guard != nullptr && a.guard->skipped) return;  // a non-finite step: nothing is written
  if (a.loss_scale != nullptr) {
    const float sq = *a.global_sq;
    if (!isfinite(sq)) return;  // overflow: the step is skipped, nothing is written
    unscale = 1.0 / static_cast<double>(a.loss_scale->scale);
  }
  if (a.max_norm > 0.0f) {
    const double s = a.max_norm / (sqrt(static_cast<double>(*a.global_sq)) * unscale + 1e-6);
    clip = s < 1.0 ? s : 1.0;
  }
  const AdamWStep f(a);
  const float scale = static_cast<float>(static_cast<double>(f.grad_scale) * clip * unscale);
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if constexpr (!kVecPath) {
    for (int64_t i = tid; i < a.n; i += stride) adamw_scalar<TW>(a, f, i, scale);
  } else {
    if (tid < a.head) adamw_scalar<TW>(a, f, tid, scale);
    const int64_t chunks = (a.n - a.head) / 4;
    for (int64_t c = tid; c < chunks; c += stride) {
      const int64_t e0 = a.head + 4 * c;
      float4 p = *reinterpret_cast<const float4*>(a.param + e0);
      float4 m = *reinterpret_cast<const float4*>(a.m + e0);
      float4 v = *reinterpret_cast<const float4*>(a.v + e0);
      const float4 g = *reinterpret_cast<const float4*>(a.grad + e0);
      adamw_element(__fmul_rn(g.x, scale), p.x, m.x, v.x, f);
      adamw_element(__fmul_rn(g.y, scale), p.y, m.y, v.y, f);
      adamw_element(__fmul_rn(g.z, scale), p.z, m.z, v.z, f);
      adamw_element(__fmul_rn(g.w, scale), p.w, m.w, v.w, f);
      *reinterpret_cast<float4*>(a.param + e0) = p;
      *reinterpret_cast<float4*>(a.m + e0) = m;
      *reinterpret_cast<float4*>(a.v + e0) = v;
      if (a.work != nullptr) {
        if constexpr (std::is_same_v<TW, bf16>) {
          uint2 out;
          if (f.sr_seed != 0) {
            const uint4 r = sr_words4(f.sr_seed, e0);
            out.x = bf16_bits_stochastic(p.x, r.x) |
                    (static_cast<uint32_t>(bf16_bits_stochastic(p.y, r.y)) << 16);
            out.y = bf16_bits_stochastic(p.z, r.z) |
                    (static_cast<uint32_t>(bf16_bits_stochastic(p.w, r.w)) << 16);
            *reinterpret_cast<uint2*>(static_cast<bf16*>(a.work) + e0) = out;
            continue;
          }
        }
        store_work4(static_cast<TW*>(a.work) + e0, p);
      }
    }
    for (int64_t i = a.head + 4 * chunks + tid; i < a.n; i += stride)
      adamw_scalar<TW>(a, f, i, scale);
  }
}

// ---- f16 loss scaling (ops/loss_scale.h) ------------------------------------------------------

__global__ void loss_scale_dloss_kernel(float* scaled, const float* dloss,
                                        const LossScaleState* state) {
  scaled[0] = dloss[0] * state->scale;  // a power of two: exact unless it overflows
}

__global__ void loss_scale_step_kernel(LossScaleState* state, const float* global_sq,
                                       const StepGuardState* guard) {
  if (guard != nullptr && guard->skipped) {  // the guard's skip, not an overflow (ops.h)
    state->step_scale = state->scale;
    state->skipped = 0;
    return;
  }
  loss_scale_update(*state, *global_sq);
}

template <typename TW>
void launch_adamw(Context& ctx, AdamWArgs a) {
  // Elements until param reaches a 16-byte boundary; the other arrays must then be aligned too.
  const uintptr_t mis = reinterpret_cast<uintptr_t>(a.param) & 15u;
  int64_t head = mis == 0 ? 0 : static_cast<int64_t>((16 - mis) / sizeof(float));
  if (head > a.n) head = a.n;
  a.head = static_cast<int>(head);
  const bool work_ok =  // one 4-element store: 8 bytes for bf16, 16 for f32
      a.work == nullptr ||
      reinterpret_cast<uintptr_t>(static_cast<TW*>(a.work) + head) % (4 * sizeof(TW)) == 0;
  const bool vec = (mis % sizeof(float)) == 0 && aligned16(a.param + head) &&
                   aligned16(a.m + head) && aligned16(a.v + head) && aligned16(a.grad + head) &&
                   work_ok;
  const int threads = 256;
  if (vec) {
    const int grid = grid_for((a.n - head + 3) / 4 + 1, threads, ctx.num_sms());
    adamw_kernel<TW, true><<<grid, threads, 0, ctx.stream()>>>(a);
  } else {
    const int grid = grid_for(a.n, threads, ctx.num_sms());
    adamw_kernel<TW, false><<<grid, threads, 0, ctx.stream()>>>(a);
  }
  FORGE_CUDA_CHECK_LAUNCH();
}

}  // namespace

void sum_squares(Context& ctx, float* out, const float* g, int64_t n) {
  FORGE_CHECK(n >= 0, "[sum_squares] negative size ", n);
  if (n == 0) {
    FORGE_CUDA_CHECK(cudaMemsetAsync(out, 0, sizeof(float), ctx.stream()));
    return;
  }
  constexpr int64_t kPerBlock = int64_t{kSqThreads} * 16;  // ≥ 4 float4s per thread
  const int blocks =
      static_cast<int>(std::min<int64_t>(kSqMaxBlocks, (n + kPerBlock - 1) / kPerBlock));
  DeviceBuffer<float> partial(ctx.allocator(), blocks);
  sum_squares_partial_kernel<<<blocks, kSqThreads, 0, ctx.stream()>>>(partial.data(), g, n,
                                                                      aligned16(g));
  FORGE_CUDA_CHECK_LAUNCH();
  sum_squares_final_kernel<<<1, kSqMaxBlocks, 0, ctx.stream()>>>(out, partial.data(), blocks);
  FORGE_CUDA_CHECK_LAUNCH();
}

void adamw_update(Context& ctx, float* param, float* m, float* v, const float* grad, void* work,
                  DType work_dt, int64_t n, const AdamWFactors* factors, uint64_t sr_offset,
                  const float* global_sq, float max_norm, const LossScaleState* loss_scale,
                  const StepGuardState* guard) {
  FORGE_CHECK(n >= 0, "[adamw_update] negative size ", n);
  FORGE_CHECK(factors != nullptr, "[adamw_update] needs the step's factors in device memory");
  FORGE_CHECK(global_sq != nullptr || (max_norm <= 0.0f && loss_scale == nullptr),
              "[adamw_update] clipping and loss scaling need the device Σ g² (global_sq is null)");
  if (n == 0) return;
  AdamWArgs a{};
  a.param = param, a.m = m, a.v = v, a.grad = grad, a.work = work, a.n = n;
  a.factors = factors;
  a.sr_offset = sr_offset;
  a.global_sq = global_sq;
  a.max_norm = max_norm;
  a.loss_scale = loss_scale;
  a.guard = guard;
  if (work == nullptr) {
    launch_adamw<float>(ctx, a);
    return;
  }
  dispatch_dtype(work_dt, "adamw_update", [&](auto tag) { launch_adamw<decltype(tag)>(ctx, a); });
}

void loss_scale_dloss(Context& ctx, float* scaled, const float* dloss, const LossScaleState* state) {
  loss_scale_dloss_kernel<<<1, 1, 0, ctx.stream()>>>(scaled, dloss, state);
  FORGE_CUDA_CHECK_LAUNCH();
}

void loss_scale_step(Context& ctx, LossScaleState* state, const float* global_sq,
                     const StepGuardState* guard) {
  loss_scale_step_kernel<<<1, 1, 0, ctx.stream()>>>(state, global_sq, guard);
  FORGE_CUDA_CHECK_LAUNCH();
}

}  // namespace forge::cuda
