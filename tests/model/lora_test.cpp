// LoRA (model/lora.h, model/lora_dir.h): adapter gradients against finite differences, a fresh
// adapter computes the base exactly, the frozen base gets no gradient, merging equals the adapted
// model, the saved adapter directory is PEFT's format, and bad input fails in one line.
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <type_traits>

#include "forge/core/error.h"
#include "forge/io/safetensors.h"
#include "forge/model/lora.h"
#include "forge/model/lora_dir.h"
#include "forge/model/transformer_impl.h"
#include "testing.h"

namespace forge {
namespace {

namespace fs = std::filesystem;
using testing::all_close;
using testing::random_ids;

constexpr const char* kAllTargets = "targets=q,k,v,o,gate,up,down";

ModelConfig tiny_llama() {
  ModelConfig c;
  c.family = Family::kLlama;
  c.vocab_size = 37;
  c.max_seq_len = 8;
  c.n_layer = 2;
  c.n_embd = 16;
  c.n_head = 4;
  c.n_kv_head = 2;
  c.ffn_hidden = 24;
  c.rope_theta = 100.0f;
  return c;
}

// qwen3's per-head q/k norm with attention biases (q, k, v and o): the q and k adapters feed
// the norm.
ModelConfig tiny_qwen3_bias() {
  ModelConfig c = tiny_llama();
  c.variant = LlamaVariant::kQwen3;
  c.qk_norm = true;
  c.qkv_bias = c.o_bias = true;
  c.head_size = 8;
  return c;
}

template <class M>
void randomize_base(M& m, uint64_t seed) {
  using T = std::remove_reference_t<decltype(m.weights()[0])>;
  m.init_weights(seed);
  const auto noise = testing::random_normal<double>(m.weights().size(), seed + 1, 0.3);
  const int64_t pad = static_cast<int64_t>(m.config().vocab_size) * m.config().n_embd;
  for (size_t i = 0; i < noise.size(); ++i)
    if (!(static_cast<int64_t>(i) >= m.table().wte() + pad &&
          static_cast<int64_t>(i) < m.table().wte() + static_cast<int64_t>(m.config().padded_vocab()) * m.config().n_embd))
      m.weights()[i] += static_cast<T>(noise[i]);
}

// Nonzero A and B, so every adapter term matters.
template <typename T>
void randomize_adapter(Model<CpuBackend<T>>& m, uint64_t seed) {
  const auto noise = testing::random_normal<double>(m.adapter_weights().size(), seed, 0.4);
  for (size_t i = 0; i < noise.size(); ++i) m.adapter_weights()[i] = static_cast<T>(noise[i]);
}

void check_adapter_gradient(const ModelConfig& cfg, const std::string& spec, uint64_t seed) {
  Transformer<double> m(cfg);
  randomize_base(m, seed);
  m.attach_lora(parse_lora_spec(spec), seed);
  randomize_adapter(m, seed + 5);
  const int B = 2, T = 5;
  auto tokens = random_ids(B * T, cfg.vocab_size, seed + 2);
  auto targets = random_ids(B * T, cfg.vocab_size, seed + 3);
  targets[3] = -1;
  m.zero_grad();
  m.loss_and_grad(tokens.data(), targets.data(), B, T);
  EXPECT_TRUE(m.grads().empty()) << "a frozen base holds no gradient buffer";
  const std::vector<double> analytic = m.adapter_grads();
  const auto numeric =
      testing::finite_diff(m.adapter_weights(), [&] { return m.loss(tokens.data(), targets.data(), B, T); });
  ASSERT_EQ(analytic.size(), static_cast<size_t>(m.adapter_table()->total()));
  for (const auto& p : m.adapter_table()->params()) {
    std::vector<double> a(analytic.begin() + p.offset, analytic.begin() + p.offset + p.numel());
    std::vector<double> n(numeric.begin() + p.offset, numeric.begin() + p.offset + p.numel());
    EXPECT_TRUE(all_close(a, n, testing::kTolFiniteDiff)) << p.name;
    double norm = 0;
    for (double x : a) norm += x * x;
    EXPECT_GT(norm, 0.0) << p.name << ": the check needs a gradient that is not zero";
  }
}

TEST(Lora, AdapterGradientsMatchFiniteDifferencesAllTargets) {
  check_adapter_gradient(tiny_llama(), std::string("r=3,alpha=5,") + kAllTargets, 31);
}

TEST(Lora, AdapterGradientsMatchFiniteDifferencesQkNormAndBiases) {
  check_adapter_gradient(tiny_qwen3_bias(), std::string("r=2,alpha=4,") + kAllTargets, 41);
}

// The CPU backend with q, k, v and gate, up as separate products, as a model with adapters runs
// them: the base the adapted model must equal exactly. (Against the fused products the two differ
// in the last bits wherever the BLAS kernel rounds a 32-column product otherwise than 16 + 8 + 8
// columns: OpenBLAS's Haswell and SkylakeX kernels do, its Sandybridge kernel does not.)
template <typename T>
class SeparateProductsBackend : public CpuBackend<T> {
 public:
  using CpuBackend<T>::CpuBackend;
  bool fuses_qkv() const { return false; }
  bool fuses_gate_up() const { return false; }
};

TEST(Lora, FreshAdapterComputesTheBaseExactlyAndTheBaseStaysFrozen) {
  const ModelConfig cfg = tiny_llama();
  Model<SeparateProductsBackend<float>> base(cfg);
  Transformer<float> lora(cfg);
  randomize_base(base, 7);
  lora.weights() = base.weights();
  lora.attach_lora(parse_lora_spec(std::string("r=4,alpha=8,") + kAllTargets), 9);
  const int B = 2, T = 6;
  auto tokens = random_ids(B * T, cfg.vocab_size, 3), targets = random_ids(B * T, cfg.vocab_size, 4);
  EXPECT_EQ(lora.loss(tokens.data(), targets.data(), B, T), base.loss(tokens.data(), targets.data(), B, T));
  // A is drawn (PEFT's kaiming-uniform bound 1/sqrt(in)), B is zero.
  const AdapterTable& at = *lora.adapter_table();
  const LoraSlot& q0 = at.slot(0, LoraTarget::kQ);
  float amax = 0;
  for (int64_t i = 0; i < 4 * q0.in; ++i) amax = std::max(amax, std::fabs(lora.adapter_weights()[q0.a + i]));
  EXPECT_GT(amax, 0.5f / std::sqrt(16.0f));
  EXPECT_LE(amax, 1.0f / std::sqrt(16.0f));
  for (int64_t i = 0; i < static_cast<int64_t>(q0.out) * 4; ++i) ASSERT_EQ(lora.adapter_weights()[q0.b + i], 0.0f);

  // A few plain SGD steps on the adapter gradients: the adapters move, the base does not.
  const std::vector<float> w0 = lora.weights(), a0 = lora.adapter_weights();
  for (int s = 0; s < 3; ++s) {
    lora.zero_grad();
    lora.loss_and_grad(tokens.data(), targets.data(), B, T);
    for (size_t i = 0; i < a0.size(); ++i) lora.adapter_weights()[i] -= 0.1f * lora.adapter_grads()[i];
  }
  EXPECT_EQ(lora.weights(), w0);
  EXPECT_NE(lora.adapter_weights(), a0);
  EXPECT_NE(lora.loss(tokens.data(), targets.data(), B, T), base.loss(tokens.data(), targets.data(), B, T));
}

TEST(Lora, MergedModelComputesTheAdaptedLogits) {
  const ModelConfig cfg = tiny_qwen3_bias();
  Transformer<double> lora(cfg), merged(cfg);
  randomize_base(lora, 11);
  lora.attach_lora(parse_lora_spec(std::string("r=3,alpha=6,") + kAllTargets), 12);
  randomize_adapter(lora, 13);
  std::vector<double> w = lora.weights();
  merge_lora(lora.table(), w, *lora.adapter_table(), lora.adapter_weights());
  merged.weights() = w;
  const int B = 2, T = 7;
  const auto tokens = random_ids(B * T, cfg.vocab_size, 14);
  const double* lp = lora.logits_of(tokens.data(), B, T);
  const std::vector<double> want(lp, lp + static_cast<size_t>(B) * T * cfg.padded_vocab());
  const double* mp = merged.logits_of(tokens.data(), B, T);
  const std::vector<double> got(mp, mp + want.size());
  EXPECT_TRUE(all_close(got, want, {1e-12, 1e-11}));
  // ... and differ from the base's: the adapters matter here.
  Transformer<double> base(cfg);
  base.weights() = lora.weights();
  const double* bp = base.logits_of(tokens.data(), B, T);
  EXPECT_FALSE(all_close(std::vector<double>(bp, bp + want.size()), want, {1e-6, 1e-6}));
}

TEST(Lora, DecodingAnAdaptedModelIsRefused) {
  Transformer<float> m(tiny_llama());
  m.attach_lora(parse_lora_spec("r=2"), 1);
  EXPECT_THROW(m.plan_decode(1, 8), Error);
}

class LoraDir : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("forge_lora_" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST_F(LoraDir, SavedAdapterIsPeftsFormatAndLoadsBack) {
  const ModelConfig cfg = tiny_llama();
  Transformer<float> m(cfg);
  randomize_base(m, 21);
  m.attach_lora(parse_lora_spec("r=4,alpha=16,targets=q,v,o,down"), 22);
  randomize_adapter(m, 23);
  const std::string out = (dir_ / "adapter").string();
  save_adapter_dir(out, *m.adapter_table(), m.adapter_weights(), "/models/base", {{"tokenizer.json", "{}"}});

  // What PEFT's save_pretrained writes (peft/utils/save_and_load.py, tuners/lora/config.py).
  std::set<std::string> files;
  for (const auto& e : fs::directory_iterator(out)) files.insert(e.path().filename().string());
  EXPECT_EQ(files, (std::set<std::string>{"adapter_config.json", "adapter_model.safetensors", "tokenizer.json"}));
  std::ifstream cf(out + "/adapter_config.json");
  const nlohmann::json j = nlohmann::json::parse(cf);
  EXPECT_EQ(j["peft_type"], "LORA");
  EXPECT_EQ(j["task_type"], "CAUSAL_LM");
  EXPECT_EQ(j["r"], 4);
  EXPECT_TRUE(j["lora_alpha"].is_number_integer());
  EXPECT_EQ(j["lora_alpha"], 16);
  EXPECT_EQ(j["lora_dropout"], 0.0);
  EXPECT_EQ(j["bias"], "none");
  EXPECT_EQ(j["fan_in_fan_out"], false);
  EXPECT_EQ(j["base_model_name_or_path"], "/models/base");
  EXPECT_EQ(j["target_modules"].get<std::set<std::string>>(),
            (std::set<std::string>{"q_proj", "v_proj", "o_proj", "down_proj"}));

  const io::SafetensorsFile f = io::SafetensorsFile::open(out + "/adapter_model.safetensors");
  EXPECT_EQ(f.tensors().size(), 2u * 4u * 2u);  // 2 layers × 4 modules × (A, B)
  const auto shape_of = [&](const std::string& k) {
    const io::TensorInfo* t = f.find(k);
    return t ? t->shape : Shape{};
  };
  EXPECT_EQ(shape_of("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"), (Shape{4, 16}));
  EXPECT_EQ(shape_of("base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"), (Shape{16, 4}));
  EXPECT_EQ(shape_of("base_model.model.model.layers.1.self_attn.v_proj.lora_B.weight"), (Shape{8, 4}));  // 2 kv heads × 4
  EXPECT_EQ(shape_of("base_model.model.model.layers.1.self_attn.o_proj.lora_A.weight"), (Shape{4, 16}));
  EXPECT_EQ(shape_of("base_model.model.model.layers.1.mlp.down_proj.lora_A.weight"), (Shape{4, 24}));
  EXPECT_EQ(shape_of("base_model.model.model.layers.1.mlp.down_proj.lora_B.weight"), (Shape{16, 4}));
  EXPECT_EQ(f.find("base_model.model.model.layers.0.self_attn.k_proj.lora_A.weight"), nullptr);

  const LoadedAdapter back = load_adapter_dir(out, cfg);
  EXPECT_EQ(back.base_model, "/models/base");
  EXPECT_EQ(back.lora.r, 4);
  EXPECT_EQ(back.lora.alpha, 16.0);
  Transformer<float> m2(cfg);
  m2.weights() = m.weights();
  m2.attach_lora(back.lora, 99);
  m2.adapter_weights() = back.weights;
  const int B = 1, T = 8;
  const auto tokens = random_ids(B * T, cfg.vocab_size, 24);
  const float* l1 = m.logits_of(tokens.data(), B, T);
  const std::vector<float> want(l1, l1 + static_cast<size_t>(T) * cfg.padded_vocab());
  const float* l2 = m2.logits_of(tokens.data(), B, T);
  EXPECT_EQ(std::vector<float>(l2, l2 + want.size()), want);
}

TEST_F(LoraDir, AdapterOfAnotherBaseIsRefused) {
  ModelConfig cfg = tiny_llama();
  Transformer<float> m(cfg);
  m.attach_lora(parse_lora_spec("r=2,targets=q,up"), 1);
  const std::string out = (dir_ / "adapter").string();
  save_adapter_dir(out, *m.adapter_table(), m.adapter_weights(), "base");
  ModelConfig wider = cfg;
  wider.ffn_hidden = 32;
  EXPECT_THROW(load_adapter_dir(out, wider), Error);  // up_proj's B has 24 rows, not 32
  ModelConfig deeper = cfg;
  deeper.n_layer = 3;
  EXPECT_THROW(load_adapter_dir(out, deeper), Error);  // no tensors for layer 2
  ModelConfig shallower = cfg;
  shallower.n_layer = 1;
  EXPECT_THROW(load_adapter_dir(out, shallower), Error);  // layer 1's tensors belong to no slot
  ModelConfig gpt2 = cfg;
  gpt2.family = Family::kGpt2;
  gpt2.n_kv_head = gpt2.n_head;
  EXPECT_THROW(load_adapter_dir(out, gpt2), Error);
  EXPECT_NO_THROW(load_adapter_dir(out, cfg));
}

TEST(Lora, SpecParsingAndItsErrors) {
  const LoraConfig c = parse_lora_spec("r=16,alpha=32,targets=q,k,v,o,gate,up,down");
  EXPECT_EQ(c.r, 16);
  EXPECT_EQ(c.alpha, 32.0);
  EXPECT_EQ(c.scale(), 2.0);
  EXPECT_EQ(c.targets.size(), 7u);
  const LoraConfig d = parse_lora_spec("targets=q_proj,down_proj,r=4");
  EXPECT_EQ(d.r, 4);
  EXPECT_EQ(d.targets, (std::vector<LoraTarget>{LoraTarget::kQ, LoraTarget::kDown}));
  for (const char* bad : {"r=0", "r=-2", "r=x", "targets=q,w", "alpha=1,targets=q,q", "dropout=0.1", "rank=4",
                          "r=4,,alpha=2", "alpha=nan"})
    EXPECT_THROW(parse_lora_spec(bad), Error) << bad;
  EXPECT_NO_THROW(parse_lora_spec("r=4,dropout=0"));
  ModelConfig g = tiny_llama();
  g.family = Family::kGpt2;
  g.n_kv_head = g.n_head;
  try {
    AdapterTable t(g, parse_lora_spec("r=2"));
    FAIL() << "GPT-2 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("GPT-2"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace forge
