// The op sequence of the one model, recorded on the CPU: a backend that logs each op before the
// CPU backend runs it. Model<Backend> is the template the GPU instantiates too, so these are the
// calls a GPU step makes — fused ops included (residual + norm, the GEMM with the GELU epilogue
// and its fused backward, attention reading GPT-2's q/k/v in place with strides, the LM head
// fused with the loss). The expected sequences are DESIGN.md's "one training step", written out
// by hand; the finite-difference tests (transformer_grad_test.cpp) check the same path's values.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "forge/model/transformer_impl.h"
#include "testing.h"

namespace forge {
namespace {

template <typename T>
class RecordingBackend : public CpuBackend<T> {
 public:
  using CpuBackend<T>::CpuBackend;
  std::vector<std::string> calls;

#define FORGE_RECORD(op)                             \
  template <class... A>                              \
  void op(A&&... a) {                                \
    calls.push_back(#op);                            \
    CpuBackend<T>::op(std::forward<A>(a)...);        \
  }
  FORGE_RECORD(embedding_fwd)
  FORGE_RECORD(embedding_bwd)
  FORGE_RECORD(layernorm_fwd)
  FORGE_RECORD(residual_layernorm_fwd)
  FORGE_RECORD(layernorm_bwd)
  FORGE_RECORD(rmsnorm_fwd)
  FORGE_RECORD(residual_rmsnorm_fwd)
  FORGE_RECORD(rmsnorm_bwd)
  FORGE_RECORD(linear_fwd)
  FORGE_RECORD(linear_gelu_fwd)
  FORGE_RECORD(linear_bwd)
  FORGE_RECORD(linear_dgelu_bwd)
  FORGE_RECORD(swiglu_fwd)
  FORGE_RECORD(swiglu_bwd)
  FORGE_RECORD(swiglu_fwd_rows)
  FORGE_RECORD(swiglu_bwd_rows)
  FORGE_RECORD(rope_fwd)
  FORGE_RECORD(rope_bwd)
  FORGE_RECORD(head_norm_rope_fwd)
  FORGE_RECORD(head_norm_rope_bwd)
  FORGE_RECORD(rope_bias_bwd)
  FORGE_RECORD(bias_grad)
  FORGE_RECORD(lm_head_cross_entropy)
#undef FORGE_RECORD

  // Attention is logged with whether any of q/k/v is read in place (a strided view).
  static bool strided(const AttentionStrides& st) { return st.q != 0 || st.k != 0 || st.v != 0; }
  void attention_fwd(T* out, typename CpuBackend<T>::AttnSaved& saved, T* q, T* k, T* v, const AttentionShape& s,
                     const AttentionStrides& st, const int32_t* seg) {
    calls.push_back(strided(st) ? "attention_fwd strided" : "attention_fwd");
    CpuBackend<T>::attention_fwd(out, saved, q, k, v, s, st, seg);
  }
  void attention_bwd(T* dq, T* dk, T* dv, T* dout, T* q, T* k, T* v, T* out,
                     typename CpuBackend<T>::AttnSaved& saved, const AttentionShape& s, const AttentionStrides& st,
                     const int32_t* seg) {
    calls.push_back(strided(st) ? "attention_bwd strided" : "attention_bwd");
    CpuBackend<T>::attention_bwd(dq, dk, dv, dout, q, k, v, out, saved, s, st, seg);
  }
};

using Recorded = Model<RecordingBackend<double>>;

ModelConfig one_layer(Family f) {
  ModelConfig c;
  c.family = f;
  c.vocab_size = 30;
  c.max_seq_len = 8;
  c.n_layer = 1;
  c.n_embd = 16;
  c.n_head = 2;
  c.n_kv_head = f == Family::kGpt2 ? 2 : 1;
  c.ffn_hidden = 24;
  c.tie_embeddings = f == Family::kGpt2;
  return c;
}

std::vector<std::string> record_step(const ModelConfig& cfg) {
  Recorded m(cfg);
  m.init_weights(3);
  const auto x = testing::random_ids(2 * 5, cfg.vocab_size, 4), y = testing::random_ids(2 * 5, cfg.vocab_size, 5);
  m.loss_and_grad(x.data(), y.data(), 2, 5);
  return m.backend().calls;
}

TEST(ModelOps, Gpt2StepRunsTheFusedSequence) {
  const std::vector<std::string> want = {
      // forward
      "embedding_fwd", "layernorm_fwd", "linear_fwd" /* c_attn (N, 3C) */, "attention_fwd strided",
      "linear_fwd" /* attn c_proj */, "residual_layernorm_fwd", "linear_gelu_fwd" /* c_fc + GELU */,
      "linear_fwd" /* mlp c_proj */, "residual_layernorm_fwd" /* + ln_f */, "lm_head_cross_entropy",
      // backward
      "layernorm_bwd" /* ln_f */, "linear_dgelu_bwd" /* mlp c_proj + GELU */, "linear_bwd" /* c_fc */,
      "layernorm_bwd" /* ln_2 */, "linear_bwd" /* attn c_proj */, "attention_bwd strided",
      "linear_bwd" /* c_attn */, "layernorm_bwd" /* ln_1 */, "embedding_bwd"};
  EXPECT_EQ(record_step(one_layer(Family::kGpt2)), want);
}

TEST(ModelOps, LlamaStepRunsTheFusedSequence) {
  const std::vector<std::string> want = {
      // forward
      "embedding_fwd", "rmsnorm_fwd", "linear_fwd" /* q|k|v, one (N, QKV) product */,
      "rope_fwd" /* q and k (adjacent heads) in place in it */, "attention_fwd strided",
      "linear_fwd" /* o_proj */, "residual_rmsnorm_fwd", "linear_fwd" /* gate|up, one (N, 2FF) product */, "swiglu_fwd_rows",
      "linear_fwd" /* down */, "residual_rmsnorm_fwd" /* + norm */, "lm_head_cross_entropy",
      // backward
      "rmsnorm_bwd", "linear_bwd" /* down */, "swiglu_bwd_rows", "linear_bwd" /* gate|up */, "rmsnorm_bwd",
      "linear_bwd" /* o_proj */, "attention_bwd strided", "rope_bwd" /* q and k */, "linear_bwd" /* q|k|v */,
      "rmsnorm_bwd", "embedding_bwd"};
  EXPECT_EQ(record_step(one_layer(Family::kLlama)), want);
}

// Qwen3: the per-head q/k norm and RoPE are one op each way (no separate norm or rotation; the
// backward writes d(q_raw), d(k_raw) in place over dq, dk, so nothing is zeroed for it either),
// and one call takes q's and k's heads (adjacent in the fused row, their gains adjacent too).
TEST(ModelOps, Qwen3StepFusesTheHeadNormWithRope) {
  ModelConfig cfg = one_layer(Family::kLlama);
  cfg.variant = LlamaVariant::kQwen3;
  cfg.qk_norm = true;
  const std::vector<std::string> want = {
      // forward
      "embedding_fwd", "rmsnorm_fwd", "linear_fwd" /* q|k|v */,
      "head_norm_rope_fwd" /* q and k from its slices */, "attention_fwd strided" /* v in place */,
      "linear_fwd" /* o_proj */, "residual_rmsnorm_fwd", "linear_fwd" /* gate|up */, "swiglu_fwd_rows",
      "linear_fwd" /* down */, "residual_rmsnorm_fwd" /* + norm */, "lm_head_cross_entropy",
      // backward
      "rmsnorm_bwd", "linear_bwd" /* down */, "swiglu_bwd_rows", "linear_bwd" /* gate|up */, "rmsnorm_bwd",
      "linear_bwd" /* o_proj */, "attention_bwd strided",
      "head_norm_rope_bwd" /* q and k */, "linear_bwd" /* q|k|v */, "rmsnorm_bwd", "embedding_bwd"};
  EXPECT_EQ(record_step(cfg), want);
}

// A backend that runs q, k and v as three products (FORGE_QKV=separate on the GPU; every backend
// with LoRA adapters).
template <typename T>
class ThreeProductBackend : public RecordingBackend<T> {
 public:
  using RecordingBackend<T>::RecordingBackend;
  bool fuses_qkv() const { return false; }
};

// Qwen2: the q/k bias gradients come out of the backward rotation's pass (rope_bias_bwd), with
// q|k|v fused (one pass over the fused gradient's adjacent q and k heads; v's by bias_grad over
// its slice, so the fused product computes none) and with three products (v's is linear_bwd's).
TEST(ModelOps, Qwen2TakesTheQkBiasGradientFromTheRotation) {
  ModelConfig cfg = one_layer(Family::kLlama);
  cfg.variant = LlamaVariant::kQwen2;
  cfg.qkv_bias = true;
  const auto fused = record_step(cfg);
  EXPECT_EQ(std::count(fused.begin(), fused.end(), "rope_bias_bwd"), 1);  // q and k adjacent: one pass
  EXPECT_EQ(std::count(fused.begin(), fused.end(), "bias_grad"), 1);
  EXPECT_EQ(std::count(fused.begin(), fused.end(), "rope_bwd"), 0);
  EXPECT_EQ(std::count(fused.begin(), fused.end(), "linear_bwd"), 4);  // q|k|v, o, gate|up, down
  Model<ThreeProductBackend<double>> m(cfg);
  m.init_weights(3);
  const auto x = testing::random_ids(2 * 5, cfg.vocab_size, 4), y = testing::random_ids(2 * 5, cfg.vocab_size, 5);
  m.loss_and_grad(x.data(), y.data(), 2, 5);
  const auto& calls = m.backend().calls;
  EXPECT_EQ(std::count(calls.begin(), calls.end(), "rope_bias_bwd"), 2);
  EXPECT_EQ(std::count(calls.begin(), calls.end(), "rope_bwd"), 0);
  EXPECT_EQ(std::count(calls.begin(), calls.end(), "rope_fwd"), 2);
  EXPECT_EQ(std::count(calls.begin(), calls.end(), "linear_bwd"), 6);  // q, k, v, o, gate|up, down
}

// The fused q|k|v product and the three separate ones, for plain Llama, Qwen2 (biases) and
// Qwen3 (head norms): the same step up to rounding (double; the fused dX sums over QKV columns in
// one product where three products add three sums).
TEST(ModelOps, FusedQkvMatchesThreeProducts) {
  for (int variant = 0; variant < 3; ++variant) {
    ModelConfig cfg = one_layer(Family::kLlama);
    cfg.n_layer = 2;
    cfg.n_head = 4, cfg.n_kv_head = 2;  // NH ≠ NKV: the slices differ in width
    if (variant == 1) cfg.variant = LlamaVariant::kQwen2, cfg.qkv_bias = true;
    if (variant == 2) cfg.variant = LlamaVariant::kQwen3, cfg.qk_norm = true;
    Model<ThreeProductBackend<double>> three(cfg);
    Transformer<double> fused(cfg);
    three.init_weights(21);
    fused.init_weights(21);
    const auto x = testing::random_ids(10, cfg.vocab_size, 22), y = testing::random_ids(10, cfg.vocab_size, 23);
    const double l3 = three.loss_and_grad(x.data(), y.data(), 2, 5);
    const double lf = fused.loss_and_grad(x.data(), y.data(), 2, 5);
    EXPECT_NEAR(l3, lf, 1e-12 * std::abs(l3)) << "variant " << variant;
    EXPECT_TRUE(testing::all_close(three.grads(), fused.grads(), {1e-11, 1e-12})) << "variant " << variant;
    const auto& calls = three.backend().calls;
    EXPECT_EQ(std::count(calls.begin(), calls.end(), "linear_fwd"), 2 * 6);  // q, k, v, o, gate|up, down
  }
}

// Two layers: the second layer's ln1 comes from the first block's fused residual + norm, so
// exactly one plain norm runs forward (layer 0's ln1).
TEST(ModelOps, LaterLayersTakeTheirNormFromTheResidualAdd) {
  ModelConfig cfg = one_layer(Family::kLlama);
  cfg.n_layer = 2;
  const auto calls = record_step(cfg);
  EXPECT_EQ(std::count(calls.begin(), calls.end(), "rmsnorm_fwd"), 1);
  EXPECT_EQ(std::count(calls.begin(), calls.end(), "residual_rmsnorm_fwd"), 4);
}

// A backend that runs gate and up as two products (every backend with LoRA adapters on gate or
// up).
template <typename T>
class TwoProductBackend : public RecordingBackend<T> {
 public:
  using RecordingBackend<T>::RecordingBackend;
  bool fuses_gate_up() const { return false; }
};

// The fused gate|up product and the two separate ones: the same step up to rounding (double;
// the fused dX sums over 2·FF in one product where the two-product path adds two sums), and the
// sequence the two-product path records.
TEST(ModelOps, FusedGateUpMatchesTwoProducts) {
  ModelConfig cfg = one_layer(Family::kLlama);
  cfg.n_layer = 2;
  Model<TwoProductBackend<double>> two(cfg);
  Transformer<double> fused(cfg);
  two.init_weights(11);
  fused.init_weights(11);
  const auto x = testing::random_ids(10, cfg.vocab_size, 12), y = testing::random_ids(10, cfg.vocab_size, 13);
  const double l2 = two.loss_and_grad(x.data(), y.data(), 2, 5), lf = fused.loss_and_grad(x.data(), y.data(), 2, 5);
  EXPECT_NEAR(l2, lf, 1e-12 * std::abs(l2));
  EXPECT_TRUE(testing::all_close(two.grads(), fused.grads(), {1e-11, 1e-12}));
  const auto& calls = two.backend().calls;
  EXPECT_EQ(std::count(calls.begin(), calls.end(), "swiglu_fwd"), 2);
  EXPECT_EQ(std::count(calls.begin(), calls.end(), "swiglu_fwd_rows"), 0);
  EXPECT_EQ(std::count(calls.begin(), calls.end(), "linear_fwd"), 2 * 5);  // q|k|v, o, gate, up, down
}

// The recorded model is the CPU model: same loss and gradients bit for bit.
TEST(ModelOps, RecordingChangesNothing) {
  const ModelConfig cfg = one_layer(Family::kGpt2);
  Recorded a(cfg);
  Transformer<double> b(cfg);
  a.init_weights(7);
  b.init_weights(7);
  const auto x = testing::random_ids(10, cfg.vocab_size, 8), y = testing::random_ids(10, cfg.vocab_size, 9);
  EXPECT_EQ(a.loss_and_grad(x.data(), y.data(), 2, 5), b.loss_and_grad(x.data(), y.data(), 2, 5));
  EXPECT_EQ(a.grads(), b.grads());
}

}  // namespace
}  // namespace forge
