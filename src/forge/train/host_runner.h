// The host side of the CPU runner (runner_cpu.cpp, full or LoRA): every call finishes its work
// before it returns, so a step's report is complete when optimizer_step() ends (report_lag() 0);
// the numerical guard's state (ops/step_guard.h) decides each step, and Adam's t counts the
// updates taken.
#pragma once

#include <climits>
#include <cmath>
#include <deque>
#include <utility>

#include "forge/core/error.h"
#include "forge/ops/grad_norm.h"
#include "forge/ops/step_guard.h"
#include "forge/train/runner.h"

namespace forge {

class HostStepRunner : public StepRunner {
 public:
  void set_skipped_updates(int64_t n) override {
    FORGE_CHECK(n >= 0 && n <= INT32_MAX, "set_skipped_updates(", n, ")");
    guard_.skipped_total = static_cast<int32_t>(n);
  }
  int report_lag() const override { return 0; }
  StepReport take_report() override {
    FORGE_CHECK(!ended_.empty(), "take_report: no ended step to report");
    StepReport r = std::move(ended_.front());
    ended_.pop_front();
    return r;
  }

 protected:
  // The guard's decision for the step in progress, from its micro-batch losses and the global
  // gradient norm (Σ g² rounded to f32, as the GPU's is: a norm above ~1.8e19 counts as not
  // finite on both). True: the update goes ahead.
  bool guard_allows_update(double norm) {
    step_guard_update(guard_, report_.micro_losses.data(), static_cast<int>(report_.micro_losses.size()),
                      static_cast<float>(norm * norm), /*loss_scaled=*/false);
    return !guard_.skipped;
  }
  // AdamW's settings for the update: t = the step minus the updates skipped so far, clipping to
  // max_norm folded into grad_scale (weight_decay is set per tensor by the caller).
  AdamWParams update_params(const AdamWParams& p, double norm, double max_norm) const {
    AdamWParams q = p;
    q.step = p.step - guard_.skipped_total;
    q.grad_scale = static_cast<float>(p.grad_scale * clip_scale(norm, max_norm));
    return q;
  }
  // Queues the step's report (skipped or not, with its norm) and starts the next one.
  void end_step(double norm) {
    report_.skipped = guard_.skipped != 0;
    report_.grad_norm = norm;
    ended_.push_back(std::move(report_));
    report_ = {};
  }
  // inject_fault(kNanLoss)'s part: the first micro-batch's loss becomes NaN.
  void poison_first_loss() {
    if (!report_.micro_losses.empty()) report_.micro_losses[0] = NAN;
  }

  StepGuardState guard_;
  StepReport report_;             // of the step in progress
  std::deque<StepReport> ended_;  // ended steps not yet reported
};

}  // namespace forge
