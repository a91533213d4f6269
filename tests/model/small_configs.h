// Small model shapes shared by the model, decode and runner tests: two layers, 64 channels, a
// 100-token vocabulary (padded to 128), GPT-2 with tied embeddings or Llama with GQA (4 heads
// over 2 kv heads), head size 16 — fast to check against the CPU reference. And the Llama-shaped
// Hugging Face families as deltas on a llama config, with a weight perturbation that makes their
// extra tensors matter (init_weights gives biases 0 and norm gains 1).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "forge/model/config.h"
#include "forge/model/params.h"
#include "testing.h"

namespace forge::testing {

inline ModelConfig small_config(Family f) {
  ModelConfig c;
  c.family = f;
  c.vocab_size = 100;  // padded to 128
  c.max_seq_len = 32;
  c.n_layer = 2;
  c.n_embd = 64;
  c.n_head = 4;
  c.n_kv_head = f == Family::kGpt2 ? 4 : 2;
  c.ffn_hidden = f == Family::kGpt2 ? 256 : 96;
  c.tie_embeddings = f == Family::kGpt2;
  return c;
}

// qwen2 (q/k/v biases), qwen3 (qk-norm, head size 2× n_embd / n_head), and llama with
// attention_bias (q/k/v/o biases) and llama3 RoPE scaling (theta 5e5, original context 8: at head
// size 16 the frequencies fall in all three regimes — kept, blended, divided), and smollm3 with
// its last layer without RoPE.
inline std::vector<std::pair<std::string, ModelConfig>> llama_family_variants(const ModelConfig& base) {
  std::vector<std::pair<std::string, ModelConfig>> out;
  ModelConfig q2 = base;
  q2.variant = LlamaVariant::kQwen2;
  q2.qkv_bias = true;
  out.emplace_back("qwen2", q2);
  ModelConfig q3 = base;
  q3.variant = LlamaVariant::kQwen3;
  q3.qk_norm = true;
  q3.head_size = 2 * base.n_embd / base.n_head;
  out.emplace_back("qwen3", q3);
  ModelConfig l3 = base;
  l3.qkv_bias = l3.o_bias = true;
  l3.rope_theta = 500000.0f;
  l3.rope_scaling = RopeScaling::kLlama3;
  l3.rope_factor = 8.0f;
  l3.rope_original_max_positions = 8;
  out.emplace_back("llama3-bias", l3);
  ModelConfig s3 = base;
  s3.variant = LlamaVariant::kSmolLM3;
  s3.no_rope_layers.assign(base.n_layer, 1);
  s3.no_rope_layers.back() = 0;  // the last layer attends without positions
  out.emplace_back("smollm3", s3);
  return out;
}

// The 1-D tensors (biases, norm gains — the q/k head norms among them) += normal(0, scale), so a
// model's extra tensors change its outputs; matrices keep init_weights' scale, so the logits stay
// in the range the dtype tolerances are written for.
template <typename T>
void perturb_weights(std::vector<T>& w, const ParamTable& table, uint64_t seed, double scale = 0.1) {
  const std::vector<T> noise = random_normal<T>(w.size(), seed, scale);
  for (const ParamInfo& p : table.params())
    if (p.shape.size() == 1)
      for (int64_t i = p.offset; i < p.offset + p.numel(); ++i) w[i] += noise[i];
}

}  // namespace forge::testing
