// rope_kv_append (decode.h): a Llama decode step's RoPE of q and k and its KV-cache append in
// one kernel instead of three (rope_at q, rope_at k, kv_append): at batch 1 a decode step is
// launch-latency bound (~3 µs per graph node, small_gemm.cu's measurements), and these three
// move a few KB. One thread per (slot, head of q | k | v, pair of channels): q and k pairs are
// rotated with rope_at's exact angle method (inv_freq / π in double from the host, scaling
// included, the angle in half-turns reduced exactly, sincospif in f32: rope.cuh's rope_sincos,
// so the bits equal rope_at's), written back in place, and k's also
// to the cache row pos % cap; v pairs are copied to the cache. Element by element (the whole
// op touches S·(NH + 2·NKV)·HS elements, ~1k at batch 1: latency, not bandwidth, bounds it).
//
// ptxas (sm_90a, CUDA 13.0): rope_kv_append_kernel<T, style> 30-34 regs, 0 spill, 0 stack.
#include <cuda_runtime.h>

#include <algorithm>

#include "forge/backend/cuda/check.h"
#include "forge/backend/cuda/context.h"
#include "forge/backend/cuda/decode.h"
#include "forge/backend/cuda/kernel_utils.cuh"
#include "forge/backend/cuda/rope.cuh"
#include "forge/core/error.h"

namespace forge::cuda {
namespace {

using namespace kernels;

constexpr int kThreads = 256;

template <typename T, bool kRotateHalf>
__global__ void __launch_bounds__(kThreads)
    rope_kv_append_kernel(T* qkv, int64_t stride, T* __restrict__ cache_k, T* __restrict__ cache_v,
                          const int32_t* __restrict__ pos, const __grid_constant__ RopeFreqs f,
                          DecodeShape s) {
  const int half = s.HS / 2, heads = s.NH + 2 * s.NKV;
  const int total = s.S * heads * half;  // < 2^31: checked on the host
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
    const int p = i % half, hh = (i / half) % heads, b = i / (half * heads);
    T* x = qkv + b * stride + static_cast<int64_t>(hh) * s.HS;  // this head's HS channels
    const int i0 = kRotateHalf ? p : 2 * p, i1 = kRotateHalf ? p + half : 2 * p + 1;
    const int pb = pos[b];
    const int64_t row = (static_cast<int64_t>(b) * s.cap + pb % s.cap) * s.NKV * s.HS;
    if (hh >= s.NH + s.NKV) {  // v: copy the pair
      T* c = cache_v + row + static_cast<int64_t>(hh - s.NH - s.NKV) * s.HS;
      c[i0] = x[i0];
      c[i1] = x[i1];
      continue;
    }
    float sn, cs;
    rope_sincos(static_cast<double>(pb), f.inv_freq_over_pi[p], &sn, &cs);
    const float x0 = to_f32(x[i0]), x1 = to_f32(x[i1]);
    const T y0 = from_f32<T>(x0 * cs - x1 * sn), y1 = from_f32<T>(x0 * sn + x1 * cs);
    x[i0] = y0;
    x[i1] = y1;
    if (hh >= s.NH) {  // k: also into the cache
      T* c = cache_k + row + static_cast<int64_t>(hh - s.NH) * s.HS;
      c[i0] = y0;
      c[i1] = y1;
    }
  }
}

}  // namespace

void rope_kv_append(Context& ctx, DType dt, void* qkv, int64_t stride, void* cache_k, void* cache_v,
                    const int32_t* pos, const DecodeShape& s, const Rope& rope) {
  FORGE_CHECK(s.S >= 0 && s.NKV > 0 && s.NH % s.NKV == 0 && s.HS % 2 == 0 &&
                  s.HS / 2 <= kRopeMaxHalf && s.cap > 0,
              "[rope_kv_append] bad shape S=", s.S, " NH=", s.NH, " NKV=", s.NKV, " HS=", s.HS,
              " cap=", s.cap);
  const int64_t heads = s.NH + 2 * s.NKV;
  FORGE_CHECK(stride >= heads * s.HS, "[rope_kv_append] row stride ", stride, " < ", heads * s.HS);
  const RopeFreqs f = rope_freqs(rope, s.HS);  // exactly the CPU's inv_freq, then / π
  const int64_t total = static_cast<int64_t>(s.S) * heads * (s.HS / 2);
  if (total == 0) return;
  FORGE_CHECK(total < (int64_t{1} << 31), "[rope_kv_append] too many elements");
  const int grid = static_cast<int>(std::min<int64_t>((total + kThreads - 1) / kThreads, 4 * ctx.num_sms()));
  dispatch_dtype(dt, "rope_kv_append", [&](auto tag) {
    using T = decltype(tag);
    T* x = static_cast<T*>(qkv);
    T* ck = static_cast<T*>(cache_k);
    T* cv = static_cast<T*>(cache_v);
    if (rope.style == RopeStyle::kRotateHalf)
      rope_kv_append_kernel<T, true><<<grid, kThreads, 0, ctx.stream()>>>(x, stride, ck, cv, pos, f, s);
    else
      rope_kv_append_kernel<T, false><<<grid, kThreads, 0, ctx.stream()>>>(x, stride, ck, cv, pos, f, s);
    FORGE_CUDA_CHECK(cudaGetLastError());
  });
}

}  // namespace forge::cuda
