// Per-row scaled FP8 casts (ops.h; the scale rule and the shared helpers in ops/fp8_rows.h; CPU
// twins cpu::cast_fp8_rows / cpu::cast_transpose_fp8_rows, bit for bit).
//
// cast_fp8_rows: a warp a row. The first sweep takes the row's amax (8 elements a lane-step
// where the row allows 16-byte loads), the scale follows from it (every lane computes it from
// the warp's amax), and the second sweep reads the row again — from L1, a warp's row is at most
// a few KB — and writes fp8(x · s) 8 bytes a lane-step; lane 0 writes the descale.
// cast_transpose_fp8_rows (the weights' transposed copies, small): one kernel takes each
// column's amax and writes its descale (32 columns × 8 row groups a block, a fixed reduction
// order), a second converts 64 × 64 tiles through shared memory as cast_transpose_fp8 does, with
// the scale of each output row.
#include <cuda_fp8.h>

#include <cstdint>

#include "forge/backend/cuda/check.h"
#include "forge/backend/cuda/context.h"
#include "forge/backend/cuda/fp8_row.cuh"
#include "forge/backend/cuda/kernel_utils.cuh"
#include "forge/backend/cuda/ops.h"
#include "forge/core/error.h"
#include "forge/ops/fp8_rows.h"

namespace forge::cuda {
namespace {

using namespace kernels;

constexpr int kThreads = 256;

template <bool kE4M3>
__device__ __forceinline__ int scale_exponent(float amax) {
  return kE4M3 ? fp8_rows::scale_exponent<8>(amax) : fp8_rows::scale_exponent<15>(amax);
}

__device__ __forceinline__ float warp_amax(float m) {
  uint32_t b = __float_as_uint(m);  // m ≥ 0 or NaN: the bits order as the magnitudes (NaN on top)
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) b = max(b, __shfl_xor_sync(0xffffffffu, b, o));
  return __uint_as_float(b);
}

template <typename T, bool kE4M3, bool kVector>
__global__ void __launch_bounds__(kThreads)
    cast_fp8_rows_kernel(uint8_t* __restrict__ y, float* __restrict__ descale,
                         const T* __restrict__ x, int rows, int cols) {
  const int lane = threadIdx.x % 32;
  const int r = blockIdx.x * (kThreads / 32) + threadIdx.x / 32;
  if (r >= rows) return;
  const T* xr = x + static_cast<int64_t>(r) * cols;
  uint8_t* yr = y + static_cast<int64_t>(r) * cols;
  float m = 0.0f;
  if constexpr (kVector) {  // cols % 8 == 0, x 16-byte and y 8-byte aligned
    for (int c = 8 * lane; c < cols; c += 256) {
      float v[8];
      load<T, 8>(xr + c, v);
#pragma unroll
      for (int k = 0; k < 8; ++k) m = fp8_rows::fold_abs(m, v[k]);
    }
  } else {
    for (int c = lane; c < cols; c += 32) m = fp8_rows::fold_abs(m, to_f32(xr[c]));
  }
  const int e = scale_exponent<kE4M3>(warp_amax(m));
  const float s = fp8_rows::pow2(e);
  if (lane == 0) descale[r] = fp8_rows::pow2(-e);
  if constexpr (kVector) {
    for (int c = 8 * lane; c < cols; c += 256) {
      float v[8];
      load<T, 8>(xr + c, v);
      uint32_t w[2] = {0u, 0u};
#pragma unroll
      for (int k = 0; k < 8; ++k)
        w[k / 4] |= static_cast<uint32_t>(to_fp8<kE4M3>(__fmul_rn(v[k], s))) << (8 * (k % 4));
      *reinterpret_cast<uint2*>(yr + c) = make_uint2(w[0], w[1]);
    }
  } else {
    for (int c = lane; c < cols; c += 32) yr[c] = to_fp8<kE4M3>(__fmul_rn(to_f32(xr[c]), s));
  }
}

// Block: 32 columns (threadIdx.x % 32) × 8 row groups; group g takes rows g, g + 8, …; the groups'
// maxima meet in shared memory. Writes descale[c] for the column.
template <typename T, bool kE4M3>
__global__ void __launch_bounds__(kThreads)
    column_descale_kernel(float* __restrict__ descale, const T* __restrict__ x, int rows,
                          int cols) {
  __shared__ float part[8][32];
  const int cx = threadIdx.x % 32, g = threadIdx.x / 32, c = blockIdx.x * 32 + cx;
  float m = 0.0f;
  if (c < cols)
    for (int r = g; r < rows; r += 8)
      m = fp8_rows::fold_abs(m, to_f32(x[static_cast<int64_t>(r) * cols + c]));
  part[g][cx] = m;
  __syncthreads();
  if (g == 0 && c < cols) {
    for (int k = 1; k < 8; ++k) m = fp8_rows::fold_abs(m, part[k][cx]);
    descale[c] = fp8_rows::pow2(-scale_exponent<kE4M3>(m));
  }
}

// As cast_transpose_fp8_kernel (fp8_cast.cu; fp8_row.cuh's tile helpers), each column c of x
// scaled by 1 / descale[c] (exact: a power of two).
template <typename T, bool kE4M3>
__global__ void __launch_bounds__(kThreads)
    cast_transpose_rows_kernel(uint8_t* __restrict__ y, const float* __restrict__ descale,
                               const T* __restrict__ x, int rows, int cols) {
  __shared__ __align__(16) Fp8Tile tile;
  const int r0 = blockIdx.y * kFp8Tile, c0 = blockIdx.x * kFp8Tile;
  float s[2];
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    const int gc = c0 + 2 * (threadIdx.x % 32) + e;
    s[e] = gc < cols ? __frcp_rn(descale[gc]) : 1.0f;
  }
  fp8_tile_load<kE4M3>(tile, x, rows, cols, r0, c0, s, [](float) {});
  __syncthreads();
  fp8_tile_store(y, tile, rows, cols, r0, c0);
}

}  // namespace

