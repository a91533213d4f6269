// bf16 / f16 <-> f32 conversions: hand-picked bit patterns with known values, the rounding
// corner cases (ties to even, subnormals, overflow, NaN), exhaustive round trips of every 16-bit
// pattern, and random f32 inputs against an independent reference that rounds with nearbyint()
// in double precision.
#include "forge/io/bf16.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cfenv>
#include <cmath>
#include <cstdint>
#include <limits>

#include "forge/core/rng.h"

namespace forge {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// x rounded to `mant_bits` fraction bits, ties to even, with exponents below `min_exp` handled
// as subnormals (fixed step 2^(min_exp - mant_bits)); +-inf when the rounded value reaches
// `overflow`, the power of two just past the largest finite value.
// Independent of the bit manipulation under test: double arithmetic and nearbyint (the default
// rounding mode is to-nearest-even; checked in the tests that use this).
double round_reference(float x, int mant_bits, int min_exp, double overflow) {
  if (x == 0 || std::isinf(x)) return x;
  const int e = std::max(std::ilogb(x), min_exp);
  const double q = std::ldexp(std::nearbyint(std::ldexp(double{x}, mant_bits - e)), e - mant_bits);
  if (std::fabs(q) >= overflow) return std::copysign(double{kInf}, x);
  return q;
}

float f32_from_bits(uint32_t u) {
  return std::bit_cast<float>(u);
}

// ------------------------------------------------------------------------------------ bf16

TEST(Bf16, DecodesKnownPatterns) {
  EXPECT_EQ(bf16_to_f32(0x3F80), 1.0f);
  EXPECT_EQ(bf16_to_f32(0x3FC0), 1.5f);
  EXPECT_EQ(bf16_to_f32(0xC000), -2.0f);
  EXPECT_EQ(bf16_to_f32(0x3E80), 0.25f);
  EXPECT_EQ(bf16_to_f32(0x7F80), kInf);
  EXPECT_EQ(bf16_to_f32(0xFF80), -kInf);
  EXPECT_TRUE(std::isnan(bf16_to_f32(0x7FC0)));
  EXPECT_EQ(bf16_to_f32(0x0001), std::ldexp(1.0f, -133));  // smallest subnormal
}

TEST(Bf16, RoundsToNearestEven) {
  // bf16 has 7 fraction bits: one ulp at 1.0 is 2^-7, half an ulp 2^-8.
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3F80);
  EXPECT_EQ(f32_to_bf16(1.0f + 0x1p-8f), 0x3F80);             // tie, 0x3F80 is even: down
  EXPECT_EQ(f32_to_bf16(1.0f + 0x1p-8f + 0x1p-23f), 0x3F81);  // just above the tie: up
  EXPECT_EQ(f32_to_bf16(1.0f + 3 * 0x1p-9f), 0x3F81);         // 0.75 ulp: up
  EXPECT_EQ(f32_to_bf16(1.0f + 0x1p-9f), 0x3F80);             // 0.25 ulp: down
  EXPECT_EQ(f32_to_bf16(1.0f + 0x1p-7f + 0x1p-8f), 0x3F82);   // tie above odd 0x3F81: up
  EXPECT_EQ(f32_to_bf16(-(1.0f + 3 * 0x1p-9f)), 0xBF81);
  EXPECT_EQ(f32_to_bf16(2.0f - 0x1p-9f), 0x4000);  // carry into the exponent
  EXPECT_EQ(f32_to_bf16(-0.0f), 0x8000);
  // The largest f32 lies above the last bf16 (0x7F7F) by more than half an ulp: inf.
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::max()), 0x7F80);
}

TEST(Bf16, KeepsInfAndNaN) {
  EXPECT_EQ(f32_to_bf16(kInf), 0x7F80);
  EXPECT_EQ(f32_to_bf16(-kInf), 0xFF80);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(kNaN))));
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(-kNaN))));
  // NaN payloads only in the dropped low bits: plain truncation or rounding would give inf.
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(f32_from_bits(0x7F800001u)))));
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(f32_from_bits(0x7FFFFFFFu)))));
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(f32_from_bits(0xFF808000u)))));
}

TEST(Bf16, EveryPatternRoundTrips) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = bf16_to_f32(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    ASSERT_EQ(f32_to_bf16(f), h) << std::hex << "0x" << h;
  }
}

TEST(Bf16, MatchesReferenceOnRandomFloats) {
  ASSERT_EQ(std::fegetround(), FE_TONEAREST);
  const double overflow = std::ldexp(1.0, 128);
  Rng rng(20240611, 1);
  for (int i = 0; i < 200000; ++i) {
    const float x = f32_from_bits(rng.next_u32());
    if (std::isnan(x)) continue;
    const double want = round_reference(x, 7, -126, overflow);
    ASSERT_EQ(double{bf16_to_f32(f32_to_bf16(x))}, want) << "x = " << x << std::hexfloat;
  }
}

// ------------------------------------------------------------------------------------- f16

