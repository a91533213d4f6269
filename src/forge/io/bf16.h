// Scalar conversions between f32 and the two 16-bit float formats found in checkpoints.
//
// bf16 is the top half of an f32 (1 sign, 8 exponent, 7 mantissa bits), so decoding is a shift
// and encoding is a shift after rounding the dropped 16 bits to nearest, ties to even — the
// rounding PyTorch and the CUDA intrinsics (__float2bfloat16_rn) use, so a checkpoint written
// here matches one written by `transformers` bit for bit. NaN is kept a (quiet) NaN; without the
// special case the rounding increment could carry a NaN payload into the exponent and make inf.
//
// f16 (IEEE binary16: 1 sign, 5 exponent, 10 mantissa bits) has subnormals down to 2^-24, a
// largest finite value of 65504, and overflows to inf from 65520 on (the midpoint between 65504
// and the next step, 65536, rounds to even = inf). Encoding is integer-only so the result does
// not depend on the floating-point environment's rounding mode.
//
// These are the per-element reference; bulk conversion on the GPU lives with the kernels.
#pragma once

#include <bit>
#include <cstdint>

namespace forge {

constexpr float bf16_to_f32(uint16_t h) {
  return std::bit_cast<float>(uint32_t{h} << 16);
}

constexpr uint16_t f32_to_bf16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x0040u);  // NaN
  // Adding 0x7fff rounds up exactly when the dropped half is > 0x8000; the low kept bit breaks
  // the tie at 0x8000 towards even. A carry out of the mantissa correctly bumps the exponent.
  const uint32_t rounded = x + 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(rounded >> 16);
}

constexpr float f16_to_f32(uint16_t h) {
  const uint32_t sign = uint32_t{h & 0x8000u} << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  if (exp == 0) {  // zero or subnormal: mant · 2^-24, exact in f32
    const float v = static_cast<float>(mant) * 5.9604644775390625e-8f;  // 2^-24
    return sign ? -v : v;
  }
  if (exp == 31) return std::bit_cast<float>(sign | 0x7f800000u | (mant << 13));  // inf, NaN
  return std::bit_cast<float>(sign | ((exp + 112) << 23) | (mant << 13));  // rebias 15 -> 127
}

constexpr uint16_t f32_to_f16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t abs = x & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);  // NaN -> quiet NaN
  const uint32_t exp = abs >> 23;                                       // biased f32 exponent
  if (exp >= 143) return static_cast<uint16_t>(sign | 0x7c00u);         // >= 2^16 (or inf): inf
  const uint32_t mant = (abs & 0x7fffffu) | 0x800000u;                  // with the implicit bit
  // Keep the top bits of mant, drop `shift` bits with round-to-nearest-even. For normal results
  // the f16 exponent is added to the kept mantissa so a rounding carry bumps it (up to inf).
  uint32_t shift, base;
  if (exp >= 113) {  // >= 2^-14: normal f16
    shift = 13;
    base = (exp - 113) << 10;  // (exp - 112) << 10, minus the implicit bit already in mant>>13
  } else {  // subnormal f16: value / 2^-24 = mant · 2^(exp-150+24), i.e. mant >> 126-exp
    if (exp < 102) return sign;  // < 2^-25: at most half the smallest subnormal, ties to 0
    shift = 126 - exp;           // 14..24
    base = 0;
  }
  const uint32_t kept = mant >> shift;
  const uint32_t rem = mant & ((1u << shift) - 1);
  const uint32_t half = 1u << (shift - 1);
  const uint32_t q = base + kept + ((rem > half || (rem == half && (kept & 1u))) ? 1u : 0u);
  return static_cast<uint16_t>(sign | q);
}

}  // namespace forge
