// Activation recomputation (model/recompute.h) on the CPU backend: at every level the losses,
// every parameter gradient (LoRA: every adapter gradient) and the logits equal recompute=none's
// bit for bit, for GPT-2, Llama (GQA, RoPE), the Llama-shaped HF variants (Qwen2's biases,
// Qwen3's qk-norm, ...), a sliding window, packed rows and adapters, in f32 and in double; and
// each level allocates fewer activation bytes than the one below it.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "forge/core/error.h"
#include "forge/model/lora.h"
#include "forge/model/transformer.h"
#include "model/packed_layout.h"
#include "model/small_configs.h"
#include "testing.h"

namespace forge {
namespace {

using testing::small_config;

constexpr Recompute kLevels[] = {Recompute::kAttn, Recompute::kMlp, Recompute::kFull};

// Bit patterns equal (memcmp: −0 and +0 differ, as they would in the next op's rounding).
template <typename T>
::testing::AssertionResult same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  if (a.size() != b.size()) return ::testing::AssertionFailure() << "sizes " << a.size() << " vs " << b.size();
  for (size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(T)) != 0)
      return ::testing::AssertionFailure() << "element " << i << ": " << a[i] << " vs " << b[i];
  return ::testing::AssertionSuccess();
}

template <typename T>
struct Outcome {
  std::vector<T> losses, grads, logits;
  size_t act_bytes = 0;
};

struct Case {
  std::string name;
  ModelConfig cfg;
  bool perturb = false;
  bool packed = false;
  const char* lora = nullptr;  // --lora spec
};

std::vector<Case> cases() {
  std::vector<Case> out = {{"gpt2", small_config(Family::kGpt2)}, {"llama", small_config(Family::kLlama)}};
  for (auto& [name, cfg] : testing::llama_family_variants(small_config(Family::kLlama)))
    out.push_back({name, cfg, true});
  ModelConfig window = small_config(Family::kLlama);
  window.sliding_window = 5;
  out.push_back({"llama-window", window});
  out.push_back({"gpt2-packed", small_config(Family::kGpt2), false, true});
  for (auto& [name, cfg] : testing::llama_family_variants(small_config(Family::kLlama)))
    if (name == "qwen3") out.push_back({"qwen3-packed", cfg, true, true});
  out.push_back({"llama-lora", small_config(Family::kLlama), false, true, "r=4,alpha=8,targets=q,k,v,o,gate,up,down"});
  for (auto& [name, cfg] : testing::llama_family_variants(small_config(Family::kLlama)))
    if (name == "qwen2") out.push_back({"qwen2-lora", cfg, true, false, "r=2,alpha=4,targets=q,v,down"});
  return out;
}

// Two micro-batches accumulated (the second of another shape, so the activations are planned
// twice), then the logits of a third batch; the same weights and inputs at every level.
template <typename T>
Outcome<T> run(const Case& c, Recompute level) {
  Transformer<T> m(c.cfg);
  m.init_weights(3);
  if (c.perturb) testing::perturb_weights(m.weights(), m.table(), 4);
  if (c.lora) {
    m.attach_lora(parse_lora_spec(c.lora), 5);
    // B = 0 at attach: random adapters, so that every adapter's path carries a gradient.
    const std::vector<T> noise = testing::random_normal<T>(m.adapter_weights().size(), 6, 0.2);
    for (size_t i = 0; i < noise.size(); ++i) m.adapter_weights()[i] += noise[i];
  }
  m.set_recompute(level);
  EXPECT_EQ(m.recompute(), level);
  Outcome<T> o;
  m.zero_grad();
  const std::pair<int, int> shapes[] = {{2, 24}, {3, 16}};
  for (int i = 0; i < 2; ++i) {
    const auto [B, T_] = shapes[i];
    const auto x = testing::random_ids(B * T_, c.cfg.vocab_size, 10 + i);
    auto y = testing::random_ids(B * T_, c.cfg.vocab_size, 20 + i);
    y[1] = -1;
    const testing::PackedLayout lay = testing::random_packed_layout(B, T_, 7, 30 + i);
    const TokenLayout tl = c.packed ? TokenLayout{lay.pos.data(), lay.seg.data()} : TokenLayout{};
    m.loss_and_grad(x.data(), y.data(), B, T_, 0.5, tl);
    o.losses.insert(o.losses.end(), m.losses(), m.losses() + B * T_);
    if (i == 0) o.act_bytes = m.activation_bytes();
  }
  o.grads = c.lora ? m.adapter_grads() : m.grads();
  const auto x = testing::random_ids(2 * 9, c.cfg.vocab_size, 40);
  const T* logits = m.logits_of(x.data(), 2, 9);
  o.logits.assign(logits, logits + 2 * 9 * c.cfg.padded_vocab());
  return o;
}

