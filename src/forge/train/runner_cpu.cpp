// The CPU StepRunner: Transformer<float> (the one model on the CPU backend), f32 AdamW state in
// host vectors; and parse_attention_path, which every build has.
//
// What it trains is a flat buffer: the model's weights, or with LoRA (make_lora_cpu_runner; a
// model with adapters, model/lora.h) the adapter buffer alone, the base frozen. Gradients, the
// global norm, clipping, the guard, Adam's m and v and the update then cover the adapters only;
// weights() and set_weights() are the adapters (the base never changes). Everything below is
// the same for both.
//
// Data parallel (ZeRO-1, with a communicator of W >= 2 ranks): every rank holds the whole model
// and its gradients; the flat gradient buffer is copied into a zero-padded one
// (dist/communicator.h's layout), reduce-scattered and divided by W (exact for W a power of
// two), so rank r holds the mean gradient of its shard [r·s, (r+1)·s). Σ g² of the shards and
// the micro-batch losses are summed over ranks in rank order (allgather_sum_in_rank_order), so
// every rank computes the same norm, clipping factor and guard decision bit for bit. AdamW
// updates this rank's shard of the weights with m and v of that shard only (the optimizer state
// is 1/W of a single rank's), and an all-gather brings every rank the whole updated weights.
// The copies into padded buffers cost one more flat buffer of host memory and a memcpy per step;
// no bucketing, no overlap with the backward (the GPU runner is where that pays).
#include <algorithm>
#include <cmath>
#include <memory>

#include "forge/core/error.h"
#include "forge/dist/communicator.h"
#include "forge/model/transformer.h"
#include "forge/ops/grad_norm.h"
#include "forge/train/host_runner.h"

namespace forge {

namespace {

class CpuRunner final : public HostStepRunner {
 public:
  CpuRunner(const ModelConfig& cfg, Communicator* comm) : model_(cfg) { init(comm); }
  // LoRA: `lora` (a model with adapters) copied; its adapters train, its base is frozen.
  CpuRunner(const Transformer<float>& lora, Communicator* comm) : model_(lora.config()) {
    const AdapterTable* at = lora.adapter_table();
    FORGE_CHECK(at != nullptr, "make_lora_cpu_runner: the model has no adapters");
    model_.weights() = lora.weights();
    model_.attach_lora(at->lora(), 0);
    model_.adapter_weights() = lora.adapter_weights();
    init(comm);
  }

  const ParamTable& table() const override { return model_.table(); }
  std::string describe() const override {
    std::string s = "cpu fp32";
    if (const AdapterTable* at = model_.adapter_table())
      s += str(", lora r=", at->lora().r, " alpha=", at->lora().alpha, " (", at->total(), " trainable parameters)");
    return comm_ ? s + ", zero-1 over " + comm_->describe() : s;
  }
  void zero_grad() override { model_.zero_grad(); }
  void set_recompute(Recompute r) override { model_.set_recompute(r); }

  // Every call finishes its work before it returns: the report is ready at once.
  void micro_step(const int32_t* x, const int32_t* y, int B, int T_, double scale) override {
    report_.micro_losses.push_back(model_.loss_and_grad(x, y, B, T_, scale, layout_));
  }
  void set_token_layout(const int32_t* pos, const int32_t* seg) override { layout_ = {pos, seg}; }

  double eval_loss(const int32_t* x, const int32_t* y, int B, int T_) override {
    return model_.loss(x, y, B, T_);
  }

  void optimizer_step(const AdamWParams& p, double max_norm) override {
    const float* grad = grads().data();  // indexed by flat offset − grad_base
    size_t grad_base = 0;
    double sum_sq = 0;
    if (comm_) {
      reduce_gradients();
      grad = shard_buf_.data();
      grad_base = begin_;
      sum_sq = reduce_metrics(cpu::sum_squares(shard_buf_.data(), end_ - begin_));
    } else {
      sum_sq = cpu::sum_squares(grad, static_cast<int64_t>(n_));
    }
    const double norm = std::sqrt(sum_sq);
    if (guard_allows_update(norm)) {
      AdamWParams q = update_params(p, norm, max_norm);
      for (const auto& info : params()) {
        // This rank's part of the tensor: all of it without a communicator.
        const size_t lo = std::max<size_t>(info.offset, begin_);
        const size_t hi = std::min<size_t>(info.offset + info.numel(), end_);
        if (lo >= hi) continue;
        q.weight_decay = info.decay ? p.weight_decay : 0.0f;
        cpu::adamw_update(trained().data() + lo, m_.data() + (lo - begin_),
                          v_.data() + (lo - begin_), grad + (lo - grad_base),
                          static_cast<int64_t>(hi - lo), q);
      }
      if (comm_) gather_weights();
    }
    end_step(norm);
  }

  void inject_fault(StepFault f) override {
    if (f == StepFault::kNanGrad) grads()[0] = NAN;
    if (f == StepFault::kNanLoss) poison_first_loss();
  }

  std::vector<float> weights() override { return trained(); }
  void set_weights(const std::vector<float>& w) override {
    FORGE_CHECK(w.size() == n_, "set_weights: ", w.size(), " values for ", n_, " trained parameters");
    trained() = w;
  }
  std::vector<float> adam_m() override { return comm_ ? gather_shards(m_) : m_; }
  std::vector<float> adam_v() override { return comm_ ? gather_shards(v_) : v_; }
  void set_adam_state(const std::vector<float>& m, const std::vector<float>& v) override {
    FORGE_CHECK(m.size() == n_ && v.size() == n_, "set_adam_state: ", m.size(), " and ", v.size(),
                " values for ", n_, " trained parameters");
    m_.assign(m.begin() + begin_, m.begin() + end_);
    v_.assign(v.begin() + begin_, v.begin() + end_);
  }

