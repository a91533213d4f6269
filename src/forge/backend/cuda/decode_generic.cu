// decode_attention for head sizes the flash-decoding kernel (decode.cu) does not take — tiny
// models (the golden test models have head sizes 8 and 16) and odd shapes such as 48 or 256.
// Correct for any HS and GQA grouping, not tuned: one block of 128 threads per (slot, query
// head); the scores of the slot's visible rows [0, min(pos + 1, cap)) go to shared memory
// (dynamic, cap f32), then a block max, exp, block sum, and one thread per output channel sums
// p_j · v_j over the rows. f32 arithmetic, max-subtracted softmax — the CPU twin's recipe.
//
// ptxas (sm_90a, CUDA 13.0): decode_attention_generic_kernel<T> 30-32 regs, 0 spill, 0 stack.
#include <cuda_runtime.h>

#include <cmath>

#include "forge/backend/cuda/check.h"
#include "forge/backend/cuda/context.h"
#include "forge/backend/cuda/decode.h"
#include "forge/backend/cuda/kernel_utils.cuh"
#include "forge/core/error.h"

namespace forge::cuda {
namespace {

using namespace kernels;

constexpr int kThreads = 128;

template <typename T>
__global__ void __launch_bounds__(kThreads)
    decode_attention_generic_kernel(T* out, const T* q, const T* cache_k, const T* cache_v, const int32_t* pos,
                                    DecodeShape s, int64_t q_stride, float scale) {
  extern __shared__ float score[];  // (cap)
  __shared__ float red[32];
  const int b = blockIdx.x / s.NH, h = blockIdx.x % s.NH, kvh = h / (s.NH / s.NKV);
  const int n = min(pos[b] + 1, s.cap);
  const int64_t kvw = static_cast<int64_t>(s.NKV) * s.HS;
  const T* qr = q + b * q_stride + static_cast<int64_t>(h) * s.HS;
  const T* kb = cache_k + static_cast<int64_t>(b) * s.cap * kvw + static_cast<int64_t>(kvh) * s.HS;
  const T* vb = cache_v + static_cast<int64_t>(b) * s.cap * kvw + static_cast<int64_t>(kvh) * s.HS;
  float mx = -INFINITY;
  for (int j = threadIdx.x; j < n; j += blockDim.x) {
    float d = 0.0f;
    for (int i = 0; i < s.HS; ++i) d += to_f32(qr[i]) * to_f32(kb[j * kvw + i]);
    score[j] = d * scale;
    mx = fmaxf(mx, score[j]);
  }
  // Block max through the sum helper's pattern.
  for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = mx;
  __syncthreads();
  mx = -INFINITY;
  for (int w = 0; w < kThreads / 32; ++w) mx = fmaxf(mx, red[w]);
  float sum = 0.0f;
  for (int j = threadIdx.x; j < n; j += blockDim.x) sum += score[j] = expf(score[j] - mx);
  sum = block_sum(sum, red);  // its barriers also publish score[]
  T* o = out + (static_cast<int64_t>(b) * s.NH + h) * s.HS;
  for (int i = threadIdx.x; i < s.HS; i += blockDim.x) {
    float acc = 0.0f;
    for (int j = 0; j < n; ++j) acc += score[j] * to_f32(vb[j * kvw + i]);
    o[i] = from_f32<T>(acc / sum);
  }
}

}  // namespace

void decode_attention_generic(Context& ctx, DType dt, void* out, const void* q, const void* cache_k,
                              const void* cache_v, const int32_t* pos, const DecodeShape& s, int64_t q_stride) {
  FORGE_CHECK(s.NKV > 0 && s.NH % s.NKV == 0, "[decode_attention] ", s.NH, " heads over ", s.NKV, " kv heads");
  // 16 bytes past the cap rows: the compiled P·V loop loads score[] in vectors and may read up to
  // three floats past n (values it then ignores); compute-sanitizer's memcheck reported such a
  // 12-byte read past a cap-row allocation (f32, cap 70) as out of bounds.
  const size_t smem = (static_cast<size_t>(s.cap) + 4) * sizeof(float);
  constexpr size_t kMaxSmem = 200 * 1024;
  if (smem > kMaxSmem + 16)
    throw Error(str("[decode_attention] head size ", s.HS, " with a cache of ", s.cap,
                    " rows: the generic kernel holds at most ", kMaxSmem / 4, " rows"));
  if (s.S == 0) return;
  const int64_t qs = q_stride ? q_stride : static_cast<int64_t>(s.NH) * s.HS;
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.HS));
  dispatch_dtype(dt, "decode_attention", [&](auto tag) {
    using T = decltype(tag);
    auto kernel = decode_attention_generic_kernel<T>;
    if (smem > 48 * 1024)
      FORGE_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            static_cast<int>(smem)));
    kernel<<<s.S * s.NH, kThreads, smem, ctx.stream()>>>(static_cast<T*>(out), static_cast<const T*>(q),
                                                          static_cast<const T*>(cache_k),
                                                          static_cast<const T*>(cache_v), pos, s, qs, scale);
    FORGE_CUDA_CHECK(cudaGetLastError());
  });
}

}  // namespace forge::cuda
