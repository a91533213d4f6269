// The CUDA StepRunner: the model on CudaBackend, on one GPU (CudaSettings::device), every step
// queued without a host sync and reported one step late (DESIGN.md, "One training step").
//
// Per step the host validates and stages inputs, enqueues, and moves on:
//   micro_step      range-checks the ids (a bad id is a forge::Error here, not a fault on the
//                   GPU), copies tokens and targets into a pinned staging slot, counts targets
//                   and stores dloss = scale / targets next to them; packed rows
//                   (set_token_layout) also copy their positions (range-checked the same way)
//                   and segment ids into the slot
//   optimizer_step  writes AdamW's factors ([decay, no decay], adamw_factors) into the slot,
//                   then enqueues: one host→device copy of the slot into the device input block;
//                   the step (zero_grad, per micro-batch forward + backward + the in-order sum of
//                   its losses, clipping + AdamW); device→host copies of the loss sums and Σ g²
//                   into the slot; an event
//   take_report     waits for a step's event (the trainer asks after queueing the next step, so
//                   the GPU stays busy), then mean loss = sum / targets and norm = sqrt(Σ g²) in
//                   double, exactly as the synchronous runner computed them
// f16 (--precision fp16): the model keeps a dynamic loss scale on the device (ops/loss_scale.h,
// CudaBackend); each step copies that state into its slot with Σ g², and take_report
// unscales the norm by the scale the step used and reports the scale and whether the step was
// skipped. A skip is only known one step late on the host, so Adam's t cannot be fixed up
// there: the AdamW kernel subtracts the device's count of skipped steps from t itself.
// Numerical guard (ops/step_guard.h): the backend's optimizer step checks the loss sums and Σ g²
// on the device and skips the update of a non-finite step there, in the step itself; the host
// learns of it one step late from the same loss sums and Σ g² it copies back anyway (the
// device's rule, applied to the same numbers), so the guard adds no copy and no sync. Fault
// injection (inject_fault, a testing hook) writes two flags into the input block; once a run
// has used it, each step also enqueues the one-thread kernel that reads them (StepKey::faults).
// Two slots: the host fills one while the GPU may still be copying from the other. Before a
// slot is refilled, the step that last used it is waited for (it finished long ago in practice).
//
// Packed rows (--pack): once a micro-batch comes with a TokenLayout, the input block grows room
// for positions and segment ids (pos, seg) beside every micro-batch's tokens, and a step with a
// layout passes those device copies to the model (StepKey::packed: a graph of its own). A
// micro-batch without one in a packed step gets positions t and one segment per row, which is
// what no layout means. A run that never packs keeps the block, the graph and the copies of before.
//
// CUDA graph: between the two copies the step is a function of fixed device pointers only —
// everything that changes per step (tokens, targets, dloss, lr, t, pos, seg) is in the input block,
// read by the kernels at run time. The first step of a shape runs eagerly (activations planned,
// cuBLASLt plans and the allocator's cache warm), the second is captured (backend/cuda/graph.h)
// and launched, later steps replay it. A new B, T, micro-batch count or clip setting, or a
// re-plan of the activations (an evaluation with another batch size), drops the graph and starts
// over. A replay runs the same kernels on the same buffers as eager execution, so results are
// bit-identical; CudaSettings::graphs = false (the CLI's FORGE_CUDA_GRAPH=0) runs every step
// eagerly.
//
// Data parallel (a communicator of 2 or more GPU ranks, NcclComm): the step's optimizer part is
// train/zero1_cuda.h's ZeRO-1 instead of the backend's optimizer_step() (gradients
// reduce-scattered in buckets, those of the upper layers on a stream of their own while the last
// micro-batch's backward goes on below them; AdamW on this rank's shard, the updated shard
// all-gathered), enqueued inside the same step and captured in the same graph. The slot then also carries the micro-batches'
// target counts up (every rank's record holds them) and every rank's record down, from which
// take_report computes the losses over ranks as the CPU runner does; the norm and the guard's
// decision are the global ones, identical on every rank. A world of one is the runner above,
// unchanged (CudaSettings::zero1_one_rank forces the ZeRO-1 path there, for tests).
//
// LoRA (make_lora_cuda_runner): the same runner on a model with adapters (model/lora.h) and a
// frozen base in the run's precision. The backend's optimizer then trains the adapter buffer
// alone (Σ g², clipping, guard, AdamW, Adam's m and v), so the step, its graph and its reports
// are unchanged; weights(), set_weights(), adam_m() and adam_v() are the adapters', as on the
// CPU LoRA runner (train/runner_cpu.cpp). Data parallel LoRA is the ZeRO-1 path above over the
// adapter buffer (the backend's ZeRO-1 buffers are the adapters' once they are attached).
#include <cuda_runtime.h>

