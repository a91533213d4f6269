// CUDA token (+ learned position) embedding; the GPU twin of backend/cpu/embedding.cpp.
//
// Forward: a gather, one warp per (b, t) row (grid-stride over rows), each lane moving 16-byte
// chunks (kN = kVec<T> elements): out = wte[token] + wpe[t], three 16-byte accesses, coalesced
// across the warp. Element by element (kN = 1) when C is not a multiple of kVec<T> or a pointer
// is not 16-byte aligned. Indices are int32 (B·T < 2^31 is checked): an earlier flat int64
// index needed a 64-bit division, a called subroutine that spilled.
//
// Backward, deterministic without atomics. A token id can occur many times in a batch, so dwte
// rows are scatter targets shared by several positions. We group positions by token:
//   1. pos = 0 … BT−1 (iota kernel);
//   2. CUB radix sort of (token, pos) pairs over all 32 key bits (V is not passed). LSD radix
//      sort is stable, so the positions of one token stay in ascending (b, t) order;
//   3. head flags (sorted token differs from its predecessor), then CUB DeviceSelect::Flagged
//      on pos gives the start of every segment and, on the device, the segment count U;
//   4. embedding_dwte_kernel: grid (segments, channel strips of 32·kN), 4 warps per block. The
//      block for segment s sums the dout rows of its positions for its strip: warp y takes
//      positions y, y + 4, … of the segment in order, the 4 warp sums are added in order, and
//      the total is added (+=) to the f32 dwte row. The grid is capped (8 blocks per SM per
//      strip) and strides over segments, since U is known only on the device — no host sync.
// dwpe (T, C) sums over the batch: one thread per (t, chunk), b in order, then +=.
// Packed rows (pos (B, T) given): the forward is decode.cu's embedding_at over the B·T rows
// (wpe row pos[b, t]); in the backward several tokens of a row share a position, so dwpe is
// scattered exactly as dwte is, steps 1-4 with the positions as the keys instead of the tokens.
// Every summation order is a function of the inputs alone, so two runs are bit-identical.
// All temporaries (pos, sorted pairs, flags, starts, CUB temp storage) come from the
// context's allocator. Known cost: a very frequent token is one serial segment (4 warps per
// strip); at GPT-2 batch sizes the sort and the dout read dominate.
//
// ptxas (sm_90a, CUDA 13.0, -Xptxas=-v): registers, spill stores, stack frame per kernel
// (<T, kN, ...>: kN = 1 is the element-by-element instantiation):
//   embedding_dwpe_kernel<bf16, 1>                        29 regs, 0 spill, 0 stack
//   embedding_dwte_kernel<bf16, 1>                        26 regs, 0 spill, 0 stack
//   embedding_dwpe_kernel<bf16, 8>                        32 regs, 0 spill, 0 stack
//   embedding_dwte_kernel<bf16, 8>                        32 regs, 0 spill, 0 stack
//   embedding_dwpe_kernel<float, 1>                       28 regs, 0 spill, 0 stack
//   embedding_dwte_kernel<float, 1>                       26 regs, 0 spill, 0 stack
//   embedding_dwpe_kernel<float, 4>                       32 regs, 0 spill, 0 stack
//   embedding_dwte_kernel<float, 4>                       29 regs, 0 spill, 0 stack
//   embedding_fwd_kernel<bf16, 1>                         24 regs, 0 spill, 0 stack
//   embedding_fwd_kernel<bf16, 8>                         32 regs, 0 spill, 0 stack
//   embedding_fwd_kernel<float, 1>                        25 regs, 0 spill, 0 stack
//   embedding_fwd_kernel<float, 4>                        32 regs, 0 spill, 0 stack
//   segment_heads_kernel                                  10 regs, 0 spill, 0 stack
//   iota_kernel                                            8 regs, 0 spill, 0 stack
#include <cuda_runtime.h>

#include <cub/cub.cuh>

