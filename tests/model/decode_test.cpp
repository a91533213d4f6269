// KV-cache decoding gives the logits of a full recomputation: on the CPU in double, several slots
// at different positions decoded together, each slot's logits compared with forward_logits over
// that slot's whole sequence. GPT-2 (learned positions, fused strided q|k|v), Llama with GQA in
// both RoPE styles and with scaled RoPE, and a sliding window whose cache is a ring (prompts
// longer than the window). Every case twice: the prompts prefilled one by one, and all at once
// packed into one row (Model::prefill_packed, what a decode loop admitting several requests runs).
#include <gtest/gtest.h>

#include <vector>

#include "forge/core/error.h"
#include "forge/model/packed_prompts.h"
#include "forge/model/transformer.h"
#include "model/small_configs.h"
#include "testing.h"

namespace forge {
namespace {

using testing::all_close;
using testing::small_config;

// Each slot s: a prompt of prompt_len[s] tokens, then `steps` decode steps feeding the sequence's
// next tokens (teacher forcing, so the reference is the full forward over the same ids).
void expect_decode_matches_full(const ModelConfig& cfg, const std::vector<int>& prompt_len, int steps,
                                int capacity, uint64_t seed, bool perturb = false) {
  for (const bool packed : {false, true}) {
  SCOPED_TRACE(packed ? "packed prefill" : "one prefill per slot");
  Transformer<double> model(cfg);
  model.init_weights(seed);
  if (perturb) testing::perturb_weights(model.weights(), model.table(), seed + 7);
  const int S = static_cast<int>(prompt_len.size()), Vp = cfg.padded_vocab();
  std::vector<std::vector<int32_t>> seq(S);
  std::vector<std::vector<double>> full(S);  // (len, Vp) logits of each whole sequence
  for (int s = 0; s < S; ++s) {
    const int len = prompt_len[s] + steps;
    ASSERT_LE(len, cfg.max_seq_len);
    seq[s] = testing::random_ids(len, cfg.vocab_size, seed + 100 + s);
    const double* lg = model.logits_of(seq[s].data(), 1, len);
    full[s].assign(lg, lg + static_cast<size_t>(len) * Vp);
  }
  auto row = [&](int s, int t) {
    return std::vector<double>(full[s].begin() + static_cast<size_t>(t) * Vp,
                               full[s].begin() + static_cast<size_t>(t + 1) * Vp);
  };
  auto decoded = [&](int s) {
    const double* lg = model.decode_logits() + static_cast<size_t>(s) * Vp;
    return std::vector<double>(lg, lg + Vp);
  };
  model.plan_decode(S, capacity);
  // Prefill in reverse slot order: a prefill must leave the other slots' caches alone.
  if (!packed) {
    for (int s = S - 1; s >= 0; --s) {
      model.prefill(s, seq[s].data(), prompt_len[s]);
      EXPECT_EQ(model.decode_positions()[s], prompt_len[s]);
    }
  } else {  // one row: slot S−1's prompt first, with positions from 0 and its own segment id
    std::vector<PrefillSeg> segs;
    std::vector<int32_t> tokens;
    for (int s = S - 1; s >= 0; --s) {
      segs.push_back({s, prompt_len[s]});
      tokens.insert(tokens.end(), seq[s].begin(), seq[s].begin() + prompt_len[s]);
    }
    const std::vector<int32_t> lay = packed_prompt_layout(segs.data(), S);  // positions, segment ids
    model.prefill_packed(segs.data(), S, tokens.data(), TokenLayout{lay.data(), lay.data() + tokens.size()});
    for (int s = 0; s < S; ++s) EXPECT_EQ(model.decode_positions()[s], prompt_len[s]);
  }
  for (int s = 0; s < S; ++s)
    EXPECT_TRUE(all_close(decoded(s), row(s, prompt_len[s] - 1), testing::kTolF64)) << "prefill, slot " << s;
  for (int i = 0; i < steps; ++i) {
    for (int s = 0; s < S; ++s) model.decode_tokens()[s] = seq[s][prompt_len[s] + i];
    model.decode_step();
    for (int s = 0; s < S; ++s) {
      EXPECT_EQ(model.decode_positions()[s], prompt_len[s] + i + 1);
      // Double throughout: the two paths differ only in summation order (kTolF64).
      EXPECT_TRUE(all_close(decoded(s), row(s, prompt_len[s] + i), testing::kTolF64))
          << "step " << i << ", slot " << s;
    }
  }
  }
}

TEST(ModelDecodeTest, Gpt2KvCacheMatchesFullRecomputation) {
  expect_decode_matches_full(small_config(Family::kGpt2), {3, 1, 7}, 9, 32, 1);
}

TEST(ModelDecodeTest, LlamaGqaRotateHalfMatchesFullRecomputation) {
  ModelConfig cfg = small_config(Family::kLlama);  // 4 query heads over 2 kv heads
  ASSERT_LT(cfg.n_kv_head, cfg.n_head);
  expect_decode_matches_full(cfg, {5, 2, 1, 8}, 10, 32, 2);
}

TEST(ModelDecodeTest, LlamaInterleavedRopeMatchesFullRecomputation) {
  ModelConfig cfg = small_config(Family::kLlama);
  cfg.rope_style = RopeStyle::kInterleaved;
  expect_decode_matches_full(cfg, {4, 6}, 8, 20, 3);
}

// RoPE scaling reaches both paths, the full forward (transformer_impl.h) and the decode step
// (decode_impl.h), through cfg.rope(); and it changes the logits, so a path that dropped it
// would fail. HS 16, theta 10000, llama3 with original_max_positions 32: pair 0 kept, 1 blended,
// 2-7 divided by the factor.
TEST(ModelDecodeTest, LlamaScaledRopeMatchesFullRecomputation) {
  for (RopeScaling scaling : {RopeScaling::kLinear, RopeScaling::kLlama3}) {
    SCOPED_TRACE(scaling == RopeScaling::kLinear ? "linear" : "llama3");
    ModelConfig cfg = small_config(Family::kLlama);
    cfg.rope_scaling = scaling;
    cfg.rope_factor = 4.0f;
    cfg.rope_original_max_positions = 32;
    expect_decode_matches_full(cfg, {5, 3}, 9, 32, 7);

    const std::vector<int32_t> ids = testing::random_ids(12, cfg.vocab_size, 8);
    Transformer<double> scaled(cfg), plain(small_config(Family::kLlama));
    scaled.init_weights(9);
    plain.init_weights(9);
    const size_t n = static_cast<size_t>(12) * cfg.padded_vocab();
    const double* a = scaled.logits_of(ids.data(), 1, 12);
    const std::vector<double> la(a, a + n);
    const double* b = plain.logits_of(ids.data(), 1, 12);
    const std::vector<double> lb(b, b + n);
    EXPECT_FALSE(static_cast<bool>(all_close(la, lb, testing::kTolF64)))
        << "the scaling did not change the logits";
  }
}

TEST(ModelDecodeTest, SlidingWindowRingMatchesFullRecomputation) {
  ModelConfig cfg = small_config(Family::kLlama);
  cfg.sliding_window = 5;  // the cache holds 5 rows per slot; prompts up to 9 and 11 more steps wrap it
  Transformer<double> probe(cfg);
  probe.plan_decode(2, 32);
  EXPECT_EQ(probe.decode_capacity(), 5);
  EXPECT_EQ(probe.decode_context(), cfg.max_seq_len);
  expect_decode_matches_full(cfg, {9, 2}, 11, 32, 4);
}

// Qwen2 biases, Qwen3 qk-norm with its own head size, Llama attention_bias with llama3 RoPE
// scaling: the decode step's fused q|k|v bias, in-place head norms and scaled rotation.
TEST(ModelDecodeTest, HfFamilyVariantsMatchFullRecomputation) {
  for (const auto& [name, cfg] : testing::llama_family_variants(small_config(Family::kLlama))) {
    SCOPED_TRACE(name);
    expect_decode_matches_full(cfg, {5, 1, 9}, 8, 32, 5, true);
  }
}

TEST(ModelDecodeTest, PackedPrefillRefusesBadPacks) {
  const ModelConfig cfg = small_config(Family::kLlama);
  Transformer<float> model(cfg);
  model.init_weights(3);
  model.plan_decode(3, 16);
  const std::vector<int32_t> ids = testing::random_ids(cfg.max_seq_len + 1, cfg.vocab_size, 4);
  std::vector<int32_t> pos(ids.size()), seg(ids.size(), 0);
  for (size_t t = 0; t < pos.size(); ++t) pos[t] = static_cast<int32_t>(t % 8);
  const TokenLayout lay{pos.data(), seg.data()};
  const PrefillSeg twice[] = {{1, 4}, {1, 4}}, outside[] = {{0, 4}, {3, 4}}, empty[] = {{0, 4}, {2, 0}};
  EXPECT_THROW(model.prefill_packed(twice, 2, ids.data(), lay), Error);
  EXPECT_THROW(model.prefill_packed(outside, 2, ids.data(), lay), Error);
  EXPECT_THROW(model.prefill_packed(empty, 2, ids.data(), lay), Error);
  const PrefillSeg two[] = {{0, 4}, {1, 4}};
  EXPECT_THROW(model.prefill_packed(two, 2, ids.data(), TokenLayout{}), Error);  // no positions or segments
  // Prompts of 16 tokens, each fitting its slot, one more than the context (max_seq_len) holds.
  const int each = 16, k = cfg.max_seq_len / each + 1;
  ASSERT_LE(k, 3);
  std::vector<PrefillSeg> over;
  for (int i = 0; i < k; ++i) over.push_back({i, each});
  EXPECT_THROW(model.prefill_packed(over.data(), k, ids.data(), lay), Error);
}

TEST(ModelDecodeTest, FloatModelMatchesFullRecomputation) {
  // The float model (what generate runs): same path, f32 rounding (kTolF32 vs the float forward).
  const ModelConfig cfg = small_config(Family::kLlama);
  Transformer<float> model(cfg);
  model.init_weights(5);
  const std::vector<int32_t> ids = testing::random_ids(12, cfg.vocab_size, 6);
  const int Vp = cfg.padded_vocab();
  const float* lg = model.logits_of(ids.data(), 1, 12);
  const std::vector<float> full(lg, lg + 12 * Vp);
  model.plan_decode(1, 16);
  model.prefill(0, ids.data(), 4);
  for (int t = 4; t < 12; ++t) {
    model.decode_tokens()[0] = ids[t];
    model.decode_step();
    const std::vector<float> got(model.decode_logits(), model.decode_logits() + Vp);
    const std::vector<float> want(full.begin() + t * Vp, full.begin() + (t + 1) * Vp);
    EXPECT_TRUE(all_close(got, want, testing::kTolF32)) << "position " << t;
  }
}

TEST(ModelDecodeTest, PositionsStopAtTheContext) {
  const ModelConfig cfg = small_config(Family::kGpt2);
  Transformer<float> model(cfg);
  model.init_weights(7);
  model.plan_decode(1, 8);
  EXPECT_EQ(model.decode_context(), 8);
  const std::vector<int32_t> ids = testing::random_ids(8, cfg.vocab_size, 8);
  model.prefill(0, ids.data(), 6);
  for (int i = 0; i < 4; ++i) model.decode_step();  // a finished slot may keep running
  EXPECT_EQ(model.decode_positions()[0], 7);          // clamped to context − 1
}

TEST(ModelDecodeTest, BadArgumentsAreErrors) {
  const ModelConfig cfg = small_config(Family::kLlama);
  Transformer<float> model(cfg);
  EXPECT_THROW(model.plan_decode(0, 8), Error);
  EXPECT_THROW(model.plan_decode(1, cfg.max_seq_len + 1), Error);
  model.plan_decode(2, 8);
  const std::vector<int32_t> ids(9, 1);
  EXPECT_THROW(model.prefill(2, ids.data(), 3), Error);  // no slot 2
  EXPECT_THROW(model.prefill(0, ids.data(), 9), Error);  // longer than the cache
  EXPECT_THROW(model.prefill(0, ids.data(), 0), Error);
}

}  // namespace
}  // namespace forge
