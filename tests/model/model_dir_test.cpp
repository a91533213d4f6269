// Hugging Face model directories: exact save/load round trips for every family, what other
// writers produce (bf16 weights, shards, no lm_head, no "transformer." prefix, inv_freq
// buffers, the transformers 5 config dialect), and a named error for everything Forge cannot
// load faithfully.
#include "forge/model/model_dir.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "forge/core/error.h"
#include "forge/io/bf16.h"
#include "forge/io/safetensors.h"
#include "fuzz_regression.h"
#include "testing.h"

namespace forge {
namespace {

namespace fs = std::filesystem;

class ModelDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("forge_mdir_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  static ModelConfig llama(bool tied, int window = 0) {
    ModelConfig c = preset_config("llama-10m");
    c.vocab_size = 100;
    c.max_seq_len = 16;
    c.n_layer = 2;
    c.n_embd = 32;
    c.n_head = 4;
    c.n_kv_head = 2;
    c.ffn_hidden = 40;
    c.tie_embeddings = tied;
    c.sliding_window = window;
    return c;
  }
  static ModelConfig gpt2() {
    ModelConfig c = preset_config("tiny");
    c.vocab_size = 100;
    c.max_seq_len = 16;
    c.n_layer = 2;
    c.n_embd = 32;
    c.n_head = 4;
    c.n_kv_head = 4;
    c.ffn_hidden = 128;
    return c;
  }
  // The model's tensors as a checkpoint holds them (V rows for the embedding), by name.
  static std::map<std::string, std::pair<Shape, std::vector<float>>> tensors(
      const Transformer<float>& m) {
    std::map<std::string, std::pair<Shape, std::vector<float>>> out;
    const ModelConfig& c = m.config();
    for (const auto& p : m.table().params()) {
      Shape s = p.shape;
      if (p.offset == m.table().wte() || p.offset == m.table().lm_head()) s[0] = c.vocab_size;
      const float* w = m.weights().data() + p.offset;
      out[p.name] = {s, std::vector<float>(w, w + shape_numel(s))};
    }
    return out;
  }
  // Writes config.json (given) and model.safetensors holding `ts` in F32.
  void write_dir(const fs::path& d, const nlohmann::json& config,
                 const std::map<std::string, std::pair<Shape, std::vector<float>>>& ts,
                 io::StDType dtype = io::StDType::kF32) {
    fs::create_directories(d);
    std::ofstream(d / "config.json") << config.dump();
    std::vector<std::vector<uint16_t>> half;
    std::vector<io::TensorToWrite> w;
    half.reserve(ts.size());
    for (const auto& [name, t] : ts) {
      if (dtype == io::StDType::kBF16) {
        half.emplace_back();
        for (float x : t.second) half.back().push_back(f32_to_bf16(x));
        w.push_back({name, dtype, t.first, half.back().data()});
      } else {
        w.push_back({name, io::StDType::kF32, t.first, t.second.data()});
      }
    }
    io::write_safetensors((d / "model.safetensors").string(), w);
  }
  void expect_error(const std::string& d, const std::string& needle) {
    try {
      load_model_dir(d);
      ADD_FAILURE() << "loaded; expected an error containing: " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
          << needle << " in: " << e.what();
      EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
    }
  }

