// Model<Backend>'s forward and backward, the one copy of the layer orchestration: included by
// transformer.cpp (CPU backends) and transformer_cuda.cpp (the CUDA backend), which instantiate
// it. The order of operations follows DESIGN.md's "one training step"; the backward walks it in
// reverse.
//
// Per block, forward:
//   ln1 (layer 0 only: later layers get it from the previous block's fused residual + norm)
//   → q, k, v (GPT-2: one (N, 3C) product read in place with strides; Llama: three products and
//   RoPE) → attention → output projection → residual + ln2 (one fused op) → MLP (GPT-2: product
//   with the GELU fused, down projection; Llama: gate, up, SwiGLU, down) → residual + the next
//   block's ln1 (or the final norm). Then the LM head fused with the loss.
// LoRA: after each targeted projection's base product, lora_fwd adds the adapter's update; in
// the backward lora_bwd follows the base product's backward (which wrote or accumulated dinp)
// and accumulates into dinp. A frozen base passes null gradients (g()) to every op.
// Backward: gradient buffers are overwritten by the first product into them (no memset) and
// accumulated after; every norm backward accumulates into d_res_, the residual stream's gradient.
// Recomputation (model/recompute.h): the forward of a block is attn_fwd (ln1 → atty), attn_out_fwd
// (→ x_mid, ln2) and mlp_fwd (→ hidden), and block_backward(l) re-runs the ones whose outputs the
// level shares (full: ln1 too, ln1_refwd) into the shared set: the same ops, the same inputs.
#pragma once

#include <algorithm>

#include "forge/core/error.h"
#include "forge/model/transformer.h"