#include <array>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <optional>

#include "forge/backend/cuda/check.h"
#include "forge/backend/cuda/context.h"
#include "forge/backend/cuda/graph.h"
#include "forge/backend/cuda/ops.h"
#include "forge/backend/cuda/runtime.h"
#include "forge/core/error.h"
#include "forge/backend/cuda/zero1.h"
#include "forge/core/log.h"
#include "forge/dist/nccl_comm.h"
#include "forge/model/transformer_cuda.h"
#include "forge/train/runner.h"
#include "forge/train/zero1_cuda.h"

namespace forge {

namespace {

// Range check and count of real targets, the one place host ids are validated.
int64_t check_ids(const int32_t* x, const int32_t* y, size_t n, int V) {
  int64_t count = 0;
  for (size_t i = 0; i < n; ++i) {
    if (x[i] < 0 || x[i] >= V)
      throw Error(str("token id ", x[i], " at position ", i, " is out of range [0, ", V, ")"));
    if (y[i] < -1 || y[i] >= V)
      throw Error(str("target id ", y[i], " at position ", i, " is out of range [0, ", V, ")"));
    count += y[i] >= 0;
  }
  return count;
}

// Positions must index the position tables (GPT-2's wpe has max_seq_len rows): the CPU model's
// check (model/transformer_impl.h), made here before the upload.
void check_positions(const int32_t* pos, size_t n, int max_seq_len) {
  if (pos == nullptr) return;
  for (size_t i = 0; i < n; ++i)
    if (pos[i] < 0 || pos[i] >= max_seq_len)
      throw Error(str("position ", pos[i], " at ", i, " is out of range [0, ", max_seq_len, ")"));
}

// The input block, host (pinned slot) and device alike:
//   [0, 128)                 AdamWFactors[2]
//   [128, 136)               int32[2]: inject_fault's flags (nan_grad, nan_loss)
//   256 + i·stride + …       micro-batch i: tokens (N int32), targets (N int32), dloss (f32),
//                            and, packed, pos (N int32) and seg (N int32) at 16-byte offsets
struct InputLayout {
  static constexpr size_t kHead = 256;
  static constexpr size_t kFaults = 128;
  size_t N = 0;         // B·T positions per micro-batch
  int micros = 0;       // capacity in micro-batches
  bool packed = false;  // room for pos and seg
  static size_t up16(size_t b) { return (b + 15) / 16 * 16; }
  size_t used() const { return packed ? up16(8 * N + 4) + 2 * up16(4 * N) : 8 * N + 4; }
  size_t stride() const { return (used() + 255) / 256 * 256; }
  size_t bytes() const { return kHead + micros * stride(); }
  size_t tokens(int i) const { return kHead + i * stride(); }
  size_t targets(int i) const { return tokens(i) + 4 * N; }
  size_t dloss(int i) const { return tokens(i) + 8 * N; }
  size_t pos(int i) const { return tokens(i) + up16(8 * N + 4); }
  size_t seg(int i) const { return pos(i) + up16(4 * N); }
};

// Micro-batch i's pos and seg in a packed block (B·T = n, rows of T): the given arrays, or
// positions t and one segment per row where one is null (what no layout means).
void stage_layout(uint8_t* in, const InputLayout& l, int i, size_t n, int T_, const int32_t* pos,
                  const int32_t* seg) {
  int32_t* p = reinterpret_cast<int32_t*>(in + l.pos(i));
  int32_t* s = reinterpret_cast<int32_t*>(in + l.seg(i));
  if (pos != nullptr)
    std::memcpy(p, pos, n * 4);
  else
    for (size_t j = 0; j < n; ++j) p[j] = static_cast<int32_t>(j % static_cast<size_t>(T_));
  if (seg != nullptr)
    std::memcpy(s, seg, n * 4);
  else
    std::memset(s, 0, n * 4);
}

// What the captured work depends on besides the input block's contents.
struct StepKey {
  int B = 0, T = 0, micros = 0;
  bool zero = false;
  float max_norm = 0;
  int64_t plan_generation = -1;
  int64_t layout_version = -1;  // the input block moves when it grows
  bool faults = false;          // the fault-injection kernel is enqueued
  bool packed = false;          // the model gets the micro-batches' pos and seg
  bool operator==(const StepKey&) const = default;
};
static_assert(2 * sizeof(AdamWFactors) <= InputLayout::kFaults);

class CudaRunner final : public StepRunner {
 public:
  // lora_host (a model with adapters): its base is uploaded frozen and its adapters train.
  // comm (non-null: data parallel, ZeRO-1): an NCCL communicator on this runner's GPU.
  CudaRunner(const ModelConfig& cfg, DType dt, const CudaSettings& s,
             const Transformer<float>* lora_host = nullptr, Communicator* comm = nullptr)
      : ctx_(s.device),
        model_(cfg, ctx_,
               CudaModelOptions{dt, s.loss_scale, s.attention, lora_host != nullptr,
                                /*adam_state=*/comm == nullptr, s.gemm_algo, s.fuse_qkv, s.fp8}),
        graphs_(s.graphs),
        eval_sum_dev_(ctx_.allocator(), 1),
        eval_sum_(1) {
    for (Slot& s : slots_)
      FORGE_CUDA_CHECK(cudaEventCreateWithFlags(&s.done, cudaEventDisableTiming));
    FORGE_CUDA_CHECK(cudaStreamCreateWithFlags(&side_, cudaStreamNonBlocking));
    FORGE_CUDA_CHECK(cudaEventCreateWithFlags(&losses_ready_, cudaEventDisableTiming));
    FORGE_CUDA_CHECK(cudaEventCreateWithFlags(&losses_summed_, cudaEventDisableTiming));
    if (lora_host != nullptr) {
      if (s.fp8 != Fp8Recipe::kOff) throw Error("FP8 products (FORGE_FP8) are not available with LoRA adapters");
      const AdapterTable* at = lora_host->adapter_table();
      FORGE_CHECK(at != nullptr, "make_lora_cuda_runner: the model has no adapters");
      model_.set_weights(lora_host->weights());
      model_.attach_lora(at->lora(), 0);
      be().set_adapter_weights(lora_host->adapter_weights());
    }
    if (comm != nullptr) {
      set_nccl_stream(*comm, ctx_.stream());
      comm_ = comm;
      dp_ = std::make_unique<Zero1Cuda>(ctx_, be(), *comm, model_.trained_layer_starts(),
                                        s.bucket_elems);
      model_.set_layer_grads_hook([this](int l) { dp_->layer_done(l); });
    }
  }
  ~CudaRunner() override {
    graph_.reset();
    ctx_.synchronize();
    for (Slot& s : slots_) cudaEventDestroy(s.done);
    cudaEventDestroy(losses_ready_);
    cudaEventDestroy(losses_summed_);
    cudaStreamDestroy(side_);
  }

