// The CUDA StepRunner: CudaTransformer on one GPU. Each micro-step uploads its (B, T) tokens
// and reads the per-position losses back (one sync per micro-batch); the loss one step late
// and CUDA-graph replay come with the performance work.
#include <cuda_runtime.h>

#include <cmath>
#include <memory>

#include "forge/backend/cuda/check.h"
#include "forge/backend/cuda/context.h"
#include "forge/backend/cuda/runtime.h"
#include "forge/core/error.h"
#include "forge/model/transformer_cuda.h"
#include "forge/train/runner.h"

namespace forge {

namespace {

class CudaRunner final : public StepRunner {
 public:
  CudaRunner(const ModelConfig& cfg, DType dt) : ctx_(0), model_(ctx_, cfg, dt), dloss_(ctx_.allocator(), 1) {}

  const ParamTable& table() const override { return model_.table(); }
  std::string describe() const override {
    return str("cuda ", model_.dtype() == DType::kF32 ? "fp32" : "bf16", " on ", cuda::device_summary());
  }
  void zero_grad() override { model_.zero_grad(); }

  double micro_step(const int32_t* x, const int32_t* y, int B, int T_, double scale) override {
    const size_t n = upload(x, y, B, T_);
    int64_t count = 0;
    for (size_t i = 0; i < n; ++i) count += y[i] >= 0;
    const float dl = count > 0 ? static_cast<float>(scale / static_cast<double>(count)) : 0.0f;
    FORGE_CUDA_CHECK(cudaMemcpyAsync(dloss_.data(), &dl, 4, cudaMemcpyHostToDevice, ctx_.stream()));
    model_.forward(x_.data(), y_.data(), dloss_.data(), B, T_);
    model_.backward();
    return mean_loss(n, count);
  }

  double eval_loss(const int32_t* x, const int32_t* y, int B, int T_) override {
    const size_t n = upload(x, y, B, T_);
    int64_t count = 0;
    for (size_t i = 0; i < n; ++i) count += y[i] >= 0;
    model_.forward(x_.data(), y_.data(), nullptr, B, T_);
    return mean_loss(n, count);
  }

  double optimizer_step(const cpu::AdamWParams& p, double max_norm) override {
    // The bf16 working copy is the master rounded to nearest (sr_seed 0), a pure function of
    // the f32 master: a checkpoint (which stores the master) then restores it exactly, and a
    // resumed run is bit-identical. Stochastic rounding (llm.c's choice when it has no f32
    // master) would make the copy depend on the step's random key; with a master it buys
    // nothing, since sub-ulp updates accumulate in f32. Measured on the H200: with stochastic
    // rounding a SIGKILL + resume diverged in the last bits; with round-to-nearest it does not.
    model_.optimizer_step(p, static_cast<float>(max_norm), /*sr_seed=*/0);
    float sq = 0;
    FORGE_CUDA_CHECK(cudaMemcpyAsync(&sq, model_.grad_norm_sq(), 4, cudaMemcpyDeviceToHost, ctx_.stream()));
    ctx_.synchronize();
    return std::sqrt(static_cast<double>(sq));
  }

  std::vector<float> weights() override { return model_.weights_host(); }
  void set_weights(const std::vector<float>& w) override { model_.set_weights(w); }
  std::vector<float> adam_m() override { return model_.adam_m_host(); }
  std::vector<float> adam_v() override { return model_.adam_v_host(); }
  void set_adam_state(const std::vector<float>& m, const std::vector<float>& v) override {
    model_.set_adam_state(m, v);
  }

 private:
  size_t upload(const int32_t* x, const int32_t* y, int B, int T_) {
    const size_t n = static_cast<size_t>(B) * T_;
    if (x_.size() < n) {
      x_ = cuda::DeviceBuffer<int32_t>(ctx_.allocator(), n);
      y_ = cuda::DeviceBuffer<int32_t>(ctx_.allocator(), n);
    }
    const int V = model_.config().vocab_size;
    for (size_t i = 0; i < n; ++i) {
      if (x[i] < 0 || x[i] >= V) throw Error(str("token id ", x[i], " at position ", i, " is out of range [0, ", V, ")"));
      if (y[i] < -1 || y[i] >= V) throw Error(str("target id ", y[i], " at position ", i, " is out of range [0, ", V, ")"));
    }
    FORGE_CUDA_CHECK(cudaMemcpyAsync(x_.data(), x, n * 4, cudaMemcpyHostToDevice, ctx_.stream()));
    FORGE_CUDA_CHECK(cudaMemcpyAsync(y_.data(), y, n * 4, cudaMemcpyHostToDevice, ctx_.stream()));
    return n;
  }

  double mean_loss(size_t n, int64_t count) {
    losses_.resize(n);
    FORGE_CUDA_CHECK(cudaMemcpyAsync(losses_.data(), model_.losses(), n * 4, cudaMemcpyDeviceToHost, ctx_.stream()));
    ctx_.synchronize();
    double sum = 0;
    for (float l : losses_) sum += l;
    return count > 0 ? sum / static_cast<double>(count) : 0.0;
  }

  cuda::Context ctx_;
  CudaTransformer model_;
  cuda::DeviceBuffer<float> dloss_;
  cuda::DeviceBuffer<int32_t> x_, y_;
  std::vector<float> losses_;
};

}  // namespace

std::unique_ptr<StepRunner> make_cuda_runner(const ModelConfig& cfg, const std::string& precision) {
  if (!cuda::available()) throw Error("--device cuda: " + cuda::device_summary());
  if (precision == "fp16") throw Error("--precision fp16 is not supported yet on CUDA (use bf16 or fp32)");
  if (precision != "fp32" && precision != "bf16")
    throw Error(str("unknown precision '", precision, "' (expected fp32, bf16 or fp16)"));
  return std::make_unique<CudaRunner>(cfg, precision == "fp32" ? DType::kF32 : DType::kBF16);
}

}  // namespace forge
