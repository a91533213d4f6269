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

// The row scale's exponent (ops/fp8_rows.h) for E4M3 (largest value 1.75 · 2^8) or E5M2 (2^15).
template <bool kE4M3>
__device__ __forceinline__ int fp8_scale_exponent(float amax) {
  return kE4M3 ? fp8_rows::scale_exponent<8>(amax) : fp8_rows::scale_exponent<15>(amax);
}

// The warp's largest of m (each lane's m ≥ 0 or NaN: the bits order as the magnitudes, NaN on
// top), in every lane.
__device__ __forceinline__ float fp8_warp_amax(float m) {
  uint32_t b = __float_as_uint(m);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) b = max(b, __shfl_xor_sync(0xffffffffu, b, o));
  return __uint_as_float(b);
}

// Eight values as fp8(v · s), s a power of two (the per-row casts' products), in 8 bytes: value
// k in byte k.
template <bool kE4M3>
__device__ __forceinline__ uint2 fp8_pack8(const float (&v)[8], float s) {
  uint32_t w[2] = {0u, 0u};
#pragma unroll
  for (int k = 0; k < 8; ++k)
    w[k / 4] |= static_cast<uint32_t>(to_fp8<kE4M3>(__fmul_rn(v[k], s))) << (8 * (k % 4));
  return make_uint2(w[0], w[1]);
}

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
  const int e = fp8_scale_exponent<true>(fp8_warp_amax(m));
  const float s = fp8_rows::pow2(e);
  if (lane == 0) *d8 = fp8_rows::pow2(-e);
#pragma unroll
  for (int j = 0; j < kChunks; ++j) {
    const int c = row_chunk<kN>(lane, j);
    if (c >= C) continue;
    *reinterpret_cast<uint2*>(y8 + c) = fp8_pack8<true>(o[j], s);
  }
}

// The transposed casts' 64 × 64 tiles (cast_transpose_fp8 in fp8_cast.cu, a scale for the
// tensor; cast_transpose_fp8_rows in fp8_rows.cu, one a column of x): a block of 256 threads
// takes x rows r0 .. +64, columns c0 .. +64. fp8_tile_load: thread (tx = t % 32, ty = t / 32)
// reads columns 2·tx, 2·tx + 1 (scales s[0], s[1]) of rows ty + 8·k, calls seen(v) on each value
// (0 outside x) and writes fp8(v · s) into the tile transposed; after a barrier, fp8_tile_store:
// thread t writes 16 bytes of output row (column of x) c0 + t / 4. rows % 16 == 0, y 16-byte
// aligned: a 16-byte chunk is wholly inside or outside.
constexpr int kFp8Tile = 64;
constexpr int kFp8TilePitch = kFp8Tile + 16;       // bytes a transposed row in shared memory
using Fp8Tile = uint8_t[kFp8Tile][kFp8TilePitch];  // [column][row]

template <bool kE4M3, typename T, typename Seen>
__device__ __forceinline__ void fp8_tile_load(Fp8Tile& tile, const T* __restrict__ x, int rows,
                                              int cols, int r0, int c0, const float (&s)[2],
                                              Seen&& seen) {
  const int tx = threadIdx.x % 32, ty = threadIdx.x / 32;
#pragma unroll
  for (int k = 0; k < kFp8Tile / 8; ++k) {
    const int r = ty + 8 * k, gr = r0 + r;
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int c = 2 * tx + e, gc = c0 + c;
      float v = 0.0f;
      if (gr < rows && gc < cols) v = to_f32(x[static_cast<int64_t>(gr) * cols + gc]);
      seen(v);
      tile[c][r] = to_fp8<kE4M3>(__fmul_rn(v, s[e]));
    }
  }
}

__device__ __forceinline__ void fp8_tile_store(uint8_t* __restrict__ y, const Fp8Tile& tile,
                                               int rows, int cols, int r0, int c0) {
  const int c = threadIdx.x / 4, part = threadIdx.x % 4;
  const int gc = c0 + c, gr = r0 + 16 * part;
  if (gc < cols && gr < rows)
    *reinterpret_cast<uint4*>(y + static_cast<int64_t>(gc) * rows + gr) =
        *reinterpret_cast<const uint4*>(&tile[c][16 * part]);
}

}  // namespace forge::cuda::kernels
