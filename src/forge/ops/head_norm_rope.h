// Qwen3's per-head q/k RMSNorm followed by RoPE, as one op (the training step's fused pair):
// x (B, T, H, HS) = rope(rmsnorm(x_raw[b, t, h, :]) · weight), rstd (B, T, H) saved; the
// backward takes the gradient of x through the inverse rotation and the norm's backward. The CPU
// twin composes rope.cpp and rmsnorm.cpp; the CUDA op (backend/cuda/head_norm_rope.cu) reads and
// writes each element once per pass.
#pragma once

#include <cstdint>

#include "forge/ops/rope.h"

namespace forge::cpu {

// x (B, T, H, HS), rstd (B, T, H) = per-head RMSNorm of x_raw (B, T, H, HS) times weight (HS),
// then RoPE at positions t, or pos[b, t] when pos (B, T) is given. rope null: no rotation (a
// NoPE layer). x must not alias x_raw (the backward needs x_raw). ld: elements from one
// position's heads to the next in x_raw and x alike (views into fused q|k|v rows; elements
// between them untouched); 0: H·HS. rstd is dense.
// H0 in (0, H): two groups of heads with their own gains, as q's and k's heads in one fused
// q|k|v row — heads [0, H0) take weight[0, HS) and heads [H0, H) weight[HS, 2·HS); rstd is then
// (B, T, H0) followed by (B, T, H − H0), and the result is exactly that of two calls, one per
// group (the CUDA op computes a position's RoPE angles once for both). H0 = 0: one group.
template <typename T>
void head_norm_rope_fwd(T* x, T* rstd, const T* x_raw, const T* weight, int B, int T_, int H,
                        int HS, float eps, const Rope* rope, const int32_t* pos = nullptr,
                        int64_t ld = 0, int H0 = 0);

// dx_raw (B, T, H, HS) = the gradient of x_raw given dx, the gradient of the forward's x: WRITTEN,
// not accumulated (the projection backward that follows reads it). dx_raw may alias dx (in
// place); dweight (HS) accumulates (+=), nullptr: not computed (a frozen gain). ld: the row
// stride of dx_raw, dx and x_raw alike (views into fused q|k|v rows; elements between the
// views untouched); 0: H·HS. H0 in (0, H): the forward's two groups (weight, dweight (2, HS),
// rstd as the forward wrote it).
template <typename T>
void head_norm_rope_bwd(T* dx_raw, T* dweight, const T* dx, const T* x_raw, const T* weight,
                        const T* rstd, int B, int T_, int H, int HS, const Rope* rope,
                        const int32_t* pos = nullptr, int64_t ld = 0, int H0 = 0);

}  // namespace forge::cpu
