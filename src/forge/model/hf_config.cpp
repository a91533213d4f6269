// Hugging Face config.json ⇄ ModelConfig: the one place that knows the field names of the
// model types Forge computes (gpt2, llama, mistral, qwen2, qwen3, smollm3) in both dialects —
// transformers 4 (rope_theta and rope_scaling at top level) and transformers 5
// (rope_parameters {rope_type, rope_theta, ...}).
//
// What transformers hard-codes per type, and so what each type may carry:
//   llama   attention_bias → biases on q, k, v and o; head_dim; rope scaling; no mlp_bias.
//   mistral no biases; sliding_window (an int, or null for none); head_dim.
//   qwen2   biases on q, k, v always (none on o); use_sliding_window (refused when true).
//   qwen3   q_norm / k_norm (RMSNorm over each head, before RoPE) always; attention_bias → q, k,
//           v, o; head_dim (128 by default, independent of hidden_size / heads).
//   smollm3 no_rope_layers (1 = the layer applies RoPE; transformers' default drops it on every
//           4th layer); attention_bias → q, k, v, o; use_sliding_window (refused when true).
// Anything Forge does not compute is refused with one line naming the key: other rope types,
// partial rotary, mlp_bias, other activations, per-layer attention types that differ.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "forge/core/error.h"
#include "forge/model/config.h"

