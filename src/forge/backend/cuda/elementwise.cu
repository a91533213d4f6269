// CUDA elementwise ops: dtype conversion, residual add, add_inplace, GELU (tanh form) and
// SwiGLU, forward and backward. Same functions as backend/cpu/activation.cpp, computed in f32.
//
// Design: one grid-stride "map" kernel, templated on the per-element functor and on the chunk
// width kN. Each thread handles kN = 8 consecutive elements per iteration: for bf16 that is one
// 16-byte load per operand, for f32 two, all issued before the math so several loads are in
// flight per thread (the kernels are purely memory-bound: GELU backward moves 8 bytes per bf16
// element for ~20 flops). The kN = 8 instantiation runs when every pointer is 16-byte aligned;
// the n % 8 tail is then done element by element by the first threads of the grid. Any
// misaligned operand (a view at an odd offset) selects the kN = 1 instantiation instead. The
// grid is capped at 8 blocks of 256 threads per SM (a full H200 is 132 × 2048 threads) and
// strides over the rest.
//
// In-place use is allowed where the contract allows it (residual out = a or b, add_inplace, the
// += of the backward passes): each element is read and written by the same thread, so the
// pointers are deliberately not __restrict__.
//
// The math follows the CPU twin: tanh through one exp, tanh u = 1 − 2/(e^{2u} + 1), and
// σ(z) = 1/(1 + e^{−z}) with full-precision expf (not __expf), so the f32 kernels agree with the
// CPU to a few ulp (nvcc contracts a·b + c into FMAs, the CPU does not).
//
// ptxas (sm_90a, CUDA 13.0, -Xptxas=-v): registers, spill stores, stack frame per kernel
// (map_kernel<kN, TIn, TOut, inputs, outputs, op>; kN = 1 is the element-by-element one):
//   map_kernel<1, bf16, bf16, 3, 2, SwigluBwd>            (was 5 inputs: 22 regs; not re-measured)
//   map_kernel<8, bf16, bf16, 3, 2, SwigluBwd>            (was 5 inputs: 60 regs; not re-measured)
//   map_kernel<1, float, float, 3, 2, SwigluBwd>          (was 5 inputs: 40 regs; not re-measured)
//   map_kernel<8, float, float, 3, 2, SwigluBwd>          (was 5 inputs: 74 regs; not re-measured)
//   map_kernel<1, bf16, bf16, 2, 1, SwigluFwd>            19 regs, 0 spill, 0 stack
//   map_kernel<8, bf16, bf16, 2, 1, SwigluFwd>            36 regs, 0 spill, 0 stack
//   map_kernel<1, float, float, 2, 1, SwigluFwd>          30 regs, 0 spill, 0 stack
//   map_kernel<8, float, float, 2, 1, SwigluFwd>          40 regs, 0 spill, 0 stack
//   map_kernel<1, bf16, bf16, 3, 1, GeluBwd>              21 regs, 0 spill, 0 stack
//   map_kernel<8, bf16, bf16, 3, 1, GeluBwd>              45 regs, 0 spill, 0 stack
//   map_kernel<1, float, float, 3, 1, GeluBwd>            32 regs, 0 spill, 0 stack
//   map_kernel<8, float, float, 3, 1, GeluBwd>            55 regs, 0 spill, 0 stack
//   map_kernel<1, bf16, bf16, 1, 1, GeluFwd>              17 regs, 0 spill, 0 stack
//   map_kernel<8, bf16, bf16, 1, 1, GeluFwd>              29 regs, 0 spill, 0 stack
//   map_kernel<1, float, float, 1, 1, GeluFwd>            28 regs, 0 spill, 0 stack
//   map_kernel<8, float, float, 1, 1, GeluFwd>            38 regs, 0 spill, 0 stack
//   map_kernel<1, bf16, bf16, 2, 1, Add>                  13 regs, 0 spill, 0 stack
//   map_kernel<8, bf16, bf16, 2, 1, Add>                  32 regs, 0 spill, 0 stack
//   map_kernel<1, float, float, 2, 1, Add>                24 regs, 0 spill, 0 stack
//   map_kernel<8, float, float, 2, 1, Add>                28 regs, 0 spill, 0 stack
//   map_kernel<1, float, bf16, 1, 1, Copy>                10 regs, 0 spill, 0 stack
//   map_kernel<8, float, bf16, 1, 1, Copy>                28 regs, 0 spill, 0 stack
//   map_kernel<1, bf16, float, 1, 1, Copy>                12 regs, 0 spill, 0 stack
//   map_kernel<8, bf16, float, 1, 1, Copy>                32 regs, 0 spill, 0 stack
#include <cuda_runtime.h>

