#include "forge/ops/rmsnorm.h"

#include <cmath>

#include "testing.h"

namespace forge::cpu {
namespace {

using forge::testing::all_close;
using forge::testing::dot;
using forge::testing::finite_diff;
using forge::testing::kTolF32;
using forge::testing::kTolF64;
using forge::testing::kTolFiniteDiff;
using forge::testing::random_normal;
using forge::testing::to_double;

constexpr float kEps = 1e-5f;

TEST(RmsNorm, BackwardMatchesFiniteDifferences) {
  const int N = 3, C = 5;
  auto inp = random_normal<double>(N * C, 600);
  auto weight = random_normal<double>(C, 601);
  const auto w = random_normal<double>(N * C, 602);
  auto loss = [&] {
    std::vector<double> out(N * C), rstd(N);
    rmsnorm_fwd<double>(out.data(), rstd.data(), inp.data(), weight.data(), N, C, kEps);
    return dot(out, w);
  };
  std::vector<double> out(N * C), rstd(N);
  rmsnorm_fwd<double>(out.data(), rstd.data(), inp.data(), weight.data(), N, C, kEps);
  std::vector<double> dinp(N * C, 0.0), dweight(C, 0.0);
  rmsnorm_bwd<double>(dinp.data(), dweight.data(), w.data(), inp.data(), weight.data(), rstd.data(),
                      N, C);
  EXPECT_TRUE(all_close(dinp, finite_diff(inp, loss), kTolFiniteDiff));
  EXPECT_TRUE(all_close(dweight, finite_diff(weight, loss), kTolFiniteDiff));
}

TEST(RmsNorm, BackwardAccumulates) {
  const int N = 4, C = 6;
  const auto inp = random_normal<double>(N * C, 610);
  const auto weight = random_normal<double>(C, 611);
  const auto dout = random_normal<double>(N * C, 612);
  std::vector<double> out(N * C), rstd(N);
  rmsnorm_fwd<double>(out.data(), rstd.data(), inp.data(), weight.data(), N, C, kEps);
  std::vector<double> dinp0(N * C, 0.0), dweight0(C, 0.0);
  rmsnorm_bwd<double>(dinp0.data(), dweight0.data(), dout.data(), inp.data(), weight.data(),
                      rstd.data(), N, C);
  const auto dinp_pre = random_normal<double>(N * C, 613);
  const auto dweight_pre = random_normal<double>(C, 614);
  auto dinp = dinp_pre, dweight = dweight_pre;
  rmsnorm_bwd<double>(dinp.data(), dweight.data(), dout.data(), inp.data(), weight.data(),
                      rstd.data(), N, C);
  for (int i = 0; i < N * C; ++i) dinp[i] -= dinp_pre[i];
  for (int c = 0; c < C; ++c) dweight[c] -= dweight_pre[c];
  EXPECT_TRUE(all_close(dinp, dinp0, kTolF64));
  EXPECT_TRUE(all_close(dweight, dweight0, kTolF64));
}

// C = 77 is not a multiple of the 64-channel block of the weight-gradient loop.
TEST(RmsNorm, FloatMatchesDouble) {
  const int N = 19, C = 77;
  const auto inp = random_normal<float>(N * C, 620);
  const auto weight = random_normal<float>(C, 621);
  const auto dout = random_normal<float>(N * C, 622);
  const auto inp_d = to_double(inp), weight_d = to_double(weight), dout_d = to_double(dout);
  std::vector<float> out(N * C), rstd(N);
  std::vector<double> out_d(N * C), rstd_d(N);
  rmsnorm_fwd<float>(out.data(), rstd.data(), inp.data(), weight.data(), N, C, kEps);
  rmsnorm_fwd<double>(out_d.data(), rstd_d.data(), inp_d.data(), weight_d.data(), N, C, kEps);
  EXPECT_TRUE(all_close(out, out_d, kTolF32));
  EXPECT_TRUE(all_close(rstd, rstd_d, kTolF32));

  std::vector<float> dinp(N * C, 0.f), dweight(C, 0.f);
  std::vector<double> dinp_d(N * C, 0.0), dweight_d(C, 0.0);
  rmsnorm_bwd<float>(dinp.data(), dweight.data(), dout.data(), inp.data(), weight.data(),
                     rstd.data(), N, C);
  rmsnorm_bwd<double>(dinp_d.data(), dweight_d.data(), dout_d.data(), inp_d.data(), weight_d.data(),
                      rstd_d.data(), N, C);
  EXPECT_TRUE(all_close(dinp, dinp_d, kTolF32));
  EXPECT_TRUE(all_close(dweight, dweight_d, kTolF32));
}

TEST(RmsNorm, HandComputedRow) {
  // x = [3, 4], weight 1: mean(x²) = 12.5, y = x / sqrt(12.5 + eps).
  const double x[] = {3, 4}, weight[] = {1, 1};
  double y[2], rstd;
  rmsnorm_fwd<double>(y, &rstd, x, weight, 1, 2, kEps);
  const double r = 1 / std::sqrt(12.5 + static_cast<double>(kEps));
  EXPECT_DOUBLE_EQ(rstd, r);
  EXPECT_DOUBLE_EQ(y[0], 3 * r);
  EXPECT_DOUBLE_EQ(y[1], 4 * r);
  // weight [2, −1] scales each channel.
  const double weight2[] = {2, -1};
  rmsnorm_fwd<double>(y, &rstd, x, weight2, 1, 2, kEps);
  EXPECT_DOUBLE_EQ(y[0], 6 * r);
  EXPECT_DOUBLE_EQ(y[1], -4 * r);
}

// head_rmsnorm normalises each head of each row on its own (written out here in double) and
// leaves the rest of the row (k and v of a fused q|k|v row) alone.
TEST(RmsNorm, HeadRmsNormNormalisesEachHeadInPlace) {
  const int N = 3, H = 4, HS = 6;
  const int64_t stride = H * HS + 5;
  const auto x = random_normal<double>(N * stride, 71);
  const auto w = random_normal<double>(HS, 72, 0.3);
  std::vector<double> got = x;
  head_rmsnorm<double>(got.data(), w.data(), N, H, HS, stride, kEps);
  std::vector<double> want = x;
  for (int n = 0; n < N; ++n)
    for (int h = 0; h < H; ++h) {
      double* v = want.data() + n * stride + h * HS;
      double ss = 0;
      for (int c = 0; c < HS; ++c) ss += v[c] * v[c];
      const double r = 1.0 / std::sqrt(ss / HS + kEps);
      for (int c = 0; c < HS; ++c) v[c] = v[c] * r * w[c];
    }
  EXPECT_TRUE(all_close(got, want, kTolF64));
  for (int n = 0; n < N; ++n)
    for (int64_t c = H * HS; c < stride; ++c) EXPECT_EQ(got[n * stride + c], x[n * stride + c]);
}

}  // namespace
}  // namespace forge::cpu