  const ParamTable& table() const override { return model_.table(); }
  std::string describe() const override {
    const DType dt = be().dtype();
    std::string lora;
    if (const AdapterTable* at = model_.adapter_table())
      lora = str(", lora r=", at->lora().r, " alpha=", at->lora().alpha, " (", at->total(), " trainable parameters)");
    return str("cuda ", dt == DType::kF32 ? "fp32" : dt == DType::kBF16 ? "bf16" : "fp16", " on ",
               cuda::device_summary(), graphs_ ? ", CUDA graph" : ", eager",
               be().flash_attention() ? ", flash attention" : ", unfused attention",
               ", gemm ", gemm_algo_name(be().context().gemm_algo()),
               be().fp8() != Fp8Recipe::kOff ? str(", fp8 ", fp8_recipe_name(be().fp8())) : "", lora,
               dp_ ? str(", zero-1 over ", comm_->describe(), " (", dp_->plan().buckets().size(),
                         " gradient buckets)")
                   : "");
  }
  void zero_grad() override {
    FORGE_CHECK(micro_ == 0, "zero_grad() in the middle of a step");
    zero_ = true;
  }
  // The next forward re-plans the activations: the queued steps finish on the old buffers and
  // the graph goes (its key would still match: the plan generation moves only in that forward).
  void set_recompute(Recompute r) override {
    FORGE_CHECK(micro_ == 0, "set_recompute() in the middle of a step");
    if (r == model_.recompute()) return;
    ctx_.synchronize();
    graph_.reset();
    graph_key_ = eager_key_ = StepKey{};
    model_.set_recompute(r);
  }

