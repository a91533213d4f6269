// Per-row scaled FP8 casts (ops.h; the scale rule and the shared helpers in ops/fp8_rows.h; CPU
// twins cpu::cast_fp8_rows / cpu::cast_transpose_fp8_rows, bit for bit).
//
// cast_fp8_rows: a warp a row. The first sweep takes the row's amax (8 elements a lane-step
// where the row allows 16-byte loads), the scale follows from it (every lane computes it from
// the warp's amax), and the second sweep reads the row again — from L1, a warp's row is at most
// a few KB — and writes fp8(x · s) 8 bytes a lane-step; lane 0 writes the descale.
// cast_transpose_fp8_rows (the weights' transposed copies): one kernel takes each column's amax
// over slices of rows (32 columns × 8 row groups a block, a block a slice), the slices meeting by
// atomicMax on the magnitudes' bits — a maximum, so the result does not depend on the blocks'
// order; a second converts 64 × 64 tiles through shared memory as cast_transpose_fp8 does, with
// the scale of each output row from its amax, and writes the descales. The slices matter for
// tall matrices: the LM head's (50,304, 768) weight had 24 blocks walking all rows (448 µs on an
// H100, of a 77 MB read).
// cast_fp8_rows_bias (a linear layer's output gradient: its E4M3/E5M2 rows for the dX product and
// its bias gradient in one read): the same bytes and descales as cast_fp8_rows, the same rule and
// products, and the column sums. A block of kSumWarps warps takes kSumRows consecutive rows, a
// warp every kSumWarps-th of them; each lane holds its kChunks 16-byte pieces of the row as raw
// words (both sweeps from one DRAM read; cast_fp8_rows' second sweep re-reads, from L1 only while
// rows are short) and the f32 sums of its 8·kChunks columns in registers. The warps' sums meet
// in shared memory in warp order, each block writes its row of partial sums, and
// channel_grad_finish adds the blocks in order: a fixed order (another than bias_grad's), the
// same bits run to run.
#include <cuda_fp8.h>

#include <algorithm>
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
  const int e = fp8_scale_exponent<kE4M3>(fp8_warp_amax(m));
  const float s = fp8_rows::pow2(e);
  if (lane == 0) descale[r] = fp8_rows::pow2(-e);
  if constexpr (kVector) {
    for (int c = 8 * lane; c < cols; c += 256) {
      float v[8];
      load<T, 8>(xr + c, v);
      *reinterpret_cast<uint2*>(yr + c) = fp8_pack8<kE4M3>(v, s);
    }
  } else {
    for (int c = lane; c < cols; c += 32) yr[c] = to_fp8<kE4M3>(__fmul_rn(to_f32(xr[c]), s));
  }
}

// Block (blockIdx.x, blockIdx.y): 32 columns (threadIdx.x % 32) × 8 row groups over rows
// [blockIdx.y · slice, + slice); group g takes every 8th row from g; the groups' maxima meet in
// shared memory, the slices' in amax[c] (|x|'s bits, zeroed before: fold_abs's order, NaN on top).
template <typename T>
__global__ void __launch_bounds__(kThreads)
    column_amax_kernel(uint32_t* __restrict__ amax, const T* __restrict__ x, int rows, int cols,
                       int slice) {
  __shared__ uint32_t part[8][32];
  const int cx = threadIdx.x % 32, g = threadIdx.x / 32, c = blockIdx.x * 32 + cx;
  const int r1 = min(rows, (blockIdx.y + 1) * slice);
  float m = 0.0f;
  if (c < cols)
    for (int r = blockIdx.y * slice + g; r < r1; r += 8)
      m = fp8_rows::fold_abs(m, to_f32(x[static_cast<int64_t>(r) * cols + c]));
  part[g][cx] = __float_as_uint(m);
  __syncthreads();
  if (g == 0 && c < cols) {
    uint32_t b = part[0][cx];
    for (int k = 1; k < 8; ++k) b = max(b, part[k][cx]);
    atomicMax(amax + c, b);
  }
}

