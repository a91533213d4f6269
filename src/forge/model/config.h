// ModelConfig: the architecture of a model, for the two families Forge implements.
//  - gpt2:  learned positions, LayerNorm with bias, GELU (tanh), biases everywhere, tied head.
//  - llama: RMSNorm, RoPE, SwiGLU, grouped-query attention, tied or untied head; and the
//    Llama-shaped Hugging Face types as small deltas on it (LlamaVariant): Mistral (sliding
//    window), Qwen2 (q/k/v biases), Qwen3 (per-head q/k RMSNorm, explicit head_dim), SmolLM3
//    (layers without RoPE), Llama 3's RoPE scaling, Llama's attention_bias.
// Presets name common shapes; `key=value` overrides change single fields; config.json in the
// Hugging Face dialects is read and written here too (one place knows the field names).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "forge/ops/rope.h"

namespace forge {

enum class Family { kGpt2, kLlama };

// The Hugging Face model_type a llama-family model is read from and saved as. The computation is
// fixed by the feature fields of ModelConfig (biases, qk_norm, head_size, window); the variant
// says which of them the type allows (ModelConfig::validate checks the combination).
enum class LlamaVariant { kLlama, kMistral, kQwen2, kQwen3, kSmolLM3 };

struct ModelConfig {
  Family family = Family::kGpt2;
  int vocab_size = 50257;   // V: real vocabulary; the embedding is padded to padded_vocab()
  int max_seq_len = 1024;   // maxT: learned positions (gpt2) / default context (llama)
  int n_layer = 12;         // L
  int n_embd = 768;         // C
  int n_head = 12;          // NH
  int n_kv_head = 12;       // NKV (grouped-query attention when < NH); gpt2: = NH
  int ffn_hidden = 3072;    // MLP width: 4C for gpt2, SwiGLU intermediate size for llama
  float norm_eps = 1e-5f;   // LayerNorm / RMSNorm epsilon
  float rope_theta = 10000.0f;                      // llama only
  RopeStyle rope_style = RopeStyle::kRotateHalf;  // llama only
  bool tie_embeddings = true;  // lm_head shares the token embedding
  int sliding_window = 0;      // 0 = full causal attention (Mistral uses 4096)
  // Llama-family features beyond plain Llama (all off for gpt2).
  LlamaVariant variant = LlamaVariant::kLlama;
  int head_size = 0;        // HS when set (Qwen3, Gemma-style); 0: n_embd / n_head
  bool qkv_bias = false;    // biases on q_proj, k_proj, v_proj (Qwen2; Llama/Qwen3 attention_bias)
  bool o_bias = false;      // bias on o_proj (Llama/Qwen3 attention_bias)
  bool qk_norm = false;     // RMSNorm over each head of q and k before RoPE (Qwen3), weights (HS)
  // SmolLM3's no_rope_layers, with Hugging Face's meaning: entry l is 1 when layer l applies RoPE
  // and 0 when it attends without positions (NoPE). Empty: every layer applies RoPE, except for
  // a smollm3 model, whose default is transformers' (every 4th layer without).
  std::vector<int> no_rope_layers;
  // config.json's pad_token_id when it names a row of the vocabulary, else -1 (written as null).
  // Carried so that transformers builds the embedding as the source did; it never changes what
  // Forge computes. (SmolLM3Config defaults a missing one to 128004, outside a small vocabulary.)
  int pad_token_id = -1;
  // RoPE scaling (Hugging Face rope_type linear, llama3, dynamic; ops/rope.h has the formulas).
  RopeScaling rope_scaling = RopeScaling::kNone;
  float rope_factor = 1.0f;               // linear, llama3, dynamic
  float rope_low_freq_factor = 1.0f;      // llama3
  float rope_high_freq_factor = 4.0f;     // llama3
  int rope_original_max_positions = 0;    // llama3 (required), dynamic (0: max_seq_len)

