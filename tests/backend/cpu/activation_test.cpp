#include "forge/ops/activation.h"

#include <cmath>

#include "testing.h"

namespace forge::cpu {
namespace {

using forge::testing::all_close;
using forge::testing::dot;
using forge::testing::finite_diff;
using forge::testing::kTolF32;
using forge::testing::kTolFiniteDiff;
using forge::testing::random_normal;
using forge::testing::to_double;

constexpr int kN = 15;  // tiny: finite differences cost 2 forward passes per element

// Subtracts the pre-filled values, leaving what bwd added.
std::vector<double> added(const std::vector<double>& after, const std::vector<double>& before) {
  std::vector<double> d(after.size());
  for (size_t i = 0; i < after.size(); ++i) d[i] = after[i] - before[i];
  return d;
}

// ---- GELU -----------------------------------------------------------------------------------

TEST(Gelu, BackwardMatchesFiniteDifferencesAndAccumulates) {
  auto inp = random_normal<double>(kN, 700, 2.0);
  inp[0] = 0;
  const auto w = random_normal<double>(kN, 701);
  auto loss = [&] {
    std::vector<double> out(kN);
    gelu_fwd<double>(out.data(), inp.data(), kN);
    return dot(out, w);
  };
  const auto pre = random_normal<double>(kN, 702);
  auto dinp = pre;
  gelu_bwd<double>(dinp.data(), inp.data(), w.data(), kN);
  EXPECT_TRUE(all_close(added(dinp, pre), finite_diff(inp, loss), kTolFiniteDiff));
}

TEST(Gelu, HandComputedValues) {
  const double x[] = {0, 1, -1, 10, -10};
  double y[5];
  gelu_fwd<double>(y, x, 5);
  EXPECT_EQ(y[0], 0);
  // 0.5·(1 + tanh(√(2/π)·1.044715)) = 0.841192 (the tanh form; the erf form gives 0.841345).
  EXPECT_NEAR(y[1], 0.841192, 1e-6);
  EXPECT_NEAR(y[2], 0.841192 - 1, 1e-6);  // gelu(x) − gelu(−x) = x
  EXPECT_NEAR(y[3], 10, 1e-12);
  EXPECT_NEAR(y[4], 0, 1e-12);
  // gelu'(0) = 0.5.
  const double zero = 0, one = 1;
  double d = 0;
  gelu_bwd<double>(&d, &zero, &one, 1);
  EXPECT_DOUBLE_EQ(d, 0.5);
}

TEST(Gelu, FloatMatchesDouble) {
  const int n = 1000;
  const auto inp = random_normal<float>(n, 710, 3.0);
  const auto dout = random_normal<float>(n, 711);
  const auto inp_d = to_double(inp), dout_d = to_double(dout);
  std::vector<float> out(n), dinp(n, 0.f);
  std::vector<double> out_d(n), dinp_d(n, 0.0);
  gelu_fwd<float>(out.data(), inp.data(), n);
  gelu_fwd<double>(out_d.data(), inp_d.data(), n);
  gelu_bwd<float>(dinp.data(), inp.data(), dout.data(), n);
  gelu_bwd<double>(dinp_d.data(), inp_d.data(), dout_d.data(), n);
  EXPECT_TRUE(all_close(out, out_d, kTolF32));
  EXPECT_TRUE(all_close(dinp, dinp_d, kTolF32));
}

// ---- SwiGLU ---------------------------------------------------------------------------------

TEST(SwiGlu, BackwardMatchesFiniteDifferencesAndOverwrites) {
  auto gate = random_normal<double>(kN, 720, 2.0);
  auto up = random_normal<double>(kN, 721);
  const auto w = random_normal<double>(kN, 722);
  auto loss = [&] {
    std::vector<double> out(kN);
    swiglu_fwd<double>(out.data(), gate.data(), up.data(), kN);
    return dot(out, w);
  };
  const auto dgate_pre = random_normal<double>(kN, 723);
  const auto dup_pre = random_normal<double>(kN, 724);
  auto dgate = dgate_pre, dup = dup_pre;
  swiglu_bwd<double>(dgate.data(), dup.data(), w.data(), gate.data(), up.data(), kN);
  // Written, not accumulated: what was in dgate and dup before does not count.
  EXPECT_TRUE(all_close(dgate, finite_diff(gate, loss), kTolFiniteDiff));
  EXPECT_TRUE(all_close(dup, finite_diff(up, loss), kTolFiniteDiff));
}

// The row-strided ops on gate|up rows (rows, ld), gate at column 0 and up at ff, give the dense
// ops' results on the two halves copied out, bit for bit (the same arithmetic per element), and
// leave the ld − 2·ff gap of each row alone.
TEST(SwiGlu, RowsEqualTheDenseOpsOnTheHalves) {
  const int rows = 7, ff = 13;
  const int64_t ld = 2 * ff + 5, n = static_cast<int64_t>(rows) * ff;
  const auto gu = forge::testing::random_normal<float>(rows * ld, 91, 3.0);
  const auto dout = forge::testing::random_normal<float>(n, 92);
  std::vector<float> gate(n), upv(n);
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < ff; ++c) gate[r * ff + c] = gu[r * ld + c], upv[r * ff + c] = gu[r * ld + ff + c];
  std::vector<float> out(n), dgate(n), dup(n), out_rows(n, -7.0f), d_rows(rows * ld, -7.0f);
  swiglu_fwd<float>(out.data(), gate.data(), upv.data(), n);
  swiglu_bwd<float>(dgate.data(), dup.data(), dout.data(), gate.data(), upv.data(), n);
  swiglu_fwd_rows<float>(out_rows.data(), gu.data(), gu.data() + ff, rows, ff, ld);
  swiglu_bwd_rows<float>(d_rows.data(), d_rows.data() + ff, dout.data(), gu.data(), gu.data() + ff, rows, ff, ld);
  EXPECT_EQ(out_rows, out);
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < ff; ++c) {
      ASSERT_EQ(d_rows[r * ld + c], dgate[r * ff + c]) << r << "," << c;
      ASSERT_EQ(d_rows[r * ld + ff + c], dup[r * ff + c]) << r << "," << c;
    }
  for (int r = 0; r < rows; ++r)
    for (int64_t c = 2 * ff; c < ld; ++c) EXPECT_EQ(d_rows[r * ld + c], -7.0f) << "gap written at " << r;
}