#include "forge/backend/cuda/context.h"
#include "forge/backend/cuda/decode.h"
#include "forge/backend/cuda/kernel_utils.cuh"
#include "forge/backend/cuda/ops.h"

namespace forge::cuda {
namespace {

using namespace kernels;

constexpr int kThreads = 256;
constexpr int kSegWarps = 4;  // warps summing one segment's rows (blockDim.y of dwte)

// One warp per (b, t) row, grid-stride over rows; lane l moves chunks l, l + 32, ... of kN.
template <typename T, int kN>
__global__ void __launch_bounds__(kThreads)
    embedding_fwd_kernel(T* __restrict__ out, const int32_t* __restrict__ tokens,
                         const T* __restrict__ wte, const T* __restrict__ wpe, int BT, int T_,
                         int C) {
  const int lane = threadIdx.x % 32, warps_per_block = blockDim.x / 32;
  const int warps = gridDim.x * warps_per_block;
  for (int bt = blockIdx.x * warps_per_block + threadIdx.x / 32; bt < BT; bt += warps) {
    const T* e = wte + static_cast<int64_t>(tokens[bt]) * C;                          // (C)
    const T* p = wpe != nullptr ? wpe + static_cast<int64_t>(bt % T_) * C : nullptr;  // (C)
    T* o = out + static_cast<int64_t>(bt) * C;                                        // (C)
#pragma unroll 2
    for (int c = lane * kN; c < C; c += 32 * kN) {
      float v[kN];
      load<T, kN>(e + c, v);
      if (p != nullptr) {
        float q[kN];
        load<T, kN>(p + c, q);
#pragma unroll
        for (int k = 0; k < kN; ++k) v[k] += q[k];
      }
      store<T, kN>(o + c, v);
    }
  }
}

__global__ void iota_kernel(int32_t* __restrict__ out, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    out[i] = i;
}

// flags[i] = 1 where sorted token i starts a new segment.
__global__ void segment_heads_kernel(uint8_t* __restrict__ flags, const int32_t* __restrict__ keys,
                                     int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    flags[i] = (i == 0 || keys[i] != keys[i - 1]) ? 1 : 0;
}

// grid (≤ segments, strips), block (32, kSegWarps). dwte (V, C) f32 += Σ dout rows per segment.
template <typename T, int kN>
__global__ void __launch_bounds__(32 * kSegWarps)
    embedding_dwte_kernel(float* __restrict__ dwte, const T* __restrict__ dout,
                          const int32_t* __restrict__ keys, const int32_t* __restrict__ pos,
                          const int32_t* __restrict__ starts,
                          const int32_t* __restrict__ num_segments, int BT, int C) {
  __shared__ float sh[kSegWarps][32 * kN];  // [warp][k·32 + lane]: conflict-free
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int c0 = (blockIdx.y * 32 + tx) * kN;  // C % kN == 0, so the chunk is all in range
  const int U = *num_segments;
  for (int s = blockIdx.x; s < U; s += gridDim.x) {
    const int begin = starts[s];
    const int end = s + 1 < U ? starts[s + 1] : BT;
    float acc[kN];
#pragma unroll
    for (int k = 0; k < kN; ++k) acc[k] = 0.0f;
    if (c0 < C) {
#pragma unroll 2
      for (int j = begin + ty; j < end; j += kSegWarps) {
        float v[kN];
        load<T, kN>(dout + static_cast<int64_t>(pos[j]) * C + c0, v);
#pragma unroll
        for (int k = 0; k < kN; ++k) acc[k] += v[k];
      }
    }
#pragma unroll
    for (int k = 0; k < kN; ++k) sh[ty][k * 32 + tx] = acc[k];
    __syncthreads();
    if (ty == 0 && c0 < C) {
      float* row = dwte + static_cast<int64_t>(keys[begin]) * C + c0;  // (kN) of (C)
      float d[kN];
      load<float, kN>(row, d);
#pragma unroll
      for (int k = 0; k < kN; ++k) {
        float t = 0.0f;
#pragma unroll
        for (int y = 0; y < kSegWarps; ++y) t += sh[y][k * 32 + tx];
        d[k] += t;
      }
      store<float, kN>(row, d);
    }
    __syncthreads();  // sh is reused by the next segment
  }
}

// dwpe (T, C) f32 += Σ_b dout[b, t]; one thread per (t, chunk of kN channels), b in order.
template <typename T, int kN>
__global__ void __launch_bounds__(kThreads)
    embedding_dwpe_kernel(float* __restrict__ dwpe, const T* __restrict__ dout, int B, int T_,
                          int C) {
  const int chunks_per_row = C / kN;
  const int total = T_ * chunks_per_row;  // < 2^31: checked on the host
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
    const int t = i / chunks_per_row;
    const int c = (i - t * chunks_per_row) * kN;
    float acc[kN];
#pragma unroll
    for (int k = 0; k < kN; ++k) acc[k] = 0.0f;
#pragma unroll 4
    for (int b = 0; b < B; ++b) {
      float v[kN];
      load<T, kN>(dout + (static_cast<int64_t>(b) * T_ + t) * C + c, v);
#pragma unroll
      for (int k = 0; k < kN; ++k) acc[k] += v[k];
    }
    float* row = dwpe + static_cast<int64_t>(t) * C + c;
    float d[kN];
    load<float, kN>(row, d);
#pragma unroll
    for (int k = 0; k < kN; ++k) d[k] += acc[k];
    store<float, kN>(row, d);
  }
}

// table (rows, C) f32 += Σ dout rows grouped by keys (BT), steps 1-4 of the header.
template <typename T, int kN>
void scatter_rows_by_key(Context& ctx, float* table, const T* dout, const int32_t* keys, int BT,
                         int C) {
  cudaStream_t st = ctx.stream();
  Allocator& al = ctx.allocator();
  DeviceBuffer<int32_t> pos(al, BT), keys_sorted(al, BT), pos_sorted(al, BT), starts(al, BT);
  DeviceBuffer<int32_t> num_segments(al, 1);
  DeviceBuffer<uint8_t> flags(al, BT);

  size_t sort_bytes = 0, select_bytes = 0;
  FORGE_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, sort_bytes, keys, keys_sorted.data(),
                                                   pos.data(), pos_sorted.data(), BT, 0, 32, st));
  FORGE_CUDA_CHECK(cub::DeviceSelect::Flagged(nullptr, select_bytes, pos.data(), flags.data(),
                                              starts.data(), num_segments.data(), BT, st));
  DeviceBuffer<uint8_t> temp(al, sort_bytes > select_bytes ? sort_bytes : select_bytes);

  const int grid1 = grid_for(BT, kThreads, ctx.num_sms());
  iota_kernel<<<grid1, kThreads, 0, st>>>(pos.data(), BT);
  FORGE_CUDA_CHECK_LAUNCH();
  FORGE_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp.data(), sort_bytes, keys,
                                                   keys_sorted.data(), pos.data(),
                                                   pos_sorted.data(), BT, 0, 32, st));
  segment_heads_kernel<<<grid1, kThreads, 0, st>>>(flags.data(), keys_sorted.data(), BT);
  FORGE_CUDA_CHECK_LAUNCH();
  FORGE_CUDA_CHECK(cub::DeviceSelect::Flagged(temp.data(), select_bytes, pos.data(), flags.data(),
                                              starts.data(), num_segments.data(), BT, st));

  const int strips = (C + 32 * kN - 1) / (32 * kN);
  const int segments_grid = BT < ctx.num_sms() * 8 ? BT : ctx.num_sms() * 8;
  embedding_dwte_kernel<T, kN><<<dim3(segments_grid, strips), dim3(32, kSegWarps), 0, st>>>(
      table, dout, keys_sorted.data(), pos_sorted.data(), starts.data(), num_segments.data(), BT,
      C);
  FORGE_CUDA_CHECK_LAUNCH();
  // The temporaries return to the allocator here; only work enqueued later on this stream can
  // reuse them.
}