// As cast_transpose_fp8_kernel (fp8_cast.cu; fp8_row.cuh's tile helpers), each column c of x
// scaled by s = 2^e from its amax (column_amax_kernel); the first row of blocks writes
// descale[c] = 2^-e.
template <typename T, bool kE4M3>
__global__ void __launch_bounds__(kThreads)
    cast_transpose_rows_kernel(uint8_t* __restrict__ y, float* __restrict__ descale,
                               const uint32_t* __restrict__ amax, const T* __restrict__ x,
                               int rows, int cols) {
  __shared__ __align__(16) Fp8Tile tile;
  const int r0 = blockIdx.y * kFp8Tile, c0 = blockIdx.x * kFp8Tile;
  float s[2];
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    const int gc = c0 + 2 * (threadIdx.x % 32) + e;
    const int ex = gc < cols ? fp8_scale_exponent<kE4M3>(__uint_as_float(amax[gc])) : 0;
    s[e] = fp8_rows::pow2(ex);
    if (blockIdx.y == 0 && threadIdx.x < 32 && gc < cols) descale[gc] = fp8_rows::pow2(-ex);
  }
  fp8_tile_load<kE4M3>(tile, x, rows, cols, r0, c0, s, [](float) {});
  __syncthreads();
  fp8_tile_store(y, tile, rows, cols, r0, c0);
}


constexpr int kSumWarps = 4;   // warps a block in cast_fp8_rows_sum_kernel
constexpr int kSumRows = 64;   // rows a block (16 a warp), 1,024 blocks at 65,536 rows