  fs::path dir_;
};

TEST_F(ModelDirTest, SaveLoadRoundTripIsExactForEveryFamily) {
  for (const ModelConfig& c : {llama(false), llama(true), llama(false, 4), gpt2()}) {
    Transformer<float> m(c);
    m.init_weights(11);
    const std::string d = (dir_ / (c.family_name() + std::to_string(c.tie_embeddings) +
                                   std::to_string(c.sliding_window)))
                              .string();
    save_model_dir(d, m);
    const Transformer<float> back = load_model_dir(d);
    EXPECT_EQ(back.weights(), m.weights()) << d;
    EXPECT_EQ(back.config().tie_embeddings, c.tie_embeddings);
    EXPECT_EQ(back.config().sliding_window, c.sliding_window);
    EXPECT_EQ(back.config().n_kv_head, c.n_kv_head);
    // What transformers reads: a tied model has no lm_head.weight; the embedding has V rows.
    const auto st = io::SafetensorsFile::open(d + "/model.safetensors");
    EXPECT_EQ(st.find("lm_head.weight") != nullptr,
              c.family == Family::kLlama && !c.tie_embeddings);
    const std::string emb =
        c.family == Family::kGpt2 ? "transformer.wte.weight" : "model.embed_tokens.weight";
    EXPECT_EQ(st.find(emb)->shape, (Shape{100, 32}));
  }
}

// A model loaded for inference (GradBuffers::kNone: what generate, serve, eval, merge and
// validate load) holds the weights only, computes the same losses and logits as one loaded for
// training, and refuses a training forward with a one-line error.
TEST_F(ModelDirTest, AnInferenceLoadHoldsNoGradientsAndComputesTheSame) {
  for (const ModelConfig& c : {llama(false), llama(true), gpt2()}) {
    Transformer<float> m(c);
    m.init_weights(5);
    const std::string d = (dir_ / (c.family_name() + std::to_string(c.tie_embeddings))).string();
    save_model_dir(d, m);
    Transformer<float> train = load_model_dir(d);
    Transformer<float> infer = load_model_dir(d, GradBuffers::kNone);
    EXPECT_EQ(infer.weights(), train.weights()) << d;
    EXPECT_EQ(train.grads().size(), train.weights().size());
    EXPECT_TRUE(infer.grads().empty());
    const int B = 2, T = 8;
    std::vector<int32_t> x(B * T), y(B * T);
    for (int i = 0; i < B * T; ++i) {
      x[i] = (7 * i + 3) % c.vocab_size;
      y[i] = (11 * i + 5) % c.vocab_size;
    }
    EXPECT_EQ(infer.loss(x.data(), y.data(), B, T), train.loss(x.data(), y.data(), B, T)) << d;
    const float* a = infer.logits_of(x.data(), B, T);
    const std::vector<float> la(a, a + static_cast<size_t>(B) * T * c.padded_vocab());
    const float* b = train.logits_of(x.data(), B, T);
    EXPECT_EQ(la, std::vector<float>(b, b + la.size())) << d;
    try {
      infer.loss_and_grad(x.data(), y.data(), B, T);
      ADD_FAILURE() << "a training forward on an inference model did not throw";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("no gradient buffers"), std::string::npos) << e.what();
    }
    EXPECT_GT(train.loss_and_grad(x.data(), y.data(), B, T), 0.0);  // the training load still trains
  }
}

