// The CPU twin of the flash kernels against the naive reference attention (attention_fwd/bwd,
// itself checked against the textbook formula and finite differences in attention_test.cpp):
// same outputs and gradients in double, strided q/k/v views read and written in place, the lse
// it saves, bit-identical results for 1–4 threads; and the fused LM head + loss against its
// unfused composition.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "forge/ops/attention.h"
#include "forge/ops/cross_entropy.h"
#include "forge/ops/linear.h"
#include "testing.h"

namespace forge::cpu {
namespace {

using forge::testing::all_close;
using forge::testing::random_normal;

// Packs dense (B, T, H·HS) into a strided buffer of `stride` elements per token at column `col`.
std::vector<double> scatter(const std::vector<double>& dense, int rows, int width, int stride, int col,
                            std::vector<double> into) {
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < width; ++c) into[static_cast<size_t>(r) * stride + col + c] = dense[static_cast<size_t>(r) * width + c];
  return into;
}
std::vector<double> gather(const std::vector<double>& strided, int rows, int width, int stride, int col) {
  std::vector<double> d(static_cast<size_t>(rows) * width);
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < width; ++c) d[static_cast<size_t>(r) * width + c] = strided[static_cast<size_t>(r) * stride + col + c];
  return d;
}

// Double in, double out: the two algorithms differ only in rounding (1e-12 relative).
TEST(FlashAttentionCpu, MatchesTheReferenceForwardAndBackward) {
  const AttentionShape shapes[] = {{2, 7, 4, 2, 8, true, 0}, {1, 13, 3, 1, 5, true, 4},
                                   {2, 9, 2, 2, 16, false, 0}, {1, 1, 2, 1, 4, true, 0}};
  uint64_t seed = 100;
  for (const AttentionShape& s : shapes) {
    SCOPED_TRACE("B=" + std::to_string(s.B) + " T=" + std::to_string(s.T) + " NH=" + std::to_string(s.NH) +
                 " NKV=" + std::to_string(s.NKV) + " window=" + std::to_string(s.window));
    const size_t nq = static_cast<size_t>(s.B) * s.T * s.NH * s.HS, nkv = static_cast<size_t>(s.B) * s.T * s.NKV * s.HS;
    const auto q = random_normal<double>(nq, ++seed), k = random_normal<double>(nkv, ++seed);
    const auto v = random_normal<double>(nkv, ++seed), dout = random_normal<double>(nq, ++seed);
    std::vector<double> out_ref(nq), att(static_cast<size_t>(s.B) * s.NH * s.T * s.T);
    attention_fwd<double>(out_ref.data(), att.data(), q.data(), k.data(), v.data(), s);
    std::vector<double> dq_ref(nq), dk_ref(nkv), dv_ref(nkv);
    attention_bwd<double>(dq_ref.data(), dk_ref.data(), dv_ref.data(), dout.data(), q.data(), k.data(), v.data(),
                          att.data(), s);

    std::vector<double> out(nq), lse(static_cast<size_t>(s.B) * s.NH * s.T);
    flash_attention_fwd<double>(out.data(), lse.data(), q.data(), k.data(), v.data(), s);
    EXPECT_TRUE(all_close(out, out_ref, {1e-12, 1e-10})) << "out";
    // Poisoned: the backward must write (not accumulate) every element.
    std::vector<double> dq(nq, 1e30), dk(nkv, 1e30), dv(nkv, 1e30);
    flash_attention_bwd<double>(dq.data(), dk.data(), dv.data(), dout.data(), q.data(), k.data(), v.data(),
                                out.data(), lse.data(), s);
    EXPECT_TRUE(all_close(dq, dq_ref, {1e-12, 1e-10})) << "dq";
    EXPECT_TRUE(all_close(dk, dk_ref, {1e-12, 1e-10})) << "dk";
    EXPECT_TRUE(all_close(dv, dv_ref, {1e-12, 1e-10})) << "dv";

    // With the probabilities saved by the forward, the backward reads them instead: the same
    // results, and the saved rows are the reference's (which has 0 at masked keys; the fused
    // op leaves those untouched, so the buffer starts at 0 here).
    std::vector<double> probs(att.size(), 0.0), out2(nq), lse2(lse.size());
    flash_attention_fwd<double>(out2.data(), lse2.data(), q.data(), k.data(), v.data(), s, {}, probs.data());
    EXPECT_EQ(out2, out);
    EXPECT_TRUE(all_close(probs, att, {1e-14, 1e-12})) << "probs";
    std::fill(dq.begin(), dq.end(), 1e30), std::fill(dk.begin(), dk.end(), 1e30), std::fill(dv.begin(), dv.end(), 1e30);
    flash_attention_bwd<double>(dq.data(), dk.data(), dv.data(), dout.data(), q.data(), k.data(), v.data(),
                                out.data(), lse.data(), s, {}, probs.data());
    EXPECT_TRUE(all_close(dq, dq_ref, {1e-12, 1e-10})) << "dq from saved P";
    EXPECT_TRUE(all_close(dk, dk_ref, {1e-12, 1e-10})) << "dk from saved P";
    EXPECT_TRUE(all_close(dv, dv_ref, {1e-12, 1e-10})) << "dv from saved P";
  }
}

