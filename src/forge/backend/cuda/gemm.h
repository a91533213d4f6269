// Matrix products through cuBLASLt, row-major like the CPU matmul (ops/matmul.h): transposes,
// bias and GELU are layout flags and epilogues, never extra passes or copies.
//
// Row-major C (M, N) = op(A) · op(B) is computed as the column-major product
// Cᵀ (N, M) = op(B)ᵀ · op(A)ᵀ: a row-major matrix is its transpose in column-major order, so
// the operands swap places and keep their transpose flags. Bias (N) is then per row of Cᵀ,
// which is what cuBLASLt's bias epilogue adds.
//
// Strided views: lda/ldb/ldc are the row strides (elements) of the stored row-major matrices,
// 0 = packed (the number of stored columns). They let a per-head view of a (B, T, NH, HS)
// activation — T rows of HS values, row stride NH·HS — be a GEMM operand without a copy.
//
// Alignment: cuBLASLt's heuristic assumes 256-byte-aligned operands unless told otherwise, and a
// view such as q + h·HS is not. gemm() measures the alignment of every operand (pointer, row
// stride and batch stride, capped at 256 bytes), passes it to the heuristic and keys the plan
// cache on it, so such views get an algorithm that is valid for them.
#pragma once

#include <cstdint>

#include "forge/backend/cuda/context.h"
#include "forge/core/dtype.h"

namespace forge::cuda {

enum class GemmEpilogue {
  kNone,
  kBias,         // C = αAB + βC + bias
  kGelu,         // C = gelu(αAB + βC), tanh form
  kBiasGelu,     // C = gelu(αAB + βC + bias)
  kBiasGeluAux,  // as kBiasGelu, and the pre-GELU values go to `aux` (for the backward)
  kDGelu,        // C = (αAB) ∘ gelu'(aux): the GELU backward fused into the dX product; aux
                 // (M, N) of c_type holds the pre-GELU values kBiasGeluAux saved; beta must be 0
};

struct GemmArgs {
  int M = 0, N = 0, K = 0;
  bool trans_a = false, trans_b = false;
  DType ab_type = DType::kF32;  // A and B: kF32 (true fp32 compute, no TF32) or kBF16
  DType c_type = DType::kF32;   // C: kF32 or kBF16 (f32 accumulation either way)
  float alpha = 1.0f, beta = 0.0f;
  GemmEpilogue epilogue = GemmEpilogue::kNone;
  const void* bias = nullptr;  // (N), of c_type
  void* aux = nullptr;         // (M, N) of c_type, for kBiasGeluAux and kDGelu
  int batch = 1;
  int64_t stride_a = 0, stride_b = 0, stride_c = 0;  // elements, for batch > 1
  int64_t lda = 0, ldb = 0, ldc = 0;  // row strides in elements of the stored A, B, C; 0 = packed
  // -1: the plan's algorithm; k ≥ 0: the heuristic's k-th candidate (forge bench gemm --algos).
  int candidate = -1;
  // FP8 products (Hopper tensor cores): ab_type is A's format (kF8E4M3 or kF8E5M2) and b_type
  // B's (E5M2 × E5M2 does not exist); C is bf16 or f32. C = a_scale·b_scale·α·A·B + βC with the
  // scales device floats: an operand stored as fp8(x·s) is passed with scale 1/s. cuBLASLt runs
  // FP8 only in the TN layout — here trans_a false and trans_b true, both operands K-contiguous
  // (A (M, K), B (N, K)), which the forward X·Wᵀ with W (OC, C) is; the backward's operands get
  // there through cast_transpose_fp8 (ops.h).
  DType b_type = DType::kF32;  // ignored unless ab_type is an FP8 type
  const float* a_scale = nullptr;
  const float* b_scale = nullptr;
  bool fast_accum = false;  // FP8: cuBLASLt's faster accumulation (fewer f32 promotions)
  // FP8: a_scale holds M floats (one per row of A) and b_scale N (one per row of B), C[i][j] =
  // a_scale[i]·b_scale[j]·α·Σ_k A[i][k]·B[j][k] (+ βC): cuBLASLt's OUTER_VEC_32F scale mode, the
  // per-row scales of cast_fp8_rows (ops.h). false: each a single float.
  bool row_scales = false;
};

inline bool is_fp8(DType t) { return t == DType::kF8E4M3 || t == DType::kF8E5M2; }

// Enqueues C = op(A)·op(B) on the context's stream. Algorithms are chosen once per shape and
// cached: cuBLASLt's heuristic's first, or under a timed Context::gemm_algo the fastest of its
// candidates (under GemmAlgo::kTimed, of those with the first's bits) timed on the first (eager)
// call (gemm.cu).
void gemm(Context& ctx, const GemmArgs& g, const void* a, const void* b, void* c);

// How many algorithms the heuristic offers for this call (at most 8; at least 1, or it throws).
// Builds the call's plan as gemm() would, without enqueueing the product.
int gemm_candidates(Context& ctx, const GemmArgs& g, const void* a, const void* b, void* c);

// Whether the heuristic's k-th candidate writes the same bits as its first on these operands (C,
// and the aux output under kBiasGeluAux), each run from C as it is now; C is put back where the
// call accumulates, else left as a candidate wrote it. Synchronises the stream. What
// GemmAlgo::kTimed asks of a candidate; forge bench gemm --algos prints it. Throws forge::Error
// where the first does not run or the comparison would be blind: its output all zero bits, or
// C unchanged where the call accumulates (GemmAlgo::kTimed keeps the first there).
bool gemm_candidate_same_bits(Context& ctx, const GemmArgs& g, const void* a, const void* b,
                              void* c, int k);

}  // namespace forge::cuda
