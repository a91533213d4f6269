// Linear layers with few rows (N = 1..32: one row per sequence of a KV-cache decode step), where
// cuBLASLt is latency-bound. Same contract as cpu::linear_fwd (ops/linear.h), plus the fused
// gate/up projection + SwiGLU of a Llama MLP. The CPU twins are cpu::linear_fwd and
// cpu::linear_fwd (twice) + cpu::swiglu_fwd; the kernels are in small_gemm.cu, whose header has
// the design and the measured times.
//
// Two questions, two functions: *_supported — can the kernels compute this shape (the call's
// precondition; tests and benchmarks use any supported shape) — and *_eligible — is it measured
// faster than cuBLASLt, so that CudaBackend::linear_fwd / linear_swiglu_fwd take it (with
// small_linear_aligned pointers). Training never is (N = B·T is large).
#pragma once

#include <cstdint>

#include "forge/core/dtype.h"
#include "forge/ops/linear.h"

namespace forge::cuda {

class Context;

// The most rows the kernels take.
inline constexpr int kSmallLinearMaxRows = 32;
// Eligibility limits from the H200 measurements (small_gemm.cu): a plain product up to 16 rows
// (from 17 rows on the kernels run two 16-row tiles and lose on wide shapes: SmolLM2 gate|up at
// N = 24 takes 5.3 µs against cuBLASLt's 3.8), the fused SwiGLU up to kSmallLinearMaxRows (it
// replaces three kernels); weights up to 4M elements (the 49152 × 576 LM head streams at 2 TB/s
// here against cuBLASLt's 3.5).
inline constexpr int kSmallLinearEligibleRows = 16;
inline constexpr int64_t kSmallLinearMaxWeights = int64_t{4} << 20;

// Whether the kernels take this shape: dt is f32, bf16 or f16; 1 <= N <= kSmallLinearMaxRows;
// and the weight's rows are whole 16-byte vectors, which they read: C % v == 0 for kOutIn
// ((OC, C) rows of C), OC % v == 0 for kInOut ((C, OC) rows of OC; bf16/f16 also need C even),
// with v = 16 / sizeof(element). The pointers must also pass small_linear_aligned().
bool small_linear_supported(DType dt, int N, int C, int OC, WeightLayout layout);
// small_linear_supported for the fused gate/up + SwiGLU: the (2FF, C) kOutIn product.
bool small_linear_swiglu_supported(DType dt, int N, int C, int FF);
// Whether CudaBackend takes the kernels: supported, bf16 or f16, W (OC, C), N <=
// kSmallLinearEligibleRows and C·OC <= kSmallLinearMaxWeights. Not taken (measured slower or not
// measured): W (C, OC) — GPT-2's Conv1D shapes lost 0.56-0.79× to cuBLASLt — and f32, the
// CPU-parity mode, which keeps cuBLASLt's true-fp32 GEMM.
bool small_linear_eligible(DType dt, int N, int C, int OC, WeightLayout layout);
// The fused SwiGLU's rule: supported, bf16 or f16, 2FF·C <= kSmallLinearMaxWeights (any N the
// kernels take).
bool small_linear_swiglu_eligible(DType dt, int N, int C, int FF);
// All non-null pointers 16-byte aligned (the kernels' vector loads); bias may be anything.
bool small_linear_aligned(const void* out, const void* inp, const void* w);

// How a call is cut into blocks; 0 = chosen from the shape (small_gemm.cu). Benchmarks force one
// to compare; every choice computes the same mathematics (the summation order differs).
struct SmallLinearTiling {
  int col_tiles = 0;  // kOutIn 16-bit: 8-row weight tiles per warp, 1, 2 or 4 (SwiGLU: 2 or 4)
  int warps = 0;      // warps per block splitting C, 1..16
};

// What a product fuses around it (a decode step's norm before and residual after it, so a
// Llama layer is five kernels: small_gemm.cu). bf16 / f16 with W (OC, C) only.
struct SmallLinearFusion {
  // Non-null (C, 16-byte aligned): the product's input is rmsnorm(inp)·norm_w with this eps,
  // computed as rmsnorm_fwd does, rounded to dt (what the unfused rmsnorm_fwd would store).
  const void* norm_w = nullptr;
  float eps = 0.0f;
  // out += the product (+ bias) rounded to dt first: linear_fwd into a temporary, then the
  // residual add, in place (out is read and written element by element).
  bool residual = false;
};
// The widest C the norm prologue stages (16 rows of C in shared memory).
inline constexpr int kSmallLinearMaxNormC = 4096;
// Whether the kernels take this shape with this fusion (no fusion: small_linear_supported).
bool small_linear_fusion_supported(DType dt, int N, int C, int OC, WeightLayout layout,
                                   const SmallLinearFusion& f);

// out (N, OC) = inp (N, C) · op(W) + bias (OC, may be null), f32 accumulation, rounded once to dt.
// W (OC, C) for kOutIn, (C, OC) for kInOut. Requires small_linear_supported and _aligned, and
// small_linear_fusion_supported for a fusion.
void small_linear_fwd(Context& ctx, DType dt, void* out, const void* inp, const void* w,
                      const void* bias, int N, int C, int OC, WeightLayout layout,
                      SmallLinearTiling tiling = {}, const SmallLinearFusion& fusion = {});

// hidden (N, FF) = silu(g) ∘ u with g = inp · Wgᵀ and u = inp · Wuᵀ, each rounded to dt first
// (what linear_fwd stores and swiglu_fwd reads on the unfused path). w_gate_up (2FF, C) kOutIn:
// rows [0, FF) the gate weight, rows [FF, 2FF) the up weight. Requires
// small_linear_swiglu_supported and _aligned.
// A fusion's norm_w applies the norm prologue (residual is not allowed here).
void small_linear_swiglu_fwd(Context& ctx, DType dt, void* hidden, const void* inp,
                             const void* w_gate_up, int N, int C, int FF,
                             SmallLinearTiling tiling = {}, const SmallLinearFusion& fusion = {});

}  // namespace forge::cuda
