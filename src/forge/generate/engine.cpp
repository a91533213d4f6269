#include "forge/generate/engine.h"

#include <type_traits>
#include <utility>

#include "forge/backend/cuda/runtime.h"
#include "forge/core/error.h"
#include "forge/model/transformer.h"

namespace forge {

namespace {

class CpuEngine final : public Engine {
 public:
  CpuEngine(const ModelConfig& cfg, const std::vector<float>& weights) : model_(cfg, GradBuffers::kNone) {
    model_.set_weights(weights);
  }
  explicit CpuEngine(Transformer<float>&& model) : model_(std::move(model)) {}
  const ModelConfig& config() const override { return model_.config(); }
  std::string device_name() const override { return "cpu (f32)"; }
  std::vector<GenResult> generate(const std::vector<GenRequest>& reqs, const GenOptions& opt,
                                  const TokenCallback& on_token, GenStats* stats) override {
    return generate_batch(model_, reqs, opt, on_token, stats);
  }
  std::unique_ptr<DecodeSession> open_loop(DecodeLoopOptions opt, TokenCallback on_token, DoneCallback on_done,
                                           bool) override {
    if (opt.capacity <= 0) opt.capacity = model_.config().max_seq_len;
    return std::make_unique<DecodeLoop<Backend>>(model_, opt, std::move(on_token), std::move(on_done));
  }

 private:
  using Backend = std::remove_reference_t<decltype(std::declval<Transformer<float>&>().backend())>;
  Transformer<float> model_;
};

}  // namespace

std::unique_ptr<Engine> make_cpu_engine(const ModelConfig& cfg, const std::vector<float>& weights) {
  return std::make_unique<CpuEngine>(cfg, weights);
}

std::unique_ptr<Engine> make_cpu_engine(Transformer<float>&& model) {
  return std::make_unique<CpuEngine>(std::move(model));
}

std::unique_ptr<Engine> make_engine(Transformer<float>&& model, Device device, const std::string& dtype) {
  if (device == Device::kCpu) return make_cpu_engine(std::move(model));
  const Transformer<float> host = std::move(model);  // freed on return, once the GPU has its copy
  return make_cuda_engine(host.config(), host.weights(), dtype);
}

#ifndef FORGE_HAVE_CUDA
std::unique_ptr<Engine> make_cuda_engine(const ModelConfig&, const std::vector<float>&, const std::string&, int) {
  throw Error("--device cuda: " + cuda::device_summary());
}
#endif

}  // namespace forge