  void micro_step(const int32_t* x, const int32_t* y, int B, int T_, double scale) override {
    const size_t n = static_cast<size_t>(B) * T_;
    if (micro_ == 0) {
      begin_slot();
      B_ = B, T_step_ = T_;
    }
    FORGE_CHECK(B == B_ && T_ == T_step_, "micro-batches of one step must share B and T");
    const int64_t count = check_ids(x, y, n, model_.config().vocab_size);
    check_positions(pos_host_, n, model_.config().max_seq_len);
    const bool packed = pos_host_ != nullptr || seg_host_ != nullptr;
    reserve(n, micro_ + 1, packed);
    Slot& s = slots_[cur_];
    uint8_t* in = s.in.data();
    std::memcpy(in + layout_.tokens(micro_), x, n * 4);
    std::memcpy(in + layout_.targets(micro_), y, n * 4);
    const float dl = count > 0 ? static_cast<float>(scale / static_cast<double>(count)) : 0.0f;
    std::memcpy(in + layout_.dloss(micro_), &dl, 4);
    if (layout_.packed) stage_layout(in, layout_, micro_, n, T_, pos_host_, seg_host_);
    step_packed_ = step_packed_ || packed;
    s.counts.push_back(count);
    if (dp_) s.counts_up.data()[micro_] = static_cast<double>(count);
    ++micro_;
  }
  void set_token_layout(const int32_t* pos, const int32_t* seg) override {
    pos_host_ = pos, seg_host_ = seg;
  }

  void optimizer_step(const AdamWParams& p, double max_norm) override {
    FORGE_CHECK(micro_ > 0, "optimizer_step() without a micro_step()");
    Slot& s = slots_[cur_];
    // The bf16 working copy is the master rounded to nearest (sr_seed 0), a pure function of
    // the f32 master: a checkpoint (which stores the master) then restores it exactly, and a
    // resumed run is bit-identical. Stochastic rounding (llm.c's choice when it has no f32
    // master) would make the copy depend on the step's random key; with a master it buys
    // nothing, since sub-ulp updates accumulate in f32. Measured on the H200: with stochastic
    // rounding a SIGKILL + resume diverged in the last bits; with round-to-nearest it does not.
    const auto factors = CudaBackend::optimizer_factors(p, /*sr_seed=*/0);
    std::memcpy(s.in.data(), factors.data(), sizeof(factors));
    std::memcpy(s.in.data() + InputLayout::kFaults, fault_.data(), sizeof(fault_));
    fault_ = {0, 0};
    const StepKey key{B_,
                      T_step_,
                      micro_,
                      zero_,
                      static_cast<float>(max_norm),
                      model_.plan_generation(),
                      layout_version_,
                      faults_armed_,
                      step_packed_};
    cudaStream_t st = ctx_.stream();
    FORGE_CUDA_CHECK(cudaMemcpyAsync(in_dev_.data(), s.in.data(), layout_.tokens(micro_),
                                     cudaMemcpyHostToDevice, st));
    if (dp_)
      FORGE_CUDA_CHECK(cudaMemcpyAsync(dp_->counts(), s.counts_up.data(), micro_ * sizeof(double),
                                       cudaMemcpyHostToDevice, st));
    if (graphs_ && !graph_.empty() && graph_key_ == key) {
      graph_.launch();
    } else if (graphs_ && eager_key_ == key) {
      graph_.capture(ctx_, [&] { enqueue_step(key); });
      graph_key_ = key;
      log_debug("cuda: training step captured as a CUDA graph (B=", key.B, " T=", key.T,
                " micro-batches=", key.micros, ")");
      graph_.launch();
    } else {
      graph_.reset();  // stale: its pool goes back to the cache for the eager step
      enqueue_step(key);
      eager_key_ = key;
      eager_key_.plan_generation = model_.plan_generation();  // after a forward that re-planned
    }
    // Data parallel: the global loss sums and Σ g² (what the guard decided on) and every rank's
    // record (its losses and target counts).
    FORGE_CUDA_CHECK(cudaMemcpyAsync(s.loss_sums.data(),
                                     dp_ ? dp_->global_loss_sums() : loss_sums_dev_.data(),
                                     micro_ * sizeof(double), cudaMemcpyDeviceToHost, st));
    FORGE_CUDA_CHECK(cudaMemcpyAsync(s.norm_sq.data(), dp_ ? dp_->global_sq() : be().grad_norm_sq(),
                                     sizeof(float), cudaMemcpyDeviceToHost, st));
    if (dp_)
      FORGE_CUDA_CHECK(cudaMemcpyAsync(
          s.records.data(), dp_->records(),
          dp_->world() * cuda::zero1_record_size(micro_) * sizeof(double), cudaMemcpyDeviceToHost, st));
    if (be().loss_scale() != nullptr)
      FORGE_CUDA_CHECK(cudaMemcpyAsync(s.loss_scale.data(), be().loss_scale(),
                                       sizeof(LossScaleState), cudaMemcpyDeviceToHost, st));
    FORGE_CUDA_CHECK(cudaEventRecord(s.done, st));
    s.in_flight = true;
    pending_.push_back(cur_);
    cur_ ^= 1;
    micro_ = 0;
    zero_ = false;
    step_packed_ = false;
  }

