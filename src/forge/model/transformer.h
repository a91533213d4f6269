// The model, written once for every backend: explicit forward and backward (no autograd) and an
// inference forward, over the op interface a backend implements (backend/cpu/backend.h,
// backend/cuda/backend.h). The backend is a template parameter: each op is a direct call, no
// virtual dispatch. The CPU backend composes the GPU's fused ops from unfused kernels, so the
// CPU runs exactly the sequence of calls the GPU does and CI tests the GPU's orchestration.
//
// One training micro-batch is forward(tokens, targets, dloss) then backward():
//   - The LM head is fused with the loss (lm_head_cross_entropy): with dloss given, forward()
//     already produces the head's gradients and backward() carries on from the final norm.
//     dloss points to one Real in backend memory: the gradient of the summed per-position
//     losses (scale / number of targets), so a GPU step needs no host sync.
//   - Parameter gradients accumulate into the backend's flat gradient buffer (same table as the
//     weights), so gradient accumulation is several micro-batches between zero_grad()s.
//   - Activations kept for the backward are planned once per (B, T) (plan_generation() changes
//     when they are allocated anew, which makes a captured CUDA graph stale).
//   - Recomputation (set_recompute, model/recompute.h): at a level above none some groups of a
//     layer's activations are one shared set instead of one set per layer, and block_backward(l)
//     recomputes them from what the layer kept, with the forward's own ops on the same inputs,
//     so losses and gradients are bit-identical to none's; only memory and time change.
//   - LoRA (model/lora.h, CPU and CUDA backends): attach_lora() adds low-rank adapters in a second flat
//     buffer and freezes the base. Every targeted projection's output gains
//     (alpha / r)·(x·Aᵀ)·Bᵀ in the same orchestration (lora_fwd / lora_bwd after the base
//     product); the base's gradients are not computed at all (its ops get null gradient
//     pointers: no dW products, no embedding backward) and the backend holds none.
//
// Host conveniences (CPU backend): loss(), loss_and_grad() and logits_of() validate host ids
// and return host values; the CPU runner, the CLI and the tests use them.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <utility>
#include <vector>

#include "forge/backend/cpu/backend.h"
#include "forge/core/error.h"
#include "forge/model/config.h"
#include "forge/model/lora.h"
#include "forge/model/params.h"
#include "forge/model/recompute.h"

namespace forge {

// Packed rows (several examples in one row, data/sft_data.h): per-token positions pos (B, T),
// restarting at 0 per example, used by RoPE and GPT-2's learned position embedding; and segment
// ids seg (B, T), one per example (a run of equal ids in a row), whose keys attention keeps
// inside the segment (causal, and windowed, within it). Backend memory; null = none (positions
// t, the whole row one segment). Either may be given without the other.
struct TokenLayout {
  const int32_t* pos = nullptr;
  const int32_t* seg = nullptr;
};

// One prompt of a packed prefill (Model::prefill_packed): its decode slot and its length.
struct PrefillSeg {
  int slot = 0;
  int len = 0;
};

template <class Backend>
class Model {
 public:
  using Real = typename Backend::Real;
  using Act = typename Backend::Act;
  using Stat = typename Backend::Stat;

  // Backend arguments follow the configuration (the CUDA backend takes its context and options).
  template <class... Args>
  explicit Model(const ModelConfig& cfg, Args&&... backend_args)
      : cfg_(cfg), table_(cfg), be_(cfg_, table_, std::forward<Args>(backend_args)...) {}

  const ModelConfig& config() const { return cfg_; }
  const ParamTable& table() const { return table_; }
  int64_t num_params() const { return table_.total(); }
  Backend& backend() { return be_; }
  const Backend& backend() const { return be_; }

  // Weights as host f32 (the parameter table's layout), gradients likewise.
  void set_weights(const std::vector<float>& w) { be_.set_weights(w); }
  std::vector<float> weights_host() const { return be_.weights_host(); }
  std::vector<float> grads_host() const { return be_.grads_host(); }
  // Initialises weights as ParamTable::init describes.
  void init_weights(uint64_t seed);
  void zero_grad() { be_.zero_grad(); }

