// Forward and backward of both families, composed from the CPU ops in ops/*.h. The order of
// operations follows DESIGN.md's "one training step"; the backward walks it in reverse, every
// op's *_bwd accumulating into gradient buffers that are zeroed right before use.
#include "forge/model/transformer.h"

#include <algorithm>

#include "forge/core/error.h"
#include "forge/ops/activation.h"
#include "forge/ops/attention.h"
#include "forge/ops/cross_entropy.h"
#include "forge/ops/embedding.h"
#include "forge/ops/layernorm.h"
#include "forge/ops/linear.h"
#include "forge/ops/rmsnorm.h"
#include "forge/ops/rope.h"

namespace forge {


namespace {

template <typename T>
void zero(std::vector<T>& v) {
  std::fill(v.begin(), v.end(), T(0));
}

}  // namespace

template <typename T>
Transformer<T>::Transformer(const ModelConfig& cfg)
    : cfg_(cfg), table_(cfg), weights_(table_.total()), grads_(table_.total()) {}

template <typename T>
void Transformer<T>::init_weights(uint64_t seed) {
  std::vector<float> w(table_.total());
  table_.init(w.data(), seed);
  std::copy(w.begin(), w.end(), weights_.begin());
}

template <typename T>
void Transformer<T>::zero_grad() {
  zero(grads_);
}

template <typename T>
void Transformer<T>::plan(int B, int T_) {
  if (B == B_ && T_ == this->T_) return;
  B_ = B;
  this->T_ = T_;
  const size_t N = static_cast<size_t>(B) * T_;
  const size_t C = cfg_.n_embd, FF = cfg_.ffn_hidden, HS = cfg_.head_dim();
  const size_t NH = cfg_.n_head, NKV = cfg_.n_kv_head, Vp = cfg_.padded_vocab();
  const bool gpt2 = cfg_.family == Family::kGpt2;
  acts_.assign(cfg_.n_layer, LayerActs{});
  for (auto& a : acts_) {
    a.x_in.resize(N * C);
    a.ln1.resize(N * C);
    a.ln1_mean.resize(N);
    a.ln1_rstd.resize(N);
    a.q.resize(N * NH * HS);
    a.k.resize(N * NKV * HS);
    a.v.resize(N * NKV * HS);
    a.att.resize(static_cast<size_t>(B) * NH * T_ * T_);
    a.atty.resize(N * NH * HS);
    a.x_mid.resize(N * C);
    a.ln2.resize(N * C);
    a.ln2_mean.resize(N);
    a.ln2_rstd.resize(N);
    a.fc.resize(N * FF);
    if (!gpt2) a.up.resize(N * FF);
    a.hidden.resize(N * FF);
  }
  x_out_.resize(N * C);
  lnf_.resize(N * C);
  lnf_mean_.resize(N);
  lnf_rstd_.resize(N);
  logits_.resize(N * Vp);
  losses_.resize(N);
  d_ln_.resize(N * C);
  d_atty_.resize(N * NH * HS);
  d_q_.resize(N * NH * HS);
  d_k_.resize(N * NKV * HS);
  d_v_.resize(N * NKV * HS);
  if (gpt2) d_qkv_.resize(N * 3 * C);
  d_fc_.resize(N * FF);
  if (!gpt2) d_up_.resize(N * FF);
  d_hidden_.resize(N * FF);
  tmp_.resize(N * std::max<size_t>(3 * C, C));
}

// Final and per-block normalisation: LayerNorm (gpt2) or RMSNorm (llama).
#define FORGE_NORM_FWD(out, mean, rstd, inp, w_off, b_off)                                       \
  (gpt2 ? cpu::layernorm_fwd<T>(out, mean, rstd, inp, W + (w_off), W + (b_off), N, C, cfg_.norm_eps) \
        : cpu::rmsnorm_fwd<T>(out, rstd, inp, W + (w_off), N, C, cfg_.norm_eps))
#define FORGE_NORM_BWD(dinp, dout, inp, mean, rstd, w_off, b_off)                                   \
  (gpt2 ? cpu::layernorm_bwd<T>(dinp, G + (w_off), G + (b_off), dout, inp, W + (w_off), mean, rstd, \
                                N, C)                                                               \
        : cpu::rmsnorm_bwd<T>(dinp, G + (w_off), dout, inp, W + (w_off), rstd, N, C))

template <typename T>
void Transformer<T>::attention_forward(int l, const T* x, int B, int T_) {
  const bool gpt2 = cfg_.family == Family::kGpt2;
  const int N = B * T_, C = cfg_.n_embd, NH = cfg_.n_head, NKV = cfg_.n_kv_head;
  const int HS = cfg_.head_dim();
  const T* W = weights_.data();
  const LayerOffsets& o = table_.layer(l);
  LayerActs& a = acts_[l];
  FORGE_NORM_FWD(a.ln1.data(), a.ln1_mean.data(), a.ln1_rstd.data(), x, o.ln1_w, o.ln1_b);
  if (gpt2) {
    // c_attn: (N, C) · (C, 3C) → tmp (N, 3C), then split into q, k, v (N, C) each.
    cpu::linear_fwd<T>(tmp_.data(), a.ln1.data(), W + o.qkv_w, W + o.qkv_b, N, C, 3 * C,
                       WeightLayout::kInOut);
    for (int n = 0; n < N; ++n) {
      const T* row = tmp_.data() + static_cast<size_t>(n) * 3 * C;
      std::copy(row, row + C, a.q.data() + static_cast<size_t>(n) * C);
      std::copy(row + C, row + 2 * C, a.k.data() + static_cast<size_t>(n) * C);
      std::copy(row + 2 * C, row + 3 * C, a.v.data() + static_cast<size_t>(n) * C);
    }
  } else {
    cpu::linear_fwd<T>(a.q.data(), a.ln1.data(), W + o.q_w, nullptr, N, C, NH * HS, WeightLayout::kOutIn);
    cpu::linear_fwd<T>(a.k.data(), a.ln1.data(), W + o.k_w, nullptr, N, C, NKV * HS, WeightLayout::kOutIn);
    cpu::linear_fwd<T>(a.v.data(), a.ln1.data(), W + o.v_w, nullptr, N, C, NKV * HS, WeightLayout::kOutIn);
    cpu::rope_fwd<T>(a.q.data(), B, T_, NH, HS, cfg_.rope_theta, cfg_.rope_style);
    cpu::rope_fwd<T>(a.k.data(), B, T_, NKV, HS, cfg_.rope_theta, cfg_.rope_style);
  }
  const AttentionShape shape{B, T_, NH, NKV, HS, true, cfg_.sliding_window};
  cpu::attention_fwd<T>(a.atty.data(), a.att.data(), a.q.data(), a.k.data(), a.v.data(), shape);
  if (gpt2)
    cpu::linear_fwd<T>(tmp_.data(), a.atty.data(), W + o.attn_out_w, W + o.attn_out_b, N, C, C,
                       WeightLayout::kInOut);
  else
    cpu::linear_fwd<T>(tmp_.data(), a.atty.data(), W + o.attn_out_w, nullptr, N, NH * HS, C,
                       WeightLayout::kOutIn);
  cpu::residual_fwd<T>(a.x_mid.data(), x, tmp_.data(), static_cast<int64_t>(N) * C);
}

template <typename T>
void Transformer<T>::mlp_forward(int l, int B, int T_) {
  const bool gpt2 = cfg_.family == Family::kGpt2;
  const int N = B * T_, C = cfg_.n_embd, FF = cfg_.ffn_hidden;
  const T* W = weights_.data();
  const LayerOffsets& o = table_.layer(l);
  LayerActs& a = acts_[l];
  FORGE_NORM_FWD(a.ln2.data(), a.ln2_mean.data(), a.ln2_rstd.data(), a.x_mid.data(), o.ln2_w, o.ln2_b);
  const int64_t nff = static_cast<int64_t>(N) * FF;
  if (gpt2) {
    cpu::linear_fwd<T>(a.fc.data(), a.ln2.data(), W + o.fc_w, W + o.fc_b, N, C, FF, WeightLayout::kInOut);
    cpu::gelu_fwd<T>(a.hidden.data(), a.fc.data(), nff);
    cpu::linear_fwd<T>(tmp_.data(), a.hidden.data(), W + o.down_w, W + o.down_b, N, FF, C, WeightLayout::kInOut);
  } else {
    cpu::linear_fwd<T>(a.fc.data(), a.ln2.data(), W + o.gate_w, nullptr, N, C, FF, WeightLayout::kOutIn);
    cpu::linear_fwd<T>(a.up.data(), a.ln2.data(), W + o.up_w, nullptr, N, C, FF, WeightLayout::kOutIn);
    cpu::swiglu_fwd<T>(a.hidden.data(), a.fc.data(), a.up.data(), nff);
    cpu::linear_fwd<T>(tmp_.data(), a.hidden.data(), W + o.down_w, nullptr, N, FF, C, WeightLayout::kOutIn);
  }
  T* out = (l + 1 < cfg_.n_layer) ? acts_[l + 1].x_in.data() : x_out_.data();
  cpu::residual_fwd<T>(out, a.x_mid.data(), tmp_.data(), static_cast<int64_t>(N) * C);
}

template <typename T>
double Transformer<T>::forward(const int32_t* tokens, const int32_t* targets, int B, int T_) {
  if (B <= 0 || T_ <= 0) throw Error(str("[forward] empty batch (B=", B, ", T=", T_, ")"));
  if (T_ > cfg_.max_seq_len)
    throw Error(str("[forward] sequence length ", T_, " exceeds the model's max_seq_len ", cfg_.max_seq_len));
  const int64_t N = static_cast<int64_t>(B) * T_;
  for (int64_t i = 0; i < N; ++i) {
    if (tokens[i] < 0 || tokens[i] >= cfg_.vocab_size)
      throw Error(str("token id ", tokens[i], " at position ", i, " is out of range [0, ", cfg_.vocab_size, ")"));
    if (targets && (targets[i] < -1 || targets[i] >= cfg_.vocab_size))
      throw Error(str("target id ", targets[i], " at position ", i, " is out of range [0, ", cfg_.vocab_size, ")"));
  }
  plan(B, T_);
  const bool gpt2 = cfg_.family == Family::kGpt2;
  const int C = cfg_.n_embd, Vp = cfg_.padded_vocab();
  const T* W = weights_.data();
  tokens_.assign(tokens, tokens + N);
  have_targets_ = targets != nullptr;
  if (have_targets_) targets_.assign(targets, targets + N);

  cpu::embedding_fwd<T>(acts_[0].x_in.data(), tokens, W + table_.wte(), gpt2 ? W + table_.wpe() : nullptr, B, T_, C);
  for (int l = 0; l < cfg_.n_layer; ++l) {
    attention_forward(l, acts_[l].x_in.data(), B, T_);
    mlp_forward(l, B, T_);
  }
  FORGE_NORM_FWD(lnf_.data(), lnf_mean_.data(), lnf_rstd_.data(), x_out_.data(), table_.lnf_w(), table_.lnf_b());
  cpu::linear_fwd<T>(logits_.data(), lnf_.data(), W + table_.lm_head(), nullptr, static_cast<int>(N), C, Vp,
                     WeightLayout::kOutIn);
  if (!have_targets_) return 0.0;
  cpu::cross_entropy_fwd<T>(losses_.data(), logits_.data(), targets, static_cast<int>(N), cfg_.vocab_size, Vp);
  double sum = 0;
  loss_count_ = 0;
  for (int64_t i = 0; i < N; ++i) {
    if (targets[i] < 0) continue;
    sum += static_cast<double>(losses_[i]);
    ++loss_count_;
  }
  return loss_count_ > 0 ? sum / static_cast<double>(loss_count_) : 0.0;
}

template <typename T>
void Transformer<T>::block_backward(int l, std::vector<T>& dres, int B, int T_) {
  const bool gpt2 = cfg_.family == Family::kGpt2;
  const int N = B * T_, C = cfg_.n_embd, FF = cfg_.ffn_hidden, NH = cfg_.n_head;
  const int NKV = cfg_.n_kv_head, HS = cfg_.head_dim();
  const T* W = weights_.data();
  T* G = grads_.data();
  const LayerOffsets& o = table_.layer(l);
  LayerActs& a = acts_[l];
  const int64_t nff = static_cast<int64_t>(N) * FF;

  // MLP: dres is d(block output) = d(x_mid) through the residual + d(mlp output).
  zero(d_hidden_);
  zero(d_ln_);
  if (gpt2) {
    cpu::linear_bwd<T>(d_hidden_.data(), G + o.down_w, G + o.down_b, dres.data(), a.hidden.data(), W + o.down_w, N, FF, C, WeightLayout::kInOut);
    zero(d_fc_);
    cpu::gelu_bwd<T>(d_fc_.data(), a.fc.data(), d_hidden_.data(), nff);
    cpu::linear_bwd<T>(d_ln_.data(), G + o.fc_w, G + o.fc_b, d_fc_.data(), a.ln2.data(), W + o.fc_w, N, C, FF, WeightLayout::kInOut);
  } else {
    cpu::linear_bwd<T>(d_hidden_.data(), G + o.down_w, nullptr, dres.data(), a.hidden.data(), W + o.down_w, N, FF, C, WeightLayout::kOutIn);
    zero(d_fc_);
    zero(d_up_);
    cpu::swiglu_bwd<T>(d_fc_.data(), d_up_.data(), d_hidden_.data(), a.fc.data(), a.up.data(), nff);
    cpu::linear_bwd<T>(d_ln_.data(), G + o.gate_w, nullptr, d_fc_.data(), a.ln2.data(), W + o.gate_w, N, C, FF, WeightLayout::kOutIn);
    cpu::linear_bwd<T>(d_ln_.data(), G + o.up_w, nullptr, d_up_.data(), a.ln2.data(), W + o.up_w, N, C, FF, WeightLayout::kOutIn);
  }
  FORGE_NORM_BWD(dres.data(), d_ln_.data(), a.x_mid.data(), a.ln2_mean.data(), a.ln2_rstd.data(), o.ln2_w, o.ln2_b);

  // Attention: dres is now d(x_mid) = d(x_in) through the residual + d(attention output).
  zero(d_atty_);
  if (gpt2)
    cpu::linear_bwd<T>(d_atty_.data(), G + o.attn_out_w, G + o.attn_out_b, dres.data(), a.atty.data(), W + o.attn_out_w, N, C, C, WeightLayout::kInOut);
  else
    cpu::linear_bwd<T>(d_atty_.data(), G + o.attn_out_w, nullptr, dres.data(), a.atty.data(), W + o.attn_out_w, N, NH * HS, C, WeightLayout::kOutIn);
  zero(d_q_);
  zero(d_k_);
  zero(d_v_);
  const AttentionShape shape{B, T_, NH, NKV, HS, true, cfg_.sliding_window};
  cpu::attention_bwd<T>(d_q_.data(), d_k_.data(), d_v_.data(), d_atty_.data(), a.q.data(), a.k.data(), a.v.data(), a.att.data(), shape);
  zero(d_ln_);
  if (gpt2) {
    for (int n = 0; n < N; ++n) {
      T* row = d_qkv_.data() + static_cast<size_t>(n) * 3 * C;
      std::copy_n(d_q_.data() + static_cast<size_t>(n) * C, C, row);
      std::copy_n(d_k_.data() + static_cast<size_t>(n) * C, C, row + C);
      std::copy_n(d_v_.data() + static_cast<size_t>(n) * C, C, row + 2 * C);
    }
    cpu::linear_bwd<T>(d_ln_.data(), G + o.qkv_w, G + o.qkv_b, d_qkv_.data(), a.ln1.data(), W + o.qkv_w, N, C, 3 * C, WeightLayout::kInOut);
  } else {
    cpu::rope_bwd<T>(d_q_.data(), B, T_, NH, HS, cfg_.rope_theta, cfg_.rope_style);
    cpu::rope_bwd<T>(d_k_.data(), B, T_, NKV, HS, cfg_.rope_theta, cfg_.rope_style);
    cpu::linear_bwd<T>(d_ln_.data(), G + o.q_w, nullptr, d_q_.data(), a.ln1.data(), W + o.q_w, N, C, NH * HS, WeightLayout::kOutIn);
    cpu::linear_bwd<T>(d_ln_.data(), G + o.k_w, nullptr, d_k_.data(), a.ln1.data(), W + o.k_w, N, C, NKV * HS, WeightLayout::kOutIn);
    cpu::linear_bwd<T>(d_ln_.data(), G + o.v_w, nullptr, d_v_.data(), a.ln1.data(), W + o.v_w, N, C, NKV * HS, WeightLayout::kOutIn);
  }
  FORGE_NORM_BWD(dres.data(), d_ln_.data(), a.x_in.data(), a.ln1_mean.data(), a.ln1_rstd.data(), o.ln1_w, o.ln1_b);
}

template <typename T>
void Transformer<T>::backward(double scale) {
  FORGE_CHECK(have_targets_, "backward() needs a forward() with targets");
  const bool gpt2 = cfg_.family == Family::kGpt2;
  const int B = B_, T_ = this->T_, N = B * T_, C = cfg_.n_embd, Vp = cfg_.padded_vocab();
  const T* W = weights_.data();
  T* G = grads_.data();
  if (loss_count_ == 0) return;  // every target ignored: the loss is constant
  const T dloss = static_cast<T>(scale / static_cast<double>(loss_count_));
  // Gradient of the loss with respect to the logits, written over the logits.
  cpu::cross_entropy_bwd<T>(logits_.data(), logits_.data(), targets_.data(), dloss, N, cfg_.vocab_size, Vp);
  zero(d_ln_);
  cpu::linear_bwd<T>(d_ln_.data(), G + table_.lm_head(), nullptr, logits_.data(), lnf_.data(), W + table_.lm_head(), N, C, Vp, WeightLayout::kOutIn);
  std::vector<T>& dres = tmp_;  // d(residual stream), (N, C): tmp_ is free during backward
  std::fill_n(dres.begin(), static_cast<size_t>(N) * C, T(0));
  FORGE_NORM_BWD(dres.data(), d_ln_.data(), x_out_.data(), lnf_mean_.data(), lnf_rstd_.data(), table_.lnf_w(), table_.lnf_b());
  for (int l = cfg_.n_layer - 1; l >= 0; --l) block_backward(l, dres, B, T_);
  cpu::embedding_bwd<T>(G + table_.wte(), gpt2 ? G + table_.wpe() : nullptr, dres.data(), tokens_.data(), B, T_, C);
}

#undef FORGE_NORM_FWD
#undef FORGE_NORM_BWD

template class Transformer<float>;
template class Transformer<double>;

}  // namespace forge
