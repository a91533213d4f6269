#include "forge/ops/reduce.h"

#include "testing.h"

namespace forge::cpu {
namespace {

TEST(SumInOrder, HandComputedValues) {
  const float x[] = {1.5f, -2.0f, 0.25f};
  EXPECT_EQ(sum_in_order(x, 3), -0.25);
  EXPECT_EQ(sum_in_order(x, 0), 0.0);
}

// The order is part of the contract: 2^53 + 1 + 1 loses both ones left to right (each sum rounds
// back to 2^53), and keeps them when the ones come first.
TEST(SumInOrder, AddsLeftToRight) {
  const float big = 9007199254740992.0f;  // 2^53, exact in f32
  const float left[] = {big, 1.0f, 1.0f}, right[] = {1.0f, 1.0f, big};
  EXPECT_EQ(sum_in_order(left, 3), 9007199254740992.0);
  EXPECT_EQ(sum_in_order(right, 3), 9007199254740994.0);
}

}  // namespace
}  // namespace forge::cpu