  void set_skipped_updates(int64_t n) override {
    FORGE_CHECK(n >= 0 && n <= INT32_MAX, "set_skipped_updates(", n, ")");
    FORGE_CHECK(micro_ == 0, "set_skipped_updates in the middle of a step");
    be().set_step_guard(StepGuardState{0, static_cast<int32_t>(n)});
  }
  void inject_fault(StepFault f) override {
    FORGE_CHECK(micro_ > 0, "inject_fault() outside a step");
    fault_[f == StepFault::kNanGrad ? 0 : 1] = 1;
    faults_armed_ = true;
  }

  int report_lag() const override { return 1; }

  StepReport take_report() override {
    if (!ready_.empty()) {
      StepReport r = std::move(ready_.front());
      ready_.pop_front();
      return r;
    }
    FORGE_CHECK(!pending_.empty(), "take_report: no ended step to report");
    return collect_oldest();
  }

  double eval_loss(const int32_t* x, const int32_t* y, int B, int T_) override {
    const size_t n = static_cast<size_t>(B) * T_;
    const int64_t count = check_ids(x, y, n, model_.config().vocab_size);
    if (eval_in_.size() < 2 * n) {
      ctx_.synchronize();  // the old buffers may still be read
      eval_in_ = cuda::PinnedBuffer<int32_t>(2 * n);
      eval_dev_ = cuda::DeviceBuffer<int32_t>(ctx_.allocator(), 2 * n);
    }
    std::memcpy(eval_in_.data(), x, n * 4);
    std::memcpy(eval_in_.data() + n, y, n * 4);
    cudaStream_t st = ctx_.stream();
    FORGE_CUDA_CHECK(
        cudaMemcpyAsync(eval_dev_.data(), eval_in_.data(), 2 * n * 4, cudaMemcpyHostToDevice, st));
    model_.forward(eval_dev_.data(), eval_dev_.data() + n, nullptr, B, T_);
    cuda::sum_in_order(ctx_, eval_sum_dev_.data(), model_.losses(), static_cast<int64_t>(n));
    FORGE_CUDA_CHECK(cudaMemcpyAsync(eval_sum_.data(), eval_sum_dev_.data(), sizeof(double),
                                     cudaMemcpyDeviceToHost, st));
    ctx_.synchronize();  // also the staging buffer's copy, before the next call rewrites it
    return count > 0 ? eval_sum_.data()[0] / static_cast<double>(count) : 0.0;
  }

