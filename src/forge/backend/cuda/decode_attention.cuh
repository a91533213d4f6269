// Private to the decode attention kernels: decode_attention.cu (the split kernel and the entry
// points of decode.h) and decode_attention_rows.cu (the one-pass kernel for short caches). The
// kernels' arguments and the pieces both use.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "forge/backend/cuda/context.h"
#include "forge/backend/cuda/decode.h"
#include "forge/backend/cuda/rope.cuh"
#include "forge/core/dtype.h"

namespace forge::cuda::decode_attn {

inline constexpr int kMaxHeads = 8;  // query heads per block of the split kernel

struct HeadChunks {
  int chunks;  // blocks per kv head
  int heads;   // query heads per block (the last chunk may have fewer)
};

inline HeadChunks head_chunks(int group, int max_heads = kMaxHeads) {
  const int chunks = (group + max_heads - 1) / max_heads;
  return {chunks, (group + chunks - 1) / chunks};
}

template <typename T>
struct AttnArgs {
  T* out;              // (S, NH, HS)
  const T* q;          // (S, q_stride), heads at h·HS
  T* cache_k;          // (S, cap, NKV, HS)
  T* cache_v;          // (S, cap, NKV, HS)
  const int32_t* pos;  // (S)
  float* part_ml;      // (S, NH, splits, 2) running max (log2 units) and sum per split
  float* part_acc;     // (S, NH, splits, HS) unnormalised output per split
  int* arrivals;       // (S, NKV·chunks) splits done, zero between calls
  // rope_decode_attention: the step's k and v rows (S, q_stride) at kv head h·HS (k before
  // RoPE), null for decode_attention (the cache already holds row pos % cap).
  const T* k_new;
  const T* v_new;
  bool rope;         // rotate q and k_new (freqs in the kernel's second parameter)
  bool rotate_half;  // pairs (i, i + HS/2); else (2i, 2i + 1)
  int64_t q_stride;
  int NH, NKV, cap;
  int group;        // NH / NKV
  int chunk_heads;  // query heads per block (HeadChunks::heads)
  int chunks;       // blocks per kv head
  int splits;
  float scale_log2;  // log2(e) / sqrt(HS)
};

__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}

// decode_attention_rows.cu: whether the one-pass kernel takes a call (a function of the shape,
// so a captured graph keeps its kernel at every position), and its launch (bf16 and f16; it sets
// a.chunk_heads and a.chunks for the query heads it puts in a block).
bool rows_kernel_takes(DType dt, const DecodeShape& s);
template <typename T>
void launch_rows(Context& ctx, AttnArgs<T> a, const kernels::RopeFreqs& f, int S);

}  // namespace forge::cuda::decode_attn
