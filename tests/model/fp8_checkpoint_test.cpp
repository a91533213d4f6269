// FP8 checkpoints (model/fp8_checkpoint.h): a Llama whose linear weights are written the way
// transformers' fine-grained FP8 quantizer stores them — F8_E4M3 tensors, "<name>_scale_inv"
// block scales of amax/448 per block, quantization_config in config.json — loads with every
// weight equal to fp8 · scale of its block (blocks that do not divide the matrices included), saves
// as an ordinary model, and forge inspect's info names it. What Forge does not read is one line:
// other quantization methods, static activation scales, a missing or misshapen scale tensor, FP8
// tensors without a quantization_config.
#include "forge/model/fp8_checkpoint.h"

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>

#include "forge/core/error.h"
#include "forge/io/fp8.h"
#include "forge/io/safetensors.h"
#include "forge/model/model_dir.h"
#include "testing.h"

namespace forge {
namespace {

namespace fs = std::filesystem;

struct Source {
  Shape shape;
  std::vector<float> w;
};

class Fp8CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("forge_fp8_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    ModelConfig c = preset_config("llama-10m");
    c.vocab_size = 100, c.max_seq_len = 16, c.n_layer = 2, c.n_embd = 48, c.n_head = 4, c.n_kv_head = 2;
    c.ffn_hidden = 80;
    model_ = std::make_unique<Transformer<float>>(c);
    model_->init_weights(11);
    for (const auto& p : model_->table().params()) {
      Shape s = p.shape;
      if (p.offset == model_->table().wte() || p.offset == model_->table().lm_head()) s[0] = c.vocab_size;
      const float* w = model_->weights().data() + p.offset;
      source_[p.name] = {s, std::vector<float>(w, w + shape_numel(s))};
    }
  }
  void TearDown() override { fs::remove_all(dir_); }

  static bool quantized(const std::string& name) { return name.ends_with("_proj.weight"); }

  // Writes the model as an FP8 checkpoint with blocks (br, bc) into dir_/name: quantized
  // weights as F8_E4M3 with F32 scales (amax/448 of the block), the rest F32. Returns the
  // weights a faithful loader must produce, by name. `edit` may change the tensors' list.
  std::map<std::string, std::vector<float>> write(const std::string& name, int br, int bc, nlohmann::json qc,
                                                  const std::function<void(std::vector<io::TensorToWrite>&)>& edit = {}) {
    const fs::path d = dir_ / name;
    fs::create_directories(d);
    nlohmann::json config = to_hf_config(model_->config());
    if (!qc.is_null()) config["quantization_config"] = qc;
    std::ofstream(d / "config.json") << config.dump();
    std::map<std::string, std::vector<float>> expect;
    bytes_.clear();
    scales_.clear();
    bytes_.reserve(source_.size());
    scales_.reserve(source_.size());
    std::vector<io::TensorToWrite> out;
    for (const auto& [n, src] : source_) {
      if (!quantized(n)) {
        out.push_back({n, io::StDType::kF32, src.shape, src.w.data()});
        expect[n] = src.w;
        continue;
      }
      const int64_t R = src.shape[0], C = src.shape[1], SR = (R + br - 1) / br, SC = (C + bc - 1) / bc;
      std::vector<float> s(SR * SC, 0.0f);
      for (int64_t r = 0; r < R; ++r)
        for (int64_t c = 0; c < C; ++c)
          s[(r / br) * SC + c / bc] = std::max(s[(r / br) * SC + c / bc], std::fabs(src.w[r * C + c]) / 448.0f);
      std::vector<uint8_t> q(R * C);
      std::vector<float> deq(R * C);
      for (int64_t r = 0; r < R; ++r)
        for (int64_t c = 0; c < C; ++c) {
          const float sc = s[(r / br) * SC + c / bc];
          q[r * C + c] = f32_to_e4m3(src.w[r * C + c] / sc);
          deq[r * C + c] = e4m3_to_f32(q[r * C + c]) * sc;  // what the checkpoint means
        }
      bytes_.push_back(std::move(q));
      scales_.push_back(std::move(s));
      out.push_back({n, io::StDType::kF8E4M3, src.shape, bytes_.back().data()});
      out.push_back({fp8_scale_name(n), io::StDType::kF32, {SR, SC}, scales_.back().data()});
      expect[n] = std::move(deq);
    }
    if (edit) edit(out);
    io::write_safetensors((d / "model.safetensors").string(), out);
    return expect;
  }

  static nlohmann::json fp8_config(int br, int bc) {
    return {{"quant_method", "fp8"}, {"fmt", "e4m3"}, {"activation_scheme", "dynamic"}, {"weight_block_size", {br, bc}}};
  }

  // load_model_dir fails with one line holding `needle`; so does inspect_model_dir when the
  // problem is in config.json (it reads no tensor data).
  void expect_error(const std::string& d, const std::string& needle, bool in_config) {
    for (int inspect = 0; inspect < (in_config ? 2 : 1); ++inspect) {
      try {
        if (inspect) inspect_model_dir(d); else load_model_dir(d);
        ADD_FAILURE() << (inspect ? "inspected" : "loaded") << "; expected an error containing: " << needle;
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << needle << " in: " << e.what();
        EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
      }
    }
  }

