// A training backend as the trainer sees it: one model with its gradients and optimizer state,
// on the CPU (the reference) or a GPU. The trainer loop, metrics, evaluation and checkpoints are
// written once against this interface.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "forge/core/dtype.h"
#include "forge/model/config.h"
#include "forge/model/params.h"
#include "forge/ops/adamw.h"

namespace forge {

class StepRunner {
 public:
  virtual ~StepRunner() = default;
  virtual const ParamTable& table() const = 0;
  virtual std::string describe() const = 0;  // "cpu fp32", "cuda bf16 on NVIDIA H200 ..."

  virtual void zero_grad() = 0;
  // Forward + backward of one micro-batch (host tokens and targets, (B, T)); gradients of
  // scale · (mean loss) accumulate. Returns the micro-batch's mean loss.
  virtual double micro_step(const int32_t* x, const int32_t* y, int B, int T_, double scale) = 0;
  // Mean loss without gradients.
  virtual double eval_loss(const int32_t* x, const int32_t* y, int B, int T_) = 0;
  // Global-norm clipping to max_norm (<= 0: none) and AdamW with p (p.weight_decay applies to
  // >= 2-D tensors only; p.step is t). Returns the gradient norm before clipping.
  virtual double optimizer_step(const cpu::AdamWParams& p, double max_norm) = 0;

  // Host copies for checkpoints and export (f32, the parameter table's layout).
  virtual std::vector<float> weights() = 0;
  virtual void set_weights(const std::vector<float>& w) = 0;
  virtual std::vector<float> adam_m() = 0;
  virtual std::vector<float> adam_v() = 0;
  virtual void set_adam_state(const std::vector<float>& m, const std::vector<float>& v) = 0;
};

std::unique_ptr<StepRunner> make_cpu_runner(const ModelConfig& cfg);
// precision: "fp32" or "bf16". Throws forge::Error when Forge was built without CUDA, there is
// no GPU, or the precision is not supported.
std::unique_ptr<StepRunner> make_cuda_runner(const ModelConfig& cfg, const std::string& precision);

}  // namespace forge
