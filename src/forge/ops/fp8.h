// Casts to the 8-bit float GEMM operands (io/fp8.h has the formats and their rounding). The
// CUDA twins are cuda::cast_fp8 / cuda::cast_transpose_fp8 and the per-row variants
// (backend/cuda/ops.h), bit for bit.
#pragma once

#include <cstdint>

#include "forge/core/dtype.h"

namespace forge::cpu {

// y[i] = fp8(x[i] · scale) in format y_t (kF8E4M3 or kF8E5M2): the f32 product rounded to
// nearest even and saturated; returns amax = max |x[i]| (the statistic a per-tensor scale is
// derived from; NaN if any x is NaN).
float cast_fp8(DType y_t, uint8_t* y, const float* x, int64_t n, float scale);

// y (cols, rows) = fp8(xᵀ · scale) for x (rows, cols) row-major: the transposed copy a TN GEMM
// operand needs (cuda/gemm.h). Returns amax as cast_fp8 does.
float cast_transpose_fp8(DType y_t, uint8_t* y, const float* x, int rows, int cols, float scale);

// Per-row scaled casts (ops/fp8_rows.h has the scale rule). cast_fp8_rows: y (rows, cols) with
// row r = fp8(x[r] · s_r), descale[r] = 1/s_r. cast_transpose_fp8_rows: y (cols, rows) = the
// same of xᵀ, one scale per row of y (per column of x), descale (cols). Twins of
// cuda::cast_fp8_rows / cuda::cast_transpose_fp8_rows, bit for bit.
void cast_fp8_rows(DType y_t, uint8_t* y, float* descale, const float* x, int rows, int cols);
void cast_transpose_fp8_rows(DType y_t, uint8_t* y, float* descale, const float* x, int rows, int cols);

}  // namespace forge::cpu