#include <type_traits>

#include "forge/backend/cuda/context.h"
#include "forge/backend/cuda/kernel_utils.cuh"
#include "forge/backend/cuda/ops.h"

namespace forge::cuda {
namespace {

using namespace kernels;

// ---- per-element functors: f32 in, f32 out ---------------------------------------------------

struct Copy {
  __device__ void operator()(const float* x, float* y) const { y[0] = x[0]; }
};
struct Add {  // y = x0 + x1
  __device__ void operator()(const float* x, float* y) const { y[0] = x[0] + x[1]; }
};

constexpr float kGeluScale = 0.7978845608028654f;  // √(2/π)
constexpr float kGeluCubic = 0.044715f;

__device__ __forceinline__ float tanh_via_exp(float u) {
  return 1.0f - 2.0f / (expf(2.0f * u) + 1.0f);
}
__device__ __forceinline__ float sigmoid(float z) {
  return 1.0f / (1.0f + expf(-z));
}

struct GeluFwd {  // x = {inp}
  __device__ void operator()(const float* x, float* y) const {
    const float v = x[0];
    y[0] = 0.5f * v * (1.0f + tanh_via_exp(kGeluScale * (v + kGeluCubic * v * v * v)));
  }
};
struct GeluBwd {  // x = {inp, dout, dinp}; y = {dinp + gelu'(inp)·dout}
  __device__ void operator()(const float* x, float* y) const {
    const float v = x[0];
    const float th = tanh_via_exp(kGeluScale * (v + kGeluCubic * v * v * v));
    const float du_dx = kGeluScale * (1.0f + 3.0f * kGeluCubic * v * v);
    const float grad = 0.5f * (1.0f + th) + 0.5f * v * (1.0f - th * th) * du_dx;
    y[0] = x[2] + grad * x[1];
  }
};
struct SwigluFwd {  // x = {gate, up}
  __device__ void operator()(const float* x, float* y) const {
    const float g = x[0];
    y[0] = g * sigmoid(g) * x[1];
  }
};
struct SwigluBwd {  // x = {gate, up, dout}; y = {dgate, dup} (written, not accumulated)
  __device__ void operator()(const float* x, float* y) const {
    const float g = x[0], s = sigmoid(g);
    y[0] = x[2] * x[1] * s * (1.0f + g * (1.0f - s));
    y[1] = x[2] * g * s;
  }
};

// ---- the map kernel ---------------------------------------------------------------------------

template <typename TIn, typename TOut, int NIn, int NOut>
struct MapArgs {
  const TIn* in[NIn];  // (n) each
  TOut* out[NOut];     // (n) each; may alias an input
  int64_t n;
  // Rows (row > 0, the kRows kernels): element i is (i / row, i % row), at r · ld + c of its
  // operand (the halves of a fused gate|up product). row = 0: dense, ld unused.
  int64_t row = 0;
  int64_t ld_in[NIn] = {};
  int64_t ld_out[NOut] = {};
};

// Where element i of an operand with row stride ld lies.
template <bool kRows>
__device__ __forceinline__ int64_t at_row(int64_t i, int64_t row, int64_t ld) {
  if constexpr (kRows) return i / row * ld + i % row;
  return i;
}

template <int kN, bool kRows, typename TIn, typename TOut, int NIn, int NOut, typename Op>
__global__ void __launch_bounds__(256) map_kernel(MapArgs<TIn, TOut, NIn, NOut> a, Op op) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t chunks = a.n / kN;
  for (int64_t c = tid; c < chunks; c += stride) {  // a chunk never straddles rows (row % kN == 0)
    float x[NIn][kN], y[NOut][kN];
#pragma unroll
    for (int i = 0; i < NIn; ++i) load<TIn, kN>(a.in[i] + at_row<kRows>(c * kN, a.row, a.ld_in[i]), x[i]);
#pragma unroll
    for (int e = 0; e < kN; ++e) {
      float xe[NIn], ye[NOut];
#pragma unroll
      for (int i = 0; i < NIn; ++i) xe[i] = x[i][e];
      op(xe, ye);
#pragma unroll
      for (int o = 0; o < NOut; ++o) y[o][e] = ye[o];
    }
#pragma unroll
    for (int o = 0; o < NOut; ++o) store<TOut, kN>(a.out[o] + at_row<kRows>(c * kN, a.row, a.ld_out[o]), y[o]);
  }
  if constexpr (kN > 1 && !kRows) {  // the n % kN tail (rows: row % kN == 0, so n % kN == 0)
    for (int64_t i = chunks * kN + tid; i < a.n; i += stride) {
      float xe[NIn], ye[NOut];
#pragma unroll
      for (int k = 0; k < NIn; ++k) xe[k] = to_f32(a.in[k][i]);
      op(xe, ye);
#pragma unroll
      for (int o = 0; o < NOut; ++o) a.out[o][i] = from_f32<TOut>(ye[o]);
    }
  }
}

template <typename TIn, typename TOut, int NIn, int NOut, typename Op>
void launch_map(Context& ctx, const MapArgs<TIn, TOut, NIn, NOut>& a, Op op) {
  if (a.n == 0) return;
  constexpr int kThreads = 256, kChunk = 8;
  bool vec = true;
  for (const TIn* p : a.in) vec = vec && aligned16(p);
  for (const TOut* p : a.out) vec = vec && aligned16(p);
  if (a.row > 0) {  // rows of whole 16-byte chunks: row and every ld a multiple of kChunk
    vec = vec && a.row % kChunk == 0;
    for (int64_t ld : a.ld_in) vec = vec && ld % kChunk == 0;
    for (int64_t ld : a.ld_out) vec = vec && ld % kChunk == 0;
  }
  const int64_t work = vec ? (a.n + kChunk - 1) / kChunk : a.n;
  const int grid = grid_for(work, kThreads, ctx.num_sms());
  if (a.row > 0) {
    if (vec) map_kernel<kChunk, true><<<grid, kThreads, 0, ctx.stream()>>>(a, op);
    else map_kernel<1, true><<<grid, kThreads, 0, ctx.stream()>>>(a, op);
  } else if (vec) {
    map_kernel<kChunk, false><<<grid, kThreads, 0, ctx.stream()>>>(a, op);
  } else {
    map_kernel<1, false><<<grid, kThreads, 0, ctx.stream()>>>(a, op);
  }
  FORGE_CUDA_CHECK_LAUNCH();
}

}  // namespace