  // LoRA: the adapters (the base never changes). Data parallel: gathered from every rank's
  // shard (collective, as adam_m() and adam_v() are).
  std::vector<float> weights() override {
    if (dp_) return dp_->weights();
    return be().has_adapter() ? be().adapter_weights_host() : model_.weights_host();
  }
  void set_weights(const std::vector<float>& w) override {
    if (be().has_adapter()) be().set_adapter_weights(w);
    else model_.set_weights(w);
  }
  std::vector<float> adam_m() override { return dp_ ? dp_->adam_m() : be().adam_m_host(); }
  std::vector<float> adam_v() override { return dp_ ? dp_->adam_v() : be().adam_v_host(); }
  void set_adam_state(const std::vector<float>& m, const std::vector<float>& v) override {
    if (dp_)
      dp_->set_adam_state(m, v);
    else
      be().set_adam_state(m, v);
  }
  // f16: the device's loss-scale state; callers ask between steps (checkpoints), and
  // loss_scale_host() waits for everything queued.
  std::optional<LossScaleState> loss_scale_state() override {
    if (be().loss_scale() == nullptr) return std::nullopt;
    return be().loss_scale_host();
  }
  // Written in place (the captured graph reads that buffer) and waited for; nothing else moves.
  void set_loss_scale_state(const LossScaleState& s) override {
    FORGE_CHECK(be().loss_scale() != nullptr, "set_loss_scale_state: this runner has no loss scaling");
    FORGE_CHECK(micro_ == 0, "set_loss_scale_state in the middle of a step");
    be().set_loss_scale(s);
  }
  size_t peak_device_bytes() const override {
    return ctx_.allocator().stats().peak_reserved + ctx_.workspace_bytes();
  }

 private:
  CudaBackend& be() { return model_.backend(); }
  const CudaBackend& be() const { return model_.backend(); }
  struct Slot {
    cuda::PinnedBuffer<uint8_t> in;        // InputLayout: what the step reads
    cuda::PinnedBuffer<double> loss_sums;  // (micro-batches) Σ per-position losses
    cuda::PinnedBuffer<float> norm_sq;     // (1) Σ g²
    cuda::PinnedBuffer<LossScaleState> loss_scale;  // (1) f16: the state after the step
    std::vector<int64_t> counts;           // targets per micro-batch
    cuda::PinnedBuffer<double> counts_up;  // data parallel: the same, uploaded with the step
    cuda::PinnedBuffer<double> records;    // data parallel: every rank's record (zero1.h)
    cudaEvent_t done = nullptr;            // after the step's device→host copies
    bool in_flight = false;                // ended and not yet collected
  };
  // enqueue_step's fork and join of the loss sum (side stream; captured with the step).
  cudaStream_t side_ = nullptr;
  cudaEvent_t losses_ready_ = nullptr, losses_summed_ = nullptr;

  // The step between the input and output copies; captured as a graph or run eagerly.
  void enqueue_step(const StepKey& k) {
    uint8_t* in = in_dev_.data();
    const int64_t n = static_cast<int64_t>(k.B) * k.T;
    if (k.zero) model_.zero_grad();
    for (int i = 0; i < k.micros; ++i) {
      TokenLayout lay;
      if (k.packed)
        lay = {reinterpret_cast<const int32_t*>(in + layout_.pos(i)),
               reinterpret_cast<const int32_t*>(in + layout_.seg(i))};
      model_.forward(reinterpret_cast<const int32_t*>(in + layout_.tokens(i)),
                     reinterpret_cast<const int32_t*>(in + layout_.targets(i)),
                     reinterpret_cast<const float*>(in + layout_.dloss(i)), k.B, k.T, lay);
      // The loss sum (one thread, in index order: ~0.9 ms at 65,536 positions) runs on the side
      // stream beside the backward, which does not touch the losses; joined before the next
      // micro-batch's forward overwrites them and before the optimizer reads the sums.
      FORGE_CUDA_CHECK(cudaEventRecord(losses_ready_, ctx_.stream()));
      FORGE_CUDA_CHECK(cudaStreamWaitEvent(side_, losses_ready_, 0));
      cuda::sum_in_order(side_, loss_sums_dev_.data() + i, model_.losses(), n);
      FORGE_CUDA_CHECK(cudaEventRecord(losses_summed_, side_));
      if (dp_ && i == k.micros - 1) dp_->arm();  // its buckets start during this backward
      model_.backward();
      FORGE_CUDA_CHECK(cudaStreamWaitEvent(ctx_.stream(), losses_summed_, 0));
    }
    if (k.faults)
      cuda::inject_step_fault(ctx_, be().has_adapter() ? be().ag(0) : be().g(0), loss_sums_dev_.data(),
                              reinterpret_cast<const int32_t*>(in + InputLayout::kFaults));
    if (dp_)
      dp_->step(reinterpret_cast<const AdamWFactors*>(in), k.max_norm, loss_sums_dev_.data(),
                k.micros);
    else
      be().optimizer_step(reinterpret_cast<const AdamWFactors*>(in), k.max_norm,
                          loss_sums_dev_.data(), k.micros);
  }

