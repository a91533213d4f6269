// Casts to FP8 GEMM operands (ops.h; CPU twins cpu::cast_fp8 / cpu::cast_transpose_fp8 in
// ops/fp8.h, bit for bit): y = fp8(x · scale) by the hardware's cvt.rn.satfinite (round to
// nearest even, saturating at the largest finite value; io/fp8.h encodes the same way), with the
// tensor's amax = max |x| for the per-tensor scale of the next step.
//
// amax is taken with an integer atomicMax on the f32 bits of |x| (non-negative floats order as
// their bits do): a maximum does not depend on the order its operands arrive in, so the result
// is deterministic (ops.h's "no floating-point atomics" is about sums, whose rounding does).
//
// cast_fp8: 8 elements a thread (16 bytes of bf16 in, 8 bytes out) where n and the pointers
// allow, else one a thread. cast_transpose_fp8: 64 × 64 tiles, a block of 256 threads each; the
// tile is read row-wise (coalesced), converted, written to shared memory transposed as bytes,
// and stored as 64 rows of 64 bytes (16 bytes a thread).
#include <cuda_fp8.h>

#include <cstdint>

#include "forge/backend/cuda/check.h"
#include "forge/backend/cuda/context.h"
#include "forge/backend/cuda/fp8_row.cuh"
#include "forge/backend/cuda/kernel_utils.cuh"
#include "forge/backend/cuda/ops.h"
#include "forge/core/error.h"

namespace forge::cuda {
namespace {

using namespace kernels;

constexpr int kThreads = 256;

// The block's max |x| (m ≥ 0 or NaN from every thread) into *amax by one integer atomicMax. The
// whole reduction is on the f32 bits as ints (fmaxf would drop a NaN; its bits, 0x7fc00000 for
// |NaN|, are above every finite value's and inf's, so NaN wins as in the CPU twin).
__device__ __forceinline__ void block_amax(float m, float* amax) {
  __shared__ int s[kThreads / 32];
  int b = __float_as_int(m);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) b = max(b, __shfl_xor_sync(0xffffffffu, b, o));
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) s[warp] = b;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kThreads / 32; ++w) b = max(b, s[w]);
    atomicMax(reinterpret_cast<int*>(amax), b);
  }
}

// |v| folded into m, NaN kept (fmaxf would drop it): its bits then win the integer max.
__device__ __forceinline__ float fold_abs(float m, float v) {
  const float a = fabsf(v);
  return (a > m || a != a) ? a : m;
}

template <typename T, bool kE4M3, bool kVector>
__global__ void __launch_bounds__(kThreads) cast_fp8_kernel(uint8_t* __restrict__ y, const T* __restrict__ x,
                                                            int64_t n, const float* __restrict__ scale,
                                                            float* __restrict__ amax) {
  const float s = *scale;
  float m = 0.0f;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  if constexpr (kVector) {  // n % 8 == 0, x 16-byte and y 8-byte aligned
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n / 8; i += stride) {
      float v[8];
      load<T, 8>(x + i * 8, v);
      uint32_t w[2] = {0u, 0u};
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        m = fold_abs(m, v[k]);
        w[k / 4] |= static_cast<uint32_t>(to_fp8<kE4M3>(v[k] * s)) << (8 * (k % 4));
      }
      *reinterpret_cast<uint2*>(y + i * 8) = make_uint2(w[0], w[1]);
    }
  } else {
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n; i += stride) {
      const float v = to_f32(x[i]);
      m = fold_abs(m, v);
      y[i] = to_fp8<kE4M3>(v * s);
    }
  }
  if (amax) block_amax(m, amax);
}

// Block (bx, by): the 64 × 64 tile of x at rows by·64, columns bx·64 (fp8_row.cuh's tile
// helpers), every value times the tensor's scale.
template <typename T, bool kE4M3>
__global__ void __launch_bounds__(kThreads)
    cast_transpose_fp8_kernel(uint8_t* __restrict__ y, const T* __restrict__ x, int rows, int cols,
                              const float* __restrict__ scale, float* __restrict__ amax) {
  __shared__ __align__(16) Fp8Tile tile;
  const float s[2] = {*scale, *scale};
  const int r0 = blockIdx.y * kFp8Tile, c0 = blockIdx.x * kFp8Tile;
  float m = 0.0f;
  fp8_tile_load<kE4M3>(tile, x, rows, cols, r0, c0, s, [&](float v) { m = fold_abs(m, v); });
  __syncthreads();
  fp8_tile_store(y, tile, rows, cols, r0, c0);
  if (amax) block_amax(m, amax);
}

}  // namespace

void cast_fp8(Context& ctx, DType y_t, uint8_t* y, DType x_t, const void* x, int64_t n,
              const float* scale, float* amax) {
  FORGE_CHECK(n >= 0, "[cast_fp8] negative size ", n);
  if (amax) FORGE_CUDA_CHECK(cudaMemsetAsync(amax, 0, sizeof(float), ctx.stream()));
  if (n == 0) return;
  const bool vector = n % 8 == 0 && aligned16(x) && reinterpret_cast<uintptr_t>(y) % 8 == 0;
  const int64_t work = vector ? n / 8 : n;
  const int blocks = static_cast<int>(std::min<int64_t>((work + kThreads - 1) / kThreads, 16 * ctx.num_sms()));
  dispatch_fp8(y_t, "cast_fp8", [&](auto e4m3) {
    constexpr bool kE4M3 = decltype(e4m3)::value;
    dispatch_dtype(x_t, "cast_fp8", [&](auto tag) {
      using T = decltype(tag);
      if (vector)
        cast_fp8_kernel<T, kE4M3, true><<<blocks, kThreads, 0, ctx.stream()>>>(y, static_cast<const T*>(x), n,
                                                                             scale, amax);
      else
        cast_fp8_kernel<T, kE4M3, false><<<blocks, kThreads, 0, ctx.stream()>>>(y, static_cast<const T*>(x), n,
                                                                              scale, amax);
    });
  });
  FORGE_CUDA_CHECK(cudaGetLastError());
}

void cast_transpose_fp8(Context& ctx, DType y_t, uint8_t* y, DType x_t, const void* x, int rows, int cols,
                        const float* scale, float* amax) {
  FORGE_CHECK(rows > 0 && cols > 0 && rows % 16 == 0, "[cast_transpose_fp8] rows=", rows, " cols=", cols,
              " (rows must be a positive multiple of 16: the output rows are written 16 bytes at a time)");
  FORGE_CHECK(reinterpret_cast<uintptr_t>(y) % 16 == 0, "[cast_transpose_fp8] y is not 16-byte aligned");
  if (amax) FORGE_CUDA_CHECK(cudaMemsetAsync(amax, 0, sizeof(float), ctx.stream()));
  const dim3 grid((cols + kFp8Tile - 1) / kFp8Tile, (rows + kFp8Tile - 1) / kFp8Tile);
  dispatch_fp8(y_t, "cast_transpose_fp8", [&](auto e4m3) {
    constexpr bool kE4M3 = decltype(e4m3)::value;
    dispatch_dtype(x_t, "cast_transpose_fp8", [&](auto tag) {
      using T = decltype(tag);
      cast_transpose_fp8_kernel<T, kE4M3><<<grid, kThreads, 0, ctx.stream()>>>(y, static_cast<const T*>(x), rows,
                                                                              cols, scale, amax);
    });
  });
  FORGE_CUDA_CHECK(cudaGetLastError());
}

}  // namespace forge::cuda