namespace forge {

template <class B>
void Model<B>::init_weights(uint64_t seed) {
  std::vector<float> w(table_.total());
  table_.init(w.data(), seed);
  be_.set_weights(w);
}

template <class B>
void Model<B>::lora_fwd(int l, LoraTarget t, Act out, Act inp) {
  if constexpr (kLora) {
    if (!adapter_) return;
    const LoraSlot& s = adapter_->slot(l, t);
    if (s.a < 0) return;
    be_.lora_fwd(out, acts_[l].lora_h[static_cast<int>(t)].data(), inp, be_.aw(s.a), be_.aw(s.b), B_ * T_, s.in,
                 s.out, adapter_->lora().r, adapter_->lora().scale());
  }
}

template <class B>
void Model<B>::lora_bwd(int l, LoraTarget t, Act dinp, Act dout, Act inp) {
  if constexpr (kLora) {
    if (!adapter_) return;
    const LoraSlot& s = adapter_->slot(l, t);
    if (s.a < 0) return;
    be_.lora_bwd(dinp, be_.ag(s.a), be_.ag(s.b), lora_dh_.data(), dout, inp,
                 acts_[l].lora_h[static_cast<int>(t)].data(), be_.aw(s.a), be_.aw(s.b), B_ * T_, s.in, s.out,
                 adapter_->lora().r, adapter_->lora().scale());
  }
}

template <class B>
void Model<B>::check_shape(int Bn, int Tn) const {
  if (Bn <= 0 || Tn <= 0) throw Error(str("[forward] empty batch (B=", Bn, ", T=", Tn, ")"));
  if (Tn > cfg_.max_seq_len)
    throw Error(str("[forward] sequence length ", Tn, " exceeds the model's max_seq_len ", cfg_.max_seq_len));
}

namespace detail {

// Bytes of a backend buffer (std::vector on the CPU, DeviceBuffer on the GPU) and of the
// attention's saved state (the CPU's lse and probs, the GPU's lse or att).
template <class Buf>
size_t buf_bytes(const Buf& b) {
  return b.size() * sizeof(*b.data());
}
template <class Saved>
size_t saved_bytes(const Saved& s) {
  size_t n = buf_bytes(s.lse);
  if constexpr (requires { s.probs; }) n += buf_bytes(s.probs);
  if constexpr (requires { s.att; }) n += buf_bytes(s.att);
  return n;
}

}  // namespace detail

template <class B>
void Model<B>::plan(int Bn, int Tn) {
  if (Bn == B_ && Tn == T_) return;
  ++plan_generation_;
  be_.synchronize();  // the buffers below may be in use by enqueued work of the old shape
  B_ = Bn;
  T_ = Tn;
  const size_t N = static_cast<size_t>(Bn) * Tn, C = cfg_.n_embd, FF = cfg_.ffn_hidden;
  const size_t HS = cfg_.head_dim(), NH = cfg_.n_head, NKV = cfg_.n_kv_head;
  const AttentionShape shape = attention_shape();
  act_bytes_ = 0;
  auto act = [&](size_t n) {
    ActBuf b = be_.act_buf(n);
    act_bytes_ += detail::buf_bytes(b);
    return b;
  };
  auto stat = [&](size_t n) {
    StatBuf b = be_.stat_buf(n);
    act_bytes_ += detail::buf_bytes(b);
    return b;
  };
  // The groups of LayerActs (transformer.h), each allocated per layer or once in shared_.
  auto norms = [&](LayerActs& a) {
    a.ln1 = act(N * C);
    if (gpt2()) a.ln1_mean = stat(N);
    a.ln1_rstd = stat(N);
    a.x_mid = act(N * C);
    a.ln2 = act(N * C);
    if (gpt2()) a.ln2_mean = stat(N);
    a.ln2_rstd = stat(N);
  };
  // The Llama family's q, k, v as one (N, QKV) product where the backend does so (the weights,
  // and the biases, are contiguous rows: params.cpp); LoRA's q/k/v adapters add into separate
  // outputs, so a model with adapters keeps three products.
  fused_qkv_ = !gpt2() && !adapter_ && be_.fuses_qkv();
  const size_t QKV = qkv_width();
  for (int l = 0; fused_qkv_ && l < cfg_.n_layer; ++l) {
    const LayerOffsets& o = table_.layer(l);
    const auto q_rows = static_cast<int64_t>(NH * HS), kv_rows = static_cast<int64_t>(NKV * HS);
    FORGE_CHECK(o.k_w == o.q_w + q_rows * static_cast<int64_t>(C) && o.v_w == o.k_w + kv_rows * static_cast<int64_t>(C) &&
                    (o.q_b < 0 || (o.k_b == o.q_b + q_rows && o.v_b == o.k_b + kv_rows)),
                "fused q|k|v needs k_proj's and v_proj's rows (and biases) right after q_proj's (layer ", l, ")");
    FORGE_CHECK(o.q_norm_w < 0 || o.k_norm_w == o.q_norm_w + static_cast<int64_t>(HS),
                "fused q|k|v needs k_norm's gain right after q_norm's (layer ", l, ")");
  }
  auto attention = [&](LayerActs& a) {
    if (gpt2()) {
      a.qkv = act(N * 3 * C);
    } else if (fused_qkv_) {
      a.qkv = act(N * QKV);
      if (cfg_.qk_norm) {  // one head norm + RoPE over q's and k's heads: rstd q's, then k's
        a.q = act(N * QKV);
        a.q_rstd = stat(N * (NH + NKV));
      }
    } else {
      a.q = act(N * NH * HS);
      a.k = act(N * NKV * HS);
      a.v = act(N * NKV * HS);
      if (cfg_.qk_norm) {
        a.q_raw = act(N * NH * HS);
        a.k_raw = act(N * NKV * HS);
        a.q_rstd = stat(N * NH);
        a.k_rstd = stat(N * NKV);
      }
    }
    a.att = be_.attention_saved(shape);
    act_bytes_ += detail::saved_bytes(a.att);
    a.atty = act(N * NH * HS);
  };
  // The Llama family's gate and up as one (N, 2·FF) product where the backend does so (fc holds
  // each row's gate, then its up; up stays empty); LoRA's gate/up adapters add into separate
  // outputs, so a model with adapters keeps two products.
  fused_gate_up_ = !gpt2() && !adapter_ && be_.fuses_gate_up();
  const size_t fc_width = fused_gate_up_ ? 2 * FF : FF;
  for (int l = 0; fused_gate_up_ && l < cfg_.n_layer; ++l)
    FORGE_CHECK(table_.layer(l).up_w == table_.layer(l).gate_w + static_cast<int64_t>(FF * C),
                "fused gate|up needs up_proj's rows right after gate_proj's (layer ", l, ")");
  auto mlp = [&](LayerActs& a) {
    a.fc = act(N * fc_width);
    if (!gpt2() && !fused_gate_up_) a.up = act(N * FF);
    a.hidden = act(N * FF);
  };
  acts_.clear();
  shared_ = LayerActs{};
  neg_zero_ = ActBuf{};
  acts_.resize(cfg_.n_layer);
  for (LayerActs& a : acts_) {
    a.x_in = act(N * C);
    if (!full()) norms(a);
    if (!shares_attn()) attention(a);
    if (!shares_mlp()) mlp(a);
    if (adapter_)
      for (int t = 0; t < kNumLoraTargets; ++t)
        if (adapter_->lora().targets_has(static_cast<LoraTarget>(t)))
          a.lora_h[t] = act(N * adapter_->lora().r);
  }
  if (full()) {
    norms(shared_);
    neg_zero_ = act(N * C);
    be_.fill_negative_zero(neg_zero_.data(), N * C);
  }
  if (shares_attn()) attention(shared_);
  if (shares_mlp()) mlp(shared_);
  if (adapter_) lora_dh_ = act(N * adapter_->lora().r);
  x_out_ = act(N * C);
  lnf_ = act(N * C);
  if (gpt2()) lnf_mean_ = stat(N);
  lnf_rstd_ = stat(N);
  losses_ = stat(N);
  tmp_ = act(N * C);
  d_res_ = act(N * C);
  d_ln_ = act(N * C);
  d_atty_ = act(N * NH * HS);
  if (gpt2() || fused_qkv_) {  // the attention backward writes into the fused gradient in place
    d_qkv_ = act(N * (gpt2() ? 3 * C : QKV));
  } else {
    d_q_ = act(N * NH * HS);
    d_k_ = act(N * NKV * HS);
    d_v_ = act(N * NKV * HS);
  }
  d_fc_ = act(N * fc_width);
  if (!gpt2() && !fused_gate_up_) d_up_ = act(N * FF);
  if (!gpt2() || !be_.fuses_gelu()) d_hidden_ = act(N * FF);  // a fused DGELU needs none
  be_.plan_attention(shape);
}

template <class B>
void Model<B>::plan_logits(int N) {
  if (N <= logits_rows_) return;
  be_.synchronize();
  logits_ = be_.act_buf(static_cast<size_t>(N) * cfg_.padded_vocab());
  logits_rows_ = N;
}

// Where a layer's q, k, v live: column slices of a fused (N, 3C) or (N, QKV) projection (under
// qk_norm q and k are the head norm's outputs at the same columns of a second (N, QKV) buffer),
// or three dense buffers. The gradients mirror them, all three slices of the fused gradient.
template <class B>
typename Model<B>::QkvView Model<B>::qkv_view(LayerActs& a) {
  if (gpt2()) {
    const int64_t C = cfg_.n_embd;
    Act base = a.qkv.data();
    return {base, be_.at(base, C), be_.at(base, 2 * C), {3 * C, 3 * C, 3 * C, 0}};
  }
  if (fused_qkv_) {
    QkvView s = fused_slices(a.qkv.data());
    if (cfg_.qk_norm) {  // q, k after the head norm, at the same columns of a.q
      const QkvView normed = fused_slices(a.q.data());
      s.q = normed.q, s.k = normed.k;
    }
    return s;
  }
  return {a.q.data(), a.k.data(), a.v.data(), {}};
}

template <class B>
typename Model<B>::QkvView Model<B>::dqkv_view() {
  if (gpt2()) {
    const int64_t C = cfg_.n_embd;
    Act base = d_qkv_.data();
    return {base, be_.at(base, C), be_.at(base, 2 * C), {3 * C, 3 * C, 3 * C, 0}};
  }
  if (fused_qkv_) return fused_slices(d_qkv_.data());
  return {d_q_.data(), d_k_.data(), d_v_.data(), {}};
}

// Normalisation: LayerNorm (GPT-2) or RMSNorm (Llama).
template <class B>
void Model<B>::norm_fwd(Act out, Stat mean, Stat rstd, Act inp, int64_t w_off, int64_t b_off, int N) {
  const int C = cfg_.n_embd;
  if (gpt2()) be_.layernorm_fwd(out, mean, rstd, inp, w(w_off), w(b_off), N, C, cfg_.norm_eps);
  else be_.rmsnorm_fwd(out, rstd, inp, w(w_off), N, C, cfg_.norm_eps);
}

// res = a + b, then out = norm(res), in one op. Its backward needs no counterpart: the add's is
// the identity and norm_bwd accumulates into the residual stream's gradient.
template <class B>
void Model<B>::residual_norm_fwd(Act res, Act out, Stat mean, Stat rstd, Act a, Act b, int64_t w_off,
                                 int64_t b_off, int N) {
  const int C = cfg_.n_embd;
  if (gpt2()) be_.residual_layernorm_fwd(res, out, mean, rstd, a, b, w(w_off), w(b_off), N, C, cfg_.norm_eps);
  else be_.residual_rmsnorm_fwd(res, out, rstd, a, b, w(w_off), N, C, cfg_.norm_eps);
}

template <class B>
void Model<B>::norm_bwd(Act dinp, Act dout, Act inp, Stat mean, Stat rstd, int64_t w_off, int64_t b_off,
                        int64_t res_bias_off) {
  const int N = B_ * T_, C = cfg_.n_embd;
  if (gpt2()) be_.layernorm_bwd(dinp, g(w_off), g(b_off), dout, inp, w(w_off), mean, rstd, N, C, g(res_bias_off));
  else be_.rmsnorm_bwd(dinp, g(w_off), dout, inp, w(w_off), rstd, N, C, g(res_bias_off));
}

// Only GPT-2's MLP has an output bias (the Llama families' down projection never does).
template <class B>
int64_t Model<B>::mlp_out_bias_below(int l) const {
  return l > 0 && gpt2() ? table_.layer(l - 1).down_b : -1;
}

template <class B>
void Model<B>::embed(const int32_t* tokens) {
  tokens_ = tokens;
  be_.embedding_fwd(acts_[0].x_in.data(), tokens, w(table_.wte()), w(table_.wpe()), B_, T_, cfg_.n_embd,
                    layout_.pos);
}

// Layer l's attention, from its ln1 to atty.
template <class B>
void Model<B>::attn_fwd(int l, bool store_kv) {
  const int N = B_ * T_, C = cfg_.n_embd, NH = cfg_.n_head, NKV = cfg_.n_kv_head, HS = cfg_.head_dim();
  const WeightLayout lay = layout();
  const LayerOffsets& o = table_.layer(l);
  const Act ln1 = norm_acts(l).ln1.data();
  LayerActs& a = attn_acts(l);
  const Rope rope = cfg_.rope();
  const Rope* rope_l = cfg_.layer_uses_rope(l) ? &rope : nullptr;  // SmolLM3's NoPE layers: none
  if (gpt2()) {
    be_.linear_fwd(a.qkv.data(), ln1, w(o.qkv_w), w(o.qkv_b), N, C, 3 * C, lay);
  } else if (fused_qkv_) {  // one product over the contiguous q|k|v weights (and biases)
    const int QKV = qkv_width();
    const QkvView raw = fused_slices(a.qkv.data());
    be_.linear_fwd(raw.q, ln1, w(o.q_w), w(o.q_b), N, C, QKV, lay);
    if (cfg_.qk_norm) {  // q, k: the head norm + RoPE of the fused row's slices, into a.q's;
      // q's NH heads and k's NKV adjacent, their gains too (q_norm's then k_norm's): one call
      const QkvView normed = fused_slices(a.q.data());
      be_.head_norm_rope_fwd(normed.q, a.q_rstd.data(), raw.q, w(o.q_norm_w), B_, T_, NH + NKV, HS, cfg_.norm_eps,
                             rope_l, layout_.pos, QKV, NH);
    } else if (rope_l) {  // q's and k's heads are adjacent in the row: one pass over NH + NKV
      be_.rope_fwd(raw.q, B_, T_, NH + NKV, HS, rope, layout_.pos, QKV);
    }
  } else {
    // qk_norm (Qwen3): the projections land in q_raw / k_raw, and one op writes q / k as the
    // RMSNorm over each head (N·NH rows of HS) followed by RoPE.
    const bool qkn = cfg_.qk_norm;
    Act q = qkn ? a.q_raw.data() : a.q.data(), k = qkn ? a.k_raw.data() : a.k.data();
    be_.linear_fwd(q, ln1, w(o.q_w), w(o.q_b), N, C, NH * HS, lay);
    lora_fwd(l, LoraTarget::kQ, q, ln1);
    be_.linear_fwd(k, ln1, w(o.k_w), w(o.k_b), N, C, NKV * HS, lay);
    lora_fwd(l, LoraTarget::kK, k, ln1);
    be_.linear_fwd(a.v.data(), ln1, w(o.v_w), w(o.v_b), N, C, NKV * HS, lay);
    lora_fwd(l, LoraTarget::kV, a.v.data(), ln1);
    if (qkn) {
      be_.head_norm_rope_fwd(a.q.data(), a.q_rstd.data(), a.q_raw.data(), w(o.q_norm_w), B_, T_, NH, HS,
                             cfg_.norm_eps, rope_l, layout_.pos, 0);
      be_.head_norm_rope_fwd(a.k.data(), a.k_rstd.data(), a.k_raw.data(), w(o.k_norm_w), B_, T_, NKV, HS,
                             cfg_.norm_eps, rope_l, layout_.pos, 0);
    } else if (rope_l) {
      be_.rope_fwd(a.q.data(), B_, T_, NH, HS, rope, layout_.pos, 0);
      be_.rope_fwd(a.k.data(), B_, T_, NKV, HS, rope, layout_.pos, 0);
    }
  }
  const QkvView in = qkv_view(a);
  if (store_kv) store_prefill_kv(l, in);
  be_.attention_fwd(a.atty.data(), a.att, in.q, in.k, in.v, attention_shape(), in.st, layout_.seg);
}

// atty → output projection (tmp_) → x_mid = x_in + it, and ln2 (one fused op).
template <class B>
void Model<B>::attn_out_fwd(int l) {
  const int N = B_ * T_, C = cfg_.n_embd, NH = cfg_.n_head, HS = cfg_.head_dim();
  const LayerOffsets& o = table_.layer(l);
  const Act atty = attn_acts(l).atty.data();
  LayerActs& n = norm_acts(l);
  be_.linear_fwd(tmp_.data(), atty, w(o.attn_out_w), w(o.attn_out_b), N, NH * HS, C, layout());
  lora_fwd(l, LoraTarget::kO, tmp_.data(), atty);
  residual_norm_fwd(n.x_mid.data(), n.ln2.data(), n.ln2_mean.data(), n.ln2_rstd.data(), acts_[l].x_in.data(),
                    tmp_.data(), o.ln2_w, o.ln2_b, N);
}

// ln2 → the MLP's hidden (GPT-2: product with the GELU fused; Llama: gate, up, SwiGLU).
template <class B>
void Model<B>::mlp_fwd(int l) {
  const int N = B_ * T_, C = cfg_.n_embd, FF = cfg_.ffn_hidden;
  const WeightLayout lay = layout();
  const LayerOffsets& o = table_.layer(l);
  const Act ln2 = norm_acts(l).ln2.data();
  LayerActs& m = mlp_acts(l);
  if (gpt2()) {
    be_.linear_gelu_fwd(m.hidden.data(), m.fc.data(), ln2, w(o.fc_w), w(o.fc_b), N, C, FF, lay);
  } else if (fused_gate_up_) {  // W_gate and W_up are contiguous rows (params.cpp): one (2FF, C) weight
    const Act gu = m.fc.data();
    be_.linear_fwd(gu, ln2, w(o.gate_w), nullptr, N, C, 2 * FF, lay);
    be_.swiglu_fwd_rows(m.hidden.data(), gu, be_.at(gu, FF), N, FF, 2 * FF);
  } else {
    be_.linear_fwd(m.fc.data(), ln2, w(o.gate_w), nullptr, N, C, FF, lay);
    lora_fwd(l, LoraTarget::kGate, m.fc.data(), ln2);
    be_.linear_fwd(m.up.data(), ln2, w(o.up_w), nullptr, N, C, FF, lay);
    lora_fwd(l, LoraTarget::kUp, m.up.data(), ln2);
    be_.swiglu_fwd(m.hidden.data(), m.fc.data(), m.up.data(), static_cast<int64_t>(N) * FF);
  }
}

// The forward made layer 0's ln1 with norm_fwd and every later one with residual_norm_fwd, the
// residual of the layer below fused in: the recomputation runs that same op (a fused kernel need
// not round like the plain one), on x_in + (−0), which is x_in exactly, −0 elements included.
// tmp_ takes the sum (the op wants its own buffer for it); nothing reads it afterwards.
template <class B>
void Model<B>::ln1_refwd(int l) {
  const int N = B_ * T_;
  const LayerOffsets& o = table_.layer(l);
  LayerActs& n = norm_acts(l);
  const Act x_in = acts_[l].x_in.data();
  if (l == 0) norm_fwd(n.ln1.data(), n.ln1_mean.data(), n.ln1_rstd.data(), x_in, o.ln1_w, o.ln1_b, N);
  else
    residual_norm_fwd(tmp_.data(), n.ln1.data(), n.ln1_mean.data(), n.ln1_rstd.data(), x_in, neg_zero_.data(),
                      o.ln1_w, o.ln1_b, N);
}

template <class B>
void Model<B>::blocks_forward() {
  const int N = B_ * T_, C = cfg_.n_embd, FF = cfg_.ffn_hidden;
  for (int l = 0; l < cfg_.n_layer; ++l) {
    const LayerOffsets& o = table_.layer(l);
    if (l == 0) {
      LayerActs& n = norm_acts(0);
      norm_fwd(n.ln1.data(), n.ln1_mean.data(), n.ln1_rstd.data(), acts_[0].x_in.data(), o.ln1_w, o.ln1_b, N);
    }
    attn_fwd(l, !prefill_segs_.empty());
    attn_out_fwd(l);
    mlp_fwd(l);
    const Act hidden = mlp_acts(l).hidden.data();
    be_.linear_fwd(tmp_.data(), hidden, w(o.down_w), w(o.down_b), N, FF, C, layout());
    lora_fwd(l, LoraTarget::kDown, tmp_.data(), hidden);
    const Act x_mid = norm_acts(l).x_mid.data();
    if (l + 1 < cfg_.n_layer) {  // the block's output and the next layer's ln1
      LayerActs& nx = norm_acts(l + 1);
      const LayerOffsets& no = table_.layer(l + 1);
      residual_norm_fwd(acts_[l + 1].x_in.data(), nx.ln1.data(), nx.ln1_mean.data(), nx.ln1_rstd.data(), x_mid,
                        tmp_.data(), no.ln1_w, no.ln1_b, N);
    } else {  // the last block's output and the final norm
      residual_norm_fwd(x_out_.data(), lnf_.data(), lnf_mean_.data(), lnf_rstd_.data(), x_mid, tmp_.data(),
                        table_.lnf_w(), table_.lnf_b(), N);
    }
  }
}

template <class B>
void Model<B>::forward(const int32_t* tokens, const int32_t* targets, const Real* dloss, int Bn, int Tn,
                       TokenLayout layout) {
  check_shape(Bn, Tn);
  FORGE_CHECK(targets != nullptr, "Model::forward needs targets (the head is fused with the loss)");
  if constexpr (requires(const B& b) { b.has_grads(); })
    if (dloss != nullptr && !frozen() && !be_.has_grads())
      throw Error("this model was made for inference (no gradient buffers), so it cannot train");
  plan(Bn, Tn);
  layout_ = layout;
  embed(tokens);
  blocks_forward();
  const int N = B_ * T_, C = cfg_.n_embd;
  have_head_grad_ = dloss != nullptr;
  if (have_head_grad_) {
    be_.zero(d_ln_.data(), static_cast<size_t>(N) * C);
    dloss = be_.scale_dloss(dloss);  // f16: back-propagate scale · dloss
  }
  be_.lm_head_cross_entropy(losses_.data(), have_head_grad_ ? d_ln_.data() : nullptr,
                            have_head_grad_ ? g(table_.lm_head()) : nullptr, lnf_.data(), w(table_.lm_head()),
                            targets, dloss, N, C, cfg_.vocab_size, cfg_.padded_vocab());
}

template <class B>
void Model<B>::forward_logits(const int32_t* tokens, int Bn, int Tn, TokenLayout layout) {
  check_shape(Bn, Tn);
  plan(Bn, Tn);
  layout_ = layout;
  embed(tokens);
  blocks_forward();
  const int N = B_ * T_;
  plan_logits(N);
  have_head_grad_ = false;
  be_.linear_fwd(logits_.data(), lnf_.data(), w(table_.lm_head()), nullptr, N, cfg_.n_embd, cfg_.padded_vocab(),
                 WeightLayout::kOutIn);
}

template <class B>
void Model<B>::block_backward(int l) {
  const int N = B_ * T_, C = cfg_.n_embd, NH = cfg_.n_head, NKV = cfg_.n_kv_head, HS = cfg_.head_dim();
  const int FF = cfg_.ffn_hidden;
  const WeightLayout lay = layout();
  const LayerOffsets& o = table_.layer(l);
  // Recomputation writes only the shared set, tmp_ and the layer's own lora_h (the same values
  // again): never d_res_ (the gradient flowing down) nor d_ln_.
  if (full()) {  // the block's forward again, up to the MLP's hidden
    ln1_refwd(l);
    attn_fwd(l, false);
    attn_out_fwd(l);
    mlp_fwd(l);
  } else if (shares_mlp()) {
    mlp_fwd(l);
  }
  LayerActs& n = norm_acts(l);
  LayerActs& m = mlp_acts(l);
  // MLP: d_res_ is d(block output).
  // The MLP's output bias (GPT-2) had its gradient taken by the norm_bwd above this block (ln_f
  // or layer l + 1's ln1: mlp_out_bias_below), so its product below gets none.
  if (gpt2()) {  // d_fc = (d_res · W_down) ∘ gelu'(fc), fused where the backend can
    be_.linear_dgelu_bwd(d_fc_.data(), g(o.down_w), nullptr, d_res_.data(), m.hidden.data(), w(o.down_w),
                         m.fc.data(), d_hidden_.data(), N, FF, C, lay);
    be_.linear_bwd(d_ln_.data(), g(o.fc_w), g(o.fc_b), d_fc_.data(), n.ln2.data(), w(o.fc_w), N, C, FF, lay, false);
  } else if (fused_gate_up_) {  // d(gate|up) (N, 2FF), then one product for dX and the (2FF, C) dW
    be_.linear_bwd(d_hidden_.data(), g(o.down_w), nullptr, d_res_.data(), m.hidden.data(), w(o.down_w), N, FF, C,
                   lay, false);
    const Act gu = m.fc.data(), dgu = d_fc_.data();
    be_.swiglu_bwd_rows(dgu, be_.at(dgu, FF), d_hidden_.data(), gu, be_.at(gu, FF), N, FF, 2 * FF);
    be_.linear_bwd(d_ln_.data(), g(o.gate_w), nullptr, dgu, n.ln2.data(), w(o.gate_w), N, C, 2 * FF, lay, false);
  } else {
    const int64_t nff = static_cast<int64_t>(N) * FF;
    be_.linear_bwd(d_hidden_.data(), g(o.down_w), nullptr, d_res_.data(), m.hidden.data(), w(o.down_w), N, FF, C,
                   lay, false);
    lora_bwd(l, LoraTarget::kDown, d_hidden_.data(), d_res_.data(), m.hidden.data());
    be_.swiglu_bwd(d_fc_.data(), d_up_.data(), d_hidden_.data(), m.fc.data(), m.up.data(), nff);
    be_.linear_bwd(d_ln_.data(), g(o.gate_w), nullptr, d_fc_.data(), n.ln2.data(), w(o.gate_w), N, C, FF, lay,
                   false);
    lora_bwd(l, LoraTarget::kGate, d_ln_.data(), d_fc_.data(), n.ln2.data());
    be_.linear_bwd(d_ln_.data(), g(o.up_w), nullptr, d_up_.data(), n.ln2.data(), w(o.up_w), N, C, FF, lay, true);
    lora_bwd(l, LoraTarget::kUp, d_ln_.data(), d_up_.data(), n.ln2.data());
  }
  // d_res_ becomes d(x_mid), the attention output's gradient: its bias gradient is taken here.
  norm_bwd(d_res_.data(), d_ln_.data(), n.x_mid.data(), n.ln2_mean.data(), n.ln2_rstd.data(), o.ln2_w, o.ln2_b,
           o.attn_out_b);
  if (shares_attn() && !full()) attn_fwd(l, false);  // recompute=attn: from the layer's ln1
  LayerActs& a = attn_acts(l);
  be_.linear_bwd(d_atty_.data(), g(o.attn_out_w), nullptr, d_res_.data(), a.atty.data(), w(o.attn_out_w), N,
                 NH * HS, C, lay, false);
  lora_bwd(l, LoraTarget::kO, d_atty_.data(), d_res_.data(), a.atty.data());
  const QkvView in = qkv_view(a), d = dqkv_view();
  be_.attention_bwd(d.q, d.k, d.v, d_atty_.data(), in.q, in.k, in.v, a.atty.data(), a.att, attention_shape(),
                    in.st, layout_.seg);
  const Rope rope = cfg_.rope();
  const Rope* rope_l = cfg_.layer_uses_rope(l) ? &rope : nullptr;
  // Qwen2's q/k biases: their gradient comes out of the backward rotation's pass over dq, dk
  // (rope_bias_bwd), so the projections' backward below skips it.
  const bool bias_in_rope = rope_l && !cfg_.qk_norm && o.q_b >= 0 && o.k_b >= 0;
  if (gpt2()) {
    be_.linear_bwd(d_ln_.data(), g(o.qkv_w), g(o.qkv_b), d_qkv_.data(), n.ln1.data(), w(o.qkv_w), N, C, 3 * C,
                   lay, false);
  } else if (fused_qkv_) {
    // In place on the fused gradient's q and k slices, then one product backward; with biases in
    // the rotation, v's comes from its slice (elsewhere, a NoPE layer, the fused product takes
    // q|k|v's at once).
    const int QKV = qkv_width();
    const QkvView raw = fused_slices(a.qkv.data());
    if (cfg_.qk_norm) {  // q's and k's heads in one call, as in the forward
      be_.head_norm_rope_bwd(d.q, g(o.q_norm_w), d.q, raw.q, w(o.q_norm_w), a.q_rstd.data(), B_, T_, NH + NKV, HS,
                             rope_l, layout_.pos, QKV, NH);
    } else if (bias_in_rope) {  // q's and k's heads and biases adjacent (the fused product's)
      be_.rope_bias_bwd(d.q, g(o.q_b), B_, T_, NH + NKV, HS, rope, layout_.pos, QKV);
      if (auto dvb = g(o.v_b)) be_.bias_grad(dvb, d.v, N, NKV * HS, QKV);
    } else if (rope_l) {  // q's and k's heads adjacent, as in the forward
      be_.rope_bwd(d.q, B_, T_, NH + NKV, HS, rope, layout_.pos, QKV);
    }
    be_.linear_bwd(d_ln_.data(), g(o.q_w), bias_in_rope ? nullptr : g(o.q_b), d_qkv_.data(), n.ln1.data(), w(o.q_w),
                   N, C, QKV, lay, false);
  } else {
    if (cfg_.qk_norm) {  // through RoPE and the head RMSNorm, in place: d.q, d.k become d(q_raw), d(k_raw)
      be_.head_norm_rope_bwd(d.q, g(o.q_norm_w), d.q, a.q_raw.data(), w(o.q_norm_w), a.q_rstd.data(), B_, T_, NH,
                             HS, rope_l, layout_.pos, 0);
      be_.head_norm_rope_bwd(d.k, g(o.k_norm_w), d.k, a.k_raw.data(), w(o.k_norm_w), a.k_rstd.data(), B_, T_, NKV,
                             HS, rope_l, layout_.pos, 0);
    } else if (bias_in_rope) {
      be_.rope_bias_bwd(d.q, g(o.q_b), B_, T_, NH, HS, rope, layout_.pos, 0);
      be_.rope_bias_bwd(d.k, g(o.k_b), B_, T_, NKV, HS, rope, layout_.pos, 0);
    } else if (rope_l) {
      be_.rope_bwd(d.q, B_, T_, NH, HS, rope, layout_.pos, 0);
      be_.rope_bwd(d.k, B_, T_, NKV, HS, rope, layout_.pos, 0);
    }
    const Act dq = d.q, dk = d.k;
    be_.linear_bwd(d_ln_.data(), g(o.q_w), bias_in_rope ? nullptr : g(o.q_b), dq, n.ln1.data(), w(o.q_w), N, C,
                   NH * HS, lay, false);
    lora_bwd(l, LoraTarget::kQ, d_ln_.data(), dq, n.ln1.data());
    be_.linear_bwd(d_ln_.data(), g(o.k_w), bias_in_rope ? nullptr : g(o.k_b), dk, n.ln1.data(), w(o.k_w), N, C,
                   NKV * HS, lay, true);
    lora_bwd(l, LoraTarget::kK, d_ln_.data(), dk, n.ln1.data());
    be_.linear_bwd(d_ln_.data(), g(o.v_w), g(o.v_b), d.v, n.ln1.data(), w(o.v_w), N, C, NKV * HS, lay, true);
    lora_bwd(l, LoraTarget::kV, d_ln_.data(), d.v, n.ln1.data());
  }
  norm_bwd(d_res_.data(), d_ln_.data(), acts_[l].x_in.data(), n.ln1_mean.data(), n.ln1_rstd.data(), o.ln1_w,
           o.ln1_b, mlp_out_bias_below(l));
}

template <class B>
void Model<B>::backward() {
  FORGE_CHECK(have_head_grad_, "backward() needs a forward() with dloss");
  const int N = B_ * T_, C = cfg_.n_embd;
  be_.zero(d_res_.data(), static_cast<size_t>(N) * C);
  norm_bwd(d_res_.data(), d_ln_.data(), x_out_.data(), lnf_mean_.data(), lnf_rstd_.data(), table_.lnf_w(),
           table_.lnf_b(), mlp_out_bias_below(cfg_.n_layer));
  for (int l = cfg_.n_layer - 1; l >= 0; --l) {
    block_backward(l);
    if (layer_grads_hook_) layer_grads_hook_(l);
  }
  if (frozen()) return;  // the embedding's gradient is the base's
  be_.embedding_bwd(g(table_.wte()), g(table_.wpe()), d_res_.data(), tokens_, B_, T_, C, layout_.pos);
}

// ---- host conveniences ------------------------------------------------------------------------

namespace detail {

// Range check of host ids, the one place they are validated before a CPU forward.
inline int64_t check_host_ids(const int32_t* tokens, const int32_t* targets, int64_t n, int V) {
  int64_t count = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (tokens[i] < 0 || tokens[i] >= V)
      throw Error(str("token id ", tokens[i], " at position ", i, " is out of range [0, ", V, ")"));
    if (targets && (targets[i] < -1 || targets[i] >= V))
      throw Error(str("target id ", targets[i], " at position ", i, " is out of range [0, ", V, ")"));
    count += targets && targets[i] >= 0;
  }
  return count;
}

// Packed rows' positions must index the position tables (GPT-2's wpe has max_seq_len rows).
inline void check_host_layout(const TokenLayout& lay, int64_t n, int max_seq_len) {
  if (lay.pos == nullptr) return;
  for (int64_t i = 0; i < n; ++i)
    if (lay.pos[i] < 0 || lay.pos[i] >= max_seq_len)
      throw Error(str("position ", lay.pos[i], " at ", i, " is out of range [0, ", max_seq_len, ")"));
}

}  // namespace detail