template <typename T, int kN>
void launch_embedding_bwd(Context& ctx, float* dwte, float* dwpe, const T* dout,
                          const int32_t* tokens, const int32_t* pos, int B, int T_, int C) {
  const int BT = B * T_;
  scatter_rows_by_key<T, kN>(ctx, dwte, dout, tokens, BT, C);
  if (dwpe == nullptr) return;
  if (pos != nullptr) {  // packed rows: positions repeat within a row
    scatter_rows_by_key<T, kN>(ctx, dwpe, dout, pos, BT, C);
    return;
  }
  const int grid = grid_for(T_ * (C / kN), kThreads, ctx.num_sms());
  embedding_dwpe_kernel<T, kN><<<grid, kThreads, 0, ctx.stream()>>>(dwpe, dout, B, T_, C);
  FORGE_CUDA_CHECK_LAUNCH();
}

}  // namespace

void embedding_fwd(Context& ctx, DType dt, void* out, const int32_t* tokens, const void* wte,
                   const void* wpe, int B, int T_, int C, const int32_t* pos) {
  FORGE_CHECK(B >= 0 && T_ >= 0 && C > 0, "[embedding_fwd] bad dims B=", B, " T=", T_, " C=", C);
  FORGE_CHECK(static_cast<int64_t>(B) * T_ < (int64_t{1} << 31),
              "[embedding_fwd] B·T = ", static_cast<int64_t>(B) * T_,
              " positions exceed int32 indexing");
  const int BT = B * T_;
  if (pos != nullptr) {  // packed rows: a position per row, the decode op's kernel
    embedding_at(ctx, dt, out, tokens, pos, wte, wpe, BT, C);
    return;
  }
  if (BT == 0) return;
  dispatch_dtype(dt, "embedding_fwd", [&](auto tag) {
    using T = decltype(tag);
    const bool vec =
        C % kVec<T> == 0 && aligned16(out) && aligned16(wte) && (wpe == nullptr || aligned16(wpe));
    const int grid = grid_for(BT, kThreads / 32, ctx.num_sms());  // a warp per row
    auto run = [&](auto kernel) {
      kernel<<<grid, kThreads, 0, ctx.stream()>>>(static_cast<T*>(out), tokens,
                                                  static_cast<const T*>(wte),
                                                  static_cast<const T*>(wpe), BT, T_, C);
    };
    if (vec) {
      run(embedding_fwd_kernel<T, kVec<T>>);
    } else {
      run(embedding_fwd_kernel<T, 1>);
    }
    FORGE_CUDA_CHECK_LAUNCH();
  });
}

