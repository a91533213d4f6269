#include "forge/ops/layernorm.h"

#include <omp.h>

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

TEST(LayerNorm, BackwardMatchesFiniteDifferences) {
  const int N = 3, C = 5;
  auto inp = random_normal<double>(N * C, 500);
  auto weight = random_normal<double>(C, 501);
  auto bias = random_normal<double>(C, 502);
  const auto w = random_normal<double>(N * C, 503);
  auto loss = [&] {
    std::vector<double> out(N * C), mean(N), rstd(N);
    layernorm_fwd<double>(out.data(), mean.data(), rstd.data(), inp.data(), weight.data(),
                          bias.data(), N, C, kEps);
    return dot(out, w);
  };
  std::vector<double> out(N * C), mean(N), rstd(N);
  layernorm_fwd<double>(out.data(), mean.data(), rstd.data(), inp.data(), weight.data(),
                        bias.data(), N, C, kEps);
  std::vector<double> dinp(N * C, 0.0), dweight(C, 0.0), dbias(C, 0.0);
  layernorm_bwd<double>(dinp.data(), dweight.data(), dbias.data(), w.data(), inp.data(),
                        weight.data(), mean.data(), rstd.data(), N, C);
  EXPECT_TRUE(all_close(dinp, finite_diff(inp, loss), kTolFiniteDiff));
  EXPECT_TRUE(all_close(dweight, finite_diff(weight, loss), kTolFiniteDiff));
  EXPECT_TRUE(all_close(dbias, finite_diff(bias, loss), kTolFiniteDiff));
}

TEST(LayerNorm, BackwardAccumulates) {
  const int N = 4, C = 7;
  const auto inp = random_normal<double>(N * C, 510);
  const auto weight = random_normal<double>(C, 511);
  const auto bias = random_normal<double>(C, 512);
  const auto dout = random_normal<double>(N * C, 513);
  std::vector<double> out(N * C), mean(N), rstd(N);
  layernorm_fwd<double>(out.data(), mean.data(), rstd.data(), inp.data(), weight.data(),
                        bias.data(), N, C, kEps);
  std::vector<double> dinp0(N * C, 0.0), dweight0(C, 0.0), dbias0(C, 0.0);
  layernorm_bwd<double>(dinp0.data(), dweight0.data(), dbias0.data(), dout.data(), inp.data(),
                        weight.data(), mean.data(), rstd.data(), N, C);
  const auto dinp_pre = random_normal<double>(N * C, 514);
  const auto dweight_pre = random_normal<double>(C, 515);
  const auto dbias_pre = random_normal<double>(C, 516);
  auto dinp = dinp_pre, dweight = dweight_pre, dbias = dbias_pre;
  layernorm_bwd<double>(dinp.data(), dweight.data(), dbias.data(), dout.data(), inp.data(),
                        weight.data(), mean.data(), rstd.data(), N, C);
  for (int i = 0; i < N * C; ++i) dinp[i] -= dinp_pre[i];
  for (int c = 0; c < C; ++c) {
    dweight[c] -= dweight_pre[c];
    dbias[c] -= dbias_pre[c];
  }
  EXPECT_TRUE(all_close(dinp, dinp0, kTolF64));
  EXPECT_TRUE(all_close(dweight, dweight0, kTolF64));
  EXPECT_TRUE(all_close(dbias, dbias0, kTolF64));
}