  // tokens, targets (B, T) in backend memory, targets −1 = ignore; T <= max_seq_len. Per-position
  // losses go to losses(); with dloss non-null the head's gradients too (see the header). Ids
  // are not checked here (a host check before the upload is the caller's: loss() does it).
  // layout: packed rows (TokenLayout), kept for the backward.
  void forward(const int32_t* tokens, const int32_t* targets, const Real* dloss, int B, int T_,
               TokenLayout layout = {});
  // Per-position losses of the last forward, (B·T), 0 at ignored targets.
  Stat losses() { return losses_.data(); }
  // Continues the backward from the final norm; needs a forward with dloss.
  void backward();
  // Called by backward() after layer l's backward (l from n_layer − 1 down to 0): every
  // gradient of the trained buffer at or above trained_layer_starts()[l] is then final (the
  // data-parallel runner starts reducing those buckets; dist/buckets.h). Empty: no call.
  void set_layer_grads_hook(std::function<void(int)> hook) { layer_grads_hook_ = std::move(hook); }
  // The first element of each layer in the trained buffer: the weights', or the adapters'.
  std::vector<int64_t> trained_layer_starts() const {
    return adapter_ ? adapter_->layer_starts() : table_.layer_starts();
  }

  // Inference: logits (B, T, Vp) of tokens (backend memory) into logits(); columns >= V are
  // padding. No targets, nothing kept for a backward.
  void forward_logits(const int32_t* tokens, int B, int T_, TokenLayout layout = {});
  Act logits() { return logits_.data(); }

  int64_t plan_generation() const { return plan_generation_; }

  // Activation recomputation (model/recompute.h); the next forward plans the buffers anew.
  void set_recompute(Recompute r) {
    if (r == recompute_) return;
    recompute_ = r;
    B_ = T_ = 0;
  }
  Recompute recompute() const { return recompute_; }
  // Bytes of the buffers the last plan allocated for a forward and backward of (B, T): the
  // layers' activations, the shared recomputation set, the backward scratch and the attention's
  // saved state (not the backend's own attention scratch, nor the logits of forward_logits).
  size_t activation_bytes() const { return act_bytes_; }

  // ---- inference over a KV cache (ops/decode.h; the loop is generate/generator.h) ------------
  // Allocates the cache for `slots` sequences of up to `capacity` tokens each (1 <= capacity <=
  // max_seq_len) and the buffers of a decode step. With a sliding window shorter than capacity
  // the cache holds only the window, as a ring, and sequences may run to max_seq_len.
  void plan_decode(int slots, int capacity);
  int decode_slots() const { return S_; }
  // Rows of the next decode_step() calls: slots 0 .. n−1 (1 <= n <= decode_slots(); plan_decode
  // sets all of them). A step then reads, writes and advances only those slots' tokens, positions,
  // caches and logits rows, so the slots above keep everything; a decode loop whose live slots are
  // the lowest ones steps only as many rows as it needs (a step's time grows with its rows).
  void set_decode_rows(int n);
  int decode_rows() const { return rows_; }
  int decode_capacity() const { return cap_; }
  // The most tokens one slot can hold: capacity, or max_seq_len for a ring.
  int decode_context() const { return ring_ ? cfg_.max_seq_len : cap_; }
  // Runs the prompt (T tokens in backend memory, 1 <= T <= decode_context()) of one slot with the
  // training kernels, stores its keys and values in the slot's cache (the last `capacity` of them
  // for a ring), writes the logits of its last position to decode_logits() row `slot` and sets
  // the slot's position to T. Other slots are untouched.
  void prefill(int slot, const int32_t* tokens, int T);
  // The same for k prompts at once, packed into one row of the training forward (its launches
  // paid once, not k times): segs[i] names prompt i's slot (all distinct) and length; `tokens`
  // (backend memory) holds the prompts one after another, and `layout` their positions (0, 1, …
  // per prompt) and segment ids (i for prompt i), so that no prompt attends to another. The
  // total is at most max_seq_len. k = 1 may leave `layout` empty (prefill() does).
  void prefill_packed(const PrefillSeg* segs, int k, const int32_t* tokens, TokenLayout layout);
  // One token for every slot of decode_rows(): decode_tokens() at decode_positions() →
  // decode_logits() (rows, Vp),
  // then positions += 1 (clamped to decode_context() − 1). Host-sync free, so a backend can
  // capture it (a CUDA graph) and replay it.
  void decode_step();
  int32_t* decode_tokens() { return dec_tokens_.data(); }
  int32_t* decode_positions() { return dec_pos_.data(); }
  Act decode_logits() { return dec_logits_.data(); }

