// Scalar conversions between f32 and the two 8-bit float formats of Hopper's tensor cores (the
// OCP 8-bit floating point formats CUDA's __nv_fp8_e4m3 / __nv_fp8_e5m2 hold):
//   E4M3: 1 sign, 4 exponent (bias 7), 3 mantissa bits; no infinities, S.1111.111 is NaN, the
//         largest finite value 448 (S.1111.110), subnormals m·2^-9. For weights and activations.
//   E5M2: 1 sign, 5 exponent (bias 15), 2 mantissa bits; IEEE-like inf (S.11111.00) and NaN,
//         the largest finite value 57344 (S.11110.11), subnormals m·2^-16. For gradients.
// Encoding rounds to nearest, ties to even, and saturates: whatever lies beyond the largest
// finite value — infinities included — becomes ± that value. That is the GPU's cvt.rn.satfinite
// (what the CUDA cast kernel uses), so the two agree bit for bit on every non-NaN input; a NaN
// stays a NaN (its code is not specified). Integer-only, like bf16.h's f16 encoder.
//
// These are the per-element reference; bulk conversion on the GPU lives with the kernels.
#pragma once

#include <bit>
#include <cstdint>

namespace forge {

namespace fp8_detail {

// kE exponent bits, kM mantissa bits, kBias; kMaxCode: the largest finite magnitude's code.
template <int kE, int kM, int kBias, uint8_t kMaxCode>
constexpr uint8_t encode(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint8_t sign = static_cast<uint8_t>((x >> 24) & 0x80u);
  const uint32_t abs = x & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint8_t>(sign | (kE == 4 ? 0x7fu : 0x7eu));  // NaN
  const int exp32 = static_cast<int>(abs >> 23);  // biased by 127; 0: zero or f32 subnormal
  if (exp32 == 0) return sign;                    // < 2^-126: far below half the smallest step
  const int e = exp32 - 127 + kBias;              // the target's biased exponent
  constexpr int kMaxExp = (1 << kE) - 1;
  if (e > kMaxExp) return static_cast<uint8_t>(sign | kMaxCode);  // saturates (inf too)
  const uint32_t mant = (abs & 0x7fffffu) | 0x800000u;            // with the implicit bit
  // Keep the top bits of mant, drop `shift` with round-to-nearest-even. Normal results: the
  // exponent is added to the kept mantissa (implicit bit included), so a carry bumps it.
  int shift;
  uint32_t base;
  if (e >= 1) {
    shift = 23 - kM;
    base = static_cast<uint32_t>(e - 1) << kM;
  } else {  // subnormal: value / 2^(1-bias-kM) = mant >> (23 - kM + 1 - e)
    shift = 24 - kM - e;
    if (shift > 24) return sign;  // below half the smallest subnormal (the tie goes to 0 too)
    base = 0;
  }
  const uint32_t kept = mant >> shift;
  const uint32_t rem = mant & ((1u << shift) - 1);
  const uint32_t half = 1u << (shift - 1);
  uint32_t q = base + kept + ((rem > half || (rem == half && (kept & 1u))) ? 1u : 0u);
  if (q > kMaxCode) q = kMaxCode;  // rounded past the largest finite value (or onto E4M3's NaN)
  return static_cast<uint8_t>(sign | q);
}

template <int kE, int kM, int kBias>
constexpr float decode(uint8_t v) {
  const uint32_t sign = uint32_t{v & 0x80u} << 24;
  const uint32_t exp = (v >> kM) & ((1u << kE) - 1);
  const uint32_t mant = v & ((1u << kM) - 1);
  if (kE == 4 && exp == 15 && mant == 7) return std::bit_cast<float>(sign | 0x7fc00000u);  // NaN
  if (kE == 5 && exp == 31) return std::bit_cast<float>(sign | 0x7f800000u | (mant ? 0x400000u : 0u));
  if (exp == 0) {  // subnormal: mant · 2^(1 - bias - kM), exact in f32
    const float unit = std::bit_cast<float>(static_cast<uint32_t>(127 + 1 - kBias - kM) << 23);
    const float m = static_cast<float>(mant) * unit;
    return sign ? -m : m;
  }
  return std::bit_cast<float>(sign | ((exp - kBias + 127) << 23) | (mant << (23 - kM)));
}

}  // namespace fp8_detail

constexpr float e4m3_to_f32(uint8_t v) { return fp8_detail::decode<4, 3, 7>(v); }
constexpr float e5m2_to_f32(uint8_t v) { return fp8_detail::decode<5, 2, 15>(v); }
constexpr uint8_t f32_to_e4m3(float f) { return fp8_detail::encode<4, 3, 7, 0x7e>(f); }
constexpr uint8_t f32_to_e5m2(float f) { return fp8_detail::encode<5, 2, 15, 0x7b>(f); }

}  // namespace forge
