#include "forge/model/config.h"

#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <type_traits>
#include <variant>

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
struct VariantRow {};    // llama | mistral | qwen2 | qwen3 (sets the type's fixed features)
struct ScalingRow {};    // none | linear | llama3 | dynamic

struct ModelRow {
  const char* name;
  const char* metavar;
  const char* help;
  std::variant<IntRow, FloatRow, BoolRow, RopeStyleRow, VariantRow, ScalingRow> member;
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
    {"variant", "TYPE",
     "Hugging Face type of a llama-family model: llama, mistral, qwen2 (sets qkv_bias), qwen3 "
     "(sets qk_norm), smollm3 (every 4th layer without RoPE)",
     VariantRow{}},
    {"head_size", "N", "HS when not n_embd / n_head (llama family); 0: n_embd / n_head",
     IntRow{&ModelConfig::head_size, 0, kIntMax}},
    {"qkv_bias", "BOOL", "biases on the q, k, v projections (llama family)",
     BoolRow{&ModelConfig::qkv_bias}},
    {"o_bias", "BOOL", "bias on the attention output projection (llama family)",
     BoolRow{&ModelConfig::o_bias}},
    {"qk_norm", "BOOL", "RMSNorm over each head of q and k before RoPE (qwen3)",
     BoolRow{&ModelConfig::qk_norm}},
    {"rope_scaling", "TYPE", "RoPE scaling: none, linear, llama3 or dynamic", ScalingRow{}},
    {"rope_factor", "X", "RoPE scaling factor",
     FloatRow{&ModelConfig::rope_factor, {0, kInf, true, false}}},
    {"rope_low_freq_factor", "X", "llama3 RoPE scaling: low_freq_factor",
     FloatRow{&ModelConfig::rope_low_freq_factor, {0, kInf, true, false}}},
    {"rope_high_freq_factor", "X", "llama3 RoPE scaling: high_freq_factor",
     FloatRow{&ModelConfig::rope_high_freq_factor, {0, kInf, true, false}}},
    {"rope_original_max_positions", "N",
     "RoPE scaling: the pretraining context (original_max_position_embeddings)",
     IntRow{&ModelConfig::rope_original_max_positions, 0, kIntMax}},
};

// The features a Hugging Face type fixes (transformers hard-codes them), set by `variant=`.
void set_variant(ModelConfig& c, LlamaVariant v) {
  c.variant = v;
  c.qk_norm = v == LlamaVariant::kQwen3;
  if (v == LlamaVariant::kQwen2) {
    c.qkv_bias = true;
    c.o_bias = false;
  }
  if (v == LlamaVariant::kMistral) c.qkv_bias = c.o_bias = false;
}

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
            throw Error(str(what, ": expected a value that fits a 32-bit float, got ", quote(v)));
          c.*m.ptr = static_cast<float>(x);
        } else if constexpr (std::is_same_v<M, BoolRow>) {
          c.*m.ptr = parse_bool(what, v);
        } else if constexpr (std::is_same_v<M, RopeStyleRow>) {
          const std::optional<RopeStyle> style = parse_rope_style(v);
          if (!style)
            throw Error(str(what, ": expected rotate_half or interleaved, got ", quote(v)));
          c.rope_style = *style;
        } else if constexpr (std::is_same_v<M, VariantRow>) {
          const std::optional<LlamaVariant> variant = parse_llama_variant(v);
          if (!variant)
            throw Error(
                str(what, ": expected llama, mistral, qwen2, qwen3 or smollm3, got ", quote(v)));
          set_variant(c, *variant);
        } else {
          const std::optional<RopeScaling> scaling = parse_rope_scaling(v);
          if (!scaling)
            throw Error(str(what, ": expected none, linear, llama3 or dynamic, got ", quote(v)));
          c.rope_scaling = *scaling;
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

// Sizes far beyond any published model (the largest have vocabularies of ~256K, widths of 16K
// and MLPs of 53K, 126 layers, 128 heads, about 10^12 parameters), refused before anything is
// allocated: a config.json from a stranger cannot make a load ask for terabytes or wait hours
// for a table of millions of layers, and every size the model computes from these (widths times
// heads, the padded vocabulary, byte counts) fits the integers it is computed in.
constexpr int kMaxVocab = 1 << 24;      // 16.8M ids
constexpr int kMaxPositions = 1 << 24;  // max_seq_len, sliding_window, RoPE's original context
constexpr int kMaxWidth = 1 << 20;      // n_embd, ffn_hidden, head_size and NH·HS, NKV·HS
constexpr int kMaxLayers = 1 << 12;
constexpr int kMaxHeads = 1 << 14;
constexpr double kMaxParams = 4e12;

}  // namespace

