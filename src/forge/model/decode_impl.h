// Model<Backend>'s inference over a KV cache: plan_decode, prefill and the one-token decode step,
// written once for every backend like the training orchestration (transformer_impl.h, which
// includes this file). ops/decode.h describes the cache.
//
// Prefill is the training forward (blocks_forward, the training attention kernels) over one
// slot's prompt with a hook that stores each layer's k and v (after RoPE) into the cache, then
// the LM head on the last position only.
//
// A decode step has one row per slot (N = S), so every product is (S, C) × op(W):
//   embedding at pos → per block: ln1 → one q|k|v product (Llama's q_proj, k_proj, v_proj rows
//   are contiguous in the parameter table, so they are one (NH + 2·NKV)·HS × C matrix, and so are
//   their biases when the model has them; GPT-2's c_attn already is one) → (qk_norm: RMSNorm of
//   each q and k head) → RoPE of q and k at pos, k and v appended to the cache at pos, decode
//   attention over the slot's cache (one op) → output projection + residual → ln2 → MLP (GPT-2:
//   product + GELU; Llama: gate|up product and SwiGLU) → down projection + residual.
//   Then the final norm, the LM head (S, Vp) and positions += 1. Nothing reads back to the host.
// The Llama family's ops are fused as the GPU wants them at a few rows (decode_block_llama: five
// kernels a layer, each launched while the one before finishes); GPT-2 keeps the unfused ops
// (its Conv1D weights run on cuBLASLt) and the residual + next norm of the training forward.
#pragma once

#include <algorithm>

#include "forge/core/error.h"
#include "forge/model/transformer.h"