// ---- op entry points --------------------------------------------------------------------------

void convert(Context& ctx, DType dst_t, void* dst, DType src_t, const void* src, int64_t n) {
  FORGE_CHECK(n >= 0, "[convert] negative size ", n);
  if (n == 0) return;
  dispatch_dtype(dst_t, "convert", [&](auto dst_tag) {
    using TOut = decltype(dst_tag);
    dispatch_dtype(src_t, "convert", [&](auto src_tag) {
      using TIn = decltype(src_tag);
      if constexpr (std::is_same_v<TIn, TOut>) {
        FORGE_CUDA_CHECK(
            cudaMemcpyAsync(dst, src, n * sizeof(TIn), cudaMemcpyDeviceToDevice, ctx.stream()));
      } else {
        launch_map(
            ctx,
            MapArgs<TIn, TOut, 1, 1>{{static_cast<const TIn*>(src)}, {static_cast<TOut*>(dst)}, n},
            Copy{});
      }
    });
  });
}

void residual_fwd(Context& ctx, DType dt, void* out, const void* a, const void* b, int64_t n) {
  FORGE_CHECK(n >= 0, "[residual_fwd] negative size ", n);
  dispatch_dtype(dt, "residual_fwd", [&](auto tag) {
    using T = decltype(tag);
    launch_map(ctx,
               MapArgs<T, T, 2, 1>{
                   {static_cast<const T*>(a), static_cast<const T*>(b)}, {static_cast<T*>(out)}, n},
               Add{});
  });
}

void add_inplace(Context& ctx, DType dt, void* dst, const void* src, int64_t n) {
  FORGE_CHECK(n >= 0, "[add_inplace] negative size ", n);
  dispatch_dtype(dt, "add_inplace", [&](auto tag) {
    using T = decltype(tag);
    launch_map(
        ctx,
        MapArgs<T, T, 2, 1>{
            {static_cast<const T*>(dst), static_cast<const T*>(src)}, {static_cast<T*>(dst)}, n},
        Add{});
  });
}