  // ---- LoRA (model/lora.h; backends with adapter storage: the CPU's and the CUDA one's) -------
  static constexpr bool kLora = requires(Backend& b) { b.aw(int64_t{0}); };
  // Adds adapters (A from `seed` as AdapterTable::init draws it, B = 0) and freezes the base:
  // from now on gradients are the adapters' only (adapter_grads(); grads() is empty). Once.
  // (Defined here: clang 14 does not match an out-of-line definition with this constraint.)
  void attach_lora(const LoraConfig& lora, uint64_t seed)
    requires kLora
  {
    FORGE_CHECK(!adapter_, "attach_lora: the model has adapters already");
    adapter_.emplace(cfg_, lora);  // throws for GPT-2 or a bad configuration
    std::vector<float> a(adapter_->total());
    adapter_->init(a.data(), seed);
    be_.set_adapter(a, adapter_->params());
    B_ = T_ = 0;  // plan() again: the adapters need activation buffers
  }
  // nullptr without adapters.
  const AdapterTable* adapter_table() const { return adapter_ ? &*adapter_ : nullptr; }
  // Host backends; the CUDA backend has adapter_weights_host() / set_adapter_weights().
  auto& adapter_weights() requires(kLora && Backend::kHost) { return be_.adapter_weights(); }
  const auto& adapter_weights() const requires(kLora && Backend::kHost) { return be_.adapter_weights(); }
  auto& adapter_grads() requires(kLora && Backend::kHost) { return be_.adapter_grads(); }

  // ---- host conveniences (backends whose memory the host reads) -------------------------------
  // Mean loss over non-ignored targets (0 when all are ignored), no gradients. layout (host
  // memory): packed rows; positions are checked to be in [0, max_seq_len).
  double loss(const int32_t* tokens, const int32_t* targets, int B, int T_, TokenLayout layout = {})
    requires Backend::kHost;
  // The same, and gradients of scale · (mean loss) accumulated (+=) into grads().
  double loss_and_grad(const int32_t* tokens, const int32_t* targets, int B, int T_, double scale = 1.0,
                       TokenLayout layout = {})
    requires Backend::kHost;
  // logits (B, T, Vp) of host tokens, checked.
  const Real* logits_of(const int32_t* tokens, int B, int T_, TokenLayout layout = {})
    requires Backend::kHost;
  auto& weights() requires Backend::kHost { return be_.weights(); }
  const auto& weights() const requires Backend::kHost { return be_.weights(); }
  auto& grads() requires Backend::kHost { return be_.grads(); }
  const auto& grads() const requires Backend::kHost { return be_.grads(); }

 private:
  using ActBuf = typename Backend::ActBuf;
  using StatBuf = typename Backend::StatBuf;
  // One layer's activations, in four groups: x_in (always the layer's own); the norms (ln1, x_mid,
  // ln2 and their statistics: shared under recompute=full); the attention's (qkv .. atty: shared
  // under attn and full); the MLP's (fc, up, hidden: shared under mlp and full). lora_h stays the
  // layer's own at every level (r columns: small). Per layer and token, in elements (e bytes
  // each; statistics f32 on the GPU, the CPU's T), with A = NH·HS, K = NKV·HS:
  //   x_in C | norms 3C + 2 stats (GPT-2: 4) | attention GPT-2 3C + C, Llama A + 2K + A
  //   (+ qk_norm: A + K + NH + NKV stats) + the saved state (flash: NH log-sum-exps; the CPU
  //   also NH·T probabilities where small; unfused CUDA: NH·T probabilities) | MLP GPT-2 2FF,
  //   Llama 3FF.
  // So none keeps all four groups a layer, attn and mlp one group fewer, full C elements a token
  // a layer; the shared set (one layer's worth of what is shared) and, under full, one (B, T, C)
  // buffer of −0 (ln1_refwd) are allocated once. E.g. SmolLM2-135M (C 576, A 576, K 192,
  // FF 1536), elements a token a layer without statistics: none 8,448, attn 6,912, mlp 3,840,
  // full 576.
  struct LayerActs {
    ActBuf x_in;     // (B, T, C) residual stream entering the block
    ActBuf ln1;      // (B, T, C)
    StatBuf ln1_mean, ln1_rstd;  // (B, T)
    ActBuf qkv;      // gpt2: (B, T, 3C), read in place as q, k, v (strides 3C); llama with q|k|v
                     // fused: (B, T, (NH + 2·NKV)·HS), q and k after RoPE (qk_norm: before the
                     // head norm, which writes q, k) and v, read in place
    ActBuf q, k, v;  // llama unfused: (B, T, NH, HS), (B, T, NKV, HS) ×2, after RoPE; fused
                     // with qk_norm: q (B, T, QKV) holds q and k after the head norm at their
                     // q|k|v columns (v's unused: the attention's gradients take q's strides)
    ActBuf q_raw, k_raw;      // qk_norm unfused: the projections before the per-head RMSNorm
    StatBuf q_rstd, k_rstd;   // qk_norm: (B, T, NH), (B, T, NKV); fused q|k|v: q_rstd q's then k's
    typename Backend::AttnSaved att;  // what the attention backward needs (backend's choice)
    ActBuf atty;     // (B, T, NH·HS) attention output before the projection
    ActBuf x_mid;    // (B, T, C) residual stream after attention
    ActBuf ln2;
    StatBuf ln2_mean, ln2_rstd;
    ActBuf fc;       // gpt2: (B, T, FF) pre-GELU; llama: gate (B, T, FF), or gate|up (B, T, 2FF) fused
    ActBuf up;       // llama, gate and up not fused: (B, T, FF)
    ActBuf hidden;   // (B, T, FF) activation output (GELU or SwiGLU)
    std::array<ActBuf, kNumLoraTargets> lora_h;  // LoRA: x·Aᵀ (B, T, r) per targeted projection
  };
  struct QkvView {
    Act q, k, v;
    AttentionStrides st;
  };

