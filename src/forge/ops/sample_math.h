// The f32 arithmetic of the row sampler (ops/sample.h), shared by both twins so that they agree
// bit for bit: cpu::sample_rows includes it as plain C++, backend/cuda/sample.cu as device code.
//
// Why not logf/expf: the host's libm and CUDA's libdevice are each within about an ulp, but not
// the same ulp, and a 1-ulp difference in one Gumbel noise value flips the sampled id whenever
// two candidates' scores are that close. The functions below use only operations that IEEE 754
// defines exactly — +, −, ×, ÷, fma, rint and conversions, each rounded to nearest even — in a
// fixed order, so every compiler and device produces the same bits. On the device every operation
// is written as its _rn intrinsic, which nvcc never contracts or approximates (also under
// -use_fast_math); on the host every product that is added is an explicit std::fma and the
// remaining products are exact (by powers of two) or feed no addition, so -ffp-contract cannot
// change a result either.
//
// Accuracy (tests/backend/cpu/sample_test.cpp, against double): log_f32 within 0.72 ulp and
// exp_f32 within 0.85 ulp on 200k random arguments, gumbel within 8.8e-7 absolute on all 2^24
// uniforms — far below what the sampler's statistics can resolve; bit-identity between the
// twins is what matters.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "forge/core/host_device.h"

