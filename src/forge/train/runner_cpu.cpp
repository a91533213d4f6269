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
// and its gradients. The flat gradient buffer is cut into buckets and shards as dist/buckets.h
// says (the GPU runner's layout); after the backward each bucket is reduce-scattered, from the
// top of the buffer down, and divided by W (exact for W a power of two), so rank r holds the
// mean gradient of its shard. Σ g² of the shards and the micro-batch losses are summed over
// ranks in rank order (allgather_sum_in_rank_order), so every rank computes the same norm,
// clipping factor and guard decision bit for bit. AdamW updates this rank's parts of the
// weights with m and v of its shard only (the optimizer state is 1/W of a single rank's), and
// a bucket-by-bucket all-gather brings every rank the whole updated weights. The buckets are
// reduced after the whole backward: on the CPU the backward already uses every core, so
// there is nothing to overlap (the GPU runner reduces them during the backward).
#include <algorithm>
#include <cmath>
#include <memory>
#include <optional>

#include "forge/core/error.h"
#include "forge/dist/buckets.h"
#include "forge/dist/communicator.h"
#include "forge/model/transformer.h"
#include "forge/ops/grad_norm.h"
#include "forge/train/host_runner.h"

namespace forge {

namespace {

class CpuRunner final : public HostStepRunner {
 public:
  CpuRunner(const ModelConfig& cfg, Communicator* comm, size_t bucket_elems) : model_(cfg) {
    init(comm, bucket_elems);
  }
  // LoRA: `lora` (a model with adapters) copied; its adapters train, its base is frozen.
  CpuRunner(const Transformer<float>& lora, Communicator* comm, size_t bucket_elems)
      : model_(lora.config()) {
    const AdapterTable* at = lora.adapter_table();
    FORGE_CHECK(at != nullptr, "make_lora_cpu_runner: the model has no adapters");
    model_.weights() = lora.weights();
    model_.attach_lora(at->lora(), 0);
    model_.adapter_weights() = lora.adapter_weights();
    init(comm, bucket_elems);
  }