void embedding_bwd(Context& ctx, DType dt, float* dwte, float* dwpe, const void* dout,
                   const int32_t* tokens, int B, int T_, int C, const int32_t* pos) {
  FORGE_CHECK(B >= 0 && T_ >= 0 && C > 0, "[embedding_bwd] bad dims B=", B, " T=", T_, " C=", C);
  FORGE_CHECK(static_cast<int64_t>(B) * T_ < (int64_t{1} << 31) &&
                  static_cast<int64_t>(T_) * C < (int64_t{1} << 31),
              "[embedding_bwd] B=", B, " T=", T_, " C=", C, " exceed int32 indexing");
  if (B == 0 || T_ == 0) return;
  dispatch_dtype(dt, "embedding_bwd", [&](auto tag) {
    using T = decltype(tag);
    const bool vec = C % kVec<T> == 0 && aligned16(dout) && aligned16(dwte) &&
                     (dwpe == nullptr || aligned16(dwpe));
    if (vec) {
      launch_embedding_bwd<T, kVec<T>>(ctx, dwte, dwpe, static_cast<const T*>(dout), tokens, pos, B,
                                       T_, C);
    } else {
      launch_embedding_bwd<T, 1>(ctx, dwte, dwpe, static_cast<const T*>(dout), tokens, pos, B, T_,
                                 C);
    }
  });
}

}  // namespace forge::cuda