namespace forge::sampling {

// ---- IEEE operations, round to nearest even, never fused ------------------------------------
FORGE_HOST_DEVICE inline float fadd(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
FORGE_HOST_DEVICE inline float fsub(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}
FORGE_HOST_DEVICE inline float fmul(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
FORGE_HOST_DEVICE inline float fdiv(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
FORGE_HOST_DEVICE inline float ffma(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}
FORGE_HOST_DEVICE inline float frint(float x) {  // to the nearest integer, ties to even
#if defined(__CUDA_ARCH__)
  return rintf(x);
#else
  return std::rint(x);
#endif
}
FORGE_HOST_DEVICE inline uint32_t bits_of(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  uint32_t b;  // C++17: nvcc's host pass compiles this too
  std::memcpy(&b, &x, sizeof b);
  return b;
#endif
}
FORGE_HOST_DEVICE inline float float_of(uint32_t b) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(b);
#else
  float x;
  std::memcpy(&x, &b, sizeof x);
  return x;
#endif
}
FORGE_HOST_DEVICE inline int leading_zeros(uint32_t x) {  // x != 0
#if defined(__CUDA_ARCH__)
  return __clz(static_cast<int>(x));
#else
  return __builtin_clz(x);
#endif
}
// 2^e for e in [−126, 127], exactly.
FORGE_HOST_DEVICE inline float pow2(int e) {
  return float_of(static_cast<uint32_t>(e + 127) << 23);
}

inline constexpr float kInf = __builtin_huge_valf();
inline constexpr float kLn2Hi = 0x1.62e3p-1f;     // ln 2 to 14 bits: k·kLn2Hi is exact
inline constexpr float kLn2Lo = 0x1.2fefa4p-17f;  // ln 2 − kLn2Hi
inline constexpr float kLog2e = 0x1.715476p+0f;   // 1 / ln 2

// ln(2^k · (1 + f)) for f in [−0.293, 0.415], f exact. With s = f / (2 + f),
// ln(1 + f) = 2·atanh(s) = f − f²/2 + s·(f²/2 + R), R = Σ_{n≥1} 2·s^(2n) / (2n + 1); |s| ≤ 0.172
// so five terms of R leave a truncation below 1e-10. Only the small correction carries rounding.
FORGE_HOST_DEVICE inline float log_reduced(int k, float f) {
  const float kf = static_cast<float>(k);
  const float s = fdiv(f, fadd(2.0f, f));
  const float z = fmul(s, s);
  float p = 0x1.745d18p-3f;                   // 2/11
  p = ffma(p, z, 0x1.c71c72p-3f);             // 2/9
  p = ffma(p, z, 0x1.24924ap-2f);             // 2/7
  p = ffma(p, z, 0x1.99999ap-2f);             // 2/5
  p = ffma(p, z, 0x1.555556p-1f);             // 2/3
  const float hfsq = fmul(0.5f, fmul(f, f));  // f²/2 (×0.5 is exact)
  const float t = ffma(z, p, hfsq);           // f²/2 + R
  const float u = ffma(s, t, fmul(kf, kLn2Lo));
  return ffma(kf, kLn2Hi, fsub(f, fsub(hfsq, u)));
}

// ln x for x >= 0 (0 → −inf, inf → inf); NaN in, NaN out.
FORGE_HOST_DEVICE inline float log_f32(float x) {
  if (!(x > 0.0f)) return x == 0.0f ? -kInf : float_of(0x7fc00000u);  // negative, NaN → NaN
  if (x == kInf) return kInf;
  int k = 0;
  if (x < 0x1p-126f) {  // subnormal: scale into the normal range first (exact)
    x = fmul(x, 0x1p+23f);
    k = -23;
  }
  // x = 2^k · m with m in [√½, √2): shift the exponent so that m's leading bits decide.
  uint32_t ix = bits_of(x) + (0x3f800000u - 0x3f3504f3u);
  k += static_cast<int>(ix >> 23) - 0x7f;
  ix = (ix & 0x007fffffu) + 0x3f3504f3u;
  return log_reduced(k, fsub(float_of(ix), 1.0f));  // m − 1 is exact
}

// e^x for x <= 0 (the top-p weights e^(z − m)); 0 below −64 (e^−64 ≈ 1.6e-28 is far under the
// 2^−40 resolution of the fixed-point mass) and for NaN.
FORGE_HOST_DEVICE inline float exp_f32(float x) {
  if (!(x >= -64.0f)) return 0.0f;
  const float kf = frint(fmul(x, kLog2e));
  float r = ffma(-kf, kLn2Hi, x);  // x − k·ln 2 in [−0.347, 0.347], Cody–Waite in two parts
  r = ffma(-kf, kLn2Lo, r);
  float p = 0x1.a01a02p-13f;        // 1/7!  (r^8/8! < 5.3e-9: a quarter ulp)
  p = ffma(p, r, 0x1.6c16c2p-10f);  // 1/6!
  p = ffma(p, r, 0x1.111112p-7f);   // 1/5!
  p = ffma(p, r, 0x1.555556p-5f);   // 1/4!
  p = ffma(p, r, 0x1.555556p-3f);   // 1/3!
  p = ffma(p, r, 0.5f);
  p = ffma(p, r, 1.0f);
  p = ffma(p, r, 1.0f);
  return fmul(p, pow2(static_cast<int>(kf)));  // k in [−93, 0]
}

// −ln u for u = ((w >> 8) + 0.5) / 2^24, the uniform of ops/sample.h, in (2^−25, 17.33]. u is
// not an f32 (25 significant bits), so it is never formed: with the odd integer N = 2·(w >> 8) + 1,
// u = N · 2^−25 and N = 2^j · (1 + f) where the integer N − 2^j, and so f, is exact.
FORGE_HOST_DEVICE inline float neg_log_unit(uint32_t w) {
  const uint32_t n = 2u * (w >> 8) + 1u;  // < 2^25
  int j = 31 - leading_zeros(n);          // 2^j <= n < 2^(j+1)
  int32_t d = static_cast<int32_t>(n) - (1 << j);
  // 1 + d / 2^j > √2 (0x6A09E6 / 2^24 = √2 − 1 to 24 bits): use 2^(j+1), f < 0 instead.
  if ((static_cast<uint64_t>(d) << 24) > (static_cast<uint64_t>(0x6A09E6u) << j)) {
    ++j;
    d = static_cast<int32_t>(n) - (1 << j);
  }
  const float f = fmul(static_cast<float>(d), pow2(-j));  // |d| < 2^24: exact
  return -log_reduced(j - 25, f);
}

// The Gumbel noise g = −ln(−ln u) of Philox word w; increasing in w, in [−2.86, 17.33].
FORGE_HOST_DEVICE inline float gumbel(uint32_t w) {
  return -log_f32(neg_log_unit(w));
}

// An upper bound of gumbel(w) over all w with w >> 24 == b: the noise at the bucket's top plus
// 2^−16 (1.5e-5), far more than the computed noise's distance from the exact, monotone one
// (< 8.8e-7 on every word; the CPU tests check the bound exhaustively). z + bound < best proves
// that a candidate cannot win, so both twins skip its logarithms; it changes no result.
FORGE_HOST_DEVICE inline float gumbel_bucket_bound(uint32_t b) {
  return fadd(gumbel((b << 24) | 0x00ffffffu), 0x1p-16f);
}

// The sampler's f32 value of a logit: NaN counts as −inf; the repetition penalty when `seen`.
FORGE_HOST_DEVICE inline float penalized(float l, float rp, bool seen) {
  if (l != l) return -kInf;
  if (seen && rp != 1.0f) l = l > 0.0f ? fdiv(l, rp) : fmul(l, rp);
  return l != l ? -kInf : l;
}

// z = l / temperature, with NaN as −inf and −0 as +0, so that equal values have equal keys.
FORGE_HOST_DEVICE inline float scaled(float l, float temperature) {
  const float z = fdiv(l, temperature);
  if (z != z) return -kInf;
  return z == 0.0f ? 0.0f : z;
}

// Order-preserving encoding: a < b ⇔ order_key(a) < order_key(b) for non-NaN a, b (−0 must be
// canonicalised to +0 first: scaled() does).
FORGE_HOST_DEVICE inline uint32_t order_key(float z) {
  const uint32_t b = bits_of(z);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
FORGE_HOST_DEVICE inline float key_value(uint32_t key) {
  return float_of((key & 0x80000000u) ? (key & 0x7fffffffu) : ~key);
}

// Top-p weights in fixed point: e^(z − m) (<= 1) in units of 2^−40, truncated. Sums of up to
// 2^18 of them stay below 2^58, and integer sums are the same in every order, so the GPU's
// parallel reduction and the CPU's loop find the same τ. Weights under 2^−40 count as 0; against
// a total of at least 1 (the maximum's own weight) that moves no probability by more than
// V · 2^−40 ≈ 1.4e-7 at V = 152k.
FORGE_HOST_DEVICE inline uint64_t mass_fixed(float e) {
  return static_cast<uint64_t>(fmul(e, 0x1p+40f));
}

// The top-p test "Σ_{z_j >= τ} p_j >= top_p" as Σ w_j >= top_p · Σ_K w_j, in double (the f32
// top_p and the integer sums convert exactly enough; the same operations on both twins).
FORGE_HOST_DEVICE inline double top_p_target(float top_p, uint64_t total) {
  return static_cast<double>(top_p) * static_cast<double>(total);
}

}  // namespace forge::sampling
