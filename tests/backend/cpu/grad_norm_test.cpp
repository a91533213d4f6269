#include "forge/ops/grad_norm.h"

#include <omp.h>

#include <cmath>

#include "testing.h"

namespace forge::cpu {
namespace {

using forge::testing::random_normal;

TEST(GradNorm, HandComputedValues) {
  const float g[] = {3, 4};
  EXPECT_EQ(global_norm<float>(g, 2), 5.0);
  const double gd[] = {1, -2, 2, 0};
  EXPECT_EQ(global_norm<double>(gd, 4), 3.0);
  EXPECT_EQ(global_norm<double>(gd, 0), 0.0);
}

TEST(GradNorm, ClipScale) {
  EXPECT_DOUBLE_EQ(clip_scale(5.0, 1.0), 1.0 / (5.0 + 1e-6));
  EXPECT_EQ(clip_scale(0.5, 1.0), 1.0);  // below the threshold: unchanged
  EXPECT_EQ(clip_scale(5.0, 0.0), 1.0);  // clipping off
  EXPECT_EQ(clip_scale(5.0, -1.0), 1.0);
  EXPECT_EQ(clip_scale(0.0, 1.0), 1.0);
}

// More than one 65536-element block, not a multiple of it; against a serial double loop, in
// both dtypes (the float instantiation squares in double, so only the sum order differs).
TEST(GradNorm, MatchesSerialSumAcrossBlocks) {
  const int64_t n = 200003;
  const auto g = random_normal<float>(n, 900);
  double ref = 0;
  for (float x : g) ref += static_cast<double>(x) * x;
  ref = std::sqrt(ref);
  const auto gd = forge::testing::to_double(g);
  EXPECT_NEAR(global_norm<float>(g.data(), n), ref, 1e-12 * ref);
  EXPECT_NEAR(global_norm<double>(gd.data(), n), ref, 1e-12 * ref);
}

// Bit-identical for any thread count.
TEST(GradNorm, IndependentOfThreadCount) {
  const int64_t n = 300001;
  const auto g = random_normal<float>(n, 901);
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  const double one = global_norm<float>(g.data(), n);
  omp_set_num_threads(3);
  const double three = global_norm<float>(g.data(), n);
  omp_set_num_threads(saved);
  EXPECT_EQ(one, three);
}

}  // namespace
}  // namespace forge::cpu
