// The numerical guards (ops/step_guard.h, train/trainer.h): the guard's rule, the loss-spike
// detector, the fault-injection plan, and the CPU runner skipping a poisoned step — weights and
// Adam moments bit for bit as before it, and Adam's t counting only the updates taken.
#include "forge/ops/step_guard.h"

#include <cmath>
#include <limits>
#include <numeric>

#include "forge/core/error.h"
#include "forge/model/transformer.h"
#include "forge/train/fault_inject.h"
#include "forge/train/loss_outliers.h"
#include "forge/train/runner.h"
#include "testing.h"

namespace forge {
namespace {

constexpr double kNan = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

TEST(StepGuard, SkipsANonFiniteLossOrNormAndCountsIt) {
  StepGuardState s;
  const double ok[2] = {1.5, 2.5}, nan_loss[2] = {1.5, kNan}, inf_loss[2] = {-kInf, 2.0};
  step_guard_update(s, ok, 2, 4.0f, false);
  EXPECT_EQ(s.skipped, 0);
  EXPECT_EQ(s.skipped_total, 0);
  step_guard_update(s, nan_loss, 2, 4.0f, false);
  EXPECT_EQ(s.skipped, 1);
  step_guard_update(s, ok, 2, INFINITY, false);
  EXPECT_EQ(s.skipped, 1);
  step_guard_update(s, ok, 2, NAN, false);
  step_guard_update(s, inf_loss, 2, 1.0f, false);
  EXPECT_EQ(s.skipped_total, 4);
  step_guard_update(s, ok, 2, 4.0f, false);
  EXPECT_EQ(s.skipped, 0);
  EXPECT_EQ(s.skipped_total, 4);
  // f16: an overflowing Σ g² with finite losses is the loss scaler's skip, not the guard's.
  step_guard_update(s, ok, 2, INFINITY, true);
  EXPECT_EQ(s.skipped, 0);
  step_guard_update(s, nan_loss, 2, INFINITY, true);
  EXPECT_EQ(s.skipped, 1);
  EXPECT_EQ(s.skipped_total, 5);
}

// z against the previous 128 losses, computed here directly from its definition.
TEST(LossOutlierDetector, ScoresAgainstThePrevious128Losses) {
  LossOutlierDetector d;
  std::vector<double> seen;
  for (int i = 0; i < 300; ++i) {
    double loss = 3.0 - 0.001 * i + 0.05 * std::sin(0.7 * i);
    if (i == 200) loss += 2.0;  // a spike
    const double z = d.score(loss);
    if (seen.size() < LossOutlierDetector::kWindow) {
      EXPECT_TRUE(std::isnan(z)) << i;
    } else {
      const std::vector<double> w(seen.end() - 128, seen.end());
      const double mean = std::accumulate(w.begin(), w.end(), 0.0) / 128;
      double var = 0;
      for (double x : w) var += (x - mean) * (x - mean) / 128;
      EXPECT_NEAR(z, (loss - mean) / std::sqrt(var), 1e-9) << i;
      if (i == 200) {
        EXPECT_GT(z, 10.0);
      } else {
        EXPECT_LT(z, 5.0) << i;  // the default threshold: no false alarm
      }
    }
    seen.push_back(loss);
  }
  // Non-finite losses are neither scored nor kept.
  const double before = d.score(1.0);
  LossOutlierDetector twin = d;
  EXPECT_TRUE(std::isnan(d.score(kNan)));
  EXPECT_TRUE(std::isnan(d.score(kInf)));
  EXPECT_EQ(d.score(1.25), twin.score(1.25));
  EXPECT_TRUE(std::isfinite(before));
  // A constant window: z is 0, not a division by zero.
  LossOutlierDetector flat;
  for (int i = 0; i < 128; ++i) flat.score(2.0);
  EXPECT_EQ(flat.score(2.0), 0.0);
}

TEST(FaultPlan, ParsesStepsAndRanges) {
  const FaultPlan p = parse_fault_plan("nan_grad@3,nan_loss@10-12");
  EXPECT_FALSE(p.at(2));
  EXPECT_EQ(p.at(3), StepFault::kNanGrad);
  EXPECT_FALSE(p.at(4));
  for (int s = 10; s <= 12; ++s) EXPECT_EQ(p.at(s), StepFault::kNanLoss) << s;
  EXPECT_FALSE(p.at(13));
  EXPECT_TRUE(parse_fault_plan("").empty());
  // kill@STEP: one step, no range; it is no StepFault.
  const FaultPlan k = parse_fault_plan("kill@7,nan_grad@2");
  EXPECT_EQ(k.kill_at, 7);
  EXPECT_FALSE(k.at(7));
  EXPECT_EQ(k.at(2), StepFault::kNanGrad);
  EXPECT_FALSE(parse_fault_plan("kill@0").empty());
  EXPECT_EQ(parse_fault_plan("nan_grad@1").kill_at, -1);
  for (const char* bad : {"nan_grad", "nan@3", "nan_grad@", "nan_grad@x", "nan_grad@5-3",
                          "nan_grad@-1", "nan_loss@3-", "kill@", "kill@3-4", "kill@-1"}) {
    try {
      parse_fault_plan(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("fault '"), std::string::npos) << e.what();
    }
  }
}

// The CPU runner: a poisoned step changes neither the weights nor m and v, is reported skipped,
// and the next update uses t = 2 (its second update), so runner a, poisoned at step 2, ends
// exactly where runner b ends when it never ran step 2's update at all.
TEST(CpuRunnerGuard, PoisonedStepUpdatesNothingAndTCountsUpdatesTaken) {
  ModelConfig cfg = preset_config("tiny");
  cfg.vocab_size = 16;
  cfg.max_seq_len = 16;
  cfg.n_layer = 1;
  cfg.n_embd = 16;
  cfg.n_head = cfg.n_kv_head = 2;
  cfg.ffn_hidden = 32;
  Transformer<float> init(cfg);
  init.init_weights(5);
  for (const StepFault fault : {StepFault::kNanGrad, StepFault::kNanLoss}) {
    auto a = make_cpu_runner(cfg), b = make_cpu_runner(cfg);
    a->set_weights(init.weights());
    b->set_weights(init.weights());
    const int B = 2, T = 16;
    auto batch = [&](int s) {
      return std::make_pair(testing::random_ids(B * T, cfg.vocab_size, 100 + 2 * s),
                            testing::random_ids(B * T, cfg.vocab_size, 101 + 2 * s));
    };
    auto step = [&](StepRunner& r, int s, int t, bool poison) {
      const auto [x, y] = batch(s);
      r.zero_grad();
      r.micro_step(x.data(), y.data(), B, T, 1.0);
      if (poison) r.inject_fault(fault);
      AdamWParams p;
      p.lr = 1e-2f * static_cast<float>(s);  // differs per step: the skipped lr must not leak
      p.step = t;
      r.optimizer_step(p, 1.0);
      return r.take_report();
    };
    step(*a, 1, 1, false);
    step(*b, 1, 1, false);
    const std::vector<float> w = a->weights(), m = a->adam_m(), v = a->adam_v();
    const StepReport bad = step(*a, 2, 2, true);
    EXPECT_TRUE(bad.skipped);
    EXPECT_FALSE(bad.overflow);
    if (fault == StepFault::kNanGrad) {
      EXPECT_TRUE(std::isnan(bad.grad_norm));
      EXPECT_TRUE(std::isfinite(bad.micro_losses[0]));
    } else {
      EXPECT_TRUE(std::isnan(bad.micro_losses[0]));
      EXPECT_TRUE(std::isfinite(bad.grad_norm));
    }
    EXPECT_EQ(a->weights(), w);
    EXPECT_EQ(a->adam_m(), m);
    EXPECT_EQ(a->adam_v(), v);
    // Step 3 is a's second update: t = 2 although it is passed step 3.
    const StepReport ra = step(*a, 3, 3, false), rb = step(*b, 3, 2, false);
    EXPECT_FALSE(ra.skipped);
    EXPECT_EQ(ra.micro_losses, rb.micro_losses);
    EXPECT_EQ(a->weights(), b->weights());
    EXPECT_EQ(a->adam_m(), b->adam_m());
    EXPECT_EQ(a->adam_v(), b->adam_v());
    EXPECT_NE(a->weights(), w);  // and the step did update
    // A count carried from a checkpoint (set_skipped_updates) shifts t the same way.
    auto c = make_cpu_runner(cfg);
    c->set_weights(b->weights());
    c->set_adam_state(b->adam_m(), b->adam_v());
    c->set_skipped_updates(1);
    step(*c, 4, 4, false);
    step(*b, 4, 3, false);
    EXPECT_EQ(c->weights(), b->weights());
  }
}

}  // namespace
}  // namespace forge