  fs::path dir_;
  std::unique_ptr<Transformer<float>> model_;
  std::map<std::string, Source> source_;
  std::vector<std::vector<uint8_t>> bytes_;
  std::vector<std::vector<float>> scales_;
};

TEST_F(Fp8CheckpointTest, LoadsAsTheBlockScaledWeights) {
  // 16 x 32 blocks: 48- and 80-row matrices end in partial row blocks, 48 columns in a partial column block.
  for (const auto& [br, bc] : {std::pair{16, 32}, std::pair{128, 128}}) {
    SCOPED_TRACE(::testing::Message() << br << "x" << bc);
    const std::string name = "fp8_" + std::to_string(br);
    const auto expect = write(name, br, bc, fp8_config(br, bc));
    const Transformer<float> m = load_model_dir((dir_ / name).string());
    size_t checked = 0;
    for (const auto& p : m.table().params()) {
      const std::vector<float>& want = expect.at(p.name);
      const float* got = m.weights().data() + p.offset;
      for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ(got[i], want[i]) << p.name << "[" << i << "]";
      if (quantized(p.name)) {
        ++checked;
        // And near the weights they quantize: E4M3 keeps 3 mantissa bits (≤ 1/16 relative), the
        // smallest magnitudes of a block within its subnormal step.
        const std::vector<float>& w = source_.at(p.name).w;
        const float amax = *std::max_element(w.begin(), w.end(), [](float a, float b) { return std::fabs(a) < std::fabs(b); });
        for (size_t i = 0; i < w.size(); ++i)
          ASSERT_LE(std::fabs(got[i] - w[i]), std::fabs(w[i]) / 16 + std::fabs(amax) / 448 * 0x1p-9f * 2) << p.name;
      }
    }
    EXPECT_EQ(checked, 2u * 7u);  // q, k, v, o, gate, up, down in each of 2 layers
    const ModelDirInfo info = inspect_model_dir((dir_ / name).string());
    EXPECT_EQ(info.fp8.rows, br);
    EXPECT_EQ(info.fp8.cols, bc);
    EXPECT_EQ(fp8_feature(info.fp8), str("FP8 weights (E4M3, ", br, "x", bc, " blocks), dequantized to f32 on load"));
    // Saved, it is an ordinary model: no quantization_config, f32 weights, the same values.
    const std::string saved = (dir_ / (name + "_saved")).string();
    save_model_dir(saved, m);
    std::ifstream f(saved + "/config.json");
    const nlohmann::json j = nlohmann::json::parse(f);
    EXPECT_FALSE(j.contains("quantization_config"));
    EXPECT_FALSE(inspect_model_dir(saved).fp8);
    EXPECT_EQ(load_model_dir(saved).weights(), m.weights());
  }
}

TEST_F(Fp8CheckpointTest, WhatItCannotReadIsANamedError) {
  write("gptq", 16, 16, fp8_config(16, 16));
  {
    nlohmann::json c = to_hf_config(model_->config());
    c["quantization_config"] = {{"quant_method", "gptq"}, {"bits", 4}};
    std::ofstream(dir_ / "gptq" / "config.json") << c.dump();
    expect_error((dir_ / "gptq").string(), "quantization_config: quant_method 'gptq' is not supported", true);
  }
  nlohmann::json fixed = fp8_config(16, 16);
  fixed["activation_scheme"] = "static";
  write("static", 16, 16, fixed);
  expect_error((dir_ / "static").string(), "activation_scheme 'static' is not supported", true);
  nlohmann::json e5 = fp8_config(16, 16);
  e5["fmt"] = "e5m2";
  write("e5m2", 16, 16, e5);
  expect_error((dir_ / "e5m2").string(), "fmt 'e5m2' is not supported", true);
  nlohmann::json per_tensor = fp8_config(16, 16);
  per_tensor.erase("weight_block_size");
  write("per_tensor", 16, 16, per_tensor);
  expect_error((dir_ / "per_tensor").string(), "weight_block_size (missing: per-tensor FP8 scales)", true);

  const std::string q0 = "model.layers.0.self_attn.q_proj.weight";
  write("no_scale", 16, 16, fp8_config(16, 16), [&](auto& ts) {
    std::erase_if(ts, [&](const io::TensorToWrite& t) { return t.name == fp8_scale_name(q0); });
  });
  expect_error((dir_ / "no_scale").string(), "has no block scales '" + fp8_scale_name(q0) + "'", false);
  // Scales cut for 32 x 32 blocks where config.json says 16 x 16.
  write("bad_blocks", 32, 32, fp8_config(16, 16));
  expect_error((dir_ / "bad_blocks").string(), "in blocks of 16x16 needs [3, 3]", false);
  write("no_config", 16, 16, nlohmann::json());
  expect_error((dir_ / "no_config").string(), "is F8_E4M3 but config.json has no FP8 quantization_config", false);
}

}  // namespace
}  // namespace forge
