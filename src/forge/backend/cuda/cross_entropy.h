// The bf16 path of cuda::lm_head_cross_entropy (ops.h) with its row-chunk size as a parameter.
// ops.h's entry point picks the chunk from a 1 GiB bound on the bf16 logits; tests call this one
// to get several row chunks, and a partial last one, on shapes small enough for the CPU twin.
#pragma once

#include <cstdint>

#include "forge/backend/cuda/ops.h"

namespace forge::cuda {

class Context;

// lm_head_cross_entropy for dt = kBF16 (x, w, dx bf16), processing `chunk_rows` (> 0) tokens at
// a time.
void lm_head_cross_entropy_bf16(Context& ctx, float* losses, void* dx, float* dw, const void* x,
                                const void* w, const int32_t* targets, const float* dloss, int N,
                                int C, int V, int Vp, int chunk_rows,
                                const LmHeadFp8* fp8 = nullptr);

// The bf16 path's row kernel alone, over `rows` rows of bf16 logits (rows, ld) in place (ld a
// multiple of 8, columns [V, ld) read as masked): losses (rows); with dloss, the row becomes its
// bf16 dlogits, and with d8 non-null also their FP8 rows d8 (rows, ld bytes; grad_type E4M3 or
// E5M2) and descales (rows): what cast_fp8_rows of the bf16 dlogits gives (tests compare the two).
void ce_rows_bf16(Context& ctx, void* logits, int ld, float* losses, const int32_t* targets,
                  const float* dloss, int rows, int V, uint8_t* d8 = nullptr,
                  float* d_descale = nullptr, DType grad_type = DType::kF8E4M3);

// The rows of one chunk that lm_head_cross_entropy (bf16) takes for N tokens and a padded
// vocabulary Vp: all N, or the fewest equal chunks whose bf16 logits fit its 1 GiB bound
// (forge bench gemm times the LM head's products at this size).
int lm_head_chunk_rows(int N, int Vp);

}  // namespace forge::cuda