template <typename T>
void expect_levels_match_none() {
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    const Outcome<T> none = run<T>(c, Recompute::kNone);
    ASSERT_FALSE(none.grads.empty());
    for (Recompute level : kLevels) {
      SCOPED_TRACE(recompute_name(level));
      const Outcome<T> r = run<T>(c, level);
      EXPECT_TRUE(same_bits(r.losses, none.losses));
      EXPECT_TRUE(same_bits(r.grads, none.grads));
      EXPECT_TRUE(same_bits(r.logits, none.logits));
      EXPECT_LT(r.act_bytes, none.act_bytes);
    }
  }
}

TEST(Recompute, EveryLevelMatchesNoneBitForBitF32) { expect_levels_match_none<float>(); }
TEST(Recompute, EveryLevelMatchesNoneBitForBitF64) { expect_levels_match_none<double>(); }

// The gradients are not trivially equal: a changed weight changes them (the comparison above
// would catch a level that, say, skipped a layer's backward).
TEST(Recompute, ComparisonSeesADifferentGradient) {
  Case c{"llama", small_config(Family::kLlama)};
  const Outcome<float> a = run<float>(c, Recompute::kFull);
  c.cfg.rope_theta = 500.0f;
  const Outcome<float> b = run<float>(c, Recompute::kFull);
  EXPECT_FALSE(same_bits(a.grads, b.grads));
}

size_t bytes_at(ModelConfig cfg, Recompute level, int layers, int B, int T) {
  cfg.n_layer = layers;
  Transformer<float> m(cfg);
  m.init_weights(1);
  m.set_recompute(level);
  const auto x = testing::random_ids(B * T, cfg.vocab_size, 1);
  m.loss(x.data(), x.data(), B, T);
  return m.activation_bytes();
}

// none > attn, mlp > full, and each layer more costs exactly what the level keeps a layer:
// full only x_in, (B, T, C) elements.
TEST(Recompute, LevelsLowerTheActivationBytes) {
  for (Family f : {Family::kGpt2, Family::kLlama}) {
    SCOPED_TRACE(f == Family::kGpt2 ? "gpt2" : "llama");
    const ModelConfig cfg = small_config(f);
    const int B = 2, T = 32;
    const size_t none = bytes_at(cfg, Recompute::kNone, 4, B, T);
    const size_t attn = bytes_at(cfg, Recompute::kAttn, 4, B, T);
    const size_t mlp = bytes_at(cfg, Recompute::kMlp, 4, B, T);
    const size_t full = bytes_at(cfg, Recompute::kFull, 4, B, T);
    EXPECT_GT(none, attn);
    EXPECT_GT(none, mlp);
    EXPECT_GT(attn, full);
    EXPECT_GT(mlp, full);
    const size_t x_in = static_cast<size_t>(B) * T * cfg.n_embd * sizeof(float);
    EXPECT_EQ(full - bytes_at(cfg, Recompute::kFull, 3, B, T), x_in);
    // none keeps, per layer, at least x_in, ln1, x_mid, ln2, atty, q/k/v and the MLP's buffers.
    const size_t per_layer_none = none - bytes_at(cfg, Recompute::kNone, 3, B, T);
    EXPECT_GT(per_layer_none, 8 * x_in);
  }
}

// Changing the level re-plans the activations (a captured step graph is then stale) and the
// next step runs at the new level.
TEST(Recompute, SetRecomputeReplans) {
  Transformer<float> m(small_config(Family::kLlama));
  m.init_weights(1);
  const auto x = testing::random_ids(2 * 8, 100, 1);
  m.loss(x.data(), x.data(), 2, 8);
  const int64_t gen = m.plan_generation();
  const size_t before = m.activation_bytes();
  m.set_recompute(Recompute::kMlp);
  m.loss(x.data(), x.data(), 2, 8);
  EXPECT_GT(m.plan_generation(), gen);
  EXPECT_LT(m.activation_bytes(), before);
  const int64_t gen_mlp = m.plan_generation();
  m.set_recompute(Recompute::kMlp);  // the same level: no new plan
  m.loss(x.data(), x.data(), 2, 8);
  EXPECT_EQ(m.plan_generation(), gen_mlp);
}

TEST(Recompute, ParseNamesTheLevels) {
  EXPECT_EQ(parse_recompute("none"), Recompute::kNone);
  EXPECT_EQ(parse_recompute("attn"), Recompute::kAttn);
  EXPECT_EQ(parse_recompute("mlp"), Recompute::kMlp);
  EXPECT_EQ(parse_recompute("full"), Recompute::kFull);
  for (Recompute r : kLevels) EXPECT_EQ(parse_recompute(recompute_name(r)), r);
  try {
    parse_recompute("all");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "recompute: expected none, attn, mlp or full, got 'all'");
  }
}

}  // namespace
}  // namespace forge
