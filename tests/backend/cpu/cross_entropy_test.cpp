#include "forge/ops/cross_entropy.h"

#include <cmath>
#include <cstdint>
#include <vector>

#include "testing.h"

namespace forge::cpu {
namespace {

using forge::testing::all_close;
using forge::testing::random_normal;

// Logits (N, Vp) whose padded columns hold large values: any leak of [V, Vp) into the softmax
// would dominate it.
template <typename T>
std::vector<T> padded_logits(int N, int V, int Vp, uint64_t seed) {
  auto x = random_normal<T>(static_cast<size_t>(N) * Vp, seed, 2.0);
  for (int n = 0; n < N; ++n)
    for (int j = V; j < Vp; ++j) x[static_cast<size_t>(n) * Vp + j] = T(50 + j);
  return x;
}

// Softmax of (1, 2, 3) is (1, e, e²)/(1 + e + e²) = (0.0900306, 0.2447285, 0.6652410).
TEST(CrossEntropy, HandComputedThreeClasses) {
  const double logits[] = {1, 2, 3, 1, 2, 3};
  const int32_t targets[] = {0, 2};
  double losses[2];
  cross_entropy_fwd<double>(losses, logits, targets, 2, 3, 3);
  EXPECT_NEAR(losses[0], 2.4076059644443806, 1e-12);  // −log 0.0900306 = log(1 + e + e²)
  EXPECT_NEAR(losses[1], 0.4076059644443806, 1e-12);  // −log 0.6652410 = log(1 + e + e²) − 2
  double d[6];
  cross_entropy_bwd<double>(d, logits, targets, 1.0, 2, 3, 3);
  EXPECT_NEAR(d[0], 0.0900305731703805 - 1, 1e-12);
  EXPECT_NEAR(d[1], 0.2447284710547976, 1e-12);
  EXPECT_NEAR(d[2], 0.6652409557748219, 1e-12);
  EXPECT_NEAR(d[3], 0.0900305731703805, 1e-12);
  EXPECT_NEAR(d[4], 0.2447284710547976, 1e-12);
  EXPECT_NEAR(d[5], 0.6652409557748219 - 1, 1e-12);
}

// Equal logits: p = 1/V for every class, loss = log V; also at a magnitude where a softmax
// without max subtraction overflows (exp(1000) = inf).
TEST(CrossEntropy, UniformLogitsGiveLogV) {
  const int N = 3, V = 10, Vp = 16;
  for (double level : {0.0, 1000.0}) {
    auto x = padded_logits<double>(N, V, Vp, 1);
    for (int n = 0; n < N; ++n)
      for (int j = 0; j < V; ++j) x[n * Vp + j] = level;
    const int32_t targets[] = {0, 9, 4};
    std::vector<double> losses(N);
    cross_entropy_fwd<double>(losses.data(), x.data(), targets, N, V, Vp);
    for (int n = 0; n < N; ++n) EXPECT_NEAR(losses[n], std::log(10.0), 1e-14) << "level " << level;
  }
}

// Mean loss over the non-ignored rows; the gradient is bwd with dloss = 1/count.
TEST(CrossEntropy, BackwardMatchesFiniteDifferences) {
  const int N = 5, V = 7, Vp = 9;
  auto x = padded_logits<double>(N, V, Vp, 2);
  const std::vector<int32_t> targets = {3, -1, 0, 6, 2};
  const int count = 4;
  std::vector<double> losses(N);
  auto mean_loss = [&] {
    cross_entropy_fwd<double>(losses.data(), x.data(), targets.data(), N, V, Vp);
    double s = 0;
    for (double l : losses) s += l;
    return s / count;
  };
  const auto fd = forge::testing::finite_diff(x, mean_loss);
  mean_loss();
  EXPECT_EQ(losses[1], 0.0);  // ignored row
  std::vector<double> d(x.size(), 123.0);
  cross_entropy_bwd<double>(d.data(), x.data(), targets.data(), 1.0 / count, N, V, Vp);
  EXPECT_TRUE(all_close(d, fd, forge::testing::kTolFiniteDiff));
  for (int n = 0; n < N; ++n) {
    for (int j = 0; j < Vp; ++j) {
      if (j >= V || targets[n] == -1) {
        EXPECT_EQ(d[n * Vp + j], 0.0) << "n=" << n << " j=" << j;
      }
    }
  }
}

// Rows of the gradient sum to 0 over the real columns (softmax sums to 1, one-hot to 1).
TEST(CrossEntropy, GradientRowsSumToZero) {
  const int N = 4, V = 33, Vp = 40;
  auto x = padded_logits<double>(N, V, Vp, 3);
  auto targets = forge::testing::random_ids(N, V, 4);
  std::vector<double> d(x.size());
  cross_entropy_bwd<double>(d.data(), x.data(), targets.data(), 2.5, N, V, Vp);
  for (int n = 0; n < N; ++n) {
    double s = 0;
    for (int j = 0; j < V; ++j) s += d[n * Vp + j];
    EXPECT_NEAR(s, 0.0, 1e-14) << "row " << n;
    EXPECT_LT(d[n * Vp + targets[n]], 0.0) << "row " << n;
  }
}

TEST(CrossEntropy, InPlaceMatchesOutOfPlace) {
  const int N = 6, V = 50, Vp = 64;
  auto x = padded_logits<float>(N, V, Vp, 5);
  auto targets = forge::testing::random_ids(N, V, 6);
  targets[2] = -1;
  std::vector<float> separate(x.size());
  cross_entropy_bwd<float>(separate.data(), x.data(), targets.data(), 0.25f, N, V, Vp);
  auto in_place = x;
  cross_entropy_bwd<float>(in_place.data(), in_place.data(), targets.data(), 0.25f, N, V, Vp);
  EXPECT_EQ(in_place, separate);
}

// Float instantiation on float-rounded logits against double on the same values (both sum in
// double), large vocabulary with padding and an ignored row.
TEST(CrossEntropy, FloatMatchesDouble) {
  const int N = 7, V = 1000, Vp = 1024;
  auto xf = padded_logits<float>(N, V, Vp, 7);
  auto xd = forge::testing::to_double(xf);
  auto targets = forge::testing::random_ids(N, V, 8);
  targets[4] = -1;
  std::vector<float> lf(N);
  std::vector<double> ld(N);
  cross_entropy_fwd<float>(lf.data(), xf.data(), targets.data(), N, V, Vp);
  cross_entropy_fwd<double>(ld.data(), xd.data(), targets.data(), N, V, Vp);
  EXPECT_TRUE(all_close(lf, ld, forge::testing::kTolF32));
  std::vector<float> df(xf.size());
  std::vector<double> dd(xd.size());
  cross_entropy_bwd<float>(df.data(), xf.data(), targets.data(), 1.0f / 6, N, V, Vp);
  cross_entropy_bwd<double>(dd.data(), xd.data(), targets.data(), double{1.0f / 6}, N, V, Vp);
  EXPECT_TRUE(all_close(df, dd, forge::testing::kTolF32));
}

}  // namespace
}  // namespace forge::cpu
