// CUDA KV-cache decode ops (decode.h), attention aside (decode_attention.cu); the GPU twins of
// backend/cpu/decode.cpp. Every per-step value (tokens, positions) is read from device memory
// and nothing here synchronises or allocates, so a decode step is capturable in a CUDA graph
// and replays with new positions.
//
// Memory-bound ops, each a grid-stride loop with 16-byte accesses where the row length and the
// pointers allow (kN = kVec<T> elements), element by element otherwise (kN = 1):
//  - embedding_at: one warp per row, out = wte[token] + wpe[pos], added in f32 (embedding.cu's
//    forward with a position per row).
//  - rope_at: rope.cu's kernel with a position per row, built from the same pieces (rope.cuh):
//    the host passes inv_freq_i / π in double (exactly the CPU's inv_freq, scaling included) in
//    the kernel's parameter space, the kernel forms the angle in half-turns in double, reduces it
//    exactly to [−1, 1] and evaluates sincospif in f32, so the result agrees with rope_fwd at
//    t = pos bit for bit, and with the CPU to ~1e-7 at any position. One thread per (row, head,
//    chunk of kN pairs); rows may be strided (q and k slices of a fused projection).
//  - kv_append: a copy of 2·S rows of NKV·HS elements to row pos[s] % cap of the caches, raw
//    bits (no conversion), one thread per 16-byte chunk.
//  - advance_positions: one thread per slot.
//
// ptxas (sm_90a, CUDA 13.0, -Xptxas=-v): registers, spill stores, stack frame per kernel:
//   embedding_at_kernel<T, kN>                    32-40 regs, 0 spill, 0 stack
//   rope_at_kernel<T, kN, style>                  28-40 regs, 0 spill, 0 stack
//   kv_append_kernel<int4 or T>                   28-30 regs, 0 spill, 0 stack
//   advance_positions_kernel                          8 regs, 0 spill, 0 stack
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "forge/backend/cuda/context.h"
#include "forge/backend/cuda/decode.h"
#include "forge/backend/cuda/kernel_utils.cuh"
#include "forge/backend/cuda/rope.cuh"
#include "forge/core/error.h"