// The saved lse is ln Σ_visible exp(scores): recomputed here from its definition.
TEST(FlashAttentionCpu, SavesTheLogSumExp) {
  const AttentionShape s{1, 6, 2, 1, 4, true, 3};
  const auto q = random_normal<double>(6 * 2 * 4, 1), k = random_normal<double>(6 * 4, 2), v = random_normal<double>(6 * 4, 3);
  std::vector<double> out(6 * 2 * 4), lse(2 * 6);
  flash_attention_fwd<double>(out.data(), lse.data(), q.data(), k.data(), v.data(), s);
  for (int h = 0; h < 2; ++h)
    for (int i = 0; i < 6; ++i) {
      double z = 0;
      for (int j = std::max(0, i - 2); j <= i; ++j) {
        double dot = 0;
        for (int d = 0; d < 4; ++d) dot += q[(i * 2 + h) * 4 + d] * k[j * 4 + d];
        z += std::exp(dot / 2.0);
      }
      EXPECT_NEAR(lse[h * 6 + i], std::log(z), 1e-12) << "h=" << h << " i=" << i;
    }
}

// GPT-2's layout: q, k, v column slices of one (N, 3C) buffer, the gradients written into the
// slices of another, neighbours untouched.
TEST(FlashAttentionCpu, ReadsAndWritesStridedViewsInPlace) {
  const AttentionShape s{2, 5, 2, 2, 4, true, 0};
  const int rows = s.B * s.T, C = s.NH * s.HS, stride = 3 * C;
  const auto q = random_normal<double>(rows * C, 11), k = random_normal<double>(rows * C, 12);
  const auto v = random_normal<double>(rows * C, 13), dout = random_normal<double>(rows * C, 14);
  std::vector<double> qkv(static_cast<size_t>(rows) * stride);
  qkv = scatter(q, rows, C, stride, 0, qkv);
  qkv = scatter(k, rows, C, stride, C, qkv);
  qkv = scatter(v, rows, C, stride, 2 * C, qkv);
  std::vector<double> out_d(rows * C), lse_d(s.B * s.NH * s.T), out_s(rows * C), lse_s(s.B * s.NH * s.T);
  flash_attention_fwd<double>(out_d.data(), lse_d.data(), q.data(), k.data(), v.data(), s);
  const AttentionStrides st{stride, stride, stride, 0};
  flash_attention_fwd<double>(out_s.data(), lse_s.data(), qkv.data(), qkv.data() + C, qkv.data() + 2 * C, s, st);
  EXPECT_EQ(out_s, out_d);
  EXPECT_EQ(lse_s, lse_d);
  std::vector<double> dq(rows * C), dk(rows * C), dv(rows * C), dqkv(static_cast<size_t>(rows) * stride, 0.0);
  flash_attention_bwd<double>(dq.data(), dk.data(), dv.data(), dout.data(), q.data(), k.data(), v.data(), out_d.data(),
                              lse_d.data(), s);
  flash_attention_bwd<double>(dqkv.data(), dqkv.data() + C, dqkv.data() + 2 * C, dout.data(), qkv.data(),
                              qkv.data() + C, qkv.data() + 2 * C, out_s.data(), lse_s.data(), s, st);
  EXPECT_EQ(gather(dqkv, rows, C, stride, 0), dq);
  EXPECT_EQ(gather(dqkv, rows, C, stride, C), dk);
  EXPECT_EQ(gather(dqkv, rows, C, stride, 2 * C), dv);
}