// ptxas (sm_90a, CUDA 13.0): kChunks 3 / 6 / 9 / 12 (rows up to 768 / 1,536 / 2,304 / 3,072 values)
// 64 / 103 / 147 / 168 registers, no spills: 3 blocks of 128 threads a SM at the widest.
template <bool kE4M3, int kChunks>
__global__ void __launch_bounds__(32 * kSumWarps, 3)
    cast_fp8_rows_sum_kernel(uint8_t* __restrict__ y, float* __restrict__ descale,
                             float* __restrict__ partial, const bf16* __restrict__ x, int rows,
                             int cols) {
  __shared__ float total[kChunks * 256];
  const int lane = threadIdx.x % 32, w = threadIdx.x / 32;
  const int r0 = blockIdx.x * kSumRows, r1 = min(rows, r0 + kSumRows);
  float acc[kChunks][8];
#pragma unroll
  for (int j = 0; j < kChunks; ++j)
#pragma unroll
    for (int k = 0; k < 8; ++k) acc[j][k] = 0.0f;
  for (int r = r0 + w; r < r1; r += kSumWarps) {
    const bf16* xr = x + static_cast<int64_t>(r) * cols;
    int4 raw[kChunks];
#pragma unroll
    for (int j = 0; j < kChunks; ++j) {
      const int c = row_chunk<8>(lane, j);
      if (c < cols) raw[j] = *reinterpret_cast<const int4*>(xr + c);
    }
    float m = 0.0f;
#pragma unroll
    for (int j = 0; j < kChunks; ++j) {
      if (row_chunk<8>(lane, j) >= cols) continue;
      float v[8];
      unpack16(raw[j], v, bf16{});
#pragma unroll
      for (int k = 0; k < 8; ++k) m = fp8_rows::fold_abs(m, v[k]);
    }
    const int e = fp8_scale_exponent<kE4M3>(fp8_warp_amax(m));
    const float s = fp8_rows::pow2(e);
    if (lane == 0) descale[r] = fp8_rows::pow2(-e);
    uint8_t* yr = y + static_cast<int64_t>(r) * cols;
#pragma unroll
    for (int j = 0; j < kChunks; ++j) {
      const int c = row_chunk<8>(lane, j);
      if (c >= cols) continue;
      float v[8];
      unpack16(raw[j], v, bf16{});
      *reinterpret_cast<uint2*>(yr + c) = fp8_pack8<kE4M3>(v, s);
#pragma unroll
      for (int k = 0; k < 8; ++k) acc[j][k] += v[k];
    }
  }
  for (int ww = 0; ww < kSumWarps; ++ww) {  // the warps' sums in warp order
    if (w == ww)
#pragma unroll
      for (int j = 0; j < kChunks; ++j) {
        const int c = row_chunk<8>(lane, j);
        if (c >= cols) continue;
#pragma unroll
        for (int k = 0; k < 8; ++k) total[c + k] = ww == 0 ? acc[j][k] : total[c + k] + acc[j][k];
      }
    __syncthreads();
  }
  float* out = partial + static_cast<int64_t>(blockIdx.x) * cols;
  for (int c = threadIdx.x; c < cols; c += 32 * kSumWarps) out[c] = total[c];
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

void cast_fp8_rows_bias(Context& ctx, DType y_t, uint8_t* y, float* descale, float* dbias,
                        DType x_t, const void* x, int rows, int cols) {
  FORGE_CHECK(rows >= 0 && cols > 0, "[cast_fp8_rows_bias] rows=", rows, " cols=", cols);
  if (rows == 0) return;
  if (!cast_fp8_rows_bias_fused(x_t, cols) || !aligned16(x) ||
      reinterpret_cast<uintptr_t>(y) % 8 != 0) {
    cast_fp8_rows(ctx, y_t, y, descale, x_t, x, rows, cols);
    bias_grad(ctx, x_t, dbias, x, rows, cols);
    return;
  }
  const int blocks = (rows + kSumRows - 1) / kSumRows;
  DeviceBuffer<float> partial(ctx.allocator(), static_cast<size_t>(blocks) * cols);
  const bf16* xb = static_cast<const bf16*>(x);
  dispatch_fp8(y_t, "cast_fp8_rows_bias", [&](auto e4m3) {
    constexpr bool kE4M3 = decltype(e4m3)::value;
    auto launch = [&](auto kernel) {
      kernel<<<blocks, 32 * kSumWarps, 0, ctx.stream()>>>(y, descale, partial.data(), xb, rows,
                                                          cols);
    };
    if (cols <= 768)
      launch(cast_fp8_rows_sum_kernel<kE4M3, 3>);
    else if (cols <= 1536)
      launch(cast_fp8_rows_sum_kernel<kE4M3, 6>);
    else if (cols <= 2304)
      launch(cast_fp8_rows_sum_kernel<kE4M3, 9>);
    else
      launch(cast_fp8_rows_sum_kernel<kE4M3, 12>);
  });
  FORGE_CUDA_CHECK(cudaGetLastError());
  channel_grad_finish<1>(ctx, FinishOuts{{dbias, nullptr, nullptr}}, partial.data(), blocks, cols,
                         1);
}

void cast_transpose_fp8_rows(Context& ctx, DType y_t, uint8_t* y, float* descale, DType x_t,
                             const void* x, int rows, int cols) {
  FORGE_CHECK(
      rows > 0 && cols > 0 && rows % 16 == 0, "[cast_transpose_fp8_rows] rows=", rows,
      " cols=", cols,
      " (rows must be a positive multiple of 16: the output rows are written 16 bytes at a time)");
  FORGE_CHECK(reinterpret_cast<uintptr_t>(y) % 16 == 0,
              "[cast_transpose_fp8_rows] y is not 16-byte aligned");
  DeviceBuffer<uint32_t> amax(ctx.allocator(), cols);  // the columns' |x| bits
  dispatch_fp8(y_t, "cast_transpose_fp8_rows", [&](auto e4m3) {
    constexpr bool kE4M3 = decltype(e4m3)::value;
    dispatch_dtype(x_t, "cast_transpose_fp8_rows", [&](auto tag) {
      using T = decltype(tag);
      const T* xt = static_cast<const T*>(x);
      // Slices of ≥ 512 rows, about 1,024 blocks in all.
      const int col_blocks = (cols + 31) / 32;
      const int slices = std::max(1, std::min((rows + 511) / 512, 1024 / col_blocks));
      const int slice = (rows + slices - 1) / slices;
      FORGE_CUDA_CHECK(cudaMemsetAsync(amax.data(), 0, amax.bytes(), ctx.stream()));
      column_amax_kernel<T><<<dim3(col_blocks, slices), kThreads, 0, ctx.stream()>>>(
          amax.data(), xt, rows, cols, slice);
      const dim3 grid((cols + kFp8Tile - 1) / kFp8Tile, (rows + kFp8Tile - 1) / kFp8Tile);
      cast_transpose_rows_kernel<T, kE4M3>
          <<<grid, kThreads, 0, ctx.stream()>>>(y, descale, amax.data(), xt, rows, cols);
    });
  });
  FORGE_CUDA_CHECK(cudaGetLastError());
}

}  // namespace forge::cuda