namespace forge::cuda {
namespace {

using namespace kernels;

constexpr int kThreads = 256;  // memory-bound kernels

// ---- embedding_at ---------------------------------------------------------------------------

// One warp per row n, grid-stride over rows; lane l moves chunks l, l + 32, ... of kN.
template <typename T, int kN>
__global__ void __launch_bounds__(kThreads)
    embedding_at_kernel(T* __restrict__ out, const int32_t* __restrict__ tokens,
                        const int32_t* __restrict__ pos, const T* __restrict__ wte,
                        const T* __restrict__ wpe, int N, int C) {
  const int lane = threadIdx.x % 32, warps_per_block = blockDim.x / 32;
  for (int n = blockIdx.x * warps_per_block + threadIdx.x / 32; n < N;
       n += gridDim.x * warps_per_block) {
    const T* e = wte + static_cast<int64_t>(tokens[n]) * C;                          // (C)
    const T* p = wpe != nullptr ? wpe + static_cast<int64_t>(pos[n]) * C : nullptr;  // (C)
    T* o = out + static_cast<int64_t>(n) * C;                                        // (C)
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

// ---- rope_at --------------------------------------------------------------------------------

// One thread per (row = n·H + h, chunk of kN pairs); row n of x starts at x + n·stride.
template <typename T, int kN, bool kRotateHalf>
__global__ void __launch_bounds__(kThreads)
    rope_at_kernel(T* x, const int32_t* __restrict__ pos, const __grid_constant__ RopeFreqs freqs,
                   int rows, int H, int HS, int64_t stride) {
  const int half = HS / 2;
  const int chunks = half / kN;
  const int total = rows * chunks;  // < 2^31: checked on the host
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
    const int row = i / chunks;              // n·H + h
    const int p0 = (i - row * chunks) * kN;  // first pair of this thread
    const int n = row / H, h = row - n * H;
    const double at = static_cast<double>(pos[n]);
    float cs[kN], sn[kN];
#pragma unroll
    for (int k = 0; k < kN; ++k) rope_sincos(at, freqs.inv_freq_over_pi[p0 + k], &sn[k], &cs[k]);
    T* xh = x + n * stride + static_cast<int64_t>(h) * HS;  // (HS)
    rope_rotate_pairs<T, kN, kRotateHalf>(xh, p0, half, cs, sn);
  }
}

// ---- kv_append ------------------------------------------------------------------------------

// One thread per (slot, k or v, chunk of one Word): Word = int4 (16 bytes) or T.
template <typename Word>
__global__ void __launch_bounds__(kThreads)
    kv_append_kernel(Word* __restrict__ cache_k, Word* __restrict__ cache_v,
                     const Word* __restrict__ k, const Word* __restrict__ v,
                     const int32_t* __restrict__ pos, int S, int cap, int width, int64_t k_stride,
                     int64_t v_stride) {  // width, strides in Words
  const int total = 2 * S * width;        // < 2^31: checked on the host
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
    const int row = i / width, c = i - row * width;  // row = 2·slot + (0: k, 1: v)
    const int slot = row / 2;
    const int64_t dst = (static_cast<int64_t>(slot) * cap + pos[slot] % cap) * width + c;
    if (row % 2 == 0) {
      cache_k[dst] = k[slot * k_stride + c];
    } else {
      cache_v[dst] = v[slot * v_stride + c];
    }
  }
}

// ---- advance_positions ----------------------------------------------------------------------

__global__ void advance_positions_kernel(int32_t* pos, int S, int32_t limit) {
  const int s = blockIdx.x * blockDim.x + threadIdx.x;
  if (s < S) pos[s] = min(pos[s] + 1, limit);
}

}  // namespace

void check_decode_shape(const DecodeShape& s, const char* op) {
  if (s.S < 0 || s.NH <= 0 || s.NKV <= 0 || s.HS <= 0 || s.cap <= 0 || s.NH % s.NKV != 0)
    throw Error(str("[", op, "] bad shape S=", s.S, " NH=", s.NH, " NKV=", s.NKV, " HS=", s.HS,
                    " cap=", s.cap, " (want S >= 0, NH, NKV, HS, cap > 0, NH % NKV == 0)"));
}

int64_t decode_row_stride(int64_t stride, int64_t width, const char* op, const char* what) {
  if (stride == 0) return width;
  if (stride < width)
    throw Error(
        str("[", op, "] ", what, " stride ", stride, " is shorter than the row (", width, ")"));
  return stride;
}

void embedding_at(Context& ctx, DType dt, void* out, const int32_t* tokens, const int32_t* pos,
                  const void* wte, const void* wpe, int N, int C) {
  if (N < 0 || C < 0) throw Error(str("[embedding_at] negative dims N=", N, " C=", C));
  if (N == 0 || C == 0) return;
  dispatch_dtype(dt, "embedding_at", [&](auto tag) {
    using T = decltype(tag);
    T* o = static_cast<T*>(out);
    const T* e = static_cast<const T*>(wte);
    const T* p = static_cast<const T*>(wpe);
    const int grid = grid_for(static_cast<int64_t>(N) * 32, kThreads, ctx.num_sms());
    if (C % kVec<T> == 0 && aligned16(out) && aligned16(wte) &&
        (wpe == nullptr || aligned16(wpe))) {
      embedding_at_kernel<T, kVec<T>>
          <<<grid, kThreads, 0, ctx.stream()>>>(o, tokens, pos, e, p, N, C);
    } else {
      embedding_at_kernel<T, 1><<<grid, kThreads, 0, ctx.stream()>>>(o, tokens, pos, e, p, N, C);
    }
    FORGE_CUDA_CHECK_LAUNCH();
  });
}

void rope_at(Context& ctx, DType dt, void* x, const int32_t* pos, int N, int H, int HS,
             const Rope& rope, int64_t stride) {
  if (N < 0 || H < 0 || HS <= 0 || HS % 2 != 0 || HS / 2 > kRopeMaxHalf)
    throw Error(str("[rope_at] bad shape N=", N, " H=", H, " HS=", HS,
                    " (want an even HS <= ", 2 * kRopeMaxHalf, ")"));
  const int64_t rs = decode_row_stride(stride, static_cast<int64_t>(H) * HS, "rope_at", "row");
  if (static_cast<int64_t>(N) * H * HS >= (int64_t{1} << 31))
    throw Error(
        str("[rope_at] N·H·HS = ", static_cast<int64_t>(N) * H * HS, " exceeds int32 indexing"));
  const RopeFreqs f = rope_freqs(rope, HS);  // exactly the CPU's inv_freq, then / π
  const int rows = N * H;
  if (rows == 0) return;
  const int half = HS / 2;
  dispatch_dtype(dt, "rope_at", [&](auto tag) {
    using T = decltype(tag);
    T* xt = static_cast<T*>(x);
    auto run = [&](auto kn) {
      constexpr int kN = decltype(kn)::value;
      const int grid = grid_for(static_cast<int64_t>(rows) * (half / kN), kThreads, ctx.num_sms());
      if (rope.style == RopeStyle::kRotateHalf)
        rope_at_kernel<T, kN, true>
            <<<grid, kThreads, 0, ctx.stream()>>>(xt, pos, f, rows, H, HS, rs);
      else
        rope_at_kernel<T, kN, false>
            <<<grid, kThreads, 0, ctx.stream()>>>(xt, pos, f, rows, H, HS, rs);
      FORGE_CUDA_CHECK_LAUNCH();
    };
    if (half % kVec<T> == 0 && aligned16(x) && (rs * sizeof(T)) % 16 == 0)
      run(std::integral_constant<int, kVec<T>>{});
    else
      run(std::integral_constant<int, 1>{});
  });
}

void kv_append(Context& ctx, DType dt, void* cache_k, void* cache_v, const void* k, const void* v,
               const int32_t* pos, const DecodeShape& s, int64_t k_stride, int64_t v_stride) {
  check_decode_shape(s, "kv_append");
  const int64_t width = static_cast<int64_t>(s.NKV) * s.HS;
  const int64_t ks = decode_row_stride(k_stride, width, "kv_append", "k");
  const int64_t vs = decode_row_stride(v_stride, width, "kv_append", "v");
  if (2 * s.S * width >= (int64_t{1} << 31))
    throw Error(str("[kv_append] 2·S·NKV·HS = ", 2 * s.S * width, " exceeds int32 indexing"));
  if (s.S == 0) return;
  const int64_t es = static_cast<int64_t>(dtype_size(dt));
  const bool vec = (width * es) % 16 == 0 && (ks * es) % 16 == 0 && (vs * es) % 16 == 0 &&
                   aligned16(cache_k) && aligned16(cache_v) && aligned16(k) && aligned16(v);
  auto run = [&](auto word) {
    using Word = decltype(word);
    const int64_t per = static_cast<int64_t>(sizeof(Word)) / es;  // elements per Word
    const int w = static_cast<int>(width / per);
    const int grid = grid_for(2 * s.S * static_cast<int64_t>(w), kThreads, ctx.num_sms());
    kv_append_kernel<Word><<<grid, kThreads, 0, ctx.stream()>>>(
        static_cast<Word*>(cache_k), static_cast<Word*>(cache_v), static_cast<const Word*>(k),
        static_cast<const Word*>(v), pos, s.S, s.cap, w, ks / per, vs / per);
    FORGE_CUDA_CHECK_LAUNCH();
  };
  if (vec) {
    run(int4{});
  } else {
    dispatch_dtype(dt, "kv_append", [&](auto tag) { run(tag); });
  }
}

void advance_positions(Context& ctx, int32_t* pos, int S, int32_t limit) {
  if (S <= 0) return;
  advance_positions_kernel<<<(S + 127) / 128, 128, 0, ctx.stream()>>>(pos, S, limit);
  FORGE_CUDA_CHECK_LAUNCH();
}

}  // namespace forge::cuda
