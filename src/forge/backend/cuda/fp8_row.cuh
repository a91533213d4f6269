// Device side of the per-row scaled FP8 casts (ops/fp8_rows.h), for kernels that hold a whole row
// in a warp's registers: the norm forwards write their output's E4M3 copy and its descale in the
// same kernel (CudaBackend's FP8 products read them instead of casting the output again).
#pragma once

#include <cuda_fp8.h>

#include <cstdint>

#include "forge/backend/cuda/kernel_utils.cuh"
#include "forge/ops/fp8_rows.h"

namespace forge::cuda::kernels {

__device__ __forceinline__ uint8_t to_e4m3(float v) {
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3));
}

// The warp's row, lane `lane`'s chunk j at row_chunk<kN>(lane, j) (chunks at or past C skipped),
// already rounded to T (the values the row's T output holds), as E4M3 rows: y8 (C) =
// fp8(o · s), *d8 = 1/s, s from the row's amax — the bytes and descale cast_fp8_rows of the T
// output gives (fp8_rows.cu: the same rule, the same products). kN · 1 byte a chunk: kN = 8.
template <int kN, int kChunks>
__device__ __forceinline__ void store_e4m3_row(uint8_t* y8, float* d8,
                                               const float (&o)[kChunks][kN], int lane, int C) {
  static_assert(kN == 8, "8 bytes a chunk");
  float m = 0.0f;
#pragma unroll
  for (int j = 0; j < kChunks; ++j) {
    if (row_chunk<kN>(lane, j) >= C) continue;
#pragma unroll
    for (int k = 0; k < kN; ++k) m = fp8_rows::fold_abs(m, o[j][k]);
  }
  uint32_t b = __float_as_uint(m);
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) b = max(b, __shfl_xor_sync(0xffffffffu, b, off));
  const int e = fp8_rows::scale_exponent<8>(__uint_as_float(b));
  const float s = fp8_rows::pow2(e);
  if (lane == 0) *d8 = fp8_rows::pow2(-e);
#pragma unroll
  for (int j = 0; j < kChunks; ++j) {
    const int c = row_chunk<kN>(lane, j);
    if (c >= C) continue;
    uint32_t w[2] = {0u, 0u};
#pragma unroll
    for (int k = 0; k < kN; ++k)
      w[k / 4] |= static_cast<uint32_t>(to_e4m3(__fmul_rn(o[j][k], s))) << (8 * (k % 4));
    *reinterpret_cast<uint2*>(y8 + c) = make_uint2(w[0], w[1]);
  }
}

}  // namespace forge::cuda::kernels