template <class B>
double Model<B>::loss(const int32_t* tokens, const int32_t* targets, int Bn, int Tn, TokenLayout layout)
  requires B::kHost
{
  check_shape(Bn, Tn);
  const int64_t N = static_cast<int64_t>(Bn) * Tn;
  const int64_t count = detail::check_host_ids(tokens, targets, N, cfg_.vocab_size);
  detail::check_host_layout(layout, N, cfg_.max_seq_len);
  forward(tokens, targets, nullptr, Bn, Tn, layout);
  double sum = 0;  // in index order, as cpu::sum_in_order and the GPU runner sum
  for (int64_t i = 0; i < N; ++i) sum += static_cast<double>(losses_[i]);
  return count > 0 ? sum / static_cast<double>(count) : 0.0;
}

template <class B>
double Model<B>::loss_and_grad(const int32_t* tokens, const int32_t* targets, int Bn, int Tn, double scale,
                               TokenLayout layout)
  requires B::kHost
{
  check_shape(Bn, Tn);
  FORGE_CHECK(targets != nullptr, "loss_and_grad needs targets");
  const int64_t N = static_cast<int64_t>(Bn) * Tn;
  const int64_t count = detail::check_host_ids(tokens, targets, N, cfg_.vocab_size);
  detail::check_host_layout(layout, N, cfg_.max_seq_len);
  const Real dloss = count > 0 ? static_cast<Real>(scale / static_cast<double>(count)) : Real(0);
  forward(tokens, targets, &dloss, Bn, Tn, layout);
  backward();
  double sum = 0;
  for (int64_t i = 0; i < N; ++i) sum += static_cast<double>(losses_[i]);
  return count > 0 ? sum / static_cast<double>(count) : 0.0;
}

template <class B>
const typename Model<B>::Real* Model<B>::logits_of(const int32_t* tokens, int Bn, int Tn, TokenLayout layout)
  requires B::kHost
{
  check_shape(Bn, Tn);
  detail::check_host_ids(tokens, nullptr, static_cast<int64_t>(Bn) * Tn, cfg_.vocab_size);
  detail::check_host_layout(layout, static_cast<int64_t>(Bn) * Tn, cfg_.max_seq_len);
  forward_logits(tokens, Bn, Tn, layout);
  return logits_.data();
}

}  // namespace forge

// The inference path (KV cache, decode step) is part of the same orchestration.
#include "forge/model/decode_impl.h"
