// Whole-model gradients against central finite differences, in double, for tiny configs of
// both families: every parameter of the model is checked.
#include <cmath>

#include "forge/core/error.h"
#include "forge/model/transformer.h"
#include "testing.h"

namespace forge {
namespace {

using testing::all_close;
using testing::random_ids;

ModelConfig tiny_gpt2() {
  ModelConfig c;
  c.family = Family::kGpt2;
  c.vocab_size = 37;  // padded to 64: the padding must get no gradient and no probability
  c.max_seq_len = 8;
  c.n_layer = 2;
  c.n_embd = 8;
  c.n_head = c.n_kv_head = 2;
  c.ffn_hidden = 32;
  return c;
}

ModelConfig tiny_llama(bool tied, int window) {
  ModelConfig c;
  c.family = Family::kLlama;
  c.vocab_size = 37;
  c.max_seq_len = 8;
  c.n_layer = 2;
  c.n_embd = 16;
  c.n_head = 4;
  c.n_kv_head = 2;  // GQA 2:1
  c.ffn_hidden = 24;
  c.rope_theta = 100.0f;  // large angles at these short positions exercise RoPE
  c.tie_embeddings = tied;
  c.sliding_window = window;
  return c;
}

// Random weights at a scale large enough that every nonlinearity is away from linear.
void randomize(Transformer<double>& m, uint64_t seed) {
  m.init_weights(seed);
  auto noise = testing::random_normal<double>(m.weights().size(), seed + 1, 0.3);
  for (const auto& p : m.table().params()) {
    for (int64_t i = 0; i < p.numel(); ++i) {
      const bool padding_row = (p.offset == m.table().wte() || p.offset == m.table().lm_head()) &&
                               i >= static_cast<int64_t>(m.config().vocab_size) * m.config().n_embd;
      if (!padding_row) m.weights()[p.offset + i] += noise[p.offset + i];
    }
  }
}

void check_model_gradient(const ModelConfig& cfg, uint64_t seed) {
  Transformer<double> m(cfg);
  randomize(m, seed);
  const int B = 2, T = 5;
  auto tokens = random_ids(B * T, cfg.vocab_size, seed + 2);
  auto targets = random_ids(B * T, cfg.vocab_size, seed + 3);
  targets[3] = -1;  // ignore_index
  m.zero_grad();
  m.loss_and_grad(tokens.data(), targets.data(), B, T);
  const std::vector<double> analytic = m.grads();
  const auto numeric = testing::finite_diff(m.weights(), [&] { return m.loss(tokens.data(), targets.data(), B, T); });
  for (const auto& p : m.table().params()) {
    std::vector<double> a(analytic.begin() + p.offset, analytic.begin() + p.offset + p.numel());
    std::vector<double> n(numeric.begin() + p.offset, numeric.begin() + p.offset + p.numel());
    EXPECT_TRUE(all_close(a, n, testing::kTolFiniteDiff)) << p.name;
  }
  // The embedding's padding rows are never predicted: no gradient reaches them.
  const int64_t pad0 = m.table().wte() + static_cast<int64_t>(cfg.vocab_size) * cfg.n_embd;
  const int64_t pad1 = m.table().wte() + static_cast<int64_t>(cfg.padded_vocab()) * cfg.n_embd;
  for (int64_t i = pad0; i < pad1; ++i) ASSERT_EQ(analytic[i], 0.0);
}

TEST(TransformerGrad, Gpt2MatchesFiniteDifferences) { check_model_gradient(tiny_gpt2(), 10); }

TEST(TransformerGrad, LlamaUntiedGqaMatchesFiniteDifferences) {
  check_model_gradient(tiny_llama(false, 0), 20);
}

TEST(TransformerGrad, LlamaTiedSlidingWindowMatchesFiniteDifferences) {
  check_model_gradient(tiny_llama(true, 3), 30);
}

// Qwen2: biases on q, k, v (and none on o).
TEST(TransformerGrad, Qwen2QkvBiasesMatchFiniteDifferences) {
  ModelConfig c = tiny_llama(true, 0);
  c.variant = LlamaVariant::kQwen2;
  c.qkv_bias = true;
  check_model_gradient(c, 40);
}

// Qwen3: per-head q/k RMSNorm before RoPE and a head size that is not n_embd / n_head.
TEST(TransformerGrad, Qwen3QkNormAndExplicitHeadSizeMatchFiniteDifferences) {
  ModelConfig c = tiny_llama(false, 0);
  c.variant = LlamaVariant::kQwen3;
  c.qk_norm = true;
  c.head_size = 6;  // n_embd / n_head is 4
  check_model_gradient(c, 50);
}

// Llama with attention_bias (q, k, v and o biases) and llama3 RoPE scaling: at head size 4, theta
// 100 and an original context of 16 one frequency is blended and the other divided by the factor.
TEST(TransformerGrad, LlamaAttentionBiasAndLlama3RopeMatchFiniteDifferences) {
  ModelConfig c = tiny_llama(false, 0);
  c.qkv_bias = c.o_bias = true;
  c.rope_scaling = RopeScaling::kLlama3;
  c.rope_factor = 4.0f;
  c.rope_original_max_positions = 16;
  check_model_gradient(c, 60);
}

// The float model computes the same loss and gradients as the double one (same weights).
TEST(Transformer, FloatMatchesDouble) {
  for (const ModelConfig& cfg : {tiny_gpt2(), tiny_llama(false, 0)}) {
    Transformer<double> md(cfg);
    randomize(md, 40);
    Transformer<float> mf(cfg);
    std::copy(md.weights().begin(), md.weights().end(), mf.weights().begin());
    const int B = 3, T = 7;
    auto tokens = random_ids(B * T, cfg.vocab_size, 41);
    auto targets = random_ids(B * T, cfg.vocab_size, 42);
    md.zero_grad();
    mf.zero_grad();
    const double ld = md.loss_and_grad(tokens.data(), targets.data(), B, T);
    const double lf = mf.loss_and_grad(tokens.data(), targets.data(), B, T);
    EXPECT_NEAR(lf, ld, 1e-5 * std::fabs(ld));
    // f32 through ~20 ops of depth: 1e-4 relative with an absolute floor for tiny entries.
    EXPECT_TRUE(all_close(mf.grads(), md.grads(), {2e-5, 1e-3})) << cfg.family_name();
  }
}

TEST(Transformer, UniformWeightsPredictUniformly) {
  // All-zero weights except norm gains: logits are all zero, so the loss is log(V) exactly —
  // and padded columns must not take probability mass (else it would be log(Vp)).
  ModelConfig cfg = tiny_gpt2();
  Transformer<double> m(cfg);
  std::fill(m.weights().begin(), m.weights().end(), 0.0);
  const int B = 1, T = 4;
  auto tokens = random_ids(B * T, cfg.vocab_size, 5);
  auto targets = random_ids(B * T, cfg.vocab_size, 6);
  EXPECT_NEAR(m.loss(tokens.data(), targets.data(), B, T), std::log(37.0), 1e-12);
}

TEST(Transformer, RejectsOutOfRangeTokensAndLongSequences) {
  Transformer<float> m(tiny_gpt2());
  std::vector<int32_t> tokens = {1, 2, 37, 4};
  EXPECT_THROW(m.logits_of(tokens.data(), 1, 4), Error);
  EXPECT_THROW(m.loss(tokens.data(), tokens.data(), 1, 4), Error);
  std::vector<int32_t> long_seq(9, 1);
  EXPECT_THROW(m.logits_of(long_seq.data(), 1, 9), Error);
}

}  // namespace
}  // namespace forge
