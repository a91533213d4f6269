// forge inspect and forge validate through the binary, and the one-line errors every command
// that reads a model directory gives for broken files: truncated data, a header length past
// the end, overlapping offsets, a wrong dtype, a shape that disagrees with config.json, a
// missing tensor, malformed JSON. Also forge train --init-from on the command line.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cli_runner.h"
#include "forge/data/shard.h"
#include "forge/io/safetensors.h"
#include "forge/model/model_dir.h"
#include "testing.h"

namespace forge {
namespace {

namespace fs = std::filesystem;
using testing::CmdResult;
using testing::slurp;

class InspectTest : public testing::CliTest {
 protected:
  void SetUp() override {
    CliTest::SetUp();
    // An untied llama with GQA and V = 70 (a padded vocabulary).
    ModelConfig c = preset_config("llama-10m");
    c.vocab_size = 70;
    c.max_seq_len = 16;
    c.n_layer = 2;
    c.n_embd = 32;
    c.n_head = 4;
    c.n_kv_head = 2;
    c.ffn_hidden = 48;
    c.tie_embeddings = false;
    Transformer<float> m(c);
    m.init_weights(5);
    save_model_dir(p("model"), m);
  }

  // forge with OpenMP threads that sleep when idle (else they spin on this loaded machine).
  CmdResult forge(const std::string& args) const {
    return forge_env("OMP_WAIT_POLICY=passive", args);
  }
  // A copy of the good model directory to break.
  std::string copy_model(const std::string& name) {
    fs::copy(p("model"), p(name), fs::copy_options::recursive);
    return p(name);
  }
  // A safetensors file from a raw header (padded to 8 bytes) and `data_bytes` zero bytes.
  static void write_raw(const std::string& path, std::string header, size_t data_bytes) {
    while (header.size() % 8) header += ' ';
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    const uint64_t n = header.size();
    f.write(reinterpret_cast<const char*>(&n), 8);
    f << header << std::string(data_bytes, '\0');
  }
};

TEST_F(InspectTest, InspectShowsConfigTensorsAndParameterCount) {
  const CmdResult r = forge("inspect " + p("model") + " --json");
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["model_type"], "llama");
  EXPECT_EQ(j["tied"], false);
  EXPECT_EQ(j["config"]["n_kv_head"], 2);
  // Counted by hand: embed + head 2·70·32, per layer q,o 2·32·32 + k,v 2·16·32 + MLP 3·48·32
  // + norms 2·32, final norm 32.
  const int64_t per_layer = 2 * 32 * 32 + 2 * 16 * 32 + 3 * 48 * 32 + 2 * 32;
  EXPECT_EQ(j["parameters"].get<int64_t>(), 2 * 70 * 32 + 2 * per_layer + 32);
  ASSERT_EQ(j["tensors"].size(), 2u + 2 * 9 + 1);
  bool saw_k = false;
  for (const auto& t : j["tensors"]) {
    EXPECT_EQ(t["dtype"], "F32");
    if (t["name"] == "model.layers.1.self_attn.k_proj.weight") {
      saw_k = true;
      EXPECT_EQ(t["shape"], nlohmann::json::array({16, 32}));
    }
    if (t["name"] == "lm_head.weight") {
      EXPECT_EQ(t["shape"], nlohmann::json::array({70, 32}));
    }
  }
  EXPECT_TRUE(saw_k);
  const CmdResult text = forge("inspect " + p("model"));
  ASSERT_EQ(text.code, 0) << text.err;
  EXPECT_NE(text.out.find("embeddings untied"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("model.layers.0.mlp.gate_proj.weight"), std::string::npos) << text.out;
}

// The golden Qwen3 and scaled-RoPE Llama models: inspect names the type, the family and each
// feature in use, in text and in JSON.
TEST_F(InspectTest, InspectNamesTheFamilyAndEveryFeature) {
  const std::string golden = std::string(FORGE_SOURCE_DIR) + "/tests/data/hf_golden/";
  const CmdResult q3 = forge("inspect " + golden + "qwen3_qk_norm");
  ASSERT_EQ(q3.code, 0) << q3.err;
  EXPECT_NE(q3.out.find("qwen3 model (llama family)"), std::string::npos) << q3.out;
  EXPECT_NE(q3.out.find("qk-norm"), std::string::npos) << q3.out;
  EXPECT_NE(q3.out.find("head_dim 16 (hidden/heads is 8)"), std::string::npos) << q3.out;
  const CmdResult l3 = forge("inspect " + golden + "llama3_rope_scaling --json");
  ASSERT_EQ(l3.code, 0) << l3.err;
  const auto j = nlohmann::json::parse(l3.out);
  EXPECT_EQ(j["config"]["model_type"], "llama");
  bool scaling = false;
  for (const auto& f : j["config"]["features"])
    scaling |= f.get<std::string>().starts_with("RoPE scaling llama3 (factor 8");
  EXPECT_TRUE(scaling) << j["config"]["features"].dump();
  const CmdResult q2 = forge("inspect " + golden + "qwen2_bias");
  ASSERT_EQ(q2.code, 0) << q2.err;
  EXPECT_NE(q2.out.find("q/k/v biases"), std::string::npos) << q2.out;
}

TEST_F(InspectTest, ValidateRoundTripsAndPrintsTheFilesSha256) {
  const CmdResult r =
      forge("validate " + p("model") + " --json --ids 3,1,4,1,5 --logits " + p("logits.json"));
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["valid"], true);
  // The checksum agrees with coreutils' sha256sum.
  std::string want(64, '?');
  FILE* pipe = popen(("sha256sum " + p("model/model.safetensors")).c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  ASSERT_EQ(std::fread(want.data(), 1, 64, pipe), 64u);
  pclose(pipe);
  EXPECT_EQ(j["sha256"]["model.safetensors"], want);
  EXPECT_EQ(j["canonical_sha256"], want);  // Forge wrote it: the canonical form already
  EXPECT_EQ(j["identical_to_canonical"], true);
  const auto logits = nlohmann::json::parse(slurp(p("logits.json")));
  EXPECT_EQ(logits["ids"], nlohmann::json::array({3, 1, 4, 1, 5}));
  ASSERT_EQ(logits["logits"].size(), 5u);
  EXPECT_EQ(logits["logits"][0].size(), 70u);
  expect_user_error(forge("validate " + p("model") + " --ids 1,70"), "out of range");
}

// A round trip whose save is sharded (a model above --shard-size, as every model above 5 GB
// of f32 is by default) compares every file of both saves: one checksum a file, the index too.
// A directory saved with the same shard size is byte-identical to the canonical save.
TEST_F(InspectTest, ValidateRoundTripsAShardedSave) {
  const CmdResult r = forge("validate " + p("model") + " --json --shard-size 8000");
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_TRUE(j["canonical_sha256"].is_object()) << r.out;
  const auto& canon = j["canonical_sha256"];
  EXPECT_TRUE(canon.contains("model.safetensors.index.json")) << r.out;
  EXPECT_GE(canon.size(), 3u) << r.out;  // the index and at least two shards
  EXPECT_EQ(j["identical_to_canonical"], false);  // the directory is one model.safetensors
  // The same weights saved sharded: validate finds the directory to be the canonical form.
  Transformer<float> m = load_model_dir(p("model"));
  ModelSaveOptions opt;
  opt.shard_size = 8000;
  save_model_dir(p("sharded"), m, opt);
  const CmdResult s = forge("validate " + p("sharded") + " --json --shard-size 8000");
  ASSERT_EQ(s.code, 0) << s.err;
  const auto k = nlohmann::json::parse(s.out);
  EXPECT_EQ(k["canonical_sha256"], canon);
  EXPECT_EQ(k["identical_to_canonical"], true) << s.out;
  for (const auto& [f, sum] : k["sha256"].items()) EXPECT_EQ(canon[f], sum) << f;
  expect_user_error(forge("validate " + p("model") + " --shard-size 0"), "shard-size");
}

// An interleaved-RoPE model: both commands say that transformers would read it as rotate-half.
TEST_F(InspectTest, InspectAndValidateWarnAboutInterleavedRope) {
  ModelConfig c = load_model_dir(p("model")).config();
  c.rope_style = RopeStyle::kInterleaved;
  Transformer<float> il(c);
  il.init_weights(5);
  save_model_dir(p("interleaved"), il);
  const std::string warning = "transformers ignores that key and would compute this model with "
                              "rotate-half RoPE";
  for (const char* cmd : {"inspect", "validate"}) {
    SCOPED_TRACE(cmd);
    const CmdResult text = forge(std::string(cmd) + " " + p("interleaved"));
    ASSERT_EQ(text.code, 0) << text.err;
    EXPECT_NE(text.out.find("  warning: rope_style interleaved"), std::string::npos) << text.out;
    EXPECT_NE(text.out.find(warning), std::string::npos) << text.out;
    const CmdResult json = forge(std::string(cmd) + " " + p("interleaved") + " --json");
    ASSERT_EQ(json.code, 0) << json.err;
    const auto j = nlohmann::json::parse(json.out);
    ASSERT_EQ(j["warnings"].size(), 1u) << json.out;
    EXPECT_NE(j["warnings"][0].get<std::string>().find(warning), std::string::npos);
    // The default pairing: no warning.
    const CmdResult plain = forge(std::string(cmd) + " " + p("model"));
    ASSERT_EQ(plain.code, 0) << plain.err;
    EXPECT_EQ(plain.out.find("warning"), std::string::npos) << plain.out;
  }
  const auto j = nlohmann::json::parse(forge("inspect " + p("interleaved") + " --json").out);
  EXPECT_EQ(j["config"]["rope_style"], "interleaved");
}

TEST_F(InspectTest, BrokenFilesAreOneLineErrors) {
  const std::string st = "/model.safetensors";
  // Truncated in the data section, and inside the header.
  std::string d = copy_model("trunc");
  fs::resize_file(d + st, fs::file_size(d + st) - 100);
  expect_user_error(forge("validate " + d), "truncated");
  expect_user_error(forge("inspect " + d), "truncated");
  fs::resize_file(d + st, 20);
  expect_user_error(forge("validate " + d), "runs past the end of the file");
  // A header length past the end of the file.
  d = copy_model("hdr");
  {
    std::fstream f(d + st, std::ios::in | std::ios::out | std::ios::binary);
    const uint64_t huge = 1ull << 40;
    f.write(reinterpret_cast<const char*>(&huge), 8);
  }
  expect_user_error(forge("inspect " + d), "header length");
  // Overlapping tensors.
  d = copy_model("overlap");
  write_raw(
      d + st,
      R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},"b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})",
      16);
  expect_user_error(forge("validate " + d), "overlap");
  // Offsets out of range.
  write_raw(d + st, R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 8);
  expect_user_error(forge("inspect " + d), "run past the end of the data section");
  // A dtype Forge cannot use as weights.
  d = copy_model("dtype");
  {
    const auto f = io::SafetensorsFile::open(p("model") + st);
    std::vector<io::TensorToWrite> ts;
    for (const auto& t : f.tensors())
      ts.push_back({t.name, t.name == "model.norm.weight" ? io::StDType::kI32 : t.dtype, t.shape,
                    f.data(t)});
    io::write_safetensors(d + st, ts);
  }
  expect_user_error(forge("validate " + d), "'model.norm.weight' is I32");
  // config.json disagreeing with the tensors; a missing tensor; malformed JSON.
  d = copy_model("shape");
  auto cfg = nlohmann::json::parse(slurp(d + "/config.json"));
  cfg["intermediate_size"] = 64;
  std::ofstream(d + "/config.json") << cfg.dump();
  expect_user_error(forge("validate " + d), "config.json implies [64, 32]");
  expect_user_error(forge("eval --model " + d + " --data " + p("nothing.bin")),
                    "config.json implies");
  d = copy_model("missing");
  {
    const auto f = io::SafetensorsFile::open(p("model") + st);
    std::vector<io::TensorToWrite> ts;
    for (const auto& t : f.tensors())
      if (t.name != "model.layers.1.post_attention_layernorm.weight")
        ts.push_back({t.name, t.dtype, t.shape, f.data(t)});
    io::write_safetensors(d + st, ts);
  }
  expect_user_error(forge("validate " + d),
                    "missing tensor 'model.layers.1.post_attention_layernorm.weight'");
  d = copy_model("json");
  std::ofstream(d + "/config.json") << "{\"model_type\": \"llama\", \"vocab_size\": ";
  expect_user_error(forge("inspect " + d), "malformed JSON");
  expect_user_error(forge("validate " + p("absent")), "not a model directory");
  expect_user_error(forge("inspect"), "missing DIR");
}

TEST_F(InspectTest, TrainInitFromTakesTheModelAndRefusesModelSettings) {
  std::vector<uint32_t> t(3000);
  for (size_t i = 0; i < t.size(); ++i) t[i] = static_cast<uint32_t>(i % 70);
  write_shard(p("train_000000.bin"), t);
  write_shard(p("val_000000.bin"), std::vector<uint32_t>(t.begin(), t.begin() + 500));
  const std::string base = "train --init-from " + p("model") + " --data " + dir_.string() +
                           " --steps 2 seq_len=16 batch_size=2 eval_windows=2";
  expect_user_error(forge(base + " --out " + p("r1") + " n_layer=4"),
                    "drop the model setting 'n_layer=4'");
  expect_user_error(forge(base + " --out " + p("r1") + " --preset tiny"), "drop --preset");
  const CmdResult r = forge(base + " --out " + p("r2"));
  ASSERT_EQ(r.code, 0) << r.err;
  const CmdResult i = forge("inspect " + p("r2/model") + " --json");
  ASSERT_EQ(i.code, 0) << i.err;
  const auto j = nlohmann::json::parse(i.out);
  EXPECT_EQ(j["tied"], false);
  EXPECT_EQ(j["config"]["n_layer"], 2);
  EXPECT_EQ(nlohmann::json::parse(slurp(p("r2/config.json")))["init_from"], p("model"));
}

TEST_F(InspectTest, HelpForInspectAndValidate) {
  for (const char* cmd : {"inspect", "validate"}) {
    const CmdResult r = forge(std::string(cmd) + " --help");
    EXPECT_EQ(r.code, 0) << cmd;
    EXPECT_NE(r.out.find("usage: forge " + std::string(cmd)), std::string::npos) << r.out;
  }
}

}  // namespace
}  // namespace forge
