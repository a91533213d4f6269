// RoPE pieces shared by rope.cu (rope_fwd/bwd, rope_bias_bwd), head_norm_rope.cu, decode.cu
// (rope_at) and decode_fused.cu (rope_kv_append), so they rotate by the same angles with the
// same instructions: rope_at at pos = t equals rope_fwd bit for bit, and the fused decode op
// equals rope_at (both tested).
// Private to src/forge/backend/cuda/*.cu, like kernel_utils.cuh. The angle method is described
// in rope.cu's header.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <vector>

#include "forge/backend/cuda/kernel_utils.cuh"
#include "forge/core/error.h"
#include "forge/ops/rope.h"

namespace forge::cuda::kernels {

inline constexpr int kRopeMaxHalf = 256;  // HS ≤ 512

// inv_freq_i / π for i < HS/2 (2 KB at most): passed by value in the kernel's parameter space
// (__grid_constant__), so a call needs no copy or allocation, and a captured graph keeps its own.
struct RopeFreqs {
  double inv_freq_over_pi[kRopeMaxHalf];  // (HS/2)
};

// Host: rope_inv_freq (scaling included; the CPU ops use the same table) divided by π. HS/2 ≤
// kRopeMaxHalf is the caller's check, made with its op's name before this.
inline RopeFreqs rope_freqs(const Rope& rope, int HS) {
  const std::vector<double> inv_freq = rope_inv_freq(rope, HS);  // (HS/2)
  FORGE_CHECK(inv_freq.size() <= static_cast<size_t>(kRopeMaxHalf), "[rope] HS ", HS,
              " above the supported ", 2 * kRopeMaxHalf);
  RopeFreqs f{};
  for (size_t i = 0; i < inv_freq.size(); ++i) f.inv_freq_over_pi[i] = inv_freq[i] / M_PI;
  return f;
}

// The shape checks of every RoPE op (rope_rotate, rope_bias_bwd, head_norm_rope_*): B·T rows of
// H heads of HS channels, HS even and at most 2·kRopeMaxHalf, int32-indexable; H may be 0 only
// where min_heads is 0.
inline void check_rope_shape(int B, int T_, int H, int HS, const char* op, int min_heads = 1) {
  FORGE_CHECK(B >= 0 && T_ >= 0 && H >= min_heads && HS > 0, "[", op, "] bad shape B=", B, " T=", T_,
              " H=", H, " HS=", HS);
  FORGE_CHECK(HS % 2 == 0, "[", op, "] head size must be even, got HS=", HS);
  FORGE_CHECK(HS / 2 <= kRopeMaxHalf, "[", op, "] head size ", HS, " above the supported ",
              2 * kRopeMaxHalf);
  FORGE_CHECK(static_cast<int64_t>(B) * T_ * H * HS < (int64_t{1} << 31), "[", op,
              "] B·T·H·HS = ", static_cast<int64_t>(B) * T_ * H * HS, " exceeds int32 indexing");
}

// sin and cos of the angle pos·inv_freq: in half-turns in double (one DMUL), reduced exactly to
// r ∈ [−1, 1], then sincospif(r) in f32 (no large-argument reduction; ~1e-7 at any position).
__device__ __forceinline__ void rope_sincos(double pos, double inv_freq_over_pi, float* s,
                                            float* c) {
  const double turns = pos * inv_freq_over_pi;  // angle / π
  const float r = static_cast<float>(turns - 2.0 * rint(0.5 * turns));
  sincospif(r, s, c);
}

// Rotates pairs p0 … p0 + kN − 1 of one head xh (HS), half = HS/2, by (cs[k], sn[k]):
// (x0, x1) → (x0·c − x1·s, x0·s + x1·c) in f32. kRotateHalf: pair i is (i, i + half), two
// kN-element accesses; interleaved: pair i is (2i, 2i + 1), one 2·kN-element access.
template <typename T, int kN, bool kRotateHalf>
__device__ __forceinline__ void rope_rotate_pairs(T* xh, int p0, int half, const float* cs,
                                                  const float* sn) {
  if constexpr (kRotateHalf) {
    float a[kN], b[kN];
    load<T, kN>(xh + p0, a);
    load<T, kN>(xh + p0 + half, b);
#pragma unroll
    for (int k = 0; k < kN; ++k) {
      const float x0 = a[k], x1 = b[k];
      a[k] = x0 * cs[k] - x1 * sn[k];
      b[k] = x0 * sn[k] + x1 * cs[k];
    }
    store<T, kN>(xh + p0, a);
    store<T, kN>(xh + p0 + half, b);
  } else {
    float v[2 * kN];
    load<T, 2 * kN>(xh + 2 * p0, v);
#pragma unroll
    for (int k = 0; k < kN; ++k) {
      const float x0 = v[2 * k], x1 = v[2 * k + 1];
      v[2 * k] = x0 * cs[k] - x1 * sn[k];
      v[2 * k + 1] = x0 * sn[k] + x1 * cs[k];
    }
    store<T, 2 * kN>(xh + 2 * p0, v);
  }
}

// Chunks of a head for the fused ops (head_norm_rope.cu, rope_bias_bwd): the 2·kN elements of
// chunk c of head h: u[0, kN) and u[kN, 2kN) the two halves' kN elements
// (kRotateHalf), or 2·kN consecutive ones (interleaved). Pair k is (u[k], u[kN + k]) or
// (u[2k], u[2k + 1]).
template <typename T, int kN, bool kRotateHalf>
__device__ __forceinline__ void load_chunk(const T* h, int c, int half, float (&u)[2 * kN]) {
  if constexpr (kRotateHalf) {
    load<T, kN>(h + c * kN, *reinterpret_cast<float(*)[kN]>(u));
    load<T, kN>(h + half + c * kN, *reinterpret_cast<float(*)[kN]>(u + kN));
  } else {
    load<T, 2 * kN>(h + 2 * c * kN, u);
  }
}
template <typename T, int kN, bool kRotateHalf>
__device__ __forceinline__ void store_chunk(T* h, int c, int half, const float (&u)[2 * kN]) {
  if constexpr (kRotateHalf) {
    store<T, kN>(h + c * kN, *reinterpret_cast<const float(*)[kN]>(u));
    store<T, kN>(h + half + c * kN, *reinterpret_cast<const float(*)[kN]>(u + kN));
  } else {
    store<T, 2 * kN>(h + 2 * c * kN, u);
  }
}

// The angles of chunk c's kN pairs at position `at`: cs[k] = cos θ, sn[k] = sign·sin θ with
// θ = θ(at, c·kN + k). Split from the rotation so that a kernel walking several heads of one
// position (head_norm_rope.cu's per-position split) computes them once for all of its heads.
template <int kN>
__device__ __forceinline__ void chunk_angles(float (&cs)[kN], float (&sn)[kN], int c, double at,
                                             const RopeFreqs& f, float sign) {
#pragma unroll
  for (int k = 0; k < kN; ++k) {
    rope_sincos(at, f.inv_freq_over_pi[c * kN + k], &sn[k], &cs[k]);
    sn[k] *= sign;
  }
}

// Rotates the kN pairs of a chunk by (cs[k], sn[k]): (x0, x1) → (x0·c − x1·s, x0·s + x1·c).
template <int kN, bool kRotateHalf>
__device__ __forceinline__ void rotate_chunk_by(float (&u)[2 * kN], const float (&cs)[kN],
                                                const float (&sn)[kN]) {
#pragma unroll
  for (int k = 0; k < kN; ++k) {
    const int i0 = kRotateHalf ? k : 2 * k, i1 = kRotateHalf ? kN + k : 2 * k + 1;
    const float x0 = u[i0], x1 = u[i1];
    u[i0] = x0 * cs[k] - x1 * sn[k];
    u[i1] = x0 * sn[k] + x1 * cs[k];
  }
}

// Rotates the kN pairs of chunk c by sign·θ(at, pair). (Written out rather than as chunk_angles
// then rotate_chunk_by: the same arithmetic, but this form is the one measured in every kernel
// that uses it, and the split form compiles to other instruction orders.)
template <int kN, bool kRotateHalf>
__device__ __forceinline__ void rotate_chunk(float (&u)[2 * kN], int c, double at,
                                             const RopeFreqs& f, float sign) {
#pragma unroll
  for (int k = 0; k < kN; ++k) {
    float sn, cs;
    rope_sincos(at, f.inv_freq_over_pi[c * kN + k], &sn, &cs);
    sn *= sign;
    const int i0 = kRotateHalf ? k : 2 * k, i1 = kRotateHalf ? kN + k : 2 * k + 1;
    const float x0 = u[i0], x1 = u[i1];
    u[i0] = x0 * cs - x1 * sn;
    u[i1] = x0 * sn + x1 * cs;
  }
}

}  // namespace forge::cuda::kernels