  bool gpt2() const { return cfg_.family == Family::kGpt2; }
  // Columns of a fused q|k|v row (llama): NH·HS of q, then NKV·HS each of k and v.
  int qkv_width() const { return (cfg_.n_head + 2 * cfg_.n_kv_head) * cfg_.head_dim(); }
  // The q, k, v column slices of a fused (N, qkv_width()) buffer, all with its row stride.
  QkvView fused_slices(Act base) {
    const int64_t q_w = int64_t{cfg_.n_head} * cfg_.head_dim(), kv_w = int64_t{cfg_.n_kv_head} * cfg_.head_dim();
    const int64_t ld = qkv_width();
    return {base, be_.at(base, q_w), be_.at(base, q_w + kv_w), {ld, ld, ld, 0}};
  }
  AttentionShape attention_shape() const {
    return {B_, T_, cfg_.n_head, cfg_.n_kv_head, cfg_.head_dim(), true, cfg_.sliding_window};
  }
  void check_shape(int B, int T_) const;
  void plan(int B, int T_);
  void plan_logits(int N);
  QkvView qkv_view(LayerActs& a);
  QkvView dqkv_view();
  // Where layer l's groups live (LayerActs): its own set, or shared_ at a recompute level.
  bool full() const { return recompute_ == Recompute::kFull; }
  bool shares_attn() const { return full() || recompute_ == Recompute::kAttn; }
  bool shares_mlp() const { return full() || recompute_ == Recompute::kMlp; }
  LayerActs& norm_acts(int l) { return full() ? shared_ : acts_[l]; }
  LayerActs& attn_acts(int l) { return shares_attn() ? shared_ : acts_[l]; }
  LayerActs& mlp_acts(int l) { return shares_mlp() ? shared_ : acts_[l]; }
  void embed(const int32_t* tokens);
  // The block's forward in the pieces a recomputation re-runs: ln1 → atty (store_kv: a packed
  // prefill's keys and values to the cache too); atty → tmp_ → x_mid, ln2; ln2 → hidden.
  void attn_fwd(int l, bool store_kv);
  void attn_out_fwd(int l);
  void mlp_fwd(int l);
  // recompute=full: layer l's ln1 again from its x_in, by the op that made it in the forward.
  void ln1_refwd(int l);
  void blocks_forward();
  void block_backward(int l);
  void norm_fwd(Act out, Stat mean, Stat rstd, Act inp, int64_t w_off, int64_t b_off, int N);
  void residual_norm_fwd(Act res, Act out, Stat mean, Stat rstd, Act a, Act b, int64_t w_off, int64_t b_off, int N);
  void store_prefill_kv(int l, const QkvView& v);
  void decode_block_gpt2(int l);
  void decode_block_llama(int l);
  // Accumulates into dinp, the residual stream's gradient. res_bias_off (−1: none) is the bias of
  // the linear layer whose output gradient dinp is once this has added to it (the attention
  // output's after ln2, the previous block's MLP output after ln1 and ln_f): its gradient, Σ_rows
  // dinp, is taken here, in the norm's own pass on the GPU, instead of by that layer's backward.
  void norm_bwd(Act dinp, Act dout, Act inp, Stat mean, Stat rstd, int64_t w_off, int64_t b_off,
                int64_t res_bias_off);
  // The bias norm_bwd's res_bias_off names below layer l's ln1 (and for ln_f, l = n_layer):
  // layer l − 1's MLP output bias, −1 at the first layer or where it has none.
  int64_t mlp_out_bias_below(int l) const;
  // out += (alpha / r)·(inp·Aᵀ)·Bᵀ for layer l's projection t when it has an adapter; the
  // backward accumulates dA, dB and dinp (after the base product's backward wrote dinp).
  void lora_fwd(int l, LoraTarget t, Act out, Act inp);
  void lora_bwd(int l, LoraTarget t, Act dinp, Act dout, Act inp);
  bool frozen() const { return adapter_.has_value(); }
  WeightLayout layout() const { return gpt2() ? WeightLayout::kInOut : WeightLayout::kOutIn; }
  Act w(int64_t off) { return off >= 0 ? be_.w(off) : nullptr; }
  // A frozen base (LoRA) has no gradients: null tells each op to skip its weight gradient.
  typename Backend::Grad g(int64_t off) { return off >= 0 && !frozen() ? be_.g(off) : nullptr; }

