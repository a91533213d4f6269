#include "forge/model/params.h"

#include <algorithm>
#include <cmath>

#include "forge/core/error.h"
#include "forge/core/rng.h"

namespace forge {

int64_t ParamTable::add(const std::string& name, Shape shape, bool residual_out) {
  ParamInfo p;
  p.name = name;
  p.offset = total_;
  p.decay = shape.size() >= 2;
  p.residual_out = residual_out;
  p.shape = std::move(shape);
  total_ += p.numel();
  params_.push_back(std::move(p));
  return params_.back().offset;
}

ParamTable::ParamTable(const ModelConfig& cfg) : cfg_(cfg) {
  cfg.validate();
  const int64_t C = cfg.n_embd, Vp = cfg.padded_vocab(), FF = cfg.ffn_hidden;
  const int64_t HS = cfg.head_dim(), NH = cfg.n_head, NKV = cfg.n_kv_head;
  layers_.resize(cfg.n_layer);
  if (cfg.family == Family::kGpt2) {
    wte_ = add("transformer.wte.weight", {Vp, C});
    wpe_ = add("transformer.wpe.weight", {cfg.max_seq_len, C});
    for (int l = 0; l < cfg.n_layer; ++l) {
      const std::string p = "transformer.h." + std::to_string(l) + ".";
      LayerOffsets& o = layers_[l];
      o.ln1_w = add(p + "ln_1.weight", {C});
      o.ln1_b = add(p + "ln_1.bias", {C});
      o.qkv_w = add(p + "attn.c_attn.weight", {C, 3 * C});
      o.qkv_b = add(p + "attn.c_attn.bias", {3 * C});
      o.attn_out_w = add(p + "attn.c_proj.weight", {C, C}, true);
      o.attn_out_b = add(p + "attn.c_proj.bias", {C});
      o.ln2_w = add(p + "ln_2.weight", {C});
      o.ln2_b = add(p + "ln_2.bias", {C});
      o.fc_w = add(p + "mlp.c_fc.weight", {C, FF});
      o.fc_b = add(p + "mlp.c_fc.bias", {FF});
      o.down_w = add(p + "mlp.c_proj.weight", {FF, C}, true);
      o.down_b = add(p + "mlp.c_proj.bias", {C});
    }
    lnf_w_ = add("transformer.ln_f.weight", {C});
    lnf_b_ = add("transformer.ln_f.bias", {C});
    lm_head_ = wte_;
  } else {
    wte_ = add("model.embed_tokens.weight", {Vp, C});
    for (int l = 0; l < cfg.n_layer; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".";
      LayerOffsets& o = layers_[l];
      o.ln1_w = add(p + "input_layernorm.weight", {C});
      o.q_w = add(p + "self_attn.q_proj.weight", {NH * HS, C});
      o.k_w = add(p + "self_attn.k_proj.weight", {NKV * HS, C});
      o.v_w = add(p + "self_attn.v_proj.weight", {NKV * HS, C});
      // q, k, v weights and then their biases are each contiguous: a decode step runs them as
      // one (NH + 2·NKV)·HS-row product with one bias vector (model/decode_impl.h).
      if (cfg.qkv_bias) {
        o.q_b = add(p + "self_attn.q_proj.bias", {NH * HS});
        o.k_b = add(p + "self_attn.k_proj.bias", {NKV * HS});
        o.v_b = add(p + "self_attn.v_proj.bias", {NKV * HS});
      }
      if (cfg.qk_norm) {
        o.q_norm_w = add(p + "self_attn.q_norm.weight", {HS});
        o.k_norm_w = add(p + "self_attn.k_norm.weight", {HS});
      }
      o.attn_out_w = add(p + "self_attn.o_proj.weight", {C, NH * HS}, true);
      if (cfg.o_bias) o.attn_out_b = add(p + "self_attn.o_proj.bias", {C});
      o.ln2_w = add(p + "post_attention_layernorm.weight", {C});
      o.gate_w = add(p + "mlp.gate_proj.weight", {FF, C});
      o.up_w = add(p + "mlp.up_proj.weight", {FF, C});
      o.down_w = add(p + "mlp.down_proj.weight", {C, FF}, true);
    }
    lnf_w_ = add("model.norm.weight", {C});
    lm_head_ = cfg.tie_embeddings ? wte_ : add("lm_head.weight", {Vp, C});
  }
}

const ParamInfo* ParamTable::find(const std::string& name) const {
  for (const auto& p : params_)
    if (p.name == name) return &p;
  return nullptr;
}

void ParamTable::init(float* w, uint64_t seed) const {
  const float std_res = 0.02f / std::sqrt(2.0f * cfg_.n_layer);
  const int64_t C = cfg_.n_embd;
  for (const auto& p : params_) {
    float* dst = w + p.offset;
    const int64_t n = p.numel();
    const bool is_norm_gain = p.shape.size() == 1 && p.name.find("norm") != std::string::npos;
    const bool is_ln_gain = p.shape.size() == 1 && p.name.find("ln_") != std::string::npos &&
                            p.name.ends_with(".weight");
    if (p.shape.size() == 1) {
      const float v = (is_norm_gain || is_ln_gain) ? 1.0f : 0.0f;
      for (int64_t i = 0; i < n; ++i) dst[i] = v;
      continue;
    }
    const float std = p.residual_out ? std_res : 0.02f;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) dst[i] = std * philox_normal(seed, 0, p.offset + i);
    // Embedding rows past the real vocabulary stay zero: they are never predicted.
    const bool is_embedding = p.offset == wte_ || p.offset == lm_head_;
    if (is_embedding)
      for (int64_t i = static_cast<int64_t>(cfg_.vocab_size) * C; i < n; ++i) dst[i] = 0.0f;
  }
}

std::vector<int64_t> ParamTable::layer_starts() const {
  std::vector<int64_t> starts;
  for (const LayerOffsets& o : layers_) {
    int64_t lo = total_;
    for (int64_t x : {o.ln1_w, o.ln1_b, o.qkv_w, o.qkv_b, o.q_w, o.k_w, o.v_w, o.q_b, o.k_b, o.v_b,
                      o.q_norm_w, o.k_norm_w, o.attn_out_w, o.attn_out_b, o.ln2_w, o.ln2_b, o.fc_w,
                      o.fc_b, o.gate_w, o.up_w, o.down_w, o.down_b})
      if (x >= 0) lo = std::min(lo, x);
    starts.push_back(lo);
  }
  return starts;
}

}  // namespace forge