namespace forge {
namespace {

using nlohmann::json;

Error unsupported(const std::string& what) {
  return Error(str("config.json: ", what, " is not supported by Forge"));
}

int get_int(const json& j, const char* key) {
  if (!j.contains(key) || !j[key].is_number_integer())
    throw Error(str("config.json: missing or non-integer '", key, "'"));
  const int64_t v = j[key].get<int64_t>();
  if (v < 0 || v > std::numeric_limits<int>::max())
    throw Error(str("config.json: '", key, "' = ", v, " is out of range"));
  return static_cast<int>(v);
}

float get_float(const json& j, const char* key, const char* where) {
  if (!j.contains(key) || !j[key].is_number())
    throw Error(str("config.json: ", where, " needs a number '", key, "'"));
  return j[key].get<float>();
}

// The RoPE block of a llama-family config: rope_parameters (transformers 5) or rope_theta +
// rope_scaling (4.x, where the type key was "type" before "rope_type").
void read_rope(const json& j, ModelConfig& c) {
  if (j.contains("rope_theta") && j["rope_theta"].is_number())
    c.rope_theta = j["rope_theta"].get<float>();
  const json* p = nullptr;
  for (const char* key : {"rope_parameters", "rope_scaling"}) {
    if (!j.contains(key) || j[key].is_null()) continue;
    if (!j[key].is_object()) throw Error(str("config.json: '", key, "' is not an object"));
    if (!p) p = &j[key];  // rope_parameters wins when a file has both
  }
  if (!p) return;
  const json& r = *p;
  if (!r.contains("rope_type") && !r.contains("type") && !r.contains("rope_theta"))
    throw unsupported("rope_parameters per layer type");
  if (r.contains("rope_theta")) c.rope_theta = get_float(r, "rope_theta", "rope_parameters");
  if (r.contains("partial_rotary_factor") && r["partial_rotary_factor"].get<double>() != 1.0)
    throw unsupported("partial_rotary_factor != 1");
  const std::string type = r.contains("rope_type") ? r["rope_type"].get<std::string>()
                           : r.contains("type")    ? r["type"].get<std::string>()
                                                   : "default";
  const std::optional<RopeScaling> s = parse_rope_scaling(type == "default" ? "none" : type);
  if (!s)
    throw unsupported(
        str("rope_type ", quote(type), " (Forge computes default, linear, llama3, dynamic)"));
  c.rope_scaling = *s;
  if (*s == RopeScaling::kNone) return;
  c.rope_factor = get_float(r, "factor", str("rope_type ", type).c_str());
  if (*s == RopeScaling::kLlama3) {
    c.rope_low_freq_factor = get_float(r, "low_freq_factor", "rope_type llama3");
    c.rope_high_freq_factor = get_float(r, "high_freq_factor", "rope_type llama3");
    c.rope_original_max_positions = get_int(r, "original_max_position_embeddings");
  }
  if (*s == RopeScaling::kDynamic) {
    // Dynamic NTK scaling changes the frequencies only for sequences longer than the original
    // context; Forge runs such a model within it, where the frequencies are the default ones.
    c.rope_original_max_positions = r.contains("original_max_position_embeddings")
                                        ? get_int(r, "original_max_position_embeddings")
                                        : c.max_seq_len;
    c.max_seq_len = std::min(c.max_seq_len, c.rope_original_max_positions);
  }
}

// Per-layer attention types (transformers 5's layer_types; Qwen's use_sliding_window): one
// kind for every layer, or the model is refused.
void read_layer_types(const json& j, ModelConfig& c, bool window_allowed) {
  if (j.contains("use_sliding_window") && j["use_sliding_window"].is_boolean() &&
      j["use_sliding_window"].get<bool>())
    throw unsupported("use_sliding_window = true (per-layer sliding windows)");
  if (!j.contains("layer_types") || j["layer_types"].is_null()) return;
  const json& lt = j["layer_types"];
  if (!lt.is_array()) throw Error("config.json: 'layer_types' is not a list");
  bool full = false, sliding = false;
  for (const json& t : lt) {
    const std::string s = t.is_string() ? t.get<std::string>() : t.dump();
    if (s == "full_attention")
      full = true;
    else if (s == "sliding_attention")
      sliding = true;
    else
      throw unsupported(str("layer type ", quote(s)));
  }
  if (full && sliding) throw unsupported("layer_types mixing full and sliding attention");
  if (sliding && !window_allowed) throw unsupported("sliding_attention layers for this model_type");
  if (full) c.sliding_window = 0;
}

ModelConfig read_llama_family(const json& j, const std::string& type) {
  ModelConfig c;
  c.family = Family::kLlama;
  c.variant = *parse_llama_variant(type);
  c.vocab_size = get_int(j, "vocab_size");
  c.max_seq_len = get_int(j, "max_position_embeddings");
  c.n_layer = get_int(j, "num_hidden_layers");
  c.n_embd = get_int(j, "hidden_size");
  c.n_head = get_int(j, "num_attention_heads");
  c.n_kv_head = j.contains("num_key_value_heads") && !j["num_key_value_heads"].is_null()
                    ? get_int(j, "num_key_value_heads")
                    : c.n_head;
  c.ffn_hidden = get_int(j, "intermediate_size");
  c.norm_eps = j.contains("rms_norm_eps") ? j["rms_norm_eps"].get<float>() : 1e-6f;
  c.tie_embeddings = j.value("tie_word_embeddings", false);
  if (j.contains("pad_token_id") && j["pad_token_id"].is_number_integer()) {
    const int64_t pad = j["pad_token_id"].get<int64_t>();
    if (pad >= 0 && pad < c.vocab_size) c.pad_token_id = static_cast<int>(pad);
  }
  const std::string act = j.value("hidden_act", std::string("silu"));
  if (act != "silu") throw unsupported(str("hidden_act ", quote(act)));
  if (j.value("mlp_bias", false)) throw unsupported("mlp_bias = true");
  if (c.n_head <= 0) throw Error("config.json: num_attention_heads must be positive");
  if (j.contains("head_dim") && !j["head_dim"].is_null()) {
    const int hd = get_int(j, "head_dim");
    if (int64_t{hd} * c.n_head != c.n_embd) c.head_size = hd;  // int64: both may be ~2^31
  } else if (c.variant == LlamaVariant::kQwen3) {
    c.head_size = 128;  // Qwen3Config's default
  }
  read_rope(j, c);
  const bool attention_bias = j.value("attention_bias", false);
  switch (c.variant) {
    case LlamaVariant::kLlama:
    case LlamaVariant::kQwen3:
    case LlamaVariant::kSmolLM3:
      c.qkv_bias = c.o_bias = attention_bias;
      c.qk_norm = c.variant == LlamaVariant::kQwen3;
      break;
    case LlamaVariant::kMistral:
      if (attention_bias) throw unsupported("attention_bias on mistral");
      if (j.contains("sliding_window") && j["sliding_window"].is_number_integer())
        c.sliding_window = get_int(j, "sliding_window");
      break;
    case LlamaVariant::kQwen2:
      c.qkv_bias = true;  // Qwen2Attention: bias on q, k, v always, never on o
      break;
  }
  if (c.variant == LlamaVariant::kSmolLM3 && j.contains("no_rope_layers") &&
      !j["no_rope_layers"].is_null()) {
    const json& nr = j["no_rope_layers"];
    if (!nr.is_array()) throw Error("config.json: 'no_rope_layers' is not a list");
    for (const json& v : nr) {
      if (!v.is_number_integer() || (v.get<int>() != 0 && v.get<int>() != 1))
        throw Error(str("config.json: no_rope_layers holds ", v.dump(), " (expected 0 or 1)"));
      c.no_rope_layers.push_back(v.get<int>());
    }
  } else if (c.variant == LlamaVariant::kSmolLM3 && j.contains("no_rope_layer_interval") &&
             j["no_rope_layer_interval"].is_number_integer()) {
    const int every = get_int(j, "no_rope_layer_interval");
    if (every < 1) throw Error("config.json: no_rope_layer_interval must be >= 1");
    for (int l = 0; l < c.n_layer; ++l) c.no_rope_layers.push_back((l + 1) % every != 0 ? 1 : 0);
  }
  // Qwen's sliding_window is only a size; whether any layer uses it is layer_types' business.
  read_layer_types(j, c, c.variant == LlamaVariant::kMistral);
  if (j.contains(kForgeRopeStyleKey)) {
    const json& v = j[kForgeRopeStyleKey];
    const std::optional<RopeStyle> style =
        v.is_string() ? parse_rope_style(v.get<std::string>()) : std::nullopt;
    if (!style)
      throw Error(str("config.json: '", kForgeRopeStyleKey, "' is ", v.dump(),
                      ", expected \"rotate_half\" or \"interleaved\""));
    c.rope_style = *style;
  }
  return c;
}

ModelConfig read_gpt2(const json& j) {
  if (j.contains(kForgeRopeStyleKey))
    throw Error(str("config.json: '", kForgeRopeStyleKey,
                    "' is a llama setting; gpt2 has no rotary embeddings"));
  const std::string act = j.value("activation_function", std::string("gelu_new"));
  if (act != "gelu_new" && act != "gelu_pytorch_tanh")
    throw unsupported(str("activation_function ", quote(act)));
  if (!j.value("tie_word_embeddings", true)) throw unsupported("gpt2 with untied embeddings");
  if (j.value("scale_attn_by_inverse_layer_idx", false))
    throw unsupported("scale_attn_by_inverse_layer_idx = true");
  ModelConfig c;
  c.family = Family::kGpt2;
  c.vocab_size = get_int(j, "vocab_size");
  c.max_seq_len = get_int(j, "n_positions");
  c.n_layer = get_int(j, "n_layer");
  c.n_embd = get_int(j, "n_embd");
  c.n_head = c.n_kv_head = get_int(j, "n_head");
  // n_inner null or absent: 4C, as GPT2MLP; beyond int for a huge n_embd, which validate()
  // refuses anyway (so the product is taken in int64 and clamped, never overflowed).
  c.ffn_hidden = j.contains("n_inner") && j["n_inner"].is_number_integer()
                     ? get_int(j, "n_inner")
                     : static_cast<int>(std::min<int64_t>(4 * int64_t{c.n_embd}, INT32_MAX));
  if (j.contains("layer_norm_epsilon")) c.norm_eps = j["layer_norm_epsilon"].get<float>();
  c.tie_embeddings = true;
  return c;
}

void write_rope(json& j, const ModelConfig& c) {
  // rope_theta at top level (what Forge wrote before, read by both dialects) and, for a scaled
  // model, rope_parameters as transformers 5 writes it.
  j["rope_theta"] = c.rope_theta;
  if (c.rope_scaling == RopeScaling::kNone) return;
  json r = {{"rope_type", rope_scaling_name(c.rope_scaling)},
            {"rope_theta", c.rope_theta},
            {"factor", c.rope_factor}};
  if (c.rope_scaling == RopeScaling::kLlama3) {
    r["low_freq_factor"] = c.rope_low_freq_factor;
    r["high_freq_factor"] = c.rope_high_freq_factor;
  }
  if (c.rope_original_max_positions > 0)
    r["original_max_position_embeddings"] = c.rope_original_max_positions;
  j["rope_parameters"] = r;
}

}  // namespace

std::string ModelConfig::model_type() const {
  if (family == Family::kGpt2) return "gpt2";
  if (variant == LlamaVariant::kLlama && sliding_window > 0) return "mistral";
  return llama_variant_name(variant);
}

nlohmann::json to_hf_config(const ModelConfig& c) {
  json j;
  j["vocab_size"] = c.vocab_size;
  j["torch_dtype"] = "float32";
  if (c.family == Family::kGpt2) {
    j["model_type"] = "gpt2";
    j["architectures"] = {"GPT2LMHeadModel"};
    j["n_positions"] = c.max_seq_len;
    j["n_ctx"] = c.max_seq_len;
    j["n_embd"] = c.n_embd;
    j["n_layer"] = c.n_layer;
    j["n_head"] = c.n_head;
    j["n_inner"] = c.ffn_hidden;
    j["activation_function"] = "gelu_new";
    j["layer_norm_epsilon"] = c.norm_eps;
    j["tie_word_embeddings"] = true;
    return j;
  }
  const std::string type = c.model_type();
  const char* arch = type == "mistral"   ? "MistralForCausalLM"
                     : type == "qwen2"   ? "Qwen2ForCausalLM"
                     : type == "qwen3"   ? "Qwen3ForCausalLM"
                     : type == "smollm3" ? "SmolLM3ForCausalLM"
                                         : "LlamaForCausalLM";
  j["model_type"] = type;
  j["architectures"] = {arch};
  j["max_position_embeddings"] = c.max_seq_len;
  j["hidden_size"] = c.n_embd;
  j["intermediate_size"] = c.ffn_hidden;
  j["num_hidden_layers"] = c.n_layer;
  j["num_attention_heads"] = c.n_head;
  j["num_key_value_heads"] = c.n_kv_head;
  j["head_dim"] = c.head_dim();
  j["hidden_act"] = "silu";
  j["rms_norm_eps"] = c.norm_eps;
  write_rope(j, c);
  j["tie_word_embeddings"] = c.tie_embeddings;
  if (c.pad_token_id >= 0)
    j["pad_token_id"] = c.pad_token_id;
  else
    j["pad_token_id"] = nullptr;
  if (type == "llama" || type == "qwen3" || type == "smollm3") j["attention_bias"] = c.qkv_bias;
  if (type == "llama" || type == "smollm3") j["mlp_bias"] = false;
  if (type == "smollm3") {
    std::vector<int> nr;
    for (int l = 0; l < c.n_layer; ++l) nr.push_back(c.layer_uses_rope(l) ? 1 : 0);
    j["no_rope_layers"] = nr;
  }
  if (type == "mistral") {
    if (c.sliding_window > 0)
      j["sliding_window"] = c.sliding_window;
    else
      j["sliding_window"] = nullptr;
  }
  if (type == "qwen2" || type == "qwen3" || type == "smollm3") {
    j["use_sliding_window"] = false;
    j["sliding_window"] = nullptr;
    j["max_window_layers"] = c.n_layer;
  }
  // Written only when not the default, so a rotate-half model's config.json is exactly what
  // transformers writes. transformers ignores the key (and reads the model as rotate-half).
  if (c.rope_style != RopeStyle::kRotateHalf) j[kForgeRopeStyleKey] = rope_style_name(c.rope_style);
  return j;
}

ModelConfig from_hf_config(const nlohmann::json& j) {
  if (!j.is_object() || !j.contains("model_type") || !j["model_type"].is_string())
    throw Error("config.json: missing 'model_type'");
  const std::string type = j["model_type"].get<std::string>();
  ModelConfig c;
  if (type == "gpt2")
    c = read_gpt2(j);
  else if (parse_llama_variant(type))
    c = read_llama_family(j, type);
  else
    throw Error(str("config.json: unsupported model_type ", quote(type),
                    " (supported: gpt2, llama, mistral, qwen2, qwen3, smollm3)"));
  c.validate();
  return c;
}

std::vector<std::string> hf_config_warnings(const ModelConfig& c) {
  std::vector<std::string> w;
  if (c.family == Family::kLlama && c.rope_style == RopeStyle::kInterleaved)
    w.push_back(str("rope_style interleaved (config.json \"", kForgeRopeStyleKey,
                    "\"): transformers ignores that key and would compute this model with "
                    "rotate-half RoPE, giving different logits; only Forge runs it as trained"));
  return w;
}

}  // namespace forge
