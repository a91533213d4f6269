// config.json of the Llama-shaped Hugging Face families (model/hf_config.cpp): each type's fixed
// features, both RoPE dialects with scaling, the round trip through to_hf_config, and one-line
// refusals of what Forge does not compute. The numbers these configs produce are checked against
// transformers by tests/model/hf_golden_test.cpp.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "forge/core/error.h"
#include "forge/model/config.h"
#include "forge/model/params.h"
#include "fuzz_regression.h"
#include "model/small_configs.h"

namespace forge {
namespace {

using nlohmann::json;

json llama_json(const std::string& type) {
  return {
      {"model_type", type},          {"vocab_size", 1000},       {"max_position_embeddings", 4096},
      {"num_hidden_layers", 2},      {"hidden_size", 64},        {"num_attention_heads", 4},
      {"num_key_value_heads", 2},    {"intermediate_size", 128}, {"rms_norm_eps", 1e-6},
      {"tie_word_embeddings", false}};
}

std::string error_of(const json& j) {
  try {
    from_hf_config(j);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(HfConfig, EachTypeGetsItsFixedFeatures) {
  json q2 = llama_json("qwen2");
  q2["use_sliding_window"] = false;
  q2["sliding_window"] = 32768;  // a size only: no layer uses it
  q2["layer_types"] = {"full_attention", "full_attention"};
  const ModelConfig a = from_hf_config(q2);
  EXPECT_EQ(a.variant, LlamaVariant::kQwen2);
  EXPECT_TRUE(a.qkv_bias);
  EXPECT_FALSE(a.o_bias);
  EXPECT_FALSE(a.qk_norm);
  EXPECT_EQ(a.sliding_window, 0);

  json q3 = llama_json("qwen3");
  q3["head_dim"] = 32;  // hidden / heads is 16
  q3["attention_bias"] = true;
  const ModelConfig b = from_hf_config(q3);
  EXPECT_TRUE(b.qk_norm);
  EXPECT_TRUE(b.qkv_bias && b.o_bias);
  EXPECT_EQ(b.head_dim(), 32);
  const ParamTable t(b);
  ASSERT_NE(t.find("model.layers.1.self_attn.q_norm.weight"), nullptr);
  EXPECT_EQ(t.find("model.layers.1.self_attn.q_norm.weight")->shape, (Shape{32}));
  EXPECT_EQ(t.find("model.layers.0.self_attn.q_proj.weight")->shape, (Shape{4 * 32, 64}));
  EXPECT_EQ(t.find("model.layers.0.self_attn.o_proj.weight")->shape, (Shape{64, 4 * 32}));
  ASSERT_NE(t.find("model.layers.0.self_attn.o_proj.bias"), nullptr);
  // q, k, v biases are contiguous (the decode step's fused product uses them as one vector).
  const LayerOffsets& o = t.layer(0);
  EXPECT_EQ(o.k_b, o.q_b + 4 * 32);
  EXPECT_EQ(o.v_b, o.k_b + 2 * 32);

  json m = llama_json("mistral");
  m["sliding_window"] = nullptr;  // Mistral v0.2+: no window
  EXPECT_EQ(from_hf_config(m).sliding_window, 0);
  m["sliding_window"] = 4096;
  EXPECT_EQ(from_hf_config(m).sliding_window, 4096);

  json l = llama_json("llama");
  l["attention_bias"] = true;
  const ModelConfig c = from_hf_config(l);
  EXPECT_TRUE(c.qkv_bias && c.o_bias);
  EXPECT_FALSE(c.qk_norm);
}

TEST(HfConfig, RopeScalingInBothDialects) {
  // transformers 4: rope_theta + rope_scaling with "rope_type" (or the older "type").
  json v4 = llama_json("llama");
  v4["rope_theta"] = 500000.0;
  v4["rope_scaling"] = {{"type", "llama3"},
                        {"factor", 8.0},
                        {"low_freq_factor", 1.0},
                        {"high_freq_factor", 4.0},
                        {"original_max_position_embeddings", 8192}};
  // transformers 5: rope_parameters.
  json v5 = llama_json("llama");
  v5["rope_parameters"] = {{"rope_type", "llama3"},   {"rope_theta", 500000.0},
                           {"factor", 8.0},           {"low_freq_factor", 1.0},
                           {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 8192}};
  for (const json& j : {v4, v5}) {
    const ModelConfig c = from_hf_config(j);
    EXPECT_EQ(c.rope_scaling, RopeScaling::kLlama3);
    EXPECT_EQ(c.rope_theta, 500000.0f);
    EXPECT_EQ(c.rope_factor, 8.0f);
    EXPECT_EQ(c.rope_low_freq_factor, 1.0f);
    EXPECT_EQ(c.rope_high_freq_factor, 4.0f);
    EXPECT_EQ(c.rope_original_max_positions, 8192);
    const Rope r = c.rope();
    EXPECT_EQ(r.scaling, RopeScaling::kLlama3);
    EXPECT_EQ(r.original_max_positions, 8192);
  }
  json lin = llama_json("llama");
  lin["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 4.0}};
  EXPECT_EQ(from_hf_config(lin).rope_scaling, RopeScaling::kLinear);
  // Dynamic NTK is the default rotation within the original context: Forge keeps to it.
  json dyn = llama_json("llama");
  dyn["rope_parameters"] = {{"rope_type", "dynamic"},
                            {"rope_theta", 10000.0},
                            {"factor", 2.0},
                            {"original_max_position_embeddings", 2048}};
  const ModelConfig d = from_hf_config(dyn);
  EXPECT_EQ(d.rope_scaling, RopeScaling::kDynamic);
  EXPECT_EQ(d.max_seq_len, 2048);
}

TEST(HfConfig, EveryVariantRoundTrips) {
  for (const auto& [name, base] :
       testing::llama_family_variants(testing::small_config(Family::kLlama))) {
    SCOPED_TRACE(name);
    const json j = to_hf_config(base);
    const ModelConfig r = from_hf_config(j);
    EXPECT_EQ(r.model_type(), base.model_type());
    EXPECT_EQ(r.variant, base.variant);
    EXPECT_EQ(r.head_dim(), base.head_dim());
    EXPECT_EQ(r.qkv_bias, base.qkv_bias);
    EXPECT_EQ(r.o_bias, base.o_bias);
    EXPECT_EQ(r.qk_norm, base.qk_norm);
    EXPECT_EQ(r.rope_scaling, base.rope_scaling);
    EXPECT_EQ(r.rope_factor, base.rope_factor);
    EXPECT_EQ(r.rope_original_max_positions, base.rope_original_max_positions);
    EXPECT_EQ(ParamTable(r).total(), ParamTable(base).total());
  }
  EXPECT_EQ(
      to_hf_config(testing::llama_family_variants(testing::small_config(Family::kLlama))[1].second)
          .value("architectures", json::array())[0],
      "Qwen3ForCausalLM");
}

// SmolLM3's no_rope_layers in both forms, and pad_token_id carried (null when it names no row:
// SmolLM3Config would otherwise default it to 128004 and fail to build a small vocabulary).
TEST(HfConfig, SmolLM3NoRopeLayersAndPadTokenRoundTrip) {
  json s3 = llama_json("smollm3");
  s3["no_rope_layers"] = {1, 0};
  s3["pad_token_id"] = 7;
  const ModelConfig a = from_hf_config(s3);
  EXPECT_TRUE(a.layer_uses_rope(0));
  EXPECT_FALSE(a.layer_uses_rope(1));
  EXPECT_EQ(a.pad_token_id, 7);
  const json back = to_hf_config(a);
  EXPECT_EQ(back["no_rope_layers"], json({1, 0}));
  EXPECT_EQ(back["pad_token_id"], 7);
  json every4 = llama_json("smollm3");
  every4["num_hidden_layers"] = 8;
  every4["no_rope_layer_interval"] = 4;
  every4["pad_token_id"] = 128004;  // outside the vocabulary of 1000
  const ModelConfig b = from_hf_config(every4);
  for (int l = 0; l < 8; ++l) EXPECT_EQ(b.layer_uses_rope(l), (l + 1) % 4 != 0) << l;
  EXPECT_TRUE(to_hf_config(b)["pad_token_id"].is_null());
  json bad = llama_json("smollm3");
  bad["no_rope_layers"] = {1, 2};
  EXPECT_NE(error_of(bad).find("no_rope_layers holds 2"), std::string::npos) << error_of(bad);
  json short_list = llama_json("smollm3");
  short_list["no_rope_layers"] = {1};
  EXPECT_NE(error_of(short_list).find("no_rope_layers has 1 entries for 2 layers"),
            std::string::npos);
}

TEST(HfConfig, UnsupportedFeaturesAreRefusedByName) {
  json yarn = llama_json("llama");
  yarn["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
  EXPECT_NE(error_of(yarn).find("rope_type 'yarn'"), std::string::npos) << error_of(yarn);
  json mlp = llama_json("llama");
  mlp["mlp_bias"] = true;
  EXPECT_NE(error_of(mlp).find("mlp_bias"), std::string::npos);
  json sw = llama_json("qwen2");
  sw["use_sliding_window"] = true;
  EXPECT_NE(error_of(sw).find("use_sliding_window"), std::string::npos);
  json mixed = llama_json("qwen3");
  mixed["layer_types"] = {"full_attention", "sliding_attention"};
  EXPECT_NE(error_of(mixed).find("mixing full and sliding"), std::string::npos);
  json partial = llama_json("llama");
  partial["rope_parameters"] = {
      {"rope_type", "default"}, {"rope_theta", 1e4}, {"partial_rotary_factor", 0.5}};
  EXPECT_NE(error_of(partial).find("partial_rotary_factor"), std::string::npos);
  json l3 = llama_json("llama");
  l3["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}};
  EXPECT_NE(error_of(l3).find("low_freq_factor"), std::string::npos) << error_of(l3);
  json act = llama_json("qwen2");
  act["hidden_act"] = "gelu";
  EXPECT_NE(error_of(act).find("hidden_act 'gelu'"), std::string::npos);
  EXPECT_NE(error_of(json{{"model_type", "gemma"}}).find("unsupported model_type 'gemma'"),
            std::string::npos);
}

TEST(HfConfig, VariantOverrideSetsTheTypesFeaturesAndValidateChecksThem) {
  ModelConfig c = preset_config("llama-10m");
  ASSERT_TRUE(apply_model_override(c, "variant", "qwen3"));
  EXPECT_TRUE(c.qk_norm);
  EXPECT_NO_THROW(c.validate());
  c.qk_norm = false;
  EXPECT_THROW(c.validate(), Error);  // qwen3 always has the head norms
  ModelConfig q2 = preset_config("llama-10m");
  ASSERT_TRUE(apply_model_override(q2, "variant", "qwen2"));
  EXPECT_TRUE(q2.qkv_bias);
  q2.o_bias = true;
  EXPECT_THROW(q2.validate(), Error);  // transformers' Qwen2 has no o_proj bias
  ModelConfig g = preset_config("tiny");
  g.qk_norm = true;
  EXPECT_THROW(g.validate(), Error);  // gpt2 has none of the llama-family features
}

TEST(HfConfig, FeaturesNameWhatIsInUse) {
  const auto v = testing::llama_family_variants(testing::small_config(Family::kLlama));
  auto has = [](const std::vector<std::string>& f, const std::string& s) {
    for (const auto& x : f)
      if (x.find(s) != std::string::npos) return true;
    return false;
  };
  EXPECT_TRUE(has(model_features(v[0].second), "q/k/v biases"));
  EXPECT_TRUE(has(model_features(v[1].second), "qk-norm"));
  EXPECT_TRUE(has(model_features(v[1].second), "head_dim 32"));
  EXPECT_TRUE(has(model_features(v[2].second), "RoPE scaling llama3"));
  EXPECT_TRUE(has(model_features(v[2].second), "o_proj bias"));
  EXPECT_TRUE(model_features(preset_config("tiny")).empty());
}

// Found by fuzz/fuzz_config: a model_type holding a newline was printed raw, so the error was two
// lines (a value from a file could forge a log line). Values are quoted with forge::quote.
TEST(HfConfig, FuzzFindingModelTypeWithANewlineStaysOneLine) {
  const std::string in = testing::fuzz_regression("config-model_type_newline");
  testing::expect_one_line_error([&] { from_hf_config(json::parse(in)); },
                                 {"config.json: unsupported model_type '\\x0agpt2'"});
}

}  // namespace
}  // namespace forge
