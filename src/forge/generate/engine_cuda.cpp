// make_cuda_engine: generation on Model<CudaBackend>.
#include <type_traits>
#include <utility>

#include "forge/backend/cuda/runtime.h"
#include "forge/core/dtype.h"
#include "forge/core/error.h"
#include "forge/generate/engine.h"
#include "forge/model/transformer_cuda.h"

namespace forge {

namespace {

class CudaEngine final : public Engine {
 public:
  CudaEngine(const ModelConfig& cfg, const std::vector<float>& weights, DType dt, int device)
      : ctx_(device), model_(cfg, ctx_, CudaModelOptions{dt, {}, AttentionPath::kAuto}), dt_(dt) {
    model_.set_weights(weights);
  }
  const ModelConfig& config() const override { return model_.config(); }
  std::string device_name() const override { return str(cuda::device_summary(), " (", dtype_name(dt_), ")"); }
  std::vector<GenResult> generate(const std::vector<GenRequest>& reqs, const GenOptions& opt,
                                  const TokenCallback& on_token, GenStats* stats) override {
    ctx_.set_pdl(opt.pdl);  // before the step graph is captured
    ctx_.set_gemm_algo(opt.gemm_algo);  // for the plans built from here on
    return generate_batch(model_, reqs, opt, on_token, stats);
  }
  std::unique_ptr<DecodeSession> open_loop(DecodeLoopOptions opt, TokenCallback on_token, DoneCallback on_done,
                                           bool pdl) override {
    ctx_.set_pdl(pdl);  // before the step graph is captured
    if (opt.capacity <= 0) opt.capacity = model_.config().max_seq_len;
    return std::make_unique<DecodeLoop<Backend>>(model_, opt, std::move(on_token), std::move(on_done));
  }

 private:
  using Backend = std::remove_reference_t<decltype(std::declval<CudaTransformer&>().backend())>;
  cuda::Context ctx_;
  CudaTransformer model_;
  DType dt_;
};

}  // namespace

std::unique_ptr<Engine> make_cuda_engine(const ModelConfig& cfg, const std::vector<float>& weights,
                                         const std::string& dtype, int device) {
  if (!cuda::available()) throw Error("--device cuda: " + cuda::device_summary());
  return std::make_unique<CudaEngine>(cfg, weights, parse_precision(dtype), device);
}

}  // namespace forge
