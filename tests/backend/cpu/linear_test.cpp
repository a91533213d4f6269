#include "forge/ops/linear.h"

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

const char* name(WeightLayout layout) {
  return layout == WeightLayout::kOutIn ? "kOutIn" : "kInOut";
}

// Every input gradient (inp, weight, bias) against central differences of Σ out·w, for both
// layouts, with and without bias.
TEST(Linear, BackwardMatchesFiniteDifferences) {
  const int N = 3, C = 5, OC = 4;
  uint64_t seed = 10;
  for (WeightLayout layout : {WeightLayout::kOutIn, WeightLayout::kInOut}) {
    for (bool has_bias : {true, false}) {
      auto inp = random_normal<double>(N * C, seed++);
      auto weight = random_normal<double>(OC * C, seed++);
      auto bias = random_normal<double>(OC, seed++);
      const auto w = random_normal<double>(N * OC, seed++);  // dL/dout
      const double* b = has_bias ? bias.data() : nullptr;
      auto loss = [&] {
        std::vector<double> out(N * OC);
        linear_fwd<double>(out.data(), inp.data(), weight.data(), b, N, C, OC, layout);
        return dot(out, w);
      };
      std::vector<double> dinp(N * C, 0.0), dweight(OC * C, 0.0), dbias(OC, 0.0);
      linear_bwd<double>(dinp.data(), dweight.data(), has_bias ? dbias.data() : nullptr, w.data(),
                         inp.data(), weight.data(), N, C, OC, layout);
      const std::string sfx = std::string(name(layout)) + (has_bias ? " bias" : " no bias");
      EXPECT_TRUE(all_close(dinp, finite_diff(inp, loss), kTolFiniteDiff)) << "dinp " << sfx;
      EXPECT_TRUE(all_close(dweight, finite_diff(weight, loss), kTolFiniteDiff))
          << "dweight " << sfx;
      if (has_bias) {
        EXPECT_TRUE(all_close(dbias, finite_diff(bias, loss), kTolFiniteDiff)) << "dbias " << sfx;
      }
    }
  }
}

// Gradients pre-filled with random values: bwd must add to them, and dinp = null must leave
// the other gradients unchanged.
TEST(Linear, BackwardAccumulatesAndSkipsNullDinp) {
  const int N = 4, C = 6, OC = 3;
  uint64_t seed = 50;
  for (WeightLayout layout : {WeightLayout::kOutIn, WeightLayout::kInOut}) {
    const auto inp = random_normal<double>(N * C, seed++);
    const auto weight = random_normal<double>(OC * C, seed++);
    const auto dout = random_normal<double>(N * OC, seed++);
    std::vector<double> dinp0(N * C, 0.0), dweight0(OC * C, 0.0), dbias0(OC, 0.0);
    linear_bwd<double>(dinp0.data(), dweight0.data(), dbias0.data(), dout.data(), inp.data(),
                       weight.data(), N, C, OC, layout);

    const auto dinp_pre = random_normal<double>(N * C, seed++);
    const auto dweight_pre = random_normal<double>(OC * C, seed++);
    const auto dbias_pre = random_normal<double>(OC, seed++);
    auto dinp = dinp_pre, dweight = dweight_pre, dbias = dbias_pre;
    linear_bwd<double>(dinp.data(), dweight.data(), dbias.data(), dout.data(), inp.data(),
                       weight.data(), N, C, OC, layout);
    for (int i = 0; i < N * C; ++i) dinp[i] -= dinp_pre[i];
    for (int i = 0; i < OC * C; ++i) dweight[i] -= dweight_pre[i];
    for (int i = 0; i < OC; ++i) dbias[i] -= dbias_pre[i];
    EXPECT_TRUE(all_close(dinp, dinp0, kTolF64)) << name(layout);
    EXPECT_TRUE(all_close(dweight, dweight0, kTolF64)) << name(layout);
    EXPECT_TRUE(all_close(dbias, dbias0, kTolF64)) << name(layout);

    // dinp null: dweight and dbias are the same as with dinp present.
    std::vector<double> dweight1(OC * C, 0.0), dbias1(OC, 0.0);
    linear_bwd<double>(nullptr, dweight1.data(), dbias1.data(), dout.data(), inp.data(),
                       weight.data(), N, C, OC, layout);
    EXPECT_TRUE(all_close(dweight1, dweight0, kTolF64)) << name(layout);
    EXPECT_TRUE(all_close(dbias1, dbias0, kTolF64)) << name(layout);
  }
}