namespace forge {

template <class B>
void Model<B>::plan_decode(int slots, int capacity) {
  // The decode step runs q, k, v (and gate, up) as fused products of the base weights alone.
  if (adapter_) throw Error("decode: a model with LoRA adapters does not decode; merge them first (forge merge)");
  if (slots < 1) throw Error(str("decode: ", slots, " slots (expected >= 1)"));
  if (capacity < 1 || capacity > cfg_.max_seq_len)
    throw Error(str("decode: cache capacity ", capacity, " outside [1, max_seq_len = ", cfg_.max_seq_len, "]"));
  const bool ring = cfg_.sliding_window > 0 && cfg_.sliding_window < capacity;
  const int cap = ring ? cfg_.sliding_window : capacity;
  rows_ = slots;
  if (slots == S_ && cap == cap_ && ring == ring_) return;
  be_.synchronize();
  S_ = slots;
  cap_ = cap;
  ring_ = ring;
  const size_t S = slots, C = cfg_.n_embd, HS = cfg_.head_dim(), NH = cfg_.n_head, NKV = cfg_.n_kv_head;
  const size_t FF = cfg_.ffn_hidden, Vp = cfg_.padded_vocab();
  cache_k_.clear();
  cache_v_.clear();
  for (int l = 0; l < cfg_.n_layer; ++l) {
    cache_k_.push_back(be_.act_buf(S * cap * NKV * HS));
    cache_v_.push_back(be_.act_buf(S * cap * NKV * HS));
  }
  if constexpr (requires(B& b, const DecodeShape& d) { b.reserve_decode(d); })
    be_.reserve_decode(DecodeShape{slots, cfg_.n_head, cfg_.n_kv_head, cfg_.head_dim(), cap});
  dec_tokens_ = be_.template buf<int32_t>(S);
  dec_pos_ = be_.template buf<int32_t>(S);
  const std::vector<int32_t> zeros(S, 0);
  be_.upload(dec_tokens_.data(), zeros.data(), S);
  be_.upload(dec_pos_.data(), zeros.data(), S);
  dec_x_ = be_.act_buf(S * C);
  dec_mid_ = be_.act_buf(S * C);
  dec_ln_ = be_.act_buf(S * C);
  dec_tmp_ = be_.act_buf(S * C);
  if (gpt2()) dec_mean_ = be_.stat_buf(S);
  dec_rstd_ = be_.stat_buf(S);
  dec_qkv_ = be_.act_buf(S * (NH + 2 * NKV) * HS);
  dec_atty_ = be_.act_buf(S * NH * HS);
  dec_fc_ = be_.act_buf(S * 2 * FF);
  dec_hidden_ = be_.act_buf(S * FF);
  dec_logits_ = be_.act_buf(S * Vp);
}

// Keys and values of positions [max(0, len − cap), len) of each prompt to cache rows p % cap of
// its slot: at most two contiguous runs of rows per prompt.
template <class B>
void Model<B>::store_prefill_kv(int l, const QkvView& in) {
  const int64_t kvw = static_cast<int64_t>(cfg_.n_kv_head) * cfg_.head_dim();
  const int64_t ks = in.st.k ? in.st.k : kvw, vs = in.st.v ? in.st.v : kvw;
  int64_t off = 0;  // the prompt's first token in the packed row
  for (const PrefillSeg& sg : prefill_segs_) {
    const int64_t slot_row = static_cast<int64_t>(sg.slot) * cap_;
    for (int p = std::max(0, sg.len - cap_); p < sg.len;) {
      const int r = p % cap_, n = std::min(sg.len - p, cap_ - r);
      be_.copy_rows(be_.at(cache_k_[l].data(), (slot_row + r) * kvw), kvw, be_.at(in.k, (off + p) * ks), ks, n, kvw);
      be_.copy_rows(be_.at(cache_v_[l].data(), (slot_row + r) * kvw), kvw, be_.at(in.v, (off + p) * vs), vs, n, kvw);
      p += n;
    }
    off += sg.len;
  }
}

template <class B>
void Model<B>::prefill(int slot, const int32_t* tokens, int Tn) {
  const PrefillSeg one{slot, Tn};
  prefill_packed(&one, 1, tokens, TokenLayout{});
}

template <class B>
void Model<B>::prefill_packed(const PrefillSeg* segs, int k, const int32_t* tokens, TokenLayout layout) {
  FORGE_CHECK(S_ > 0, "prefill() needs plan_decode() first");
  if (k < 1) throw Error("prefill: no prompt");
  if (k > 1 && (layout.pos == nullptr || layout.seg == nullptr))
    throw Error(str("prefill: ", k, " packed prompts need their positions and segment ids"));
  int64_t total = 0;
  for (int i = 0; i < k; ++i) {
    const PrefillSeg& sg = segs[i];
    if (sg.slot < 0 || sg.slot >= S_) throw Error(str("prefill: slot ", sg.slot, " outside [0, ", S_, ")"));
    if (sg.len < 1 || sg.len > decode_context())
      throw Error(str("prefill: a prompt of ", sg.len, " tokens (expected 1 to ", decode_context(), ")"));
    for (int j = 0; j < i; ++j)
      if (segs[j].slot == sg.slot) throw Error(str("prefill: slot ", sg.slot, " named twice"));
    total += sg.len;
  }
  if (total > cfg_.max_seq_len)
    throw Error(str("prefill: ", total, " packed prompt tokens, more than the context of ", cfg_.max_seq_len));
  const int Tn = static_cast<int>(total);
  check_shape(1, Tn);
  plan(1, Tn);
  layout_ = layout;
  prefill_segs_.assign(segs, segs + k);
  try {
    embed(tokens);
    blocks_forward();
  } catch (...) {
    prefill_segs_.clear();
    throw;
  }
  prefill_segs_.clear();
  have_head_grad_ = false;
  const int C = cfg_.n_embd, Vp = cfg_.padded_vocab();
  std::vector<int32_t> pos(S_, 0);
  int64_t last = -1;  // each prompt's last token in the packed row
  for (int i = 0; i < k; ++i) {
    last += segs[i].len;
    be_.linear_fwd(be_.at(dec_logits_.data(), static_cast<int64_t>(segs[i].slot) * Vp), be_.at(lnf_.data(), last * C),
                   w(table_.lm_head()), nullptr, 1, C, Vp, WeightLayout::kOutIn);
  }
  if (k == 1) {
    be_.upload(dec_pos_.data() + segs[0].slot, &segs[0].len, 1);
    return;
  }
  // The positions of all slots in one copy: the others' read back first (the stream orders it).
  be_.download(pos.data(), dec_pos_.data(), S_);
  for (int i = 0; i < k; ++i) pos[segs[i].slot] = segs[i].len;
  be_.upload(dec_pos_.data(), pos.data(), S_);
}

// GPT-2: ln1 comes from the previous block's fused residual + norm (or the embedding's norm).
template <class B>
void Model<B>::decode_block_gpt2(int l) {
  const int S = rows_, C = cfg_.n_embd, NH = cfg_.n_head, HS = cfg_.head_dim(), FF = cfg_.ffn_hidden;
  const WeightLayout lay = layout();
  const LayerOffsets& o = table_.layer(l);
  const DecodeShape shape{S, NH, cfg_.n_kv_head, HS, cap_};
  Act qkv = dec_qkv_.data();
  be_.linear_fwd(qkv, dec_ln_.data(), w(o.qkv_w), w(o.qkv_b), S, C, 3 * C, lay);
  be_.rope_decode_attention(dec_atty_.data(), qkv, 3 * C, cache_k_[l].data(), cache_v_[l].data(), dec_pos_.data(),
                            shape, nullptr);
  be_.linear_fwd(dec_tmp_.data(), dec_atty_.data(), w(o.attn_out_w), w(o.attn_out_b), S, NH * HS, C, lay);
  residual_norm_fwd(dec_mid_.data(), dec_ln_.data(), dec_mean_.data(), dec_rstd_.data(), dec_x_.data(),
                    dec_tmp_.data(), o.ln2_w, o.ln2_b, S);
  be_.linear_gelu_fwd(dec_hidden_.data(), dec_fc_.data(), dec_ln_.data(), w(o.fc_w), w(o.fc_b), S, C, FF, lay);
  be_.linear_fwd(dec_tmp_.data(), dec_hidden_.data(), w(o.down_w), w(o.down_b), S, FF, C, lay);
  // The block's output (over its input: residual_norm_fwd's res may not alias a or b only) and
  // the next block's ln1 or the final norm.
  const bool last = l + 1 == cfg_.n_layer;
  const int64_t nw = last ? table_.lnf_w() : table_.layer(l + 1).ln1_w;
  const int64_t nb = last ? table_.lnf_b() : table_.layer(l + 1).ln1_b;
  residual_norm_fwd(dec_x_.data(), dec_ln_.data(), dec_mean_.data(), dec_rstd_.data(), dec_mid_.data(),
                    dec_tmp_.data(), nw, nb, S);
}

// The Llama family: five ops, each one kernel on the GPU at a few rows (CudaBackend): ln1 +
// q|k|v product, (Qwen3's head norms), RoPE + cache append + attention, output projection +
// residual, ln2 + gate|up product + SwiGLU, down projection + residual. The residual stream x
// is updated in place; ln, rstd, tmp and fc are the unfused paths' scratch.
template <class B>
void Model<B>::decode_block_llama(int l) {
  const int S = rows_, C = cfg_.n_embd, NH = cfg_.n_head, NKV = cfg_.n_kv_head, HS = cfg_.head_dim();
  const int FF = cfg_.ffn_hidden;
  const float eps = cfg_.norm_eps;
  const LayerOffsets& o = table_.layer(l);
  const DecodeShape shape{S, NH, NKV, HS, cap_};
  // q | k | v of every row in one product (q_proj, k_proj, v_proj rows are contiguous in the
  // parameter table, and so are their biases).
  const int64_t qkvw = static_cast<int64_t>(NH + 2 * NKV) * HS;
  Act qkv = dec_qkv_.data(), x = dec_x_.data();
  be_.rmsnorm_linear_fwd(qkv, dec_ln_.data(), dec_rstd_.data(), x, w(o.ln1_w), w(o.q_w), w(o.q_b), S, C,
                         static_cast<int>(qkvw), eps);
  if (cfg_.qk_norm) {  // Qwen3: RMSNorm over each q and k head, in place, before RoPE
    be_.head_rmsnorm(qkv, w(o.q_norm_w), S, NH, HS, qkvw, eps);
    be_.head_rmsnorm(be_.at(qkv, static_cast<int64_t>(NH) * HS), w(o.k_norm_w), S, NKV, HS, qkvw, eps);
  }
  // SmolLM3's NoPE layers: the append alone.
  const Rope rope = cfg_.rope();
  be_.rope_decode_attention(dec_atty_.data(), qkv, qkvw, cache_k_[l].data(), cache_v_[l].data(), dec_pos_.data(),
                            shape, cfg_.layer_uses_rope(l) ? &rope : nullptr);
  be_.linear_residual_fwd(x, dec_tmp_.data(), dec_atty_.data(), w(o.attn_out_w), w(o.attn_out_b), S, NH * HS, C,
                          WeightLayout::kOutIn);
  be_.rmsnorm_linear_swiglu_fwd(dec_hidden_.data(), dec_fc_.data(), dec_ln_.data(), dec_rstd_.data(), x,
                                w(o.ln2_w), w(o.gate_w), S, C, FF, eps);
  be_.linear_residual_fwd(x, dec_tmp_.data(), dec_hidden_.data(), w(o.down_w), w(o.down_b), S, FF, C,
                          WeightLayout::kOutIn);
}

template <class B>
void Model<B>::set_decode_rows(int n) {
  FORGE_CHECK(S_ > 0, "set_decode_rows() needs plan_decode() first");
  FORGE_CHECK(n >= 1 && n <= S_, "decode rows ", n, " outside [1, ", S_, "]");
  rows_ = n;
}

template <class B>
void Model<B>::decode_step() {
  FORGE_CHECK(S_ > 0, "decode_step() needs plan_decode() first");
  const int S = rows_, C = cfg_.n_embd;
  be_.embedding_at(dec_x_.data(), dec_tokens_.data(), dec_pos_.data(), w(table_.wte()), w(table_.wpe()), S, C);
  if (gpt2()) {
    const LayerOffsets& o0 = table_.layer(0);
    norm_fwd(dec_ln_.data(), dec_mean_.data(), dec_rstd_.data(), dec_x_.data(), o0.ln1_w, o0.ln1_b, S);
    for (int l = 0; l < cfg_.n_layer; ++l) decode_block_gpt2(l);
  } else {
    for (int l = 0; l < cfg_.n_layer; ++l) decode_block_llama(l);
    norm_fwd(dec_ln_.data(), dec_mean_.data(), dec_rstd_.data(), dec_x_.data(), table_.lnf_w(), table_.lnf_b(), S);
  }
  be_.linear_fwd(dec_logits_.data(), dec_ln_.data(), w(table_.lm_head()), nullptr, S, C, cfg_.padded_vocab(),
                 WeightLayout::kOutIn);
  be_.advance_positions(dec_pos_.data(), S, decode_context() - 1);
}

}  // namespace forge
