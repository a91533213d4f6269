// CUDA sum_squares and AdamW against the CPU twins (backend/cpu/grad_norm.cpp, adamw.cpp).
// AdamW runs on views at offset 0 and at offset 1 (the misaligned head before the float4 body)
// with n odd (the tail), with clipping active, inactive and disabled, and with no / bf16 / f16 /
// f32 working copy. f16 loss scaling: the scale update against its CPU twin, unscaling before
// clipping, a skipped (overflowed) step leaving everything untouched, and Adam's t after skips. Stochastic rounding is checked three ways: every value is one of its two bf16
// neighbours, it equals the rounding the CPU derives from forge::philox4x32_10, and the mean is
// unbiased.
#include "forge/ops/adamw.h"

#include <bit>
#include <cmath>
#include <cstring>

#include "forge/backend/cuda/ops.h"
#include "forge/core/rng.h"
#include "forge/ops/grad_norm.h"
#include "op_testing.h"

namespace forge::cuda {
namespace {

using namespace forge::cuda::testing;

class OptimizerTest : public CudaTest {
 protected:
  // adamw_update from host parameters: the factors uploaded first, as
  // CudaTransformer::optimizer_step(const AdamWParams&, ...) does.
  void adamw(float* param, float* m, float* v, const float* grad, void* work, DType work_dt,
             int64_t n, const AdamWParams& p, const float* global_sq, float max_norm,
             uint64_t sr_seed) {
    auto f = upload(std::vector<AdamWFactors>{adamw_factors(p, sr_seed)});
    adamw_update(ctx(), param, m, v, grad, work, work_dt, n, f.data(), 0, global_sq, max_norm);
  }
};

// f32 sums of squares (no cancellation) over ≤ ~2500 terms per thread chain: relative error well
// under 1e-5 against the double sum.
TEST_F(OptimizerTest, SumSquaresMatchesDoubleSumAndIsDeterministic) {
  for (int64_t n : {int64_t{1}, int64_t{1000}, int64_t{10000019}})
    for (int offset : {0, 1}) {
      if (offset >= n) continue;
      const auto g = random_normal<float>(n, 70 + n);
      const int64_t m = n - offset;  // a view starting `offset` elements in: misaligned for 1
      double ref = 0;
      for (int64_t i = offset; i < n; ++i) ref += static_cast<double>(g[i]) * g[i];
      auto dg = upload(g);
      auto out1 = poisoned<float>(1), out2 = poisoned<float>(1);
      sum_squares(ctx(), out1.data(), dg.data() + offset, m);
      sum_squares(ctx(), out2.data(), dg.data() + offset, m);
      const float got = download(out1)[0];
      EXPECT_NEAR(got, ref, 1e-5 * ref) << "n=" << m << " offset=" << offset;
      EXPECT_TRUE(bit_identical(download(out1), download(out2))) << "n=" << m;
    }
}

TEST_F(OptimizerTest, SumSquaresOfNothingIsZero) {
  auto out = poisoned<float>(1);
  sum_squares(ctx(), out.data(), nullptr, 0);
  EXPECT_EQ(download(out)[0], 0.0f);
}

struct ClipCase {
  float global_sq, max_norm;
  const char* what;
};
// Active: norm 100 > 1, scale 0.01. Inactive: norm 0.5 < 1. Disabled: max_norm 0.
const ClipCase kClipCases[] = {
    {1e4f, 1.0f, "clip active"}, {0.25f, 1.0f, "clip inactive"}, {1e4f, 0.0f, "clip disabled"}};

// Three steps of adamw_update against cpu::adamw_update with the CPU trainer's grad_scale. The
// kernel avoids FMA contraction, so it is expected to match bit for bit; kTolF32 leaves room for
// a host compiler that contracts. The working copy must be exactly the rounding of the new
// master weights (round to nearest even for bf16, sr_seed = 0).
TEST_F(OptimizerTest, AdamWThreeStepsMatchCpu) {
  const int64_t n = 100003;
  uint64_t seed = 80;
  for (const ClipCase& cc : kClipCases)
    for (int offset : {0, 1})
      for (DType work_dt :
           {DType::kF32, DType::kBF16, DType::kF16, DType::kI32 /* = no work copy */}) {
        const bool has_work = work_dt != DType::kI32;
        const size_t total = n + offset;
        auto param = random_normal<float>(total, seed++);
        std::vector<float> m(total, 0.0f), v(total, 0.0f);
        auto dparam = upload(param), dm = upload(m), dv = upload(v);
        auto dsq = upload(std::vector<float>{cc.global_sq});
        auto work32 = poisoned<float>(total);
        auto work16 = poisoned<uint16_t>(total);
        void* work = !has_work                ? nullptr
                     : work_dt == DType::kF32 ? static_cast<void*>(work32.data() + offset)
                                              : static_cast<void*>(work16.data() + offset);
        AdamWParams p;
        p.lr = 1e-3f, p.weight_decay = 0.1f, p.grad_scale = 0.5f;
        for (int step = 1; step <= 3; ++step) {
          p.step = step;
          const auto grad = random_normal<float>(total, seed++);
          auto dgrad = upload(grad);
          adamw(dparam.data() + offset, dm.data() + offset, dv.data() + offset,
                dgrad.data() + offset, work, work_dt, n, p, dsq.data(), cc.max_norm, 0);
          AdamWParams q = p;
          q.grad_scale = static_cast<float>(
              static_cast<double>(p.grad_scale) *
              clip_scale(std::sqrt(static_cast<double>(cc.global_sq)), cc.max_norm));
          cpu::adamw_update<float>(param.data() + offset, m.data() + offset, v.data() + offset,
                                   grad.data() + offset, n, q);
        }
        const std::string where = std::string(cc.what) + " offset=" + std::to_string(offset) +
                                  " work=" + (has_work ? dtype_name(work_dt) : "none");
        const auto got_param = download(dparam);
        EXPECT_TRUE(all_close(got_param, param, forge::testing::kTolF32)) << where;
        EXPECT_TRUE(all_close(download(dm), m, forge::testing::kTolF32)) << where;
        EXPECT_TRUE(all_close(download(dv), v, forge::testing::kTolF32)) << where;
        if (work_dt == DType::kF32) {
          const auto w = download(work32);
          EXPECT_TRUE(
              bit_identical(std::vector<float>(w.begin() + offset, w.end()),
                            std::vector<float>(got_param.begin() + offset, got_param.end())))
              << where;
        } else if (work_dt == DType::kBF16) {
          const auto w = download(work16);
          int64_t bad = 0;
          for (int64_t i = 0; i < n; ++i)
            bad += w[offset + i] != f32_to_bf16(got_param[offset + i]);
          EXPECT_EQ(bad, 0) << where << ": work copy is not round-to-nearest-even of param";
        } else if (work_dt == DType::kF16) {
          const auto w = download(work16);
          int64_t bad = 0;
          for (int64_t i = 0; i < n; ++i) bad += w[offset + i] != f32_to_f16(got_param[offset + i]);
          EXPECT_EQ(bad, 0) << where << ": f16 work copy is not round-to-nearest-even of param";
        }
        if (offset == 1 && has_work) {  // nothing written before the view
          if (work_dt == DType::kF32) {
            EXPECT_TRUE(std::isnan(download(work32)[0])) << where;
          } else {
            EXPECT_EQ(download(work16)[0], 0xFFFF) << where;
          }
        }
      }
}

// A bf16 work copy whose alignment does not match the master weights' (param at offset 1, work
// at offset 2) cannot use the 4-wide stores: the element-by-element kernel runs.
TEST_F(OptimizerTest, AdamWMisalignedWorkCopyMatchesCpu) {
  const int64_t n = 4099;
  auto param = random_normal<float>(n + 1, 85);
  std::vector<float> m(n + 1, 0.0f), v(n + 1, 0.0f);
  const auto grad = random_normal<float>(n + 1, 86);
  auto dparam = upload(param), dm = upload(m), dv = upload(v), dgrad = upload(grad);
  auto dsq = upload(std::vector<float>{1e4f});
  auto work = poisoned<uint16_t>(n + 2);
  AdamWParams p;
  adamw(dparam.data() + 1, dm.data() + 1, dv.data() + 1, dgrad.data() + 1, work.data() + 2,
        DType::kBF16, n, p, dsq.data(), 1.0f, 0);
  AdamWParams q = p;
  q.grad_scale = static_cast<float>(clip_scale(std::sqrt(1e4), 1.0));
  cpu::adamw_update<float>(param.data() + 1, m.data() + 1, v.data() + 1, grad.data() + 1, n, q);
  const auto got = download(dparam);
  EXPECT_TRUE(all_close(got, param, forge::testing::kTolF32));
  EXPECT_TRUE(all_close(download(dm), m, forge::testing::kTolF32));
  EXPECT_TRUE(all_close(download(dv), v, forge::testing::kTolF32));
  const auto w = download(work);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(w[2 + i], f32_to_bf16(got[1 + i])) << "i=" << i;
}

// lr = 0 leaves the master weights unchanged (decay 1, step size 0), so the working copy is the
// stochastic rounding of known values.
TEST_F(OptimizerTest, StochasticRoundingIsReproducibleAndUnbiased) {
  const int64_t n = (1 << 20) + 3;
  const uint64_t sr_seed = 0x1234567890abcdefull;
  for (int offset : {0, 1}) {
    const size_t total = n + offset;
    const auto param = random_normal<float>(total, 90 + offset);
    auto dparam = upload(param);
    auto dm = upload(std::vector<float>(total, 0.0f)), dv = upload(std::vector<float>(total, 0.0f));
    auto dgrad = upload(random_normal<float>(total, 95));
    auto work = poisoned<uint16_t>(total);
    AdamWParams p;
    p.lr = 0.0f;
    adamw(dparam.data() + offset, dm.data() + offset, dv.data() + offset, dgrad.data() + offset,
          work.data() + offset, DType::kBF16, n, p, nullptr, 0.0f, sr_seed);
    const auto w = download(work);
    ASSERT_TRUE(bit_identical(download(dparam), param)) << "lr = 0 must not move the weights";
    int64_t not_neighbour = 0, not_reproduced = 0, inexact = 0;
    double err_ulps = 0;  // Σ (rounded − x) / (bf16 step at x), over inexact elements
    for (int64_t i = 0; i < n; ++i) {
      const float x = param[offset + i];
      const uint32_t bits = std::bit_cast<uint32_t>(x);
      const uint16_t down = static_cast<uint16_t>(bits >> 16), got = w[offset + i];
      const bool exact = (bits & 0xffffu) == 0;
      if (!(got == down || (!exact && got == down + 1))) ++not_neighbour;
      // Word i of forge::Rng(sr_seed, 0): word i % 4 of Philox block i / 4.
      const uint64_t block = static_cast<uint64_t>(i) / 4;
      const PhiloxCounter r =
          philox4x32_10({static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32), 0u, 0u},
                        {static_cast<uint32_t>(sr_seed), static_cast<uint32_t>(sr_seed >> 32)});
      const uint16_t want = static_cast<uint16_t>((bits + (r[i % 4] & 0xffffu)) >> 16);
      not_reproduced += got != want;
      if (!exact) {
        ++inexact;
        const double lo = bf16_to_f32(down), hi = bf16_to_f32(static_cast<uint16_t>(down + 1));
        err_ulps += (bf16_to_f32(got) - static_cast<double>(x)) / (hi - lo);
      }
    }
    EXPECT_EQ(not_neighbour, 0) << "offset=" << offset;
    EXPECT_EQ(not_reproduced, 0) << "offset=" << offset;
    // Each term lies in (−1, 1) with mean 0 and variance ≤ 1/4, so the mean over ~1e6 elements
    // has σ ≤ 0.5/√n ≈ 5e-4; 3e-3 is 6σ. (Round to nearest would also pass this one — its
    // errors are symmetric for random x — hence the fixed-fraction test below.)
    EXPECT_LT(std::fabs(err_ulps / inexact), 3e-3) << "offset=" << offset;
  }
}

// Every element is 1 + 0.3·2^-7 (0.3 of the bf16 step above 1): round to nearest gives 1.0 for
// all of them, a bias of 0.3 steps; stochastic rounding must give 1 + 2^-7 for ~30% of them.
TEST_F(OptimizerTest, StochasticRoundingKeepsSubStepValuesOnAverage) {
  const int64_t n = 1 << 20;
  const float x = 1.0f + 0.3f * 0.0078125f;
  auto dparam = upload(std::vector<float>(n, x));
  auto dm = upload(std::vector<float>(n, 0.0f)), dv = upload(std::vector<float>(n, 0.0f));
  auto dgrad = upload(std::vector<float>(n, 0.0f));
  auto work = poisoned<uint16_t>(n);
  AdamWParams p;
  p.lr = 0.0f;
  adamw(dparam.data(), dm.data(), dv.data(), dgrad.data(), work.data(), DType::kBF16, n, p, nullptr,
        0.0f, /*sr_seed=*/7);
  const auto w = download(work);
  double sum = 0;
  for (uint16_t b : w) sum += bf16_to_f32(b);
  const double frac = static_cast<double>(std::bit_cast<uint32_t>(x) & 0xffffu) / 65536.0;
  // Bernoulli(frac) steps of 2^-7: σ(mean) = 2^-7·sqrt(frac(1−frac)/n) ≈ 3.5e-6; bound 6σ.
  const double sigma = 0.0078125 * std::sqrt(frac * (1 - frac) / n);
  EXPECT_NEAR(sum / n, static_cast<double>(x), 6 * sigma);
}

// ---- f16 loss scaling -------------------------------------------------------------------------

bool same_state(const LossScaleState& a, const LossScaleState& b) {
  return std::memcmp(&a, &b, sizeof(a)) == 0;
}

// loss_scale_step on the GPU against loss_scale_update on the host, over overflows (inf, NaN)
// and runs of finite steps long enough to grow (growth interval 3), field for field.
TEST_F(OptimizerTest, LossScaleStepMatchesCpuTwin) {
  LossScaleState want = loss_scale_init({/*init_scale=*/1024.0f, /*growth_interval=*/3});
  auto dstate = upload(std::vector<LossScaleState>{want});
  const float inf = INFINITY, nan = NAN;
  const float sums[] = {1.0f, inf, 2.0f, 3.0f, 4.0f, 5.0f, nan, 0.0f, 1e30f, 7.0f, 8.0f, inf};
  for (float sq : sums) {
    auto dsq = upload(std::vector<float>{sq});
    loss_scale_step(ctx(), dstate.data(), dsq.data());
    loss_scale_update(want, sq);
    const LossScaleState got = download(dstate)[0];
    ASSERT_TRUE(same_state(got, want)) << "after sq=" << sq << ": scale " << got.scale << " vs "
                                       << want.scale << ", good " << got.good_steps << " vs "
                                       << want.good_steps;
  }
  // 1024 → (inf) 512 → 3 finite: 1024 → (nan) 512 → 3 finite: 1024 → (inf) 512.
  EXPECT_EQ(want.scale, 512.0f);
  EXPECT_EQ(want.skipped_total, 3);
  EXPECT_EQ(want.skipped, 1);
  EXPECT_EQ(want.step_scale, 1024.0f);
  // dloss · scale, read from the device state.
  auto dl = upload(std::vector<float>{0.25f});
  auto out = poisoned<float>(1);
  loss_scale_dloss(ctx(), out.data(), dl.data(), dstate.data());
  EXPECT_EQ(download(out)[0], 128.0f);
}

// Gradients carrying a loss scale S = 2^10 (and Σ g² = S²·Σ g_true²): AdamW must unscale before
// clipping, i.e. equal the CPU update of the true gradients clipped by the true norm. S is a
// power of two, so the unscaled update is the unscaled one bit for bit; kTolF32 as above.
TEST_F(OptimizerTest, AdamWUnscalesBeforeClipping) {
  const int64_t n = 10001;
  const float S = 1024.0f;
  for (const ClipCase& cc : kClipCases) {
    auto param = random_normal<float>(n, 300);
    std::vector<float> m(n, 0.0f), v(n, 0.0f);
    const auto grad = random_normal<float>(n, 301);
    std::vector<float> scaled(grad);
    for (float& g : scaled) g *= S;
    auto dparam = upload(param), dm = upload(m), dv = upload(v), dgrad = upload(scaled);
    auto dsq = upload(std::vector<float>{cc.global_sq * S * S});
    auto work = poisoned<uint16_t>(n);
    LossScaleState st = loss_scale_init({S, 2000});
    auto dstate = upload(std::vector<LossScaleState>{st});
    AdamWParams p;
    p.lr = 1e-3f, p.grad_scale = 0.5f, p.step = 1;
    auto f = upload(std::vector<AdamWFactors>{adamw_factors(p)});
    adamw_update(ctx(), dparam.data(), dm.data(), dv.data(), dgrad.data(), work.data(), DType::kF16,
                 n, f.data(), 0, dsq.data(), cc.max_norm, dstate.data());
    AdamWParams q = p;
    q.grad_scale = static_cast<float>(
        static_cast<double>(p.grad_scale) *
        clip_scale(std::sqrt(static_cast<double>(cc.global_sq)), cc.max_norm));
    cpu::adamw_update<float>(param.data(), m.data(), v.data(), grad.data(), n, q);
    const auto got = download(dparam);
    EXPECT_TRUE(all_close(got, param, forge::testing::kTolF32)) << cc.what;
    EXPECT_TRUE(all_close(download(dm), m, forge::testing::kTolF32)) << cc.what;
    EXPECT_TRUE(all_close(download(dv), v, forge::testing::kTolF32)) << cc.what;
    const auto w = download(work);
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(w[i], f32_to_f16(got[i])) << cc.what << " i=" << i;
  }
}

// Σ g² = inf or NaN with a loss scale: the step is skipped, param, m, v and the working copy
// keep every bit (at offsets 0 and 1: the vector body and the scalar head and tail).
TEST_F(OptimizerTest, AdamWOverflowLeavesEverythingUntouched) {
  const int64_t n = 4099;
  for (float sq : {INFINITY, NAN})
    for (int offset : {0, 1}) {
      const auto param = random_normal<float>(n, 310), m = random_normal<float>(n, 311);
      std::vector<float> v = random_normal<float>(n, 312);
      for (float& x : v) x = x * x;
      auto dparam = upload(param), dm = upload(m), dv = upload(v);
      auto dgrad = upload(random_normal<float>(n, 313));
      std::vector<uint16_t> w16(n);
      for (int64_t i = 0; i < n; ++i) w16[i] = f32_to_f16(param[i]);
      auto work = upload(w16);
      auto dsq = upload(std::vector<float>{sq});
      auto dstate = upload(std::vector<LossScaleState>{loss_scale_init({})});
      AdamWParams p;
      auto f = upload(std::vector<AdamWFactors>{adamw_factors(p)});
      const int64_t k = n - offset;
      adamw_update(ctx(), dparam.data() + offset, dm.data() + offset, dv.data() + offset,
                   dgrad.data() + offset, work.data() + offset, DType::kF16, k, f.data(), 0,
                   dsq.data(), 1.0f, dstate.data());
      EXPECT_TRUE(bit_identical(download(dparam), param)) << "sq=" << sq << " offset=" << offset;
      EXPECT_TRUE(bit_identical(download(dm), m)) << "sq=" << sq;
      EXPECT_TRUE(bit_identical(download(dv), v)) << "sq=" << sq;
      EXPECT_TRUE(bit_identical(download(work), w16)) << "sq=" << sq;
    }
}

// After k skipped steps Adam's t is the step count minus k (PyTorch's GradScaler skips
// optimizer.step()): factors for t = 5 with skipped_total = 2 must update as t = 3 does on the CPU.
TEST_F(OptimizerTest, AdamWAfterSkippedStepsUsesTakenStepCount) {
  const int64_t n = 5003;
  auto param = random_normal<float>(n, 320);
  auto m = random_normal<float>(n, 321);
  std::vector<float> v = random_normal<float>(n, 322);
  for (float& x : v) x = x * x;
  const auto grad = random_normal<float>(n, 323);
  auto dparam = upload(param), dm = upload(m), dv = upload(v), dgrad = upload(grad);
  auto dsq = upload(std::vector<float>{1.0f});
  LossScaleState st = loss_scale_init({1.0f, 2000});
  st.skipped_total = 2;
  auto dstate = upload(std::vector<LossScaleState>{st});
  AdamWParams p;
  p.lr = 1e-3f, p.step = 5;
  auto f = upload(std::vector<AdamWFactors>{adamw_factors(p)});
  adamw_update(ctx(), dparam.data(), dm.data(), dv.data(), dgrad.data(), nullptr, DType::kF32, n,
               f.data(), 0, dsq.data(), 0.0f, dstate.data());
  AdamWParams q = p;
  q.step = 3;
  cpu::adamw_update<float>(param.data(), m.data(), v.data(), grad.data(), n, q);
  EXPECT_TRUE(all_close(download(dparam), param, forge::testing::kTolF32));
  EXPECT_TRUE(all_close(download(dm), m, forge::testing::kTolF32));
  EXPECT_TRUE(all_close(download(dv), v, forge::testing::kTolF32));
}

}  // namespace
}  // namespace forge::cuda
