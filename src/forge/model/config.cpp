#include "forge/model/config.h"

#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <type_traits>
#include <variant>

#include <nlohmann/json.hpp>

#include "forge/core/error.h"
#include "forge/core/parse.h"

namespace forge {
namespace {

ModelConfig gpt2(int V, int T, int L, int C, int NH) {
  ModelConfig c;
  c.family = Family::kGpt2;
  c.vocab_size = V;
  c.max_seq_len = T;
  c.n_layer = L;
  c.n_embd = C;
  c.n_head = c.n_kv_head = NH;
  c.ffn_hidden = 4 * C;
  c.norm_eps = 1e-5f;
  c.tie_embeddings = true;
  return c;
}

ModelConfig llama(int V, int T, int L, int C, int NH, int NKV, int FF, float theta) {
  ModelConfig c;
  c.family = Family::kLlama;
  c.vocab_size = V;
  c.max_seq_len = T;
  c.n_layer = L;
  c.n_embd = C;
  c.n_head = NH;
  c.n_kv_head = NKV;
  c.ffn_hidden = FF;
  c.norm_eps = 1e-5f;
  c.rope_theta = theta;
  c.tie_embeddings = true;
  return c;
}

// Parameter counts in the comments include the (tied) embedding at the preset's vocabulary.
//
// The from-scratch GPT-2 ladder (the sibling product's presets, seeds/001): tiny's conventions
// throughout — GPT-2 family, V = 4096, tied head, MLP 4C — with the seed's widths and heads.
//   name      C     NH  HS  L   maxT  parameters
//   tiny      128   4   32  4   256   1.35M
//   small     192   6   32  6   256   3.51M
//   huge      256   8   32  12  256   10.6M
//   mega      512   8   64  24  1024  78.3M
//   behemoth  1024  16  64  24  1024  308M
//   titan     1536  24  64  36  1024  1.03B
// The seed gives widths and heads, not depths. mega's 24 layers reproduce its measured size
// (76M parameters at the seed's byte vocabulary of 256); small → huge → mega double the depth
// (6, 12, 24); behemoth widens at that depth (GPT-2 medium's shape, gpt2-350m at V = 4096) and
// titan deepens to GPT-2 large's 36. HS 32 for tiny/small/huge, 64 from mega up (the seed's
// table). maxT 256 for the CPU-sized three, 1024 (GPT-2's) for the GPU-sized ones.
const std::map<std::string, std::function<ModelConfig()>>& presets() {
  static const std::map<std::string, std::function<ModelConfig()>> p = {
      // ~1.3M: a CPU-sized GPT-2 (0.79M in blocks + 0.52M embedding at V = 4096).
      {"tiny", [] { return gpt2(4096, 256, 4, 128, 4); }},
      // 2.67M in blocks + 0.84M embeddings (token + position).
      {"small", [] { return gpt2(4096, 256, 6, 192, 6); }},
      // 9.48M in blocks + 1.11M embeddings.
      {"huge", [] { return gpt2(4096, 256, 12, 256, 8); }},
      // 75.7M in blocks + 2.62M embeddings.
      {"mega", [] { return gpt2(4096, 1024, 24, 512, 8); }},
      // 302M in blocks + 5.24M embeddings.
      {"behemoth", [] { return gpt2(4096, 1024, 24, 1024, 16); }},
      // 1.02B in blocks + 7.86M embeddings.
      {"titan", [] { return gpt2(4096, 1024, 36, 1536, 24); }},
      {"gpt2-124m", [] { return gpt2(50257, 1024, 12, 768, 12); }},
      {"gpt2-350m", [] { return gpt2(50257, 1024, 24, 1024, 16); }},
      // ~8M: 5.9M in blocks + 2.1M embedding.
      {"llama-10m", [] { return llama(8192, 512, 8, 256, 8, 4, 704, 10000.f); }},
      // ~22M: 18.9M in blocks + 3.1M embedding.
      {"llama-25m", [] { return llama(8192, 1024, 12, 384, 6, 2, 1024, 10000.f); }},
      // ~100M: 75.5M in blocks + 24.6M embedding.
      {"llama-100m", [] { return llama(32000, 2048, 12, 768, 12, 4, 2048, 10000.f); }},
      // The SmolLM2-135M shape (HuggingFaceTB/SmolLM2-135M config.json).
      {"smollm2-135m", [] { return llama(49152, 2048, 30, 576, 9, 3, 1536, 100000.f); }},
  };
  return p;
}

// The key=value model settings, one row each: the override parser and the --help listing
// (model_settings) both walk this table. Not config.json: its keys are Hugging Face's, in
// to_hf_config / from_hf_config.
struct IntRow {
  int ModelConfig::*ptr;
  int lo, hi;
};
struct FloatRow {
  float ModelConfig::*ptr;
  Interval range;  // checked in double; the value must also fit a float
};
struct BoolRow {
  bool ModelConfig::*ptr;
};
struct RopeStyleRow {};  // rotate_half | interleaved

struct ModelRow {
  const char* name;
  const char* metavar;
  const char* help;
  std::variant<IntRow, FloatRow, BoolRow, RopeStyleRow> member;
};

constexpr int kIntMax = std::numeric_limits<int>::max();
constexpr double kInf = std::numeric_limits<double>::infinity();

// The ranges are the per-field ones; validate() checks how the fields fit together.
constexpr ModelRow kModelRows[] = {
    {"vocab_size", "N", "V: vocabulary size", IntRow{&ModelConfig::vocab_size, 1, kIntMax}},
    {"max_seq_len", "N", "context length (gpt2: learned positions)",
     IntRow{&ModelConfig::max_seq_len, 1, kIntMax}},
    {"n_layer", "N", "L: transformer blocks", IntRow{&ModelConfig::n_layer, 1, kIntMax}},
    {"n_embd", "N", "C: width", IntRow{&ModelConfig::n_embd, 1, kIntMax}},
    {"n_head", "N", "NH: attention heads (gpt2: n_kv_head follows)",
     IntRow{&ModelConfig::n_head, 1, kIntMax}},
    {"n_kv_head", "N", "NKV: key/value heads (llama; grouped-query attention when < NH)",
     IntRow{&ModelConfig::n_kv_head, 1, kIntMax}},
    {"ffn_hidden", "N", "MLP width", IntRow{&ModelConfig::ffn_hidden, 1, kIntMax}},
    {"norm_eps", "X", "LayerNorm / RMSNorm epsilon",
     FloatRow{&ModelConfig::norm_eps, {0, kInf, true, false}}},
    {"rope_theta", "X", "RoPE base (llama)",
     FloatRow{&ModelConfig::rope_theta, {0, kInf, true, false}}},
    {"rope_style", "STYLE", "how RoPE pairs dimensions (llama): rotate_half or interleaved",
     RopeStyleRow{}},
    {"tie_embeddings", "BOOL", "lm_head shares the token embedding: true or false",
     BoolRow{&ModelConfig::tie_embeddings}},
    {"sliding_window", "N", "attention window; 0: full causal",
     IntRow{&ModelConfig::sliding_window, 0, kIntMax}},
};

void apply_row(ModelConfig& c, const ModelRow& row, const std::string& v) {
  const std::string what = row.name;
  std::visit(
      [&](const auto& m) {
        using M = std::decay_t<decltype(m)>;
        if constexpr (std::is_same_v<M, IntRow>) {
          c.*m.ptr = parse_int(what, v, m.lo, m.hi);
        } else if constexpr (std::is_same_v<M, FloatRow>) {
          const double x = parse_double(what, v, m.range);
          if (std::fabs(x) > std::numeric_limits<float>::max())
            throw Error(str(what, ": expected a value that fits a 32-bit float, got '", v, "'"));
          c.*m.ptr = static_cast<float>(x);
        } else if constexpr (std::is_same_v<M, BoolRow>) {
          c.*m.ptr = parse_bool(what, v);
        } else {
          const std::optional<RopeStyle> style = parse_rope_style(v);
          if (!style)
            throw Error(str(what, ": expected rotate_half or interleaved, got '", v, "'"));
          c.rope_style = *style;
        }
      },
      row.member);
  const IntRow* int_row = std::get_if<IntRow>(&row.member);
  if (int_row && int_row->ptr == &ModelConfig::n_head && c.family == Family::kGpt2)
    c.n_kv_head = c.n_head;  // GPT-2 has no grouped heads
}

std::string accepted(const ModelRow& row) {
  return std::visit(
      [](const auto& m) -> std::string {
        using M = std::decay_t<decltype(m)>;
        if constexpr (std::is_same_v<M, IntRow>)
          return m.hi == kIntMax ? str(">= ", m.lo) : str("[", m.lo, ", ", m.hi, "]");
        else if constexpr (std::is_same_v<M, FloatRow>)
          return m.range.bounds();
        else
          return "";
      },
      row.member);
}

}  // namespace

void ModelConfig::validate() const {
  auto need = [](bool ok, const std::string& what) {
    if (!ok) throw Error("model config: " + what);
  };
  need(vocab_size > 0, str("vocab_size must be positive, got ", vocab_size));
  need(max_seq_len > 0, str("max_seq_len must be positive, got ", max_seq_len));
  need(n_layer > 0, str("n_layer must be positive, got ", n_layer));
  need(n_embd > 0 && n_head > 0, "n_embd and n_head must be positive");
  need(n_embd % n_head == 0, str("n_embd ", n_embd, " is not divisible by n_head ", n_head));
  need(n_kv_head > 0 && n_head % n_kv_head == 0,
       str("n_head ", n_head, " is not a multiple of n_kv_head ", n_kv_head));
  need(ffn_hidden > 0, str("ffn_hidden must be positive, got ", ffn_hidden));
  need(norm_eps > 0, "norm_eps must be positive");
  need(sliding_window >= 0, "sliding_window must be >= 0");
  if (family == Family::kGpt2) {
    need(n_kv_head == n_head, "gpt2 has no grouped-query attention (n_kv_head must equal n_head)");
    need(tie_embeddings, "gpt2 ties its embeddings (tie_embeddings must be true)");
    need(rope_style == RopeStyle::kRotateHalf,
         "gpt2 has no rotary embeddings (rope_style applies to llama models)");
  } else {
    need(head_dim() % 2 == 0, str("RoPE needs an even head dim, got ", head_dim()));
    need(rope_theta > 0, "rope_theta must be positive");
  }
}

ModelConfig preset_config(const std::string& name) {
  auto it = presets().find(name);
  if (it == presets().end()) {
    std::string names;
    for (const auto& n : preset_names()) names += (names.empty() ? "" : ", ") + n;
    throw Error(str("unknown preset '", name, "' (known: ", names, ")"));
  }
  return it->second();
}

std::vector<std::string> preset_names() {
  std::vector<std::string> names;
  for (const auto& [k, v] : presets()) names.push_back(k);
  return names;
}

const char* rope_style_name(RopeStyle s) {
  return s == RopeStyle::kInterleaved ? "interleaved" : "rotate_half";
}

std::optional<RopeStyle> parse_rope_style(const std::string& name) {
  if (name == "rotate_half") return RopeStyle::kRotateHalf;
  if (name == "interleaved") return RopeStyle::kInterleaved;
  return std::nullopt;
}

bool apply_model_override(ModelConfig& c, const std::string& key, const std::string& v) {
  for (const ModelRow& row : kModelRows) {
    if (key != row.name) continue;
    apply_row(c, row, v);
    return true;
  }
  return false;
}

std::vector<ModelSetting> model_settings() {
  std::vector<ModelSetting> out;
  for (const ModelRow& row : kModelRows) {
    const std::string range = accepted(row);
    out.push_back(
        {row.name, row.metavar, range.empty() ? row.help : str(row.help, " (", range, ")")});
  }
  return out;
}

nlohmann::json to_hf_config(const ModelConfig& c) {
  nlohmann::json j;
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
  } else {
    j["model_type"] = c.sliding_window > 0 ? "mistral" : "llama";
    j["architectures"] = {c.sliding_window > 0 ? "MistralForCausalLM" : "LlamaForCausalLM"};
    j["max_position_embeddings"] = c.max_seq_len;
    j["hidden_size"] = c.n_embd;
    j["intermediate_size"] = c.ffn_hidden;
    j["num_hidden_layers"] = c.n_layer;
    j["num_attention_heads"] = c.n_head;
    j["num_key_value_heads"] = c.n_kv_head;
    j["head_dim"] = c.head_dim();
    j["hidden_act"] = "silu";
    j["rms_norm_eps"] = c.norm_eps;
    j["rope_theta"] = c.rope_theta;
    j["tie_word_embeddings"] = c.tie_embeddings;
    j["attention_bias"] = false;
    j["mlp_bias"] = false;
    if (c.sliding_window > 0) j["sliding_window"] = c.sliding_window;
    // Written only when not the default, so a rotate-half model's config.json is exactly what
    // transformers writes. transformers ignores the key (and reads the model as rotate-half).
    if (c.rope_style != RopeStyle::kRotateHalf)
      j[kForgeRopeStyleKey] = rope_style_name(c.rope_style);
  }
  return j;
}