  // Starts filling slot cur_: its previous step must be done (its input copy read the slot).
  void begin_slot() {
    Slot& s = slots_[cur_];
    while (s.in_flight) ready_.push_back(collect_oldest());  // a caller that lags more than 1
    FORGE_CUDA_CHECK(cudaEventSynchronize(s.done));
    s.counts.clear();
  }

  StepReport collect_oldest() {
    Slot& s = slots_[pending_.front()];
    pending_.pop_front();
    FORGE_CUDA_CHECK(cudaEventSynchronize(s.done));
    s.in_flight = false;
    StepReport r;
    if (dp_)
      rank_losses(s, r);
    else
      for (size_t i = 0; i < s.counts.size(); ++i)
        r.micro_losses.push_back(
            s.counts[i] > 0 ? s.loss_sums.data()[i] / static_cast<double>(s.counts[i]) : 0.0);
    r.grad_norm = std::sqrt(static_cast<double>(s.norm_sq.data()[0]));
    // The device guard's decision, from the numbers it decided on (ops/step_guard.h).
    StepGuardState guard;
    step_guard_update(guard, s.loss_sums.data(), static_cast<int>(s.counts.size()),
                      s.norm_sq.data()[0], be().loss_scale() != nullptr);
    r.skipped = guard.skipped != 0;
    if (be().loss_scale() != nullptr) {  // Σ g² was of the scaled gradients
      const LossScaleState& ls = s.loss_scale.data()[0];
      r.loss_scale = ls.step_scale;
      r.overflow = ls.skipped != 0;
      r.skipped = r.skipped || r.overflow;
      r.grad_norm /= ls.step_scale;
    }
    return r;
  }

  // Data parallel: this rank's micro-batch losses (rank_micro_losses) and their means over ranks
  // (micro_losses), each rank's mean loss = its loss sum / its targets (0 without targets), added
  // in rank order and divided by the ranks: the CPU runner's numbers (train/runner_cpu.cpp).
  void rank_losses(const Slot& s, StepReport& r) const {
    const int micros = static_cast<int>(s.counts.size()), W = dp_->world();
    const int rec = cuda::zero1_record_size(micros);
    auto mean = [&](int rank, int i) {
      const double* record = s.records.data() + static_cast<size_t>(rank) * rec;
      FORGE_CHECK(record[1] == micros, "rank ", rank, " ran ", record[1],
                  " micro-batches in a step where this rank ran ", micros);
      const double count = record[2 + micros + i];
      return count > 0 ? record[2 + i] / count : 0.0;
    };
    for (int i = 0; i < micros; ++i) {
      r.rank_micro_losses.push_back(mean(comm_->rank(), i));
      double sum = 0;
      for (int rank = 0; rank < W; ++rank) sum += mean(rank, i);
      r.micro_losses.push_back(sum / W);
    }
  }