TEST(F16, DecodesKnownPatterns) {
  EXPECT_EQ(f16_to_f32(0x3C00), 1.0f);
  EXPECT_EQ(f16_to_f32(0x3E00), 1.5f);
  EXPECT_EQ(f16_to_f32(0xC000), -2.0f);
  EXPECT_EQ(f16_to_f32(0x3400), 0.25f);
  EXPECT_EQ(f16_to_f32(0x7BFF), 65504.0f);  // largest finite
  EXPECT_EQ(f16_to_f32(0x0400), 0x1p-14f);  // smallest normal
  EXPECT_EQ(f16_to_f32(0x0001), 0x1p-24f);  // smallest subnormal
  EXPECT_EQ(f16_to_f32(0x03FF), 1023 * 0x1p-24f);
  EXPECT_EQ(f16_to_f32(0x8001), -0x1p-24f);
  EXPECT_EQ(f16_to_f32(0x7C00), kInf);
  EXPECT_EQ(f16_to_f32(0xFC00), -kInf);
  EXPECT_TRUE(std::isnan(f16_to_f32(0x7E00)));
  EXPECT_TRUE(std::isnan(f16_to_f32(0x7C01)));
  EXPECT_TRUE(std::signbit(f16_to_f32(0x8000)));
  EXPECT_EQ(f16_to_f32(0x8000), 0.0f);
}

TEST(F16, EncodesNormalsWithTiesToEven) {
  // 10 fraction bits: one ulp at 1.0 is 2^-10.
  EXPECT_EQ(f32_to_f16(1.0f), 0x3C00);
  EXPECT_EQ(f32_to_f16(1.5f), 0x3E00);
  EXPECT_EQ(f32_to_f16(-2.0f), 0xC000);
  EXPECT_EQ(f32_to_f16(0.25f), 0x3400);
  EXPECT_EQ(f32_to_f16(1.0f + 0x1p-11f), 0x3C00);             // tie: down to even
  EXPECT_EQ(f32_to_f16(1.0f + 0x1p-10f + 0x1p-11f), 0x3C02);  // tie above odd: up
  EXPECT_EQ(f32_to_f16(1.0f + 0x1p-11f + 0x1p-20f), 0x3C01);  // above the tie: up
  EXPECT_EQ(f32_to_f16(-0.0f), 0x8000);
}

TEST(F16, EncodesOverflowToInf) {
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7BFF);
  EXPECT_EQ(f32_to_f16(65519.0f), 0x7BFF);  // below the midpoint to 65536
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7C00);  // the midpoint rounds to even: inf
  EXPECT_EQ(f32_to_f16(-70000.0f), 0xFC00);
  EXPECT_EQ(f32_to_f16(1e30f), 0x7C00);
  EXPECT_EQ(f32_to_f16(kInf), 0x7C00);
  EXPECT_EQ(f32_to_f16(-kInf), 0xFC00);
}

TEST(F16, EncodesSubnormals) {
  EXPECT_EQ(f32_to_f16(0x1p-24f), 0x0001);
  EXPECT_EQ(f32_to_f16(-0x1p-24f), 0x8001);
  EXPECT_EQ(f32_to_f16(0x1p-25f), 0x0000);               // tie between 0 and 2^-24: 0
  EXPECT_EQ(f32_to_f16(0x1p-25f * 1.0000001f), 0x0001);  // just above the tie
  EXPECT_EQ(f32_to_f16(3 * 0x1p-25f), 0x0002);           // tie between 1 and 2 steps: 2
  EXPECT_EQ(f32_to_f16(0x1p-26f), 0x0000);
  EXPECT_EQ(f32_to_f16(std::numeric_limits<float>::denorm_min()), 0x0000);
  EXPECT_EQ(f32_to_f16(1023 * 0x1p-24f), 0x03FF);
  EXPECT_EQ(f32_to_f16(1023.5f * 0x1p-24f), 0x0400);  // tie rounds up into the normals
  EXPECT_EQ(f32_to_f16(0x1p-14f), 0x0400);
}

TEST(F16, KeepsNaN) {
  EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(kNaN))));
  EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(f32_from_bits(0x7F800001u)))));
  EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(f32_from_bits(0xFFC00000u)))));
}

TEST(F16, EveryPatternRoundTrips) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = f16_to_f32(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    ASSERT_EQ(f32_to_f16(f), h) << std::hex << "0x" << h;
  }
}

TEST(F16, MatchesReferenceOnRandomFloats) {
  ASSERT_EQ(std::fegetround(), FE_TONEAREST);
  Rng rng(20240611, 2);
  for (int i = 0; i < 200000; ++i) {
    // Half the draws near f16's range (|x| in about [2^-30, 2^17]) where all the cases are.
    uint32_t u = rng.next_u32();
    if (i % 2) u = (u & 0x807FFFFFu) | ((97 + rng.below(48)) << 23);
    const float x = f32_from_bits(u);
    if (std::isnan(x)) continue;
    const double want = round_reference(x, 10, -14, 65536.0);
    ASSERT_EQ(double{f16_to_f32(f32_to_f16(x))}, want) << "x = " << std::hexfloat << x;
  }
}

}  // namespace
}  // namespace forge