ModelConfig from_hf_config(const nlohmann::json& j) {
  auto get_int = [&](const char* key) -> int {
    if (!j.contains(key) || !j[key].is_number_integer())
      throw Error(str("config.json: missing or non-integer '", key, "'"));
    return j[key].get<int>();
  };
  if (!j.is_object() || !j.contains("model_type") || !j["model_type"].is_string())
    throw Error("config.json: missing 'model_type'");
  const std::string type = j["model_type"].get<std::string>();
  ModelConfig c;
  if (type == "gpt2") {
    if (j.contains(kForgeRopeStyleKey))
      throw Error(str("config.json: '", kForgeRopeStyleKey,
                      "' is a llama setting; gpt2 has no rotary embeddings"));
    c = gpt2(get_int("vocab_size"), get_int("n_positions"), get_int("n_layer"), get_int("n_embd"),
             get_int("n_head"));
    if (j.contains("n_inner") && j["n_inner"].is_number_integer()) c.ffn_hidden = get_int("n_inner");
    if (j.contains("layer_norm_epsilon")) c.norm_eps = j["layer_norm_epsilon"].get<float>();
  } else if (type == "llama" || type == "mistral") {
    const int NH = get_int("num_attention_heads");
    const int NKV = j.contains("num_key_value_heads") ? get_int("num_key_value_heads") : NH;
    float theta = 10000.0f;
    if (j.contains("rope_theta")) theta = j["rope_theta"].get<float>();
    if (j.contains("rope_parameters") && j["rope_parameters"].contains("rope_theta"))
      theta = j["rope_parameters"]["rope_theta"].get<float>();
    c = llama(get_int("vocab_size"), get_int("max_position_embeddings"),
              get_int("num_hidden_layers"), get_int("hidden_size"), NH, NKV,
              get_int("intermediate_size"), theta);
    if (j.contains("rms_norm_eps")) c.norm_eps = j["rms_norm_eps"].get<float>();
    c.tie_embeddings = j.value("tie_word_embeddings", false);
    if (j.contains("sliding_window") && j["sliding_window"].is_number_integer())
      c.sliding_window = j["sliding_window"].get<int>();
    if (j.contains(kForgeRopeStyleKey)) {
      const nlohmann::json& v = j[kForgeRopeStyleKey];
      const std::optional<RopeStyle> style =
          v.is_string() ? parse_rope_style(v.get<std::string>()) : std::nullopt;
      if (!style)
        throw Error(str("config.json: '", kForgeRopeStyleKey, "' is ", v.dump(),
                        ", expected \"rotate_half\" or \"interleaved\""));
      c.rope_style = *style;
    }
    if (j.contains("head_dim") && j["head_dim"].is_number_integer() &&
        j["head_dim"].get<int>() != c.head_dim())
      throw Error(str("config.json: head_dim ", j["head_dim"].get<int>(),
                      " != hidden_size / num_attention_heads (", c.head_dim(), ") is not supported"));
  } else {
    throw Error(str("config.json: unsupported model_type '", type, "' (supported: gpt2, llama, mistral)"));
  }
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
