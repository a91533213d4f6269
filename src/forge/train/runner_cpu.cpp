// The CPU StepRunner: Transformer<float> (the one model on the CPU backend), f32 AdamW state in
// host vectors; and parse_attention_path, which every build has.
#include <climits>
#include <cmath>
#include <deque>
#include <memory>

#include "forge/core/error.h"
#include "forge/model/transformer.h"
#include "forge/ops/grad_norm.h"
#include "forge/train/runner.h"

namespace forge {

namespace {

class CpuRunner final : public StepRunner {
 public:
  explicit CpuRunner(const ModelConfig& cfg)
      : model_(cfg), m_(model_.num_params(), 0.0f), v_(model_.num_params(), 0.0f) {}

  const ParamTable& table() const override { return model_.table(); }
  std::string describe() const override { return "cpu fp32"; }
  void zero_grad() override { model_.zero_grad(); }

  // Every call finishes its work before it returns: the report is ready at once.
  void micro_step(const int32_t* x, const int32_t* y, int B, int T_, double scale) override {
    report_.micro_losses.push_back(model_.loss_and_grad(x, y, B, T_, scale));
  }

  double eval_loss(const int32_t* x, const int32_t* y, int B, int T_) override {
    return model_.loss(x, y, B, T_);
  }

  // The guard (ops/step_guard.h) sees Σ g² rounded to f32, as the GPU's is: a norm above
  // ~1.8e19 counts as not finite on both.
  void optimizer_step(const AdamWParams& p, double max_norm) override {
    const double norm = cpu::global_norm(model_.grads().data(), model_.num_params());
    step_guard_update(guard_, report_.micro_losses.data(),
                      static_cast<int>(report_.micro_losses.size()),
                      static_cast<float>(norm * norm),
                      /*loss_scaled=*/false);
    if (!guard_.skipped) {
      AdamWParams q = p;
      q.step = p.step - guard_.skipped_total;  // Adam's t counts the updates taken
      q.grad_scale = static_cast<float>(p.grad_scale * clip_scale(norm, max_norm));
      for (const auto& info : model_.table().params()) {
        q.weight_decay = info.decay ? p.weight_decay : 0.0f;
        cpu::adamw_update(model_.weights().data() + info.offset, m_.data() + info.offset,
                          v_.data() + info.offset, model_.grads().data() + info.offset,
                          info.numel(), q);
      }
    }
    report_.skipped = guard_.skipped != 0;
    report_.grad_norm = norm;
    ended_.push_back(std::move(report_));
    report_ = {};
  }

  void set_skipped_updates(int64_t n) override {
    FORGE_CHECK(n >= 0 && n <= INT32_MAX, "set_skipped_updates(", n, ")");
    guard_.skipped_total = static_cast<int32_t>(n);
  }
  void inject_fault(StepFault f) override {
    if (f == StepFault::kNanGrad) model_.grads()[0] = NAN;
    if (f == StepFault::kNanLoss && !report_.micro_losses.empty()) report_.micro_losses[0] = NAN;
  }

  int report_lag() const override { return 0; }
  StepReport take_report() override {
    FORGE_CHECK(!ended_.empty(), "take_report: no ended step to report");
    StepReport r = std::move(ended_.front());
    ended_.pop_front();
    return r;
  }

  std::vector<float> weights() override { return model_.weights(); }
  void set_weights(const std::vector<float>& w) override { model_.weights() = w; }
  std::vector<float> adam_m() override { return m_; }
  std::vector<float> adam_v() override { return v_; }
  void set_adam_state(const std::vector<float>& m, const std::vector<float>& v) override {
    m_ = m;
    v_ = v;
  }

 private:
  Transformer<float> model_;
  std::vector<float> m_, v_;
  StepGuardState guard_;
  StepReport report_;             // of the step in progress
  std::deque<StepReport> ended_;  // ended steps not yet reported
};

}  // namespace

std::unique_ptr<StepRunner> make_cpu_runner(const ModelConfig& cfg) { return std::make_unique<CpuRunner>(cfg); }

AttentionPath parse_attention_path(const std::string& name) {
  if (name == "auto" || name == "flash") return AttentionPath::kAuto;
  if (name == "unfused") return AttentionPath::kUnfused;
  if (name == "flash-mma") return AttentionPath::kFlashMma;
  if (name == "flash-wgmma") return AttentionPath::kFlashWgmma;
  throw Error(str("attention path '", name, "' (expected auto, flash, unfused, flash-mma or flash-wgmma)"));
}

}  // namespace forge
