// Device side of the FP8 casts: the conversion and the format dispatch every FP8 cast kernel
// uses (fp8_cast.cu, fp8_rows.cu), and the per-row scaled store (ops/fp8_rows.h) for kernels that
// hold a whole row in a warp's registers: the norm forwards write their output's E4M3 copy and
// its descale in the same kernel (CudaBackend's FP8 products read them instead of casting the
// output again).
#pragma once

#include <cuda_fp8.h>

#include <cstdint>

#include <type_traits>

#include "forge/backend/cuda/kernel_utils.cuh"
#include "forge/core/dtype.h"
#include "forge/core/error.h"
#include "forge/ops/fp8_rows.h"

namespace forge::cuda::kernels {

// fp8(v) by the hardware's cvt.rn.satfinite (io/fp8.h encodes the same way): E4M3 or E5M2.
template <bool kE4M3>
__device__ __forceinline__ uint8_t to_fp8(float v) {
  return static_cast<uint8_t>(
      __nv_cvt_float_to_fp8(v, __NV_SATFINITE, kE4M3 ? __NV_E4M3 : __NV_E5M2));
}
__device__ __forceinline__ uint8_t to_e4m3(float v) { return to_fp8<true>(v); }

// f(std::true_type) for E4M3, f(std::false_type) for E5M2; any other y_t is an internal error.
template <typename F>
void dispatch_fp8(DType y_t, const char* op, F&& f) {
  if (y_t == DType::kF8E4M3)
    f(std::true_type{});
  else if (y_t == DType::kF8E5M2)
    f(std::false_type{});
  else
    FORGE_CHECK(false, "[", op, "] the output type must be f8e4m3 or f8e5m2, not ",
                dtype_name(y_t));
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
