#include "forge/model/config.h"

#include <functional>
#include <map>
#include <nlohmann/json.hpp>

#include "forge/core/error.h"
#include "forge/model/params.h"
#include "fuzz_regression.h"
#include "testing.h"

namespace forge {
namespace {

TEST(ModelConfig, Gpt2PresetsHaveTheirKnownParameterCounts) {
  // GPT-2 small: 124,439,808 parameters with the 50,257-row embedding (Hugging Face's count).
  // Ours pads the embedding to 50,304 rows: +47·768.
  EXPECT_EQ(ParamTable(preset_config("gpt2-124m")).total(), 124439808 + 47 * 768);
  // GPT-2 medium: 354,823,168 in Hugging Face's count.
  EXPECT_EQ(ParamTable(preset_config("gpt2-350m")).total(), 354823168 + 47 * 1024);
}

TEST(ModelConfig, SmolLm2PresetMatchesTheReleasedModel) {
  // SmolLM2-135M: 134,515,008 parameters (tied embeddings, vocabulary 49,152 = 768·64).
  EXPECT_EQ(ParamTable(preset_config("smollm2-135m")).total(), 134515008);
}

TEST(ModelConfig, TinyIsAboutAMillionParameters) {
  const int64_t n = ParamTable(preset_config("tiny")).total();
  EXPECT_GT(n, 500000);
  EXPECT_LT(n, 2000000);
}

// The from-scratch ladder: widths, heads and head sizes of the seed's table, tiny's family and
// vocabulary, and the parameter count of the stated depth (GPT-2: 12C² + 13C per block, token
// and position embeddings, the final LayerNorm), counted here by hand.
TEST(ModelConfig, FromScratchLadderHasTheSeedsShapes) {
  struct Row {
    const char* name;
    int C, NH, HS, L, T;
  };
  const Row rows[] = {{"tiny", 128, 4, 32, 4, 256},         {"small", 192, 6, 32, 6, 256},
                      {"huge", 256, 8, 32, 12, 256},        {"mega", 512, 8, 64, 24, 1024},
                      {"behemoth", 1024, 16, 64, 24, 1024}, {"titan", 1536, 24, 64, 36, 1024}};
  const ModelConfig tiny = preset_config("tiny");
  for (const Row& r : rows) {
    const ModelConfig c = preset_config(r.name);
    EXPECT_NO_THROW(c.validate()) << r.name;
    EXPECT_EQ(c.n_embd, r.C) << r.name;
    EXPECT_EQ(c.n_head, r.NH) << r.name;
    EXPECT_EQ(c.head_dim(), r.HS) << r.name;
    EXPECT_EQ(c.n_layer, r.L) << r.name;
    EXPECT_EQ(c.max_seq_len, r.T) << r.name;
    EXPECT_EQ(c.family, Family::kGpt2) << r.name;
    EXPECT_EQ(c.vocab_size, tiny.vocab_size) << r.name;
    EXPECT_EQ(c.n_kv_head, r.NH) << r.name;
    EXPECT_EQ(c.ffn_hidden, 4 * r.C) << r.name;
    EXPECT_TRUE(c.tie_embeddings) << r.name;
    const int64_t C = r.C;
    const int64_t want = r.L * (12 * C * C + 13 * C) + (4096 + r.T) * C + 2 * C;
    EXPECT_EQ(ParamTable(c).total(), want) << r.name;
    const ModelConfig back = from_hf_config(to_hf_config(c));
    EXPECT_EQ(ParamTable(back).total(), want) << r.name;
  }
  // The sizes the table in config.cpp states.
  EXPECT_EQ(ParamTable(preset_config("mega")).total(), 78279680);
  EXPECT_EQ(ParamTable(preset_config("titan")).total(), 1027802112);
}

TEST(ModelConfig, UnknownPresetNamesTheKnownOnes) {
  try {
    preset_config("gpt5");
    FAIL() << "no exception";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("gpt5"), std::string::npos);
    EXPECT_NE(msg.find("llama-10m"), std::string::npos);
  }
}

TEST(ModelConfig, OverridesParseAndValidate) {
  ModelConfig c = preset_config("tiny");
  EXPECT_TRUE(apply_model_override(c, "n_layer", "3"));
  EXPECT_EQ(c.n_layer, 3);
  EXPECT_FALSE(apply_model_override(c, "lr", "0.1"));
  EXPECT_THROW(apply_model_override(c, "n_layer", "three"), Error);
  c.n_head = 5;  // 128 % 5 != 0
  EXPECT_THROW(c.validate(), Error);
}

// Every listed key sets the member of that name (the members are listed again here, by hand,
// on purpose), and no member is missing from the listing.
TEST(ModelConfig, EverySettingSetsItsMember) {
  struct Real {
    std::string text;  // a value unlike llama-10m's
    double want;
    std::function<double(const ModelConfig&)> get;
  };
  const std::map<std::string, Real> real = {
      {"vocab_size", {"77", 77, [](const ModelConfig& c) { return c.vocab_size; }}},
      {"max_seq_len", {"33", 33, [](const ModelConfig& c) { return c.max_seq_len; }}},
      {"n_layer", {"5", 5, [](const ModelConfig& c) { return c.n_layer; }}},
      {"n_embd", {"96", 96, [](const ModelConfig& c) { return c.n_embd; }}},
      {"n_head", {"6", 6, [](const ModelConfig& c) { return c.n_head; }}},
      {"n_kv_head", {"3", 3, [](const ModelConfig& c) { return c.n_kv_head; }}},
      {"ffn_hidden", {"250", 250, [](const ModelConfig& c) { return c.ffn_hidden; }}},
      {"norm_eps", {"0.25", 0.25, [](const ModelConfig& c) { return c.norm_eps; }}},
      {"rope_theta", {"500000", 5e5, [](const ModelConfig& c) { return c.rope_theta; }}},
      {"rope_style",
       {"interleaved", 1,
        [](const ModelConfig& c) { return c.rope_style == RopeStyle::kInterleaved ? 1 : 0; }}},
      {"tie_embeddings",
       {"false", 0, [](const ModelConfig& c) { return c.tie_embeddings ? 1 : 0; }}},
      {"sliding_window", {"64", 64, [](const ModelConfig& c) { return c.sliding_window; }}},
      {"variant",
       {"qwen2", 1, [](const ModelConfig& c) { return c.variant == LlamaVariant::kQwen2 ? 1 : 0; }}},
      {"head_size", {"48", 48, [](const ModelConfig& c) { return c.head_size; }}},
      {"qkv_bias", {"true", 1, [](const ModelConfig& c) { return c.qkv_bias ? 1 : 0; }}},
      {"o_bias", {"true", 1, [](const ModelConfig& c) { return c.o_bias ? 1 : 0; }}},
      {"qk_norm", {"true", 1, [](const ModelConfig& c) { return c.qk_norm ? 1 : 0; }}},
      {"rope_scaling",
       {"llama3", 1,
        [](const ModelConfig& c) { return c.rope_scaling == RopeScaling::kLlama3 ? 1 : 0; }}},
      {"rope_factor", {"8", 8, [](const ModelConfig& c) { return c.rope_factor; }}},
      {"rope_low_freq_factor", {"2", 2, [](const ModelConfig& c) { return c.rope_low_freq_factor; }}},
      {"rope_high_freq_factor", {"8", 8, [](const ModelConfig& c) { return c.rope_high_freq_factor; }}},
      {"rope_original_max_positions",
       {"8192", 8192, [](const ModelConfig& c) { return c.rope_original_max_positions; }}},
  };
  const auto listed = model_settings();
  EXPECT_EQ(listed.size(), real.size());
  for (const ModelSetting& m : listed) {
    SCOPED_TRACE(m.name);
    ASSERT_TRUE(real.count(m.name));
    const Real& r = real.at(m.name);
    ModelConfig c = preset_config("llama-10m");
    ASSERT_NE(r.get(c), r.want);  // the override changes something
    ASSERT_TRUE(apply_model_override(c, m.name, r.text));
    EXPECT_EQ(r.get(c), r.want);
  }
}

TEST(ModelConfig, OverridesAreCheckedAgainstTheirRange) {
  auto error_of = [](const std::string& key, const std::string& v) -> std::string {
    ModelConfig c = preset_config("tiny");
    try {
      apply_model_override(c, key, v);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_EQ(error_of("n_layer", "0"), "n_layer: expected an integer in [1, 2147483647], got '0'");
  EXPECT_EQ(error_of("vocab_size", "4294967297"),
            "vocab_size: expected an integer in [1, 2147483647], got '4294967297'");
  EXPECT_EQ(error_of("n_head", " 4"), "n_head: expected an integer in [1, 2147483647], got ' 4'");
  EXPECT_EQ(error_of("sliding_window", "-1"),
            "sliding_window: expected an integer in [0, 2147483647], got '-1'");
  EXPECT_EQ(error_of("norm_eps", "0"), "norm_eps: expected a number > 0, got '0'");
  // Before: parsed as a double and cast, 1e39 became an infinite epsilon.
  EXPECT_EQ(error_of("norm_eps", "1e39"),
            "norm_eps: expected a value that fits a 32-bit float, got '1e39'");
  EXPECT_EQ(error_of("rope_style", "spiral"),
            "rope_style: expected rotate_half or interleaved, got 'spiral'");
  EXPECT_EQ(error_of("tie_embeddings", "yes"), "tie_embeddings: expected true or false, got 'yes'");
  EXPECT_EQ(error_of("rope_theta", "1e6"), "");
}

TEST(ModelConfig, Gpt2HeadsOverrideSetsTheKvHeadsToo) {
  ModelConfig gpt2 = preset_config("tiny");
  ASSERT_TRUE(apply_model_override(gpt2, "n_head", "8"));
  EXPECT_EQ(gpt2.n_kv_head, 8);
  ModelConfig llama = preset_config("llama-10m");
  const int nkv = llama.n_kv_head;
  ASSERT_TRUE(apply_model_override(llama, "n_head", "16"));
  EXPECT_EQ(llama.n_kv_head, nkv);
}

TEST(ModelConfig, HfConfigRoundTripAndBothRopeDialects) {
  for (const std::string name : {"gpt2-124m", "llama-25m", "smollm2-135m"}) {
    const ModelConfig c = preset_config(name);
    const ModelConfig r = from_hf_config(to_hf_config(c));
    EXPECT_EQ(ParamTable(r).total(), ParamTable(c).total()) << name;
    EXPECT_EQ(r.n_kv_head, c.n_kv_head) << name;
    EXPECT_EQ(r.rope_theta, c.rope_theta) << name;
    EXPECT_EQ(r.tie_embeddings, c.tie_embeddings) << name;
  }
  // transformers 5 writes rope_parameters instead of a top-level rope_theta.
  nlohmann::json j = to_hf_config(preset_config("smollm2-135m"));
  j.erase("rope_theta");
  j["rope_parameters"] = {{"rope_theta", 12345.0}, {"rope_type", "default"}};
  EXPECT_EQ(from_hf_config(j).rope_theta, 12345.0f);
  EXPECT_THROW(from_hf_config(nlohmann::json{{"model_type", "bert"}}), Error);
}

// rope_style is Forge-only: config.json carries it as "forge_rope_style" (absent for the
// default, so a rotate-half model's config.json is plain Hugging Face), and reads it back.
TEST(ModelConfig, RopeStyleRoundTripsThroughHfConfig) {
  ModelConfig c = preset_config("llama-10m");
  EXPECT_FALSE(to_hf_config(c).contains("forge_rope_style"));
  ASSERT_TRUE(apply_model_override(c, "rope_style", "interleaved"));
  const nlohmann::json j = to_hf_config(c);
  EXPECT_EQ(j.value("forge_rope_style", ""), "interleaved");
  EXPECT_EQ(from_hf_config(j).rope_style, RopeStyle::kInterleaved);
  EXPECT_EQ(hf_config_warnings(from_hf_config(j)).size(), 1u);
  EXPECT_TRUE(hf_config_warnings(preset_config("llama-10m")).empty());

  nlohmann::json bad = j;
  bad["forge_rope_style"] = "sideways";
  try {
    from_hf_config(bad);
    ADD_FAILURE() << "read an unknown rope style";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'forge_rope_style' is \"sideways\""), std::string::npos)
        << e.what();
  }
  bad["forge_rope_style"] = "rotate_half";
  EXPECT_EQ(from_hf_config(bad).rope_style, RopeStyle::kRotateHalf);
  // GPT-2 has no RoPE: the key is an error there, as is the override.
  nlohmann::json g = to_hf_config(preset_config("tiny"));
  g["forge_rope_style"] = "interleaved";
  EXPECT_THROW(from_hf_config(g), Error);
  ModelConfig t = preset_config("tiny");
  apply_model_override(t, "rope_style", "interleaved");
  EXPECT_THROW(t.validate(), Error);
}

// Found by fuzz/fuzz_settings: a key=value setting whose value holds carriage returns was echoed
// raw in its error. Every line of the input is applied as `forge train` applies settings.
TEST(ModelConfig, FuzzFindingSettingWithCarriageReturnsStaysOneLine) {
  const std::string in = testing::fuzz_regression("settings-value_carriage_returns");
  ModelConfig c = preset_config("tiny");
  bool found = false;
  for (size_t pos = 0; pos < in.size();) {
    size_t eol = in.find('\n', pos);
    if (eol == std::string::npos) eol = in.size();
    const std::string line = in.substr(pos, eol - pos);
    pos = eol + 1;
    if (line.rfind("rope_scaling=", 0) != 0) continue;
    found = true;
    testing::expect_one_line_error(
        [&] { apply_model_override(c, "rope_scaling", line.substr(13)); },
        {"rope_scaling: expected none, linear, llama3 or dynamic, got 'lla\\x0d\\x0d\\x0dma3'"});
  }
  EXPECT_TRUE(found);
}

// Sizes beyond any real model are refused by validate(), before a table or a buffer is made: a
// config.json or a key=value setting cannot ask for terabytes or a table of a billion layers.
TEST(ModelConfig, AbsurdSizesAreRefusedByName) {
  auto error_of = [](auto edit) -> std::string {
    ModelConfig c = preset_config("llama-10m");
    edit(c);
    try {
      c.validate();
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(error_of([](ModelConfig& c) {
              c.n_layer = 2'000'000'000;
            }).find("n_layer 2000000000 is beyond"),
            std::string::npos);
  EXPECT_NE(error_of([](ModelConfig& c) { c.vocab_size = 2'147'483'647; }).find("vocab_size"),
            std::string::npos);
  EXPECT_NE(error_of([](ModelConfig& c) { c.head_size = 1 << 19; }).find("n_head x head_dim"),
            std::string::npos);
  EXPECT_NE(error_of([](ModelConfig& c) {
              c.n_embd = 1 << 20;
              c.ffn_hidden = 1 << 20;
              c.n_head = 1 << 13;
              c.n_kv_head = 1 << 13;
            }).find("parameters is beyond Forge's limit"),
            std::string::npos);
  // The largest real shapes stay well inside: Llama 3.1 405B.
  EXPECT_EQ(error_of([](ModelConfig& c) {
              c.vocab_size = 128'256;
              c.max_seq_len = 131'072;
              c.n_layer = 126;
              c.n_embd = 16'384;
              c.n_head = 128;
              c.n_kv_head = 8;
              c.ffn_hidden = 53'248;
            }),
            "");
}

// Found by fuzz/fuzz_settings: head_size=1532530533 on the gpt2 preset overflowed int in
// validate() (head_size * n_head, undefined behaviour) instead of being refused.
TEST(ModelConfig, FuzzFindingHugeHeadSizeIsRefusedWithoutOverflow) {
  const std::string in = testing::fuzz_regression("settings-head_size_overflow");
  const size_t at = in.find("head_size=");
  ASSERT_NE(at, std::string::npos);
  ModelConfig c = preset_config("tiny");
  apply_model_override(c, "head_size", in.substr(at + 10));
  EXPECT_EQ(c.head_size, 1'532'530'533);
  testing::expect_one_line_error([&] { c.validate(); },
                                 {"model config: head_size 1532530533 is beyond Forge's limit"});
}

}  // namespace
}  // namespace forge