void gelu_fwd(Context& ctx, DType dt, void* out, const void* inp, int64_t n) {
  FORGE_CHECK(n >= 0, "[gelu_fwd] negative size ", n);
  dispatch_dtype(dt, "gelu_fwd", [&](auto tag) {
    using T = decltype(tag);
    launch_map(ctx, MapArgs<T, T, 1, 1>{{static_cast<const T*>(inp)}, {static_cast<T*>(out)}, n},
               GeluFwd{});
  });
}

void gelu_bwd(Context& ctx, DType dt, void* dinp, const void* inp, const void* dout, int64_t n) {
  FORGE_CHECK(n >= 0, "[gelu_bwd] negative size ", n);
  dispatch_dtype(dt, "gelu_bwd", [&](auto tag) {
    using T = decltype(tag);
    launch_map(ctx,
               MapArgs<T, T, 3, 1>{{static_cast<const T*>(inp), static_cast<const T*>(dout),
                                    static_cast<const T*>(dinp)},
                                   {static_cast<T*>(dinp)},
                                   n},
               GeluBwd{});
  });
}

void swiglu_fwd(Context& ctx, DType dt, void* out, const void* gate, const void* up, int64_t n) {
  FORGE_CHECK(n >= 0, "[swiglu_fwd] negative size ", n);
  dispatch_dtype(dt, "swiglu_fwd", [&](auto tag) {
    using T = decltype(tag);
    launch_map(
        ctx,
        MapArgs<T, T, 2, 1>{
            {static_cast<const T*>(gate), static_cast<const T*>(up)}, {static_cast<T*>(out)}, n},
        SwigluFwd{});
  });
}

void swiglu_bwd(Context& ctx, DType dt, void* dgate, void* dup, const void* dout, const void* gate,
                const void* up, int64_t n) {
  FORGE_CHECK(n >= 0, "[swiglu_bwd] negative size ", n);
  dispatch_dtype(dt, "swiglu_bwd", [&](auto tag) {
    using T = decltype(tag);
    launch_map(ctx,
               MapArgs<T, T, 3, 2>{{static_cast<const T*>(gate), static_cast<const T*>(up),
                                    static_cast<const T*>(dout)},
                                   {static_cast<T*>(dgate), static_cast<T*>(dup)},
                                   n},
               SwigluBwd{});
  });
}

void swiglu_fwd_rows(Context& ctx, DType dt, void* out, const void* gate, const void* up, int64_t rows, int ff,
                     int64_t ld) {
  FORGE_CHECK(rows >= 0 && ff > 0 && ld >= ff, "[swiglu_fwd_rows] bad shape rows=", rows, " ff=", ff, " ld=", ld);
  dispatch_dtype(dt, "swiglu_fwd_rows", [&](auto tag) {
    using T = decltype(tag);
    MapArgs<T, T, 2, 1> a{{static_cast<const T*>(gate), static_cast<const T*>(up)}, {static_cast<T*>(out)}, rows * ff};
    a.row = ff, a.ld_in[0] = a.ld_in[1] = ld, a.ld_out[0] = ff;
    launch_map(ctx, a, SwigluFwd{});
  });
}

void swiglu_bwd_rows(Context& ctx, DType dt, void* dgate, void* dup, const void* dout, const void* gate,
                     const void* up, int64_t rows, int ff, int64_t ld) {
  FORGE_CHECK(rows >= 0 && ff > 0 && ld >= ff, "[swiglu_bwd_rows] bad shape rows=", rows, " ff=", ff, " ld=", ld);
  dispatch_dtype(dt, "swiglu_bwd_rows", [&](auto tag) {
    using T = decltype(tag);
    MapArgs<T, T, 3, 2> a{{static_cast<const T*>(gate), static_cast<const T*>(up), static_cast<const T*>(dout)},
                          {static_cast<T*>(dgate), static_cast<T*>(dup)},
                          rows * ff};
    a.row = ff, a.ld_in[0] = a.ld_in[1] = ld, a.ld_in[2] = ff, a.ld_out[0] = a.ld_out[1] = ld;
    launch_map(ctx, a, SwigluBwd{});
  });
}

}  // namespace forge::cuda