// The float instantiation against the double one, on float-representable inputs and awkward
// sizes (sums over 37 rows for dweight and dbias).
TEST(Linear, FloatMatchesDouble) {
  const int N = 37, C = 29, OC = 19;
  uint64_t seed = 90;
  for (WeightLayout layout : {WeightLayout::kOutIn, WeightLayout::kInOut}) {
    const auto inp = random_normal<float>(N * C, seed++);
    const auto weight = random_normal<float>(OC * C, seed++, 0.2);
    const auto bias = random_normal<float>(OC, seed++);
    const auto dout = random_normal<float>(N * OC, seed++);
    const auto inp_d = to_double(inp), weight_d = to_double(weight), bias_d = to_double(bias),
               dout_d = to_double(dout);

    std::vector<float> out(N * OC);
    std::vector<double> out_d(N * OC);
    linear_fwd<float>(out.data(), inp.data(), weight.data(), bias.data(), N, C, OC, layout);
    linear_fwd<double>(out_d.data(), inp_d.data(), weight_d.data(), bias_d.data(), N, C, OC,
                       layout);
    EXPECT_TRUE(all_close(out, out_d, kTolF32)) << name(layout);

    std::vector<float> dinp(N * C, 0.f), dweight(OC * C, 0.f), dbias(OC, 0.f);
    std::vector<double> dinp_d(N * C, 0.0), dweight_d(OC * C, 0.0), dbias_d(OC, 0.0);
    linear_bwd<float>(dinp.data(), dweight.data(), dbias.data(), dout.data(), inp.data(),
                      weight.data(), N, C, OC, layout);
    linear_bwd<double>(dinp_d.data(), dweight_d.data(), dbias_d.data(), dout_d.data(), inp_d.data(),
                       weight_d.data(), N, C, OC, layout);
    EXPECT_TRUE(all_close(dinp, dinp_d, kTolF32)) << name(layout);
    EXPECT_TRUE(all_close(dweight, dweight_d, kTolF32)) << name(layout);
    EXPECT_TRUE(all_close(dbias, dbias_d, kTolF32)) << name(layout);
  }
}

TEST(Linear, HandComputedValues) {
  // inp [1, 2]; W as (OC, C) = [[1, 0], [0, 1], [1, -1]]; bias [0.5, 0, -1]
  // out = [1·1 + 2·0, 1·0 + 2·1, 1·1 − 2·1] + bias = [1.5, 2, −2].
  const double inp[] = {1, 2};
  const double w_out_in[] = {1, 0, 0, 1, 1, -1};
  const double w_in_out[] = {1, 0, 1, 0, 1, -1};  // the same matrix stored (C, OC)
  const double bias[] = {0.5, 0, -1};
  double out[3];
  linear_fwd<double>(out, inp, w_out_in, bias, 1, 2, 3, WeightLayout::kOutIn);
  EXPECT_DOUBLE_EQ(out[0], 1.5);
  EXPECT_DOUBLE_EQ(out[1], 2);
  EXPECT_DOUBLE_EQ(out[2], -2);
  linear_fwd<double>(out, inp, w_in_out, nullptr, 1, 2, 3, WeightLayout::kInOut);
  EXPECT_DOUBLE_EQ(out[0], 1);
  EXPECT_DOUBLE_EQ(out[1], 2);
  EXPECT_DOUBLE_EQ(out[2], -1);

  // dout [1, 1, 1]: dinp = Σ_o W[o, :] = [2, 0]; dW[o, c] = inp[c]; dbias = dout.
  const double dout[] = {1, 1, 1};
  double dinp[2] = {}, dw[6] = {}, db[3] = {};
  linear_bwd<double>(dinp, dw, db, dout, inp, w_out_in, 1, 2, 3, WeightLayout::kOutIn);
  EXPECT_DOUBLE_EQ(dinp[0], 2);
  EXPECT_DOUBLE_EQ(dinp[1], 0);
  for (int o = 0; o < 3; ++o) {
    EXPECT_DOUBLE_EQ(dw[o * 2 + 0], 1);
    EXPECT_DOUBLE_EQ(dw[o * 2 + 1], 2);
    EXPECT_DOUBLE_EQ(db[o], 1);
  }
}

// bias_grad on its own: the column sums of dout (3, 2), added to what dbias held.
TEST(Linear, BiasGradAddsColumnSums) {
  const float dout[] = {1, -2, 3, 0.5f, -4, 8};
  float db[2] = {10, 20};
  bias_grad<float>(db, dout, 3, 2);
  EXPECT_FLOAT_EQ(db[0], 10 + (1 + 3 - 4));
  EXPECT_FLOAT_EQ(db[1], 20 + (-2 + 0.5f + 8));
}

// A column slice (row stride 4) sums its own two columns and nothing else.
TEST(Linear, BiasGradOfAStridedSlice) {
  const float dout[] = {1, -2, 3, 100, 0.5f, -4, 8, 100, 2, 7, -1, 100};  // (3, 4)
  float db[2] = {10, 20};
  bias_grad<float>(db, dout + 1, 3, 2, 4);  // columns 1 and 2
  EXPECT_FLOAT_EQ(db[0], 10 + (-2 - 4 + 7));
  EXPECT_FLOAT_EQ(db[1], 20 + (3 + 8 - 1));
}

}  // namespace
}  // namespace forge::cpu
