#include "forge/ops/adamw.h"

#include <cmath>

#include "testing.h"

namespace forge::cpu {
namespace {

using forge::testing::all_close;
using forge::testing::kTolF32;
using forge::testing::kTolF64;
using forge::testing::random_normal;
using forge::testing::to_double;

// The header's formula, written out independently in double, one element at a time.
void adamw_reference(std::vector<double>& p, std::vector<double>& m, std::vector<double>& v,
                     const std::vector<double>& grad, const AdamWParams& hp) {
  const double lr = hp.lr, b1 = hp.beta1, b2 = hp.beta2, eps = hp.eps, wd = hp.weight_decay;
  const double t = static_cast<double>(hp.step);
  for (size_t i = 0; i < p.size(); ++i) {
    const double g = grad[i] * static_cast<double>(hp.grad_scale);
    p[i] = p[i] * (1 - lr * wd);
    m[i] = m[i] + (1 - b1) * (g - m[i]);
    v[i] = b2 * v[i] + (1 - b2) * g * g;
    p[i] = p[i] - (lr / (1 - std::pow(b1, t))) * m[i] /
                      (std::sqrt(v[i]) / std::sqrt(1 - std::pow(b2, t)) + eps);
  }
}

AdamWParams test_params() {
  AdamWParams hp;
  hp.lr = 1e-2f;
  hp.beta1 = 0.9f;
  hp.beta2 = 0.95f;
  hp.eps = 1e-8f;
  hp.weight_decay = 0.1f;
  hp.grad_scale = 0.37f;
  return hp;
}

// Three steps with weight decay and grad_scale != 1, fresh gradients each step, both dtypes
// against the double reference (float inputs, so the float run sees the same starting values).
TEST(AdamW, MatchesReferenceOverThreeSteps) {
  const int n = 1001;
  const auto p0 = random_normal<float>(n, 800);
  auto p_f = p0;
  std::vector<float> m_f(n, 0.f), v_f(n, 0.f);
  auto p_d = to_double(p0), p_ref = to_double(p0);
  std::vector<double> m_d(n, 0.0), v_d(n, 0.0), m_ref(n, 0.0), v_ref(n, 0.0);
  AdamWParams hp = test_params();
  for (int t = 1; t <= 3; ++t) {
    hp.step = t;
    const auto grad = random_normal<float>(n, 810 + t, 3.0);
    const auto grad_d = to_double(grad);
    adamw_update<float>(p_f.data(), m_f.data(), v_f.data(), grad.data(), n, hp);
    adamw_update<double>(p_d.data(), m_d.data(), v_d.data(), grad_d.data(), n, hp);
    adamw_reference(p_ref, m_ref, v_ref, grad_d, hp);
    EXPECT_TRUE(all_close(p_d, p_ref, kTolF64)) << "t=" << t;
    EXPECT_TRUE(all_close(m_d, m_ref, kTolF64)) << "t=" << t;
    EXPECT_TRUE(all_close(v_d, v_ref, kTolF64)) << "t=" << t;
    EXPECT_TRUE(all_close(p_f, p_ref, kTolF32)) << "t=" << t;
    EXPECT_TRUE(all_close(m_f, m_ref, kTolF32)) << "t=" << t;
    EXPECT_TRUE(all_close(v_f, v_ref, kTolF32)) << "t=" << t;
  }
}

// A constant gradient worked by hand: p = 1, g = 2·grad_scale 0.5 = 1, lr 0.1, wd 0.1,
// β1 0.9, β2 0.95, eps 1e-8.
//   t=1: p = 1·(1 − 0.01) = 0.99; m = 0.1; v = 0.05; step_size = 0.1/0.1 = 1;
//        denom = sqrt(0.05)/sqrt(0.05) + 1e-8;  p = 0.99 − 0.1/(1 + 1e-8)
//   t=2: m = 0.1 + 0.1·(1 − 0.1) = 0.19; v = 0.95·0.05 + 0.05 = 0.0975;
//        step_size = 0.1/(1 − 0.81) = 0.1/0.19; denom = sqrt(0.0975)/sqrt(1 − 0.9025) + 1e-8
//        p = p·0.99 − (0.1/0.19)·0.19/(1 + 1e-8)
// (Bias correction makes each step lr·sign(g) for a constant gradient.)
TEST(AdamW, HandComputedTwoSteps) {
  AdamWParams hp;
  hp.lr = 0.1f;
  hp.beta1 = 0.9f;
  hp.beta2 = 0.95f;
  hp.eps = 1e-8f;
  hp.weight_decay = 0.1f;
  hp.grad_scale = 0.5f;
  double p = 1, m = 0, v = 0;
  const double g = 2;
  hp.step = 1;
  adamw_update<double>(&p, &m, &v, &g, 1, hp);
  // The hyperparameters are floats (0.1f = 0.1 + 1.5e-9), so compare to ~1e-7.
  const double p1 = 0.99 - 0.1 / (1 + 1e-8);
  EXPECT_NEAR(m, 0.1, 1e-7);
  EXPECT_NEAR(v, 0.05, 1e-7);
  EXPECT_NEAR(p, p1, 1e-7);
  hp.step = 2;
  adamw_update<double>(&p, &m, &v, &g, 1, hp);
  EXPECT_NEAR(m, 0.19, 1e-7);
  EXPECT_NEAR(v, 0.0975, 1e-7);
  EXPECT_NEAR(p, p1 * 0.99 - 0.1 / (1 + 1e-8), 1e-7);

  // Same in float.
  float pf = 1, mf = 0, vf = 0;
  const float gf = 2;
  hp.step = 1;
  adamw_update<float>(&pf, &mf, &vf, &gf, 1, hp);
  EXPECT_NEAR(pf, p1, 1e-6);
}

// wd = 0 (1-D tensors) leaves a zero-gradient parameter with zero moments untouched.
TEST(AdamW, ZeroGradientNoDecayIsIdentity) {
  AdamWParams hp = test_params();
  hp.weight_decay = 0;
  hp.step = 5;
  std::vector<double> p = {1.5, -2, 0}, m(3, 0.0), v(3, 0.0);
  const std::vector<double> g(3, 0.0);
  adamw_update<double>(p.data(), m.data(), v.data(), g.data(), 3, hp);
  EXPECT_EQ(p[0], 1.5);
  EXPECT_EQ(p[1], -2);
  EXPECT_EQ(p[2], 0);
}

}  // namespace
}  // namespace forge::cpu
