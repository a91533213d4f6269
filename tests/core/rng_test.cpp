#include "forge/core/rng.h"

#include <gtest/gtest.h>

#include <cmath>

namespace forge {
namespace {

// Known-answer vectors published with Random123 (kat_vectors, philox4x32 with 10 rounds).
TEST(Philox, KnownAnswerVectors) {
  EXPECT_EQ(philox4x32_10({0, 0, 0, 0}, {0, 0}),
            (PhiloxCounter{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}));
  EXPECT_EQ(philox4x32_10({0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu},
                          {0xffffffffu, 0xffffffffu}),
            (PhiloxCounter{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}));
  EXPECT_EQ(philox4x32_10({0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u},
                          {0xa4093822u, 0x299f31d0u}),
            (PhiloxCounter{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}));
}

TEST(Rng, OffsetRestoresTheStream) {
  Rng a(42, 3);
  for (int i = 0; i < 7; ++i) a.next_u32();
  Rng b(42, 3);
  b.set_offset(a.offset());
  for (int i = 0; i < 10; ++i) EXPECT_EQ(a.next_u32(), b.next_u32());
}

TEST(Rng, StreamsAndSeedsDiffer) {
  Rng a(1, 0), b(1, 1), c(2, 0);
  const uint32_t x = a.next_u32();
  EXPECT_NE(x, b.next_u32());
  EXPECT_NE(x, c.next_u32());
}

TEST(Rng, NormalHasUnitMoments) {
  const int n = 200000;
  double s = 0, s2 = 0;
  for (int i = 0; i < n; ++i) {
    const double x = philox_normal(5, 0, i);
    s += x;
    s2 += x * x;
  }
  // Standard errors: mean 1/sqrt(n) ≈ 0.0022, variance sqrt(2/n) ≈ 0.0032; allow ~5 sigma.
  EXPECT_NEAR(s / n, 0.0, 0.012);
  EXPECT_NEAR(s2 / n, 1.0, 0.016);
}

TEST(Rng, BelowStaysInRangeAndCoversIt) {
  Rng r(9);
  int counts[5] = {0, 0, 0, 0, 0};
  for (int i = 0; i < 5000; ++i) {
    const uint64_t x = r.below(5);
    ASSERT_LT(x, 5u);
    ++counts[x];
  }
  for (int c : counts) EXPECT_GT(c, 850);  // expected 1000 each
}

}  // namespace
}  // namespace forge