  // Room for `micros` micro-batches of n positions (packed: with pos and seg). Growing moves every
  // buffer, so it waits for the queued steps (collecting their reports) and drops the graph; the
  // micro-batches staged so far are carried over.
  void reserve(size_t n, int micros, bool packed) {
    if (n <= layout_.N && micros <= layout_.micros && (layout_.packed || !packed)) return;
    InputLayout next = layout_;
    if (n > next.N) next.N = n;
    next.packed = layout_.packed || packed;
    while (next.micros < micros) next.micros = next.micros == 0 ? 1 : 2 * next.micros;
    graph_.reset();
    ctx_.synchronize();
    while (!pending_.empty()) ready_.push_back(collect_oldest());  // before their slots go
    for (int k = 0; k < 2; ++k) {
      Slot& s = slots_[k];
      cuda::PinnedBuffer<uint8_t> in(next.bytes());
      std::memset(in.data(), 0, in.bytes());
      if (k == cur_) {  // carry over the step being filled (its micro-batches have N = n)
        for (int i = 0; i < micro_; ++i) {
          std::memcpy(in.data() + next.tokens(i), s.in.data() + layout_.tokens(i), 8 * n + 4);
          if (!next.packed) continue;
          const bool had = layout_.packed;  // else they had no layout: positions t, one segment
          stage_layout(
              in.data(), next, i, n, T_step_,
              had ? reinterpret_cast<const int32_t*>(s.in.data() + layout_.pos(i)) : nullptr,
              had ? reinterpret_cast<const int32_t*>(s.in.data() + layout_.seg(i)) : nullptr);
        }
      }
      s.in = std::move(in);
      s.loss_sums = cuda::PinnedBuffer<double>(next.micros);
      if (dp_) {
        s.counts_up = cuda::PinnedBuffer<double>(next.micros);
        s.records = cuda::PinnedBuffer<double>(dp_->world() * cuda::zero1_record_size(next.micros));
        for (int i = 0; k == cur_ && i < micro_; ++i)  // the step being filled keeps its counts
          s.counts_up.data()[i] = static_cast<double>(s.counts[i]);
      }
      if (s.norm_sq.size() == 0) s.norm_sq = cuda::PinnedBuffer<float>(1);
      if (s.loss_scale.size() == 0) s.loss_scale = cuda::PinnedBuffer<LossScaleState>(1);
    }
    in_dev_ = cuda::DeviceBuffer<uint8_t>(ctx_.allocator(), next.bytes());
    loss_sums_dev_ = cuda::DeviceBuffer<double>(ctx_.allocator(), next.micros);
    if (dp_) dp_->reserve(next.micros);
    layout_ = next;
    ++layout_version_;
  }

  cuda::Context ctx_;
  CudaTransformer model_;
  Communicator* comm_ = nullptr;      // data parallel: the NCCL communicator
  std::unique_ptr<Zero1Cuda> dp_;     // data parallel: the optimizer part of the step
  const bool graphs_;
  InputLayout layout_;
  int64_t layout_version_ = 0;
  Slot slots_[2];
  int cur_ = 0;                               // slot of the step being filled
  std::deque<int> pending_;                   // slots of ended steps, oldest first
  std::deque<StepReport> ready_;              // collected early (see begin_slot), oldest first
  int micro_ = 0;                             // micro-batches staged in the current step
  bool zero_ = false;                         // zero_grad() requested for the current step
  int B_ = 0, T_step_ = 0;                    // shape of the current step
  std::array<int32_t, 2> fault_{0, 0};        // inject_fault()'s flags for the current step
  bool faults_armed_ = false;                 // inject_fault() was called in this run
  const int32_t* pos_host_ = nullptr;         // set_token_layout(): the caller's, per micro-batch
  const int32_t* seg_host_ = nullptr;
  bool step_packed_ = false;                  // a micro-batch of the current step has a layout
  cuda::DeviceBuffer<uint8_t> in_dev_;        // InputLayout on the device
  cuda::DeviceBuffer<double> loss_sums_dev_;  // (micro-batches)
  cuda::Graph graph_;
  StepKey graph_key_, eager_key_;         // what graph_ captured; what the last eager step ran
  cuda::DeviceBuffer<int32_t> eval_dev_;  // (2·B·T) tokens, targets
  cuda::PinnedBuffer<int32_t> eval_in_;
  cuda::DeviceBuffer<double> eval_sum_dev_;
  cuda::PinnedBuffer<double> eval_sum_;
};

}  // namespace

std::unique_ptr<StepRunner> make_cuda_runner(const ModelConfig& cfg, const std::string& precision,
                                             const CudaSettings& settings, Communicator* comm) {
  if (!cuda::available()) throw Error("--device cuda: " + cuda::device_summary());
  const bool dp = comm != nullptr && (comm->size() > 1 || settings.zero1_one_rank);
  return std::make_unique<CudaRunner>(cfg, parse_precision(precision), settings, nullptr,
                                      dp ? comm : nullptr);
}

std::unique_ptr<StepRunner> make_lora_cuda_runner(const Transformer<float>& model, const std::string& precision,
                                                  const CudaSettings& settings, Communicator* comm) {
  if (!cuda::available()) throw Error("--device cuda: " + cuda::device_summary());
  const bool dp = comm != nullptr && (comm->size() > 1 || settings.zero1_one_rank);
  return std::make_unique<CudaRunner>(model.config(), parse_precision(precision), settings, &model,
                                      dp ? comm : nullptr);
}

}  // namespace forge