// The files beside the weights are written byte for byte, and only those given; a file that
// cannot be written (a name outside the directory) fails the save before anything is replaced.
TEST_F(ModelDirTest, SavesTheGivenFilesOrNothing) {
  auto read = [](const std::string& p) {
    std::ifstream f(p, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  };
  Transformer<float> m(gpt2());
  m.init_weights(5);
  const std::string d = (dir_ / "m").string();
  const std::string gen = "{\n  \"eos_token_id\": 7\n}\n";
  save_model_dir(
      d, m, {.files = {{"tokenizer.json", "{\"tokenizer\": 1}"}, {"generation_config.json", gen}}});
  EXPECT_EQ(read(d + "/tokenizer.json"), "{\"tokenizer\": 1}");
  EXPECT_EQ(read(d + "/generation_config.json"), gen);
  const std::string weights = read(d + "/model.safetensors");

  Transformer<float> other(gpt2());
  other.init_weights(6);
  for (const char* bad : {"../escape.json", "sub/x", "", "..", "config.json", "model.safetensors"})
    EXPECT_THROW(save_model_dir(d, other, {.files = {{bad, "{}\n"}}}), Error) << bad;
  EXPECT_EQ(read(d + "/model.safetensors"), weights);  // untouched
  EXPECT_EQ(read(d + "/generation_config.json"), gen);
  EXPECT_FALSE(fs::exists(dir_ / "escape.json"));
  EXPECT_FALSE(fs::exists(dir_ / ".tmp-m"));
  EXPECT_EQ(load_model_dir(d).weights(), m.weights());
  // Without either, neither is written.
  save_model_dir((dir_ / "bare").string(), m);
  EXPECT_FALSE(fs::exists(dir_ / "bare/tokenizer.json"));
  EXPECT_FALSE(fs::exists(dir_ / "bare/generation_config.json"));
}

// An interleaved-RoPE model loads back interleaved (config.json's forge_rope_style) and computes
// the same logits as before the save; as rotate-half it would not.
TEST_F(ModelDirTest, InterleavedRopeSurvivesSaveAndLoad) {
  ModelConfig c = llama(false);
  c.rope_style = RopeStyle::kInterleaved;
  Transformer<float> m(c);
  m.init_weights(3);
  const std::string d = (dir_ / "interleaved").string();
  save_model_dir(d, m);
  Transformer<float> back = load_model_dir(d);
  EXPECT_EQ(back.config().rope_style, RopeStyle::kInterleaved);
  const std::vector<int32_t> ids = {5, 17, 3, 99, 42, 0, 7, 8};
  const size_t n = ids.size() * c.padded_vocab();
  const int T = static_cast<int>(ids.size());
  const float* want = m.logits_of(ids.data(), 1, T);
  const std::vector<float> want_v(want, want + n);
  const float* got = back.logits_of(ids.data(), 1, T);
  EXPECT_EQ(std::vector<float>(got, got + n), want_v);
}

TEST_F(ModelDirTest, ReadsWhatOtherWritersProduce) {
  Transformer<float> m(llama(false));
  m.init_weights(3);
  auto ts = tensors(m);
  nlohmann::json cfg = to_hf_config(m.config());
  // transformers 5 dialect: rope_parameters instead of a top-level rope_theta.
  cfg.erase("rope_theta");
  cfg["rope_parameters"] = {{"rope_theta", 5000.0}, {"rope_type", "default"}};
  cfg["rope_scaling"] = nullptr;
  // bf16 weights (rounded here, so the expected f32 values are exact), plus an inv_freq buffer.
  for (auto& [name, t] : ts)
    for (float& x : t.second) x = bf16_to_f32(f32_to_bf16(x));
  ts["model.layers.0.self_attn.rotary_emb.inv_freq"] = {{4}, {1, 2, 3, 4}};
  write_dir(dir_ / "bf16", cfg, ts, io::StDType::kBF16);
  const Transformer<float> a = load_model_dir((dir_ / "bf16").string());
  EXPECT_FLOAT_EQ(a.config().rope_theta, 5000.0f);
  for (const auto& [name, t] : ts) {
    const ParamInfo* p = a.table().find(name);
    if (!p) continue;
    EXPECT_TRUE(std::equal(t.second.begin(), t.second.end(), a.weights().begin() + p->offset))
        << name;
  }

  // No lm_head.weight although config.json says untied: tied, as transformers would load it.
  ts.erase("lm_head.weight");
  ts.erase("model.layers.0.self_attn.rotary_emb.inv_freq");
  write_dir(dir_ / "notied", to_hf_config(m.config()), ts);
  EXPECT_TRUE(load_model_dir((dir_ / "notied").string()).config().tie_embeddings);

  // Shards with an index.
  fs::create_directories(dir_ / "sharded");
  std::ofstream(dir_ / "sharded/config.json") << to_hf_config(m.config()).dump();
  nlohmann::json map;
  std::vector<io::TensorToWrite> s1, s2;
  const auto full = tensors(m);
  for (const auto& [name, t] : full) {
    const bool first = name.find("layers.1") == std::string::npos;
    (first ? s1 : s2).push_back({name, io::StDType::kF32, t.first, t.second.data()});
    map[name] = first ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
  }
  io::write_safetensors((dir_ / "sharded/model-00001-of-00002.safetensors").string(), s1);
  io::write_safetensors((dir_ / "sharded/model-00002-of-00002.safetensors").string(), s2);
  std::ofstream(dir_ / "sharded/model.safetensors.index.json")
      << nlohmann::json{{"metadata", {}}, {"weight_map", map}}.dump();
  EXPECT_EQ(load_model_dir((dir_ / "sharded").string()).weights(), m.weights());
  const ModelDirInfo info = inspect_model_dir((dir_ / "sharded").string());
  EXPECT_EQ(info.tensors.size(), full.size());
  // A weight_map naming the wrong shard.
  map["model.norm.weight"] = "model-00002-of-00002.safetensors";
  std::ofstream(dir_ / "sharded/model.safetensors.index.json")
      << nlohmann::json{{"weight_map", map}}.dump();
  expect_error((dir_ / "sharded").string(),
               "'model.norm.weight' is not in 'model-00002-of-00002.safetensors'");

  // Original OpenAI GPT-2 exports: no "transformer." prefix, attention-mask buffers.
  Transformer<float> g(gpt2());
  g.init_weights(5);
  std::map<std::string, std::pair<Shape, std::vector<float>>> bare;
  for (auto& [name, t] : tensors(g)) bare[name.substr(12)] = t;
  bare["h.0.attn.bias"] = {{1, 1, 2, 2}, {1, 0, 1, 1}};
  write_dir(dir_ / "gpt2", to_hf_config(g.config()), bare);
  EXPECT_EQ(load_model_dir((dir_ / "gpt2").string()).weights(), g.weights());
}

TEST_F(ModelDirTest, WhatCannotBeLoadedFaithfullyIsANamedError) {
  Transformer<float> m(llama(false));
  m.init_weights(3);
  const nlohmann::json cfg = to_hf_config(m.config());
  auto write = [&](const std::string& name, nlohmann::json c, auto edit) {
    auto ts = tensors(m);
    edit(ts);
    write_dir(dir_ / name, c, ts);
    return (dir_ / name).string();
  };
  auto none = [](auto&) {};
  expect_error(
      write("missing", cfg, [](auto& ts) { ts.erase("model.layers.1.mlp.up_proj.weight"); }),
      "missing tensor 'model.layers.1.mlp.up_proj.weight'");
  expect_error(
      write("extra", cfg,
            [](auto& ts) {
              ts["model.layers.0.self_attn.q_norm.weight"] = {{32}, std::vector<float>(32)};
            }),
      "unexpected tensor 'model.layers.0.self_attn.q_norm.weight'");
  nlohmann::json wide = cfg;
  wide["intermediate_size"] = 48;
  expect_error(write("shape", wide, none), "has shape [40, 32] but config.json implies [48, 32]");
  nlohmann::json scaled = cfg;
  scaled["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}};
  expect_error(write("scaled", scaled, none), "rope_type llama3 needs a number 'low_freq_factor'");
  nlohmann::json yarn = cfg;
  yarn["rope_parameters"] = {{"rope_theta", 1e4}, {"rope_type", "yarn"}};
  expect_error(write("yarn", yarn, none), "rope_type 'yarn'");
  nlohmann::json bias = cfg;  // attention_bias is computed now: its tensors must be there
  bias["attention_bias"] = true;
  expect_error(write("bias", bias, none), "missing tensor 'model.layers.0.self_attn.q_proj.bias'");
  nlohmann::json act = cfg;
  act["hidden_act"] = "gelu";
  expect_error(write("act", act, none), "hidden_act 'gelu'");
  nlohmann::json wrong_type = cfg;
  wrong_type["rms_norm_eps"] = "small";
  expect_error(write("type", wrong_type, none), "config.json: a field has the wrong type");

  // dtype: an integer tensor where weights belong.
  const std::string d = write("dtype", cfg, none);
  {
    auto ts = tensors(m);
    std::vector<io::TensorToWrite> w;
    for (const auto& [name, t] : ts)
      w.push_back({name, name == "model.norm.weight" ? io::StDType::kI32 : io::StDType::kF32,
                   t.first, t.second.data()});
    io::write_safetensors(d + "/model.safetensors", w);
  }
  expect_error(d, "'model.norm.weight' is I32");
  std::ofstream(d + "/config.json") << "{\"model_type\": \"llama\",";
  expect_error(d, "config.json: malformed JSON");
  expect_error((dir_ / "nowhere").string(), "not a model directory");
}

// A config.json that claims a model of 20 billion parameters over the small files of a real one
// must fail on the first tensor whose shape disagrees, before the model is allocated (80 GB:
// the process would be killed for memory, or std::bad_alloc would hide which file is wrong).
TEST_F(ModelDirTest, AHugeConfigOverSmallFilesFailsBeforeAllocating) {
  Transformer<float> m(llama(false));
  m.init_weights(3);
  nlohmann::json huge = to_hf_config(m.config());
  huge["vocab_size"] = 1'000'000;
  huge["hidden_size"] = 20'480;
  huge["intermediate_size"] = 65'536;
  huge["num_hidden_layers"] = 4;
  write_dir(dir_ / "huge", huge, tensors(m));
  expect_error((dir_ / "huge").string(),
               "'model.embed_tokens.weight' has shape [100, 32] but config.json implies "
               "[1000000, 20480]");
}

// Sizes beyond Forge's limits, and zero heads (which once killed `forge eval` with SIGFPE, a
// division by n_head), are refused by config.json's validation, before a tensor is read: the
// error names the key and the limit, not a tensor, so nothing was sized from them. Real small
// weights sit beside each config, as a downloaded directory with an edited config.json would.
TEST_F(ModelDirTest, ConfigsBeyondTheLimitsFailBeforeAnyTensorIsRead) {
  Transformer<float> m(llama(false));
  m.init_weights(3);
  const nlohmann::json good = to_hf_config(m.config());
  const std::pair<const char*, int64_t> edits[] = {
      {"num_hidden_layers", 2'000'000'000},       {"vocab_size", 2'147'483'647},
      {"hidden_size", int64_t{1} << 30},          {"intermediate_size", (1 << 20) + 1},
      {"max_position_embeddings", (1 << 24) + 1}, {"num_attention_heads", 0}};
  const char* errors[] = {"config.json: model config: n_layer 2000000000 is beyond Forge's limit",
                          "config.json: model config: vocab_size 2147483647 is beyond",
                          "config.json: model config: n_embd 1073741824 is beyond",
                          "config.json: model config: ffn_hidden 1048577 is beyond",
                          "config.json: model config: max_seq_len 16777217 is beyond",
                          "config.json: num_attention_heads must be positive"};
  for (size_t i = 0; i < std::size(edits); ++i) {
    nlohmann::json bad = good;
    bad[edits[i].first] = edits[i].second;
    const fs::path d = dir_ / edits[i].first;
    write_dir(d, bad, tensors(m));
    SCOPED_TRACE(edits[i].first);
    expect_error(d.string(), errors[i]);
  }
}

// Found by fuzz_safetensors_index: a weight_map naming a shard file with a newline in it made
// "cannot open" a two-line error. The harness's directory: a tiny GPT-2 in 600-byte shards.
TEST_F(ModelDirTest, FuzzFindingShardNameWithANewlineIsRefused) {
  ModelConfig c = preset_config("tiny");
  c.vocab_size = 16;
  c.max_seq_len = 8;
  c.n_layer = 1;
  c.n_embd = 8;
  c.n_head = c.n_kv_head = 2;
  c.ffn_hidden = 32;
  Transformer<float> m(c);
  m.init_weights(1);
  ModelSaveOptions opt;
  opt.shard_size = 600;
  const std::string d = (dir_ / "sharded").string();
  save_model_dir(d, m, opt);
  std::ofstream(d + "/model.safetensors.index.json", std::ios::binary)
      << testing::fuzz_regression("safetensors_index-file_newline");
  expect_error(d, "names '\\x0adel-00003-of-00006.safetensors', which has control characters");
}

}  // namespace
}  // namespace forge