void ModelConfig::validate() const {
  auto need = [](bool ok, const std::string& what) {
    if (!ok) throw Error("model config: " + what);
  };
  auto at_most = [&](int64_t v, int64_t max, const char* what) {
    need(v <= max, str(what, " ", v, " is beyond Forge's limit of ", max));
  };
  need(vocab_size > 0, str("vocab_size must be positive, got ", vocab_size));
  need(max_seq_len > 0, str("max_seq_len must be positive, got ", max_seq_len));
  need(n_layer > 0, str("n_layer must be positive, got ", n_layer));
  need(n_embd > 0 && n_head > 0, "n_embd and n_head must be positive");
  need(head_size >= 0, str("head_size must be >= 0, got ", head_size));
  need(n_kv_head > 0, str("n_kv_head must be positive, got ", n_kv_head));
  need(ffn_hidden > 0, str("ffn_hidden must be positive, got ", ffn_hidden));
  need(sliding_window >= 0, "sliding_window must be >= 0");
  at_most(vocab_size, kMaxVocab, "vocab_size");
  at_most(max_seq_len, kMaxPositions, "max_seq_len");
  at_most(sliding_window, kMaxPositions, "sliding_window");
  at_most(rope_original_max_positions, kMaxPositions, "rope_original_max_positions");
  at_most(n_layer, kMaxLayers, "n_layer");
  at_most(n_head, kMaxHeads, "n_head");
  at_most(n_kv_head, kMaxHeads, "n_kv_head");
  at_most(n_embd, kMaxWidth, "n_embd");
  at_most(ffn_hidden, kMaxWidth, "ffn_hidden");
  at_most(head_size, kMaxWidth, "head_size");
  // int64: head_size and n_head are each below 2^20, their product is not below 2^31.
  const int64_t hs = head_dim();
  at_most(int64_t{n_head} * hs, kMaxWidth, "n_head x head_dim");
  need(head_size > 0 || n_embd % n_head == 0,
       str("n_embd ", n_embd, " is not divisible by n_head ", n_head, " (set head_size)"));
  need(n_head % n_kv_head == 0,
       str("n_head ", n_head, " is not a multiple of n_kv_head ", n_kv_head));
  need(norm_eps > 0, "norm_eps must be positive");
  // The parameter count, in double (no overflow), a little over: the embeddings (the token one
  // twice when untied, GPT-2's positions), and per layer the attention projections and up to
  // three MLP matrices; norms and biases are smaller than these.
  const double C = n_embd;
  const double per_layer = C * hs * (2.0 * n_head + 2.0 * n_kv_head) + 3.0 * C * ffn_hidden;
  const double params = padded_vocab() * C * (tie_embeddings ? 1 : 2) +
                        (family == Family::kGpt2 ? C * max_seq_len : 0.0) + n_layer * per_layer;
  need(params <= kMaxParams,
       str("about ", params, " parameters is beyond Forge's limit of ", kMaxParams));
  if (family == Family::kGpt2) {
    need(head_size == 0 || int64_t{head_size} * n_head == n_embd,
         "gpt2's head size is n_embd / n_head (head_size applies to llama models)");
    need(!qkv_bias && !o_bias && !qk_norm && rope_scaling == RopeScaling::kNone &&
             variant == LlamaVariant::kLlama,
         "gpt2 has none of variant, qkv_bias, o_bias, qk_norm, rope_scaling (llama-family settings)");
    need(n_kv_head == n_head, "gpt2 has no grouped-query attention (n_kv_head must equal n_head)");
    need(tie_embeddings, "gpt2 ties its embeddings (tie_embeddings must be true)");
    need(rope_style == RopeStyle::kRotateHalf,
         "gpt2 has no rotary embeddings (rope_style applies to llama models)");
  } else {
    need(head_dim() % 2 == 0, str("RoPE needs an even head dim, got ", head_dim()));
    need(rope_theta > 0, "rope_theta must be positive");
    const char* type = llama_variant_name(variant);
    switch (variant) {
      case LlamaVariant::kLlama:
        need(qkv_bias == o_bias, "llama's attention_bias puts biases on q, k, v and o together "
                                 "(qkv_bias and o_bias must be equal)");
        need(!(sliding_window > 0 && (qkv_bias || qk_norm)),
             "a llama model with a sliding window is saved as mistral, which has no biases");
        break;
      case LlamaVariant::kMistral:
        need(!qkv_bias && !o_bias, "mistral has no attention biases");
        break;
      case LlamaVariant::kQwen2:
        need(qkv_bias && !o_bias, "qwen2 has biases on q, k, v and none on o");
        break;
      case LlamaVariant::kQwen3:
        need(qk_norm, "qwen3 always normalises q and k per head (qk_norm must be true)");
        need(qkv_bias == o_bias, "qwen3's attention_bias puts biases on q, k, v and o together");
        break;
      case LlamaVariant::kSmolLM3:
        need(qkv_bias == o_bias, "smollm3's attention_bias puts biases on q, k, v and o together");
        break;
    }
    need(no_rope_layers.empty() || variant == LlamaVariant::kSmolLM3,
         str("no_rope_layers is a smollm3 setting, not ", type));
    need(no_rope_layers.empty() || static_cast<int>(no_rope_layers.size()) == n_layer,
         str("no_rope_layers has ", no_rope_layers.size(), " entries for ", n_layer, " layers"));
    need(!qk_norm || variant == LlamaVariant::kQwen3, str("qk_norm is a qwen3 feature, not ", type));
    need(sliding_window == 0 || variant == LlamaVariant::kLlama || variant == LlamaVariant::kMistral,
         str(type, " models have no (uniform) sliding window in Forge"));
    if (rope_scaling != RopeScaling::kNone) need(rope_factor > 0, "rope_factor must be positive");
    if (rope_scaling == RopeScaling::kLlama3) {
      need(rope_original_max_positions > 0,
           "llama3 RoPE scaling needs rope_original_max_positions (original_max_position_embeddings)");
      need(rope_high_freq_factor > rope_low_freq_factor,
           "llama3 RoPE scaling needs rope_high_freq_factor > rope_low_freq_factor");
    }
    if (rope_scaling == RopeScaling::kDynamic && rope_original_max_positions > 0)
      need(max_seq_len <= rope_original_max_positions,
           str("dynamic RoPE scaling is computed only within the original context (max_seq_len ",
               max_seq_len, " > rope_original_max_positions ", rope_original_max_positions, ")"));
  }
}