  int head_dim() const { return head_size > 0 ? head_size : n_embd / n_head; }  // HS
  bool layer_uses_rope(int l) const {
    if (family == Family::kGpt2) return false;
    if (!no_rope_layers.empty()) return no_rope_layers[l] != 0;
    return variant != LlamaVariant::kSmolLM3 || (l + 1) % 4 != 0;  // SmolLM3Config's interval 4
  }
  // The op-level RoPE description: rope_theta, rope_style and the scaling.
  Rope rope() const {
    return {rope_theta,           rope_style,          rope_scaling,
            rope_factor,          rope_low_freq_factor, rope_high_freq_factor,
            rope_original_max_positions};
  }
  // V rounded up to a multiple of 64: GEMM-friendly; padded logits are never predicted.
  int padded_vocab() const { return (vocab_size + 63) / 64 * 64; }
  // Throws forge::Error naming the inconsistent field.
  void validate() const;
  std::string family_name() const { return family == Family::kGpt2 ? "gpt2" : "llama"; }
  // The Hugging Face model_type this model is saved as: gpt2, llama, mistral, qwen2, qwen3 (a
  // llama-variant model with a sliding window is saved as mistral, the type that has one).
  std::string model_type() const;
};

// Presets: tiny, small, huge, mega, behemoth, titan (the from-scratch GPT-2 ladder: config.cpp
// tabulates it), gpt2-124m, gpt2-350m, llama-10m, llama-25m, llama-100m, smollm2-135m.
// Throws forge::Error listing the known names for an unknown one.
ModelConfig preset_config(const std::string& name);
std::vector<std::string> preset_names();

// Applies one `key=value` override (the keys of model_settings()). Returns false if the key is
// not a model field (so the caller can try other config structs); a bad value throws
// forge::Error naming the key and what it accepts.
bool apply_model_override(ModelConfig& cfg, const std::string& key, const std::string& value);

// The model's key=value settings, for --help: "n_layer", "N", "L: transformer blocks (>= 1)".
struct ModelSetting {
  std::string name, metavar, help;
};
std::vector<ModelSetting> model_settings();

// "llama" / "mistral" / "qwen2" / "qwen3" / "smollm3"; parse_llama_variant gives nullopt for other names.
const char* llama_variant_name(LlamaVariant v);
std::optional<LlamaVariant> parse_llama_variant(const std::string& name);
// "none" / "linear" / "llama3" / "dynamic" (Hugging Face's rope_type, "default" read as none).
const char* rope_scaling_name(RopeScaling s);
std::optional<RopeScaling> parse_rope_scaling(const std::string& name);

// "rotate_half" / "interleaved": the names of `rope_style=` and of config.json's
// forge_rope_style; parse_rope_style gives nullopt for any other name.
const char* rope_style_name(RopeStyle s);
std::optional<RopeStyle> parse_rope_style(const std::string& name);

// Hugging Face config.json (model_type gpt2, llama, mistral, qwen2, qwen3). Reads both the
// transformers 4 dialect (rope_theta and rope_scaling at top level) and the transformers 5 one
// (rope_parameters). A feature Forge does not compute (another rope_type, mlp_bias, per-layer
// windows, partial rotary, ...) is refused with one line naming it, never loaded approximately.
// One Forge-specific key: "forge_rope_style": "interleaved" for a llama model with the GPT-J
// RoPE pairing, written only then (a rotate-half model's config.json has nothing Forge-only).
// Forge reads it back wherever it reads config.json (model directories, checkpoints, the run
// configuration); transformers ignores it and would compute such a model as rotate-half,
// which `forge inspect` and `forge validate` warn about (hf_config_warnings).
inline constexpr const char* kForgeRopeStyleKey = "forge_rope_style";
nlohmann::json to_hf_config(const ModelConfig& cfg);
ModelConfig from_hf_config(const nlohmann::json& j);

// The architecture's features beyond its family's plain form, one short phrase each, for
// `forge inspect`: "grouped-query attention (9 heads, 3 kv)", "sliding window 4096",
// "RoPE scaling llama3 (factor 8, ...)", "q/k/v biases", "o_proj bias", "qk-norm",
// "head_dim 128 (hidden/heads is 64)", "interleaved RoPE", "untied lm_head". Empty for plain.
std::vector<std::string> model_features(const ModelConfig& cfg);

// What transformers would get wrong reading this model's config.json, one line each: empty for
// every model transformers computes as Forge does.
std::vector<std::string> hf_config_warnings(const ModelConfig& cfg);

}  // namespace forge