void cast_fp8_rows(Context& ctx, DType y_t, uint8_t* y, float* descale, DType x_t, const void* x,
                   int rows, int cols) {
  FORGE_CHECK(rows >= 0 && cols > 0, "[cast_fp8_rows] rows=", rows, " cols=", cols);
  if (rows == 0) return;
  const bool vector = cols % 8 == 0 && aligned16(x) && reinterpret_cast<uintptr_t>(y) % 8 == 0;
  const int blocks = (rows + kThreads / 32 - 1) / (kThreads / 32);
  dispatch_fp8(y_t, "cast_fp8_rows", [&](auto e4m3) {
    constexpr bool kE4M3 = decltype(e4m3)::value;
    dispatch_dtype(x_t, "cast_fp8_rows", [&](auto tag) {
      using T = decltype(tag);
      const T* xt = static_cast<const T*>(x);
      if (vector)
        cast_fp8_rows_kernel<T, kE4M3, true>
            <<<blocks, kThreads, 0, ctx.stream()>>>(y, descale, xt, rows, cols);
      else
        cast_fp8_rows_kernel<T, kE4M3, false>
            <<<blocks, kThreads, 0, ctx.stream()>>>(y, descale, xt, rows, cols);
    });
  });
  FORGE_CUDA_CHECK(cudaGetLastError());
}

void cast_transpose_fp8_rows(Context& ctx, DType y_t, uint8_t* y, float* descale, DType x_t,
                             const void* x, int rows, int cols) {
  FORGE_CHECK(
      rows > 0 && cols > 0 && rows % 16 == 0, "[cast_transpose_fp8_rows] rows=", rows,
      " cols=", cols,
      " (rows must be a positive multiple of 16: the output rows are written 16 bytes at a time)");
  FORGE_CHECK(reinterpret_cast<uintptr_t>(y) % 16 == 0,
              "[cast_transpose_fp8_rows] y is not 16-byte aligned");
  dispatch_fp8(y_t, "cast_transpose_fp8_rows", [&](auto e4m3) {
    constexpr bool kE4M3 = decltype(e4m3)::value;
    dispatch_dtype(x_t, "cast_transpose_fp8_rows", [&](auto tag) {
      using T = decltype(tag);
      const T* xt = static_cast<const T*>(x);
      column_descale_kernel<T, kE4M3>
          <<<(cols + 31) / 32, kThreads, 0, ctx.stream()>>>(descale, xt, rows, cols);
      const dim3 grid((cols + kFp8Tile - 1) / kFp8Tile, (rows + kFp8Tile - 1) / kFp8Tile);
      cast_transpose_rows_kernel<T, kE4M3>
          <<<grid, kThreads, 0, ctx.stream()>>>(y, descale, xt, rows, cols);
    });
  });
  FORGE_CUDA_CHECK(cudaGetLastError());
}

}  // namespace forge::cuda
