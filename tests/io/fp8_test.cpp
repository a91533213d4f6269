// E4M3 / E5M2 <-> f32 conversions against an independent reference built from the formats'
// definitions (OCP 8-bit floating point): every code's value computed with ldexp from its
// fields, and the encoder checked against "the nearest finite value, ties to the even code,
// saturating at the largest finite value" found by search over that table — on hand-picked
// corner cases (every midpoint between neighbours, the subnormal boundary, saturation, inf,
// NaN, f32 subnormals) and on random f32 inputs over the whole range the formats cover.
#include "forge/io/fp8.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <ostream>
#include <vector>

#include "forge/core/rng.h"

namespace forge {
namespace {

struct Format {
  const char* name;
  int e_bits, m_bits, bias;
  float (*decode)(uint8_t);
  uint8_t (*encode)(float);
};

void PrintTo(const Format& f, std::ostream* os) { *os << f.name; }

const Format kE4M3{"e4m3", 4, 3, 7, e4m3_to_f32, f32_to_e4m3};
const Format kE5M2{"e5m2", 5, 2, 15, e5m2_to_f32, f32_to_e5m2};

// The value of a code from its fields (NaN for E4M3's S.1111.111 and E5M2's exponent 31 with a
// mantissa, inf for E5M2's S.11111.00).
double reference_value(const Format& f, uint8_t code) {
  const int exp = (code >> f.m_bits) & ((1 << f.e_bits) - 1), mant = code & ((1 << f.m_bits) - 1);
  const double sign = (code & 0x80) ? -1.0 : 1.0;
  const int max_exp = (1 << f.e_bits) - 1;
  if (f.e_bits == 4 && exp == max_exp && mant == (1 << f.m_bits) - 1) return std::nan("");
  if (f.e_bits == 5 && exp == max_exp) return mant ? std::nan("") : sign * INFINITY;
  if (exp == 0) return sign * std::ldexp(double(mant), 1 - f.bias - f.m_bits);
  return sign * std::ldexp(1.0 + std::ldexp(double(mant), -f.m_bits), exp - f.bias);
}

// The finite non-negative codes, ascending in value (their codes ascend with them).
std::vector<uint8_t> finite_positive_codes(const Format& f) {
  std::vector<uint8_t> out;
  for (int c = 0; c < 0x80; ++c)
    if (std::isfinite(reference_value(f, static_cast<uint8_t>(c)))) out.push_back(static_cast<uint8_t>(c));
  return out;
}

// Nearest finite value, ties to the even code, beyond the largest finite value that value.
uint8_t reference_encode(const Format& f, float x) {
  const std::vector<uint8_t> codes = finite_positive_codes(f);
  const double a = std::fabs(double{x});
  const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  uint8_t best = codes.back();
  if (!std::isinf(a)) {
    for (size_t i = 0; i + 1 < codes.size(); ++i) {
      const double lo = reference_value(f, codes[i]), hi = reference_value(f, codes[i + 1]);
      if (a > hi) continue;
      const double mid = (lo + hi) / 2;  // exact: both have few significant bits
      best = a < mid ? codes[i] : a > mid ? codes[i + 1] : (codes[i] % 2 == 0 ? codes[i] : codes[i + 1]);
      break;
    }
  }
  return static_cast<uint8_t>(sign | best);
}

class Fp8 : public ::testing::TestWithParam<Format> {};

TEST_P(Fp8, EveryCodeDecodesToItsValue) {
  const Format& f = GetParam();
  for (int c = 0; c < 256; ++c) {
    const double want = reference_value(f, static_cast<uint8_t>(c));
    const float got = f.decode(static_cast<uint8_t>(c));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << f.name << " code " << c;
    } else {
      EXPECT_EQ(double{got}, want) << f.name << " code " << c;
      EXPECT_EQ(std::signbit(got), (c & 0x80) != 0) << f.name << " code " << c;  // -0 too
    }
  }
}

TEST_P(Fp8, FiniteCodesRoundTrip) {
  const Format& f = GetParam();
  for (int c = 0; c < 256; ++c) {
    const float v = f.decode(static_cast<uint8_t>(c));
    if (std::isfinite(v)) {
      EXPECT_EQ(f.encode(v), c) << f.name << " code " << c;
    }
  }
}

// Between every two neighbours: the midpoint goes to the even code, one f32 ulp either side of
// it to the nearer neighbour. Covers the subnormal range, the subnormal/normal boundary and the
// top binade.
TEST_P(Fp8, MidpointsRoundToEven) {
  const Format& f = GetParam();
  const std::vector<uint8_t> codes = finite_positive_codes(f);
  for (size_t i = 0; i + 1 < codes.size(); ++i) {
    const float lo = f.decode(codes[i]), hi = f.decode(codes[i + 1]);
    const float mid = (lo + hi) / 2;  // exact in f32
    const uint8_t even = codes[i] % 2 == 0 ? codes[i] : codes[i + 1];
    EXPECT_EQ(f.encode(mid), even) << f.name << " between " << lo << " and " << hi;
    EXPECT_EQ(f.encode(-mid), 0x80 | even) << f.name << " between " << -lo << " and " << -hi;
    EXPECT_EQ(f.encode(std::nextafter(mid, 0.0f)), codes[i]) << f.name << " below " << mid;
    EXPECT_EQ(f.encode(std::nextafter(mid, INFINITY)), codes[i + 1]) << f.name << " above " << mid;
  }
}

TEST_P(Fp8, SaturatesAndKeepsNaN) {
  const Format& f = GetParam();
  const uint8_t max_code = finite_positive_codes(f).back();
  const float max = f.decode(max_code);
  EXPECT_EQ(max, f.e_bits == 4 ? 448.0f : 57344.0f);
  for (float big : {max * 1.0625f, max * 1.5f, max * 2.0f, 1e30f, std::numeric_limits<float>::max(), INFINITY}) {
    EXPECT_EQ(f.encode(big), max_code) << f.name << " " << big;
    EXPECT_EQ(f.encode(-big), 0x80 | max_code) << f.name << " " << -big;
  }
  EXPECT_TRUE(std::isnan(f.decode(f.encode(std::numeric_limits<float>::quiet_NaN()))));
  // Zeros and what lies below half the smallest subnormal (f32 subnormals included) keep their sign.
  const float tiny = f.decode(1) / 2;
  for (float z : {0.0f, tiny, std::nextafter(0.0f, 1.0f), std::numeric_limits<float>::min()}) {
    EXPECT_EQ(f.encode(z), 0x00) << f.name << " " << z;
    EXPECT_EQ(f.encode(-z), 0x80) << f.name << " " << -z;
  }
  EXPECT_EQ(f.encode(std::nextafter(tiny, 1.0f)), 0x01) << f.name;
}

// Random f32 values: uniform exponents over the format's range and a little beyond, random
// mantissas and signs, against the search reference.
TEST_P(Fp8, RandomValuesMatchTheReference) {
  const Format& f = GetParam();
  Rng rng(f.e_bits == 4 ? 41 : 42);
  const int lo = 1 - f.bias - f.m_bits - 3, hi = (1 << f.e_bits) - f.bias + 2;
  for (int i = 0; i < 200000; ++i) {
    const int e = lo + static_cast<int>(rng.below(static_cast<uint64_t>(hi - lo + 1)));
    const float m = 1.0f + static_cast<float>(rng.below(1u << 23)) * 0x1p-23f;
    const float x = (rng.below(2) ? -1.0f : 1.0f) * std::ldexp(m, e);
    ASSERT_EQ(f.encode(x), reference_encode(f, x)) << f.name << " x = " << x;
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, Fp8, ::testing::Values(kE4M3, kE5M2),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace forge