  const ParamTable& table() const override { return model_.table(); }
  std::string describe() const override {
    std::string s = "cpu fp32";
    if (const AdapterTable* at = model_.adapter_table())
      s += str(", lora r=", at->lora().r, " alpha=", at->lora().alpha, " (", at->total(), " trainable parameters)");
    return comm_ ? str(s, ", zero-1 over ", comm_->describe(), " (", plan_->buckets().size(), " gradient buckets)") : s;
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
    double sum_sq = 0;
    if (comm_) {
      reduce_gradients();
      sum_sq = reduce_metrics(cpu::sum_squares(shard_buf_.data(), static_cast<int64_t>(plan_->valid(rank()))));
    } else {
      sum_sq = cpu::sum_squares(grads().data(), static_cast<int64_t>(n_));
    }
    const double norm = std::sqrt(sum_sq);
    if (guard_allows_update(norm)) {
      AdamWParams q = update_params(p, norm, max_norm);
      // This rank's parts of the buffer, each at its shard offset (all of it, at 0, without a
      // communicator); gradients, m and v are indexed by shard offset.
      const float* grad = comm_ ? shard_buf_.data() : grads().data();
      for_each_part([&](size_t part_lo, size_t part_hi, size_t k0) {
        for (const auto& info : params()) {
          const size_t lo = std::max<size_t>(info.offset, part_lo);
          const size_t hi = std::min<size_t>(info.offset + info.numel(), part_hi);
          if (lo >= hi) continue;
          const size_t k = k0 + (lo - part_lo);
          q.weight_decay = info.decay ? p.weight_decay : 0.0f;
          cpu::adamw_update(trained().data() + lo, m_.data() + k, v_.data() + k, grad + k,
                            static_cast<int64_t>(hi - lo), q);
        }
      });
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
    if (m.empty() && v.empty()) {  // zeros (runner.h); m_ and v_ keep their (shard) size
      std::fill(m_.begin(), m_.end(), 0.0f);
      std::fill(v_.begin(), v_.end(), 0.0f);
      return;
    }
    FORGE_CHECK(m.size() == n_ && v.size() == n_, "set_adam_state: ", m.size(), " and ", v.size(),
                " values for ", n_, " trained parameters");
    if (!comm_) {
      m_ = m, v_ = v;
      return;
    }
    plan_->flat_to_shard(m.data(), rank(), m_.data());
    plan_->flat_to_shard(v.data(), rank(), v_.data());
  }

 private:
  // The buckets and this rank's shard of the trained buffer (dist/buckets.h); without a
  // communicator the whole buffer is the one part.
  void init(Communicator* comm, size_t bucket_elems) {
    comm_ = comm != nullptr && comm->size() > 1 ? comm : nullptr;
    n_ = trained().size();
    size_t state = n_;
    if (comm_) {
      plan_.emplace(n_, comm_->size(), model_.trained_layer_starts(), bucket_elems);
      state = plan_->shard();
      shard_buf_.resize(state);
      const GradBucket& top = plan_->buckets().back();
      tail_.resize(top.end - top.begin);
    }
    m_.assign(state, 0.0f);
    v_.assign(state, 0.0f);
  }
  int rank() const { return comm_ ? comm_->rank() : 0; }
  // f(lo, hi, shard offset) for each of this rank's parts [lo, hi) of the trained buffer.
  template <class F>
  void for_each_part(F f) const {
    if (!comm_) return f(size_t{0}, n_, size_t{0});
    for (const GradBucket& b : plan_->buckets()) {
      const size_t lo = plan_->part_begin(b, rank()), hi = plan_->part_end(b, rank());
      if (lo < hi) f(lo, hi, b.offset);
    }
  }
  bool lora() const { return model_.adapter_table() != nullptr; }
  // The trained buffer, its gradients and its tensors: the model's, or the adapters'.
  std::vector<float>& trained() { return lora() ? model_.adapter_weights() : model_.weights(); }
  std::vector<float>& grads() { return lora() ? model_.adapter_grads() : model_.grads(); }
  const std::vector<ParamInfo>& params() const {
    return lora() ? model_.adapter_table()->params() : model_.table().params();
  }

  // Sum of every rank's gradients, ÷ W, for this rank's shard → shard_buf_ (its first
  // valid(rank) elements; the rest is padding), bucket by bucket from the top down. The top
  // bucket reaches into the padding: it goes through tail_.
  void reduce_gradients() {
    const auto& g = grads();
    const auto& buckets = plan_->buckets();
    for (auto b = buckets.rbegin(); b != buckets.rend(); ++b) {
      const float* in = g.data() + b->begin;
      if (b->end > n_) {
        std::fill(std::copy(g.begin() + b->begin, g.end(), tail_.begin()), tail_.end(), 0.0f);
        in = tail_.data();
      }
      comm_->reduce_scatter_sum(in, shard_buf_.data() + b->offset, b->piece);
    }
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

  // Every rank's updated parts of the weights → the whole weights on every rank, a bucket at a
  // time (the top one through tail_).
  void gather_weights() {
    auto& w = trained();
    for (const GradBucket& b : plan_->buckets()) {
      const size_t lo = plan_->part_begin(b, rank()), hi = plan_->part_end(b, rank());
      std::fill(std::copy(w.begin() + lo, w.begin() + hi, shard_buf_.begin()),
                shard_buf_.begin() + b.piece, 0.0f);
      float* out = b.end > n_ ? tail_.data() : w.data() + b.begin;
      comm_->allgather(shard_buf_.data(), out, b.piece);
      if (b.end > n_) std::copy(tail_.begin(), tail_.begin() + (n_ - b.begin), w.begin() + b.begin);
    }
  }

  // A per-shard buffer (m or v) of every rank → the full buffer.
  std::vector<float> gather_shards(const std::vector<float>& mine) {
    std::vector<float> all(plan_->padded()), full(n_);
    comm_->allgather(mine.data(), all.data(), plan_->shard());
    plan_->shards_to_flat(all.data(), full.data());
    return full;
  }

  Transformer<float> model_;
  TokenLayout layout_;  // of the micro-batches (set_token_layout)
  Communicator* comm_ = nullptr;  // nullptr: one process
  size_t n_ = 0;                  // trained parameters
  std::optional<BucketPlan> plan_;  // with a communicator
  std::vector<float> shard_buf_;  // (shard) this rank's mean gradients; then a part to all-gather
  std::vector<float> tail_;       // (the top bucket) its padded gradients, then its gathered weights
  std::vector<float> m_, v_;      // Adam state: of this rank's shard (shard layout), or of all
};

}  // namespace

std::unique_ptr<StepRunner> make_cpu_runner(const ModelConfig& cfg, Communicator* comm,
                                            size_t bucket_elems) {
  return std::make_unique<CpuRunner>(cfg, comm, bucket_elems);
}

std::unique_ptr<StepRunner> make_lora_cpu_runner(const Transformer<float>& model, Communicator* comm,
                                                 size_t bucket_elems) {
  return std::make_unique<CpuRunner>(model, comm, bucket_elems);
}

AttentionPath parse_attention_path(const std::string& name) {
  if (name == "auto" || name == "flash") return AttentionPath::kAuto;
  if (name == "unfused") return AttentionPath::kUnfused;
  if (name == "flash-mma") return AttentionPath::kFlashMma;
  if (name == "flash-wgmma") return AttentionPath::kFlashWgmma;
  if (name == "flash-wgmma-split") return AttentionPath::kFlashWgmmaSplit;
  throw Error(str("attention path '", name,
                  "' (expected auto, flash, unfused, flash-mma, flash-wgmma or flash-wgmma-split)"));
}

}  // namespace forge
