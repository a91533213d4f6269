// The LoRA StepRunner (runner.h): a Transformer<float> with adapters on a frozen base
// (model/lora.h). Gradients, the global norm, clipping, Adam's m and v and the update cover the
// adapter buffer alone; weights() and set_weights() are the adapters (the base never changes).
// One process, CPU: the GPU runner and data parallelism do not train adapters (yet).
#include <cmath>
#include <memory>

#include "forge/core/error.h"
#include "forge/model/transformer.h"
#include "forge/ops/grad_norm.h"
#include "forge/train/host_runner.h"

namespace forge {

namespace {

class LoraCpuRunner final : public HostStepRunner {
 public:
  explicit LoraCpuRunner(const Transformer<float>& model) : model_(model.config()) {
    const AdapterTable* at = model.adapter_table();
    FORGE_CHECK(at != nullptr, "make_lora_cpu_runner: the model has no adapters");
    model_.weights() = model.weights();
    model_.attach_lora(at->lora(), 0);
    model_.adapter_weights() = model.adapter_weights();
    m_.assign(at->total(), 0.0f);
    v_.assign(at->total(), 0.0f);
  }

  const ParamTable& table() const override { return model_.table(); }
  std::string describe() const override {
    const LoraConfig& l = model_.adapter_table()->lora();
    return str("cpu fp32, lora r=", l.r, " alpha=", l.alpha, " (", model_.adapter_table()->total(),
               " trainable parameters)");
  }
  void zero_grad() override { model_.zero_grad(); }
  void set_recompute(Recompute r) override { model_.set_recompute(r); }
  void micro_step(const int32_t* x, const int32_t* y, int B, int T_, double scale) override {
    report_.micro_losses.push_back(model_.loss_and_grad(x, y, B, T_, scale, layout_));
  }
  void set_token_layout(const int32_t* pos, const int32_t* seg) override { layout_ = {pos, seg}; }
  double eval_loss(const int32_t* x, const int32_t* y, int B, int T_) override { return model_.loss(x, y, B, T_); }

  void optimizer_step(const AdamWParams& p, double max_norm) override {
    const std::vector<float>& g = model_.adapter_grads();
    const double norm = std::sqrt(cpu::sum_squares(g.data(), static_cast<int64_t>(g.size())));
    if (guard_allows_update(norm)) {
      AdamWParams q = update_params(p, norm, max_norm);
      for (const auto& info : model_.adapter_table()->params()) {
        q.weight_decay = info.decay ? p.weight_decay : 0.0f;
        cpu::adamw_update(model_.adapter_weights().data() + info.offset, m_.data() + info.offset,
                          v_.data() + info.offset, g.data() + info.offset, info.numel(), q);
      }
    }
    end_step(norm);
  }

  void inject_fault(StepFault f) override {
    if (f == StepFault::kNanGrad) model_.adapter_grads()[0] = NAN;
    if (f == StepFault::kNanLoss) poison_first_loss();
  }

  std::vector<float> weights() override { return model_.adapter_weights(); }
  void set_weights(const std::vector<float>& w) override {
    FORGE_CHECK(w.size() == model_.adapter_weights().size(), "set_weights: ", w.size(), " adapter values for ",
                model_.adapter_weights().size());
    model_.adapter_weights() = w;
  }
  std::vector<float> adam_m() override { return m_; }
  std::vector<float> adam_v() override { return v_; }
  void set_adam_state(const std::vector<float>& m, const std::vector<float>& v) override {
    FORGE_CHECK(m.size() == m_.size() && v.size() == v_.size(), "set_adam_state: ", m.size(), " and ", v.size(),
                " values for ", m_.size(), " adapter parameters");
    m_ = m;
    v_ = v;
  }

 private:
  Transformer<float> model_;
  TokenLayout layout_;  // of the micro-batches (set_token_layout)
  std::vector<float> m_, v_;  // Adam state of the adapters only
};

}  // namespace

std::unique_ptr<StepRunner> make_lora_cpu_runner(const Transformer<float>& model) {
  return std::make_unique<LoraCpuRunner>(model);
}

}  // namespace forge