  ModelConfig cfg_;
  ParamTable table_;
  Backend be_;
  std::function<void(int)> layer_grads_hook_;  // set_layer_grads_hook
  std::optional<AdapterTable> adapter_;  // LoRA: the adapters; the base is frozen
  ActBuf lora_dh_;                       // LoRA backward scratch (B, T, r)

  int B_ = 0, T_ = 0;
  int64_t plan_generation_ = 0;
  Recompute recompute_ = Recompute::kNone;
  size_t act_bytes_ = 0;
  const int32_t* tokens_ = nullptr;
  TokenLayout layout_;  // of the last forward
  bool have_head_grad_ = false;
  std::vector<LayerActs> acts_;
  LayerActs shared_;  // the groups a recompute level shares (norm_acts, attn_acts, mlp_acts)
  ActBuf neg_zero_;   // recompute=full: (B, T, C) of −0, the identity addend (ln1_refwd)
  ActBuf x_out_, lnf_;               // (B, T, C) after the last block; final norm
  StatBuf lnf_mean_, lnf_rstd_;      // (B, T)
  StatBuf losses_;                   // (B, T)
  ActBuf logits_;                    // (N, Vp) of forward_logits
  int logits_rows_ = 0;
  // Backward scratch, (B, T, ·); tmp_ also holds each block's projection outputs forward.
  ActBuf tmp_, d_res_, d_ln_, d_atty_, d_q_, d_k_, d_v_, d_qkv_, d_fc_, d_up_, d_hidden_;
  bool fused_gate_up_ = false;  // plan(): gate|up as one (N, 2·FF) product (mlp_fwd)
  bool fused_qkv_ = false;      // plan(): llama's q|k|v as one (N, (NH + 2·NKV)·HS) product
  std::vector<int32_t> host_targets_;  // host conveniences: the targets of the last loss()

  // Decoding (plan_decode): the cache per layer, (S, cap, NKV, HS) each, and one step's buffers.
  template <class U>
  using Buf = typename Backend::template Buf<U>;
  int S_ = 0, cap_ = 0, rows_ = 0;
  bool ring_ = false;
  std::vector<PrefillSeg> prefill_segs_;  // while prefill_packed() runs: blocks_forward stores k, v there
  std::vector<ActBuf> cache_k_, cache_v_;
  Buf<int32_t> dec_tokens_, dec_pos_;  // (S)
  ActBuf dec_x_, dec_mid_, dec_ln_, dec_tmp_;  // (S, C)
  StatBuf dec_mean_, dec_rstd_;                 // (S)
  ActBuf dec_qkv_;                               // (S, (NH + 2·NKV)·HS): q | k | v per row
  ActBuf dec_atty_;                              // (S, NH·HS)
  ActBuf dec_fc_, dec_hidden_;                   // (S, 2FF) scratch (gpt2: pre-GELU), (S, FF)
  ActBuf dec_logits_;                            // (S, Vp)
};

// The CPU model; T = double for the finite-difference checks.
template <typename T>
using Transformer = Model<CpuBackend<T>>;

extern template class Model<CpuBackend<float>>;
extern template class Model<CpuBackend<double>>;

}  // namespace forge