ModelConfig preset_config(const std::string& name) {
  auto it = presets().find(name);
  if (it == presets().end()) {
    std::string names;
    for (const auto& n : preset_names()) names += (names.empty() ? "" : ", ") + n;
    throw Error(str("unknown preset ", quote(name), " (known: ", names, ")"));
  }
  return it->second();
}

std::vector<std::string> preset_names() {
  std::vector<std::string> names;
  for (const auto& [k, v] : presets()) names.push_back(k);
  return names;
}

std::vector<std::string> model_features(const ModelConfig& c) {
  std::vector<std::string> f;
  if (c.family == Family::kGpt2) return f;
  if (c.n_kv_head < c.n_head)
    f.push_back(str("grouped-query attention (", c.n_head, " heads, ", c.n_kv_head, " kv)"));
  if (c.head_size > 0 && int64_t{c.head_size} * c.n_head != c.n_embd)
    f.push_back(str("head_dim ", c.head_size, " (hidden/heads is ", c.n_embd / c.n_head, ")"));
  if (c.sliding_window > 0) f.push_back(str("sliding window ", c.sliding_window));
  if (c.qkv_bias) f.push_back("q/k/v biases");
  if (c.o_bias) f.push_back("o_proj bias");
  if (c.qk_norm) f.push_back("qk-norm");
  int nope = 0;
  for (int l = 0; l < c.n_layer; ++l) nope += !c.layer_uses_rope(l);
  if (nope > 0) f.push_back(str(nope, " of ", c.n_layer, " layers without RoPE"));
  switch (c.rope_scaling) {
    case RopeScaling::kNone: break;
    case RopeScaling::kLlama3:
      f.push_back(str("RoPE scaling llama3 (factor ", c.rope_factor, ", low_freq_factor ",
                      c.rope_low_freq_factor, ", high_freq_factor ", c.rope_high_freq_factor,
                      ", original context ", c.rope_original_max_positions, ")"));
      break;
    default:
      f.push_back(str("RoPE scaling ", rope_scaling_name(c.rope_scaling), " (factor ", c.rope_factor, ")"));
  }
  if (c.rope_style == RopeStyle::kInterleaved) f.push_back("interleaved RoPE");
  if (!c.tie_embeddings) f.push_back("untied lm_head");
  return f;
}

const char* llama_variant_name(LlamaVariant v) {
  switch (v) {
    case LlamaVariant::kMistral: return "mistral";
    case LlamaVariant::kQwen2: return "qwen2";
    case LlamaVariant::kQwen3: return "qwen3";
    case LlamaVariant::kSmolLM3: return "smollm3";
    default: return "llama";
  }
}

std::optional<LlamaVariant> parse_llama_variant(const std::string& name) {
  if (name == "llama") return LlamaVariant::kLlama;
  if (name == "mistral") return LlamaVariant::kMistral;
  if (name == "qwen2") return LlamaVariant::kQwen2;
  if (name == "qwen3") return LlamaVariant::kQwen3;
  if (name == "smollm3") return LlamaVariant::kSmolLM3;
  return std::nullopt;
}

const char* rope_scaling_name(RopeScaling s) {
  switch (s) {
    case RopeScaling::kLinear: return "linear";
    case RopeScaling::kLlama3: return "llama3";
    case RopeScaling::kDynamic: return "dynamic";
    default: return "none";
  }
}

std::optional<RopeScaling> parse_rope_scaling(const std::string& name) {
  if (name == "none") return RopeScaling::kNone;
  if (name == "linear") return RopeScaling::kLinear;
  if (name == "llama3") return RopeScaling::kLlama3;
  if (name == "dynamic") return RopeScaling::kDynamic;
  return std::nullopt;
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

}  // namespace forge