 private:
  // The shard of the trained buffer this rank updates (all of it without a communicator).
  void init(Communicator* comm) {
    comm_ = comm != nullptr && comm->size() > 1 ? comm : nullptr;
    n_ = trained().size();
    end_ = n_;
    if (comm_) {
      shard_ = shard_size(n_, comm_->size());
      begin_ = std::min(n_, comm_->rank() * shard_);
      end_ = std::min(n_, begin_ + shard_);
      padded_.resize(padded_size(n_, comm_->size()));
      shard_buf_.resize(shard_);
    }
    m_.assign(end_ - begin_, 0.0f);
    v_.assign(end_ - begin_, 0.0f);
  }
  bool lora() const { return model_.adapter_table() != nullptr; }
  // The trained buffer, its gradients and its tensors: the model's, or the adapters'.
  std::vector<float>& trained() { return lora() ? model_.adapter_weights() : model_.weights(); }
  std::vector<float>& grads() { return lora() ? model_.adapter_grads() : model_.grads(); }
  const std::vector<ParamInfo>& params() const {
    return lora() ? model_.adapter_table()->params() : model_.table().params();
  }

  // Sum of every rank's gradients, ÷ W, for this rank's shard → shard_buf_ (its first
  // end_ − begin_ elements; the rest is padding).
  void reduce_gradients() {
    const auto& g = grads();
    std::copy(g.begin(), g.end(), padded_.begin());
    std::fill(padded_.begin() + g.size(), padded_.end(), 0.0f);
    comm_->reduce_scatter_sum(padded_.data(), shard_buf_.data(), shard_);
    const float inv_world = 1.0f / static_cast<float>(comm_->size());
    for (float& x : shard_buf_) x *= inv_world;
  }

  // Σ g² and the micro-batch losses over ranks: returns the global Σ g² and replaces
  // report_.micro_losses by their means over ranks. Every rank must have run as many
  // micro-batches; one that did not stops the run (the next collectives would mismatch).
  double reduce_metrics(double local_sum_sq) {
    const double k = static_cast<double>(report_.micro_losses.size());
    const auto head = allgather_sum_in_rank_order(*comm_, {k, local_sum_sq});
    if (head[0] != k * comm_->size())
      comm_->abort(str("rank ", comm_->rank(), " ran ", report_.micro_losses.size(),
                       " micro-batches in this step, the ranks ", head[0], " in all"));
    auto losses = allgather_sum_in_rank_order(*comm_, report_.micro_losses);
    for (double& l : losses) l /= comm_->size();
    report_.rank_micro_losses = report_.micro_losses;
    report_.micro_losses = std::move(losses);
    return head[1];
  }

  // Every rank's updated shard of the weights → the whole weights on every rank.
  void gather_weights() {
    auto& w = trained();
    std::fill(shard_buf_.begin(), shard_buf_.end(), 0.0f);
    std::copy(w.begin() + begin_, w.begin() + end_, shard_buf_.begin());
    comm_->allgather(shard_buf_.data(), padded_.data(), shard_);
    std::copy(padded_.begin(), padded_.begin() + w.size(), w.begin());
  }

  // A per-shard buffer (m or v) of every rank → the full buffer.
  std::vector<float> gather_shards(const std::vector<float>& mine) {
    std::vector<float> send(shard_, 0.0f), all(padded_.size());
    std::copy(mine.begin(), mine.end(), send.begin());
    comm_->allgather(send.data(), all.data(), shard_);
    all.resize(n_);
    return all;
  }

  Transformer<float> model_;
  TokenLayout layout_;  // of the micro-batches (set_token_layout)
  Communicator* comm_ = nullptr;  // nullptr: one process
  // This rank's shard of the trained buffer (n_ values): [begin_, end_) (the whole buffer
  // without a communicator); shard_ elements per rank including padding.
  size_t n_ = 0, begin_ = 0, end_ = 0, shard_ = 0;
  std::vector<float> padded_;     // (W · shard_) staging for reduce-scatter and all-gather
  std::vector<float> shard_buf_;  // (shard_) this rank's mean gradients, then its weights
  std::vector<float> m_, v_;      // (end_ − begin_) Adam state of this rank's shard
};

}  // namespace

std::unique_ptr<StepRunner> make_cpu_runner(const ModelConfig& cfg, Communicator* comm) {
  return std::make_unique<CpuRunner>(cfg, comm);
}

std::unique_ptr<StepRunner> make_lora_cpu_runner(const Transformer<float>& model, Communicator* comm) {
  return std::make_unique<CpuRunner>(model, comm);
}

AttentionPath parse_attention_path(const std::string& name) {
  if (name == "auto" || name == "flash") return AttentionPath::kAuto;
  if (name == "unfused") return AttentionPath::kUnfused;
  if (name == "flash-mma") return AttentionPath::kFlashMma;
  if (name == "flash-wgmma") return AttentionPath::kFlashWgmma;
  throw Error(str("attention path '", name, "' (expected auto, flash, unfused, flash-mma or flash-wgmma)"));
}

}  // namespace forge