TEST(SwiGlu, HandComputedValues) {
  // silu(0) = 0; silu(1) = 1/(1 + e⁻¹) = 0.7310585786; times up = 2.
  // silu(−1000): exp overflows, σ → 0, result −0, not NaN.
  const double gate[] = {0, 1, -1000, 1000}, up[] = {5, 2, 1, 1};
  double out[4];
  swiglu_fwd<double>(out, gate, up, 4);
  EXPECT_EQ(out[0], 0);
  EXPECT_NEAR(out[1], 2 * 0.7310585786300049, 1e-15);
  EXPECT_EQ(out[2], 0);
  EXPECT_EQ(out[3], 1000);
  // d silu/dg at 0 is σ(0) = 0.5: dgate = dout·up·0.5 = 2.5; dup = dout·silu(0) = 0.
  double dgate[4] = {}, dup[4] = {};
  const double dout[] = {1, 1, 1, 1};
  swiglu_bwd<double>(dgate, dup, dout, gate, up, 4);
  EXPECT_DOUBLE_EQ(dgate[0], 2.5);
  EXPECT_EQ(dup[0], 0);
  EXPECT_EQ(dgate[2], 0);
  EXPECT_FALSE(std::isnan(dgate[2]) || std::isnan(dup[2]));
  EXPECT_DOUBLE_EQ(dgate[3], 1);  // σ → 1, derivative of g·1 is 1
}

TEST(SwiGlu, FloatMatchesDouble) {
  const int n = 1000;
  const auto gate = random_normal<float>(n, 730, 3.0);
  const auto up = random_normal<float>(n, 731);
  const auto dout = random_normal<float>(n, 732);
  const auto gate_d = to_double(gate), up_d = to_double(up), dout_d = to_double(dout);
  std::vector<float> out(n), dgate(n, 0.f), dup(n, 0.f);
  std::vector<double> out_d(n), dgate_d(n, 0.0), dup_d(n, 0.0);
  swiglu_fwd<float>(out.data(), gate.data(), up.data(), n);
  swiglu_fwd<double>(out_d.data(), gate_d.data(), up_d.data(), n);
  swiglu_bwd<float>(dgate.data(), dup.data(), dout.data(), gate.data(), up.data(), n);
  swiglu_bwd<double>(dgate_d.data(), dup_d.data(), dout_d.data(), gate_d.data(), up_d.data(), n);
  EXPECT_TRUE(all_close(out, out_d, kTolF32));
  EXPECT_TRUE(all_close(dgate, dgate_d, kTolF32));
  EXPECT_TRUE(all_close(dup, dup_d, kTolF32));
}

// ---- Residual -------------------------------------------------------------------------------

TEST(Residual, BackwardMatchesFiniteDifferencesAndAccumulates) {
  auto a = random_normal<double>(kN, 740);
  auto b = random_normal<double>(kN, 741);
  const auto w = random_normal<double>(kN, 742);
  auto loss = [&] {
    std::vector<double> out(kN);
    residual_fwd<double>(out.data(), a.data(), b.data(), kN);
    return dot(out, w);
  };
  const auto da_pre = random_normal<double>(kN, 743);
  const auto db_pre = random_normal<double>(kN, 744);
  auto da = da_pre, db = db_pre;
  residual_bwd<double>(da.data(), db.data(), w.data(), kN);
  EXPECT_TRUE(all_close(added(da, da_pre), finite_diff(a, loss), kTolFiniteDiff));
  EXPECT_TRUE(all_close(added(db, db_pre), finite_diff(b, loss), kTolFiniteDiff));
}

TEST(Residual, HandComputedAndInPlace) {
  double a[] = {1, 2, 3};
  const double b[] = {10, 20, 30};
  double out[3];
  residual_fwd<double>(out, a, b, 3);
  EXPECT_EQ(out[0], 11);
  EXPECT_EQ(out[2], 33);
  residual_fwd<double>(a, a, b, 3);  // out aliases a
  EXPECT_EQ(a[0], 11);
  EXPECT_EQ(a[1], 22);
  EXPECT_EQ(a[2], 33);
}

TEST(Residual, FloatMatchesDouble) {
  const int n = 1000;
  const auto a = random_normal<float>(n, 750);
  const auto b = random_normal<float>(n, 751);
  std::vector<float> out(n);
  std::vector<double> out_d(n);
  residual_fwd<float>(out.data(), a.data(), b.data(), n);
  residual_fwd<double>(out_d.data(), to_double(a).data(), to_double(b).data(), n);
  EXPECT_TRUE(all_close(out, out_d, kTolF32));
}

}  // namespace
}  // namespace forge::cpu
