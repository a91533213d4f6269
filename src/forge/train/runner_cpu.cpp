// The CPU StepRunner: Transformer<float>, f32 AdamW state in host vectors.
#include <memory>

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

  double micro_step(const int32_t* x, const int32_t* y, int B, int T_, double scale) override {
    const double loss = model_.forward(x, y, B, T_);
    model_.backward(scale);
    return loss;
  }

  double eval_loss(const int32_t* x, const int32_t* y, int B, int T_) override {
    return model_.forward(x, y, B, T_);
  }

  double optimizer_step(const cpu::AdamWParams& p, double max_norm) override {
    const double norm = cpu::global_norm(model_.grads().data(), model_.num_params());
    cpu::AdamWParams q = p;
    q.grad_scale = static_cast<float>(p.grad_scale * cpu::clip_scale(norm, max_norm));
    for (const auto& info : model_.table().params()) {
      q.weight_decay = info.decay ? p.weight_decay : 0.0f;
      cpu::adamw_update(model_.weights().data() + info.offset, m_.data() + info.offset, v_.data() + info.offset,
                        model_.grads().data() + info.offset, info.numel(), q);
    }
    return norm;
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
};

}  // namespace

std::unique_ptr<StepRunner> make_cpu_runner(const ModelConfig& cfg) { return std::make_unique<CpuRunner>(cfg); }

}  // namespace forge