// C = 77 is not a multiple of the 64-channel block of the weight-gradient loop.
TEST(LayerNorm, FloatMatchesDouble) {
  const int N = 19, C = 77;
  const auto inp = random_normal<float>(N * C, 520);
  const auto weight = random_normal<float>(C, 521);
  const auto bias = random_normal<float>(C, 522);
  const auto dout = random_normal<float>(N * C, 523);
  const auto inp_d = to_double(inp), weight_d = to_double(weight), bias_d = to_double(bias),
             dout_d = to_double(dout);
  std::vector<float> out(N * C), mean(N), rstd(N);
  std::vector<double> out_d(N * C), mean_d(N), rstd_d(N);
  layernorm_fwd<float>(out.data(), mean.data(), rstd.data(), inp.data(), weight.data(), bias.data(),
                       N, C, kEps);
  layernorm_fwd<double>(out_d.data(), mean_d.data(), rstd_d.data(), inp_d.data(), weight_d.data(),
                        bias_d.data(), N, C, kEps);
  EXPECT_TRUE(all_close(out, out_d, kTolF32));
  EXPECT_TRUE(all_close(mean, mean_d, kTolF32));
  EXPECT_TRUE(all_close(rstd, rstd_d, kTolF32));

  std::vector<float> dinp(N * C, 0.f), dweight(C, 0.f), dbias(C, 0.f);
  std::vector<double> dinp_d(N * C, 0.0), dweight_d(C, 0.0), dbias_d(C, 0.0);
  layernorm_bwd<float>(dinp.data(), dweight.data(), dbias.data(), dout.data(), inp.data(),
                       weight.data(), mean.data(), rstd.data(), N, C);
  layernorm_bwd<double>(dinp_d.data(), dweight_d.data(), dbias_d.data(), dout_d.data(),
                        inp_d.data(), weight_d.data(), mean_d.data(), rstd_d.data(), N, C);
  EXPECT_TRUE(all_close(dinp, dinp_d, kTolF32));
  EXPECT_TRUE(all_close(dweight, dweight_d, kTolF32));
  EXPECT_TRUE(all_close(dbias, dbias_d, kTolF32));
}

TEST(LayerNorm, HandComputedRow) {
  // x = [1, 3]: mean 2, biased var 1, rstd = 1/sqrt(1 + eps); weight [2, 1], bias [0, 10]:
  // y = [−1·rstd·2 + 0, 1·rstd·1 + 10].
  const double x[] = {1, 3}, weight[] = {2, 1}, bias[] = {0, 10};
  double y[2], mean, rstd;
  layernorm_fwd<double>(y, &mean, &rstd, x, weight, bias, 1, 2, kEps);
  const double r = 1 / std::sqrt(1 + static_cast<double>(kEps));
  EXPECT_DOUBLE_EQ(mean, 2);
  EXPECT_DOUBLE_EQ(rstd, r);
  EXPECT_DOUBLE_EQ(y[0], -2 * r);
  EXPECT_DOUBLE_EQ(y[1], r + 10);
}

// A large common offset: the two-pass variance keeps full precision in float.
TEST(LayerNorm, LargeMeanKeepsVariance) {
  const int C = 4;
  const float x[] = {10000.f, 10001.f, 10002.f, 10003.f};  // var = 1.25
  const float weight[] = {1, 1, 1, 1}, bias[] = {0, 0, 0, 0};
  float y[C], mean, rstd;
  layernorm_fwd<float>(y, &mean, &rstd, x, weight, bias, 1, C, 0.f);
  EXPECT_FLOAT_EQ(mean, 10001.5f);
  EXPECT_FLOAT_EQ(rstd, static_cast<float>(1 / std::sqrt(1.25)));
  EXPECT_NEAR(y[0], -1.5 / std::sqrt(1.25), 1e-6);
}

// Bit-identical gradients for any thread count (weight/bias sums over rows in a fixed order).
TEST(LayerNorm, BackwardIndependentOfThreadCount) {
  const int N = 67, C = 130;
  const auto inp = random_normal<float>(N * C, 530);
  const auto weight = random_normal<float>(C, 531);
  const auto bias = random_normal<float>(C, 532);
  const auto dout = random_normal<float>(N * C, 533);
  std::vector<float> out(N * C), mean(N), rstd(N);
  layernorm_fwd<float>(out.data(), mean.data(), rstd.data(), inp.data(), weight.data(), bias.data(),
                       N, C, kEps);
  const int saved = omp_get_max_threads();
  std::vector<float> dinp[2], dweight[2], dbias[2];
  for (int k = 0; k < 2; ++k) {
    omp_set_num_threads(k == 0 ? 1 : 3);
    dinp[k].assign(N * C, 0.f);
    dweight[k].assign(C, 0.f);
    dbias[k].assign(C, 0.f);
    layernorm_bwd<float>(dinp[k].data(), dweight[k].data(), dbias[k].data(), dout.data(),
                         inp.data(), weight.data(), mean.data(), rstd.data(), N, C);
  }
  omp_set_num_threads(saved);
  EXPECT_EQ(dinp[0], dinp[1]);
  EXPECT_EQ(dweight[0], dweight[1]);
  EXPECT_EQ(dbias[0], dbias[1]);
}

}  // namespace
}  // namespace forge::cpu