TEST(FlashAttentionCpu, BitIdenticalForAnyThreadCount) {
  const AttentionShape s{3, 11, 4, 2, 8, true, 5};
  const size_t nq = 3 * 11 * 4 * 8, nkv = 3 * 11 * 2 * 8;
  const auto q = random_normal<float>(nq, 21), k = random_normal<float>(nkv, 22), v = random_normal<float>(nkv, 23);
  const auto dout = random_normal<float>(nq, 24);
  std::vector<std::vector<float>> runs;
  const int saved = omp_get_max_threads();
  for (int threads : {1, 2, 3, 4}) {
    omp_set_num_threads(threads);
    std::vector<float> out(nq), lse(3 * 4 * 11), dq(nq), dk(nkv), dv(nkv);
    flash_attention_fwd<float>(out.data(), lse.data(), q.data(), k.data(), v.data(), s);
    flash_attention_bwd<float>(dq.data(), dk.data(), dv.data(), dout.data(), q.data(), k.data(), v.data(), out.data(),
                               lse.data(), s);
    std::vector<float> all = out;
    for (const auto* p : {&lse, &dq, &dk, &dv}) all.insert(all.end(), p->begin(), p->end());
    runs.push_back(all);
  }
  omp_set_num_threads(saved);
  for (size_t r = 1; r < runs.size(); ++r)
    EXPECT_EQ(std::memcmp(runs[r].data(), runs[0].data(), runs[0].size() * 4), 0) << "threads " << r + 1;
}

// The fused head + loss against linear_fwd → cross_entropy_fwd/bwd → linear_bwd, with a padded
// vocabulary and an ignored target; dx and dw accumulate onto what they held.
TEST(LmHeadCrossEntropyCpu, MatchesTheUnfusedComposition) {
  const int N = 9, C = 6, V = 11, Vp = 16;
  const auto x = random_normal<double>(N * C, 31), w = random_normal<double>(Vp * C, 32);
  auto targets = forge::testing::random_ids(N, V, 33);
  targets[4] = -1;
  const double dloss = 0.37;
  std::vector<double> logits(N * Vp), losses_ref(N), dx_ref = random_normal<double>(N * C, 34);
  std::vector<double> dw_ref = random_normal<double>(Vp * C, 35);
  std::vector<double> dx = dx_ref, dw = dw_ref, losses(N);
  linear_fwd<double>(logits.data(), x.data(), w.data(), nullptr, N, C, Vp, WeightLayout::kOutIn);
  cross_entropy_fwd<double>(losses_ref.data(), logits.data(), targets.data(), N, V, Vp);
  cross_entropy_bwd<double>(logits.data(), logits.data(), targets.data(), dloss, N, V, Vp);
  linear_bwd<double>(dx_ref.data(), dw_ref.data(), nullptr, logits.data(), x.data(), w.data(), N, C, Vp,
                     WeightLayout::kOutIn);
  lm_head_cross_entropy<double>(losses.data(), dx.data(), dw.data(), x.data(), w.data(), targets.data(), dloss, N, C,
                                V, Vp);
  EXPECT_TRUE(all_close(losses, losses_ref, {1e-13, 1e-12}));
  EXPECT_TRUE(all_close(dx, dx_ref, {1e-13, 1e-12}));
  EXPECT_TRUE(all_close(dw, dw_ref, {1e-13, 1e-12}));
  // Forward only: the gradients are not touched.
  std::vector<double> losses2(N);
  lm_head_cross_entropy<double>(losses2.data(), nullptr, nullptr, x.data(), w.data(), targets.data(), dloss, N, C, V,
                                Vp);
  EXPECT_EQ(losses2, losses);
}

}  // namespace
}  // namespace forge::cpu
