// Packed rows (model/transformer.h's TokenLayout): several examples in one row, positions
// restarting per example, attention kept inside each. In double: the gradients against finite
// differences, and the key property — a packed row's loss and gradients equal the
// token-weighted combination of each example's own padded row, so packing changes nothing but
// speed. Plus: positions restart (a row whose positions ran on gives other logits) and nothing
// leaks across segments (another example's tokens leave an example's logits unchanged).
#include <cmath>
#include <vector>

#include "forge/core/error.h"
#include "forge/model/transformer.h"
#include "testing.h"

namespace forge {
namespace {

using testing::all_close;
using testing::random_ids;

ModelConfig tiny(Family f, int window = 0) {
  ModelConfig c;
  c.family = f;
  c.vocab_size = 37;
  c.max_seq_len = 10;
  c.n_layer = 2;
  c.n_embd = f == Family::kGpt2 ? 8 : 16;
  c.n_head = f == Family::kGpt2 ? 2 : 4;
  c.n_kv_head = 2;
  c.ffn_hidden = 24;
  c.rope_theta = 100.0f;  // large angles at short positions: a wrong position shows
  c.sliding_window = window;
  return c;
}

void randomize(Transformer<double>& m, uint64_t seed) {
  m.init_weights(seed);
  auto noise = testing::random_normal<double>(m.weights().size(), seed + 1, 0.3);
  for (size_t i = 0; i < noise.size(); ++i) m.weights()[i] += noise[i];
}

// (name, config) of the cases every test runs: GPT-2 (learned positions), Llama with GQA (RoPE),
// and Llama with a sliding window shorter than an example.
std::vector<std::pair<const char*, ModelConfig>> cases() {
  return {{"gpt2", tiny(Family::kGpt2)}, {"llama", tiny(Family::kLlama)}, {"llama-window2", tiny(Family::kLlama, 2)}};
}

// Two examples of lengths 4 and 5 (inputs; targets are the next token, the last -1) packed in
// one row of T = 10 with one pad token, and each alone in a padded row of T = 10.
struct Packed {
  static constexpr int T = 10, n1 = 4, n2 = 5;
  std::vector<int32_t> e1, e2;        // inputs
  std::vector<int32_t> y1, y2;        // targets
  std::vector<int32_t> x, y, pos, seg;  // the packed row
  explicit Packed(uint64_t seed) {
    e1 = random_ids(n1, 37, seed);
    e2 = random_ids(n2, 37, seed + 1);
    y1 = random_ids(n1, 37, seed + 2);
    y2 = random_ids(n2, 37, seed + 3);
    y1.back() = y2.back() = -1;  // targets never cross into the next example
    y2[1] = -1;                  // an untrained (prompt) target inside an example
    build();
  }
  void build() {
    x.clear(), y.clear(), pos.clear(), seg.clear();
    for (int i = 0; i < n1; ++i) x.push_back(e1[i]), y.push_back(y1[i]), pos.push_back(i), seg.push_back(0);
    for (int i = 0; i < n2; ++i) x.push_back(e2[i]), y.push_back(y2[i]), pos.push_back(i), seg.push_back(1);
    x.push_back(0), y.push_back(-1), pos.push_back(0), seg.push_back(2);  // padding
  }
  TokenLayout layout() const { return {pos.data(), seg.data()}; }
  // Example e alone, padded to T (pad id 0, target -1).
  static void padded(const std::vector<int32_t>& e, const std::vector<int32_t>& t, std::vector<int32_t>& px,
                     std::vector<int32_t>& py) {
    px.assign(T, 0);
    py.assign(T, -1);
    std::copy(e.begin(), e.end(), px.begin());
    std::copy(t.begin(), t.end(), py.begin());
  }
};

int64_t trained(const std::vector<int32_t>& y) {
  int64_t n = 0;
  for (int32_t t : y) n += t >= 0;
  return n;
}

TEST(Packing, GradientsMatchFiniteDifferences) {
  for (const auto& c : cases()) {
    const char* name = c.first;
    const ModelConfig& cfg = c.second;
    Transformer<double> m(cfg);
    randomize(m, 7);
    // Two rows of 5: row 0 holds examples of 3 and 2 tokens, row 1 of 1 and 4.
    const int B = 2, T = 5;
    const std::vector<int32_t> pos = {0, 1, 2, 0, 1, 0, 0, 1, 2, 3}, seg = {0, 0, 0, 1, 1, 0, 1, 1, 1, 1};
    auto tokens = random_ids(B * T, cfg.vocab_size, 8);
    auto targets = random_ids(B * T, cfg.vocab_size, 9);
    targets[2] = targets[5] = -1;
    const TokenLayout lay{pos.data(), seg.data()};
    m.zero_grad();
    m.loss_and_grad(tokens.data(), targets.data(), B, T, 1.0, lay);
    const std::vector<double> analytic = m.grads();
    const auto numeric =
        testing::finite_diff(m.weights(), [&] { return m.loss(tokens.data(), targets.data(), B, T, lay); });
    for (const auto& p : m.table().params()) {
      std::vector<double> a(analytic.begin() + p.offset, analytic.begin() + p.offset + p.numel());
      std::vector<double> n(numeric.begin() + p.offset, numeric.begin() + p.offset + p.numel());
      EXPECT_TRUE(all_close(a, n, testing::kTolFiniteDiff)) << name << " " << p.name;
    }
  }
}

// The key property: loss and gradients of the packed row [e1 | e2 | pad] equal the
// token-weighted mean of e1's and e2's padded rows.
TEST(Packing, PackedRowEqualsTokenWeightedPaddedRows) {
  for (const auto& c : cases()) {
    const char* name = c.first;
    const ModelConfig& cfg = c.second;
    Transformer<double> m(cfg);
    randomize(m, 11);
    const Packed p(12);
    const int T = Packed::T;
    m.zero_grad();
    const double packed_loss = m.loss_and_grad(p.x.data(), p.y.data(), 1, T, 1.0, p.layout());
    const std::vector<double> packed_grad = m.grads();

    std::vector<int32_t> x1, y1, x2, y2;
    Packed::padded(p.e1, p.y1, x1, y1);
    Packed::padded(p.e2, p.y2, x2, y2);
    const double n1 = static_cast<double>(trained(y1)), n2 = static_cast<double>(trained(y2));
    ASSERT_GT(n1, 0);
    ASSERT_GT(n2, 0);
    m.zero_grad();
    const double l1 = m.loss_and_grad(x1.data(), y1.data(), 1, T, n1 / (n1 + n2));
    const double l2 = m.loss_and_grad(x2.data(), y2.data(), 1, T, n2 / (n1 + n2));
    EXPECT_NEAR(packed_loss, (n1 * l1 + n2 * l2) / (n1 + n2), 1e-12) << name;
    EXPECT_TRUE(all_close(packed_grad, m.grads(), testing::kTolF64)) << name;

    // And the float model agrees to f32 rounding.
    Transformer<float> mf(cfg);
    std::copy(m.weights().begin(), m.weights().end(), mf.weights().begin());
    EXPECT_NEAR(mf.loss(p.x.data(), p.y.data(), 1, T, p.layout()), packed_loss, 1e-5 * packed_loss) << name;
  }
}

// e2's logits in the packed row equal its logits alone at positions 0..n2-1. With GPT-2's learned
// positions they differ when e2's positions run on from e1's (4..8): restarting is what makes
// them equal. RoPE's scores depend on position differences only, so within a segment Llama's
// logits do not see the shift (checked too); RopeUsesPerTokenPositions checks the rotation.
TEST(Packing, PositionsRestartPerExample) {
  for (const auto& c : cases()) {
    const char* name = c.first;
    const ModelConfig& cfg = c.second;
    if (cfg.sliding_window > 0) continue;
    Transformer<double> m(cfg);
    randomize(m, 21);
    const Packed p(22);
    const int T = Packed::T, Vp = cfg.padded_vocab();
    std::vector<int32_t> x2, y2;
    Packed::padded(p.e2, p.y2, x2, y2);
    const double* a = m.logits_of(x2.data(), 1, T);
    const std::vector<double> alone(a, a + static_cast<size_t>(Packed::n2) * Vp);
    auto e2_logits = [&](const std::vector<int32_t>& pos) {
      const double* l = m.logits_of(p.x.data(), 1, T, {pos.data(), p.seg.data()});
      return std::vector<double>(l + static_cast<size_t>(Packed::n1) * Vp,
                                 l + static_cast<size_t>(Packed::n1 + Packed::n2) * Vp);
    };
    EXPECT_TRUE(all_close(e2_logits(p.pos), alone, testing::kTolF64)) << name;
    std::vector<int32_t> running(T);
    for (int t = 0; t < T; ++t) running[t] = t;
    const std::vector<double> ran_on = e2_logits(running);
    double diff = 0;
    for (size_t i = 0; i < alone.size(); ++i) diff = std::max(diff, std::fabs(ran_on[i] - alone[i]));
    if (cfg.family == Family::kGpt2)
      EXPECT_GT(diff, 1e-3) << name << ": positions 4..8 gave the logits of positions 0..4";
    else
      EXPECT_LT(diff, 1e-9) << name << ": RoPE within a segment depends on position differences only";
  }
}

// Changing e1's tokens leaves e2's logits unchanged with segments, and changes them without
// (so the test can see a leak).
TEST(Packing, NoAttentionAcrossSegments) {
  for (const auto& c : cases()) {
    const char* name = c.first;
    const ModelConfig& cfg = c.second;
    Transformer<double> m(cfg);
    randomize(m, 31);
    Packed p(32);
    const int T = Packed::T, Vp = cfg.padded_vocab();
    auto e2_logits = [&](bool segments) {
      const double* l = m.logits_of(p.x.data(), 1, T, {p.pos.data(), segments ? p.seg.data() : nullptr});
      return std::vector<double>(l + static_cast<size_t>(Packed::n1) * Vp,
                                 l + static_cast<size_t>(Packed::n1 + Packed::n2) * Vp);
    };
    const std::vector<double> before = e2_logits(true), before_leaky = e2_logits(false);
    for (int32_t& t : p.e1) t = (t + 5) % cfg.vocab_size;
    p.build();
    EXPECT_TRUE(all_close(e2_logits(true), before, testing::kTolF64)) << name;
    const std::vector<double> after_leaky = e2_logits(false);
    double diff = 0;
    for (size_t i = 0; i < before.size(); ++i) diff = std::max(diff, std::fabs(after_leaky[i] - before_leaky[i]));
    EXPECT_GT(diff, 1e-6) << name << ": without segments e1 should reach e2";
  }
}

// The RoPE op with per-token positions rotates each token by its own position: a row holding
// segments of 3 and 2 tokens at positions 0,1,2,0,1 equals each segment rotated from 0 alone,
// and differs from the rotation by t.
TEST(Packing, RopeUsesPerTokenPositions) {
  const int T = 5, H = 2, HS = 8;
  const Rope rope{100.0f};
  const std::vector<int32_t> pos = {0, 1, 2, 0, 1};
  const std::vector<double> x = testing::random_normal<double>(static_cast<size_t>(T) * H * HS, 3, 1.0);
  std::vector<double> packed = x, by_t = x, first(x.begin(), x.begin() + 3 * H * HS),
                      second(x.begin() + 3 * H * HS, x.end());
  cpu::rope_fwd<double>(packed.data(), 1, T, H, HS, rope, 0, pos.data());
  cpu::rope_fwd<double>(by_t.data(), 1, T, H, HS, rope);
  cpu::rope_fwd<double>(first.data(), 1, 3, H, HS, rope);
  cpu::rope_fwd<double>(second.data(), 1, 2, H, HS, rope);
  std::vector<double> expect = first;
  expect.insert(expect.end(), second.begin(), second.end());
  EXPECT_TRUE(all_close(packed, expect, testing::kTolF64));
  EXPECT_FALSE(all_close(packed, by_t, testing::kTolF64));
  // The backward undoes the forward at the same positions.
  cpu::rope_bwd<double>(packed.data(), 1, T, H, HS, rope, 0, pos.data());
  EXPECT_TRUE(all_close(packed, x, testing::kTolF64));
}

// The attention op with segment ids: a row holding segments of 3 and 4 tokens gives each
// segment's output and gradients exactly as that segment alone (its own row), with and without
// a window shorter than a segment, with and without the saved probabilities.
TEST(Packing, AttentionWithSegmentsEqualsEachSegmentAlone) {
  const int T = 7, NH = 4, NKV = 2, HS = 4, n1 = 3;
  const std::vector<int32_t> seg = {0, 0, 0, 1, 1, 1, 1};
  for (int window : {0, 2}) {
    for (bool saved : {false, true}) {
      const size_t q_row = NH * HS, kv_row = NKV * HS;
      const auto q = testing::random_normal<double>(T * q_row, 41, 1.0);
      const auto k = testing::random_normal<double>(T * kv_row, 42, 1.0);
      const auto v = testing::random_normal<double>(T * kv_row, 43, 1.0);
      const auto dout = testing::random_normal<double>(T * q_row, 44, 1.0);
      auto run = [&](int t0, int len, const int32_t* sg, std::vector<double>& out, std::vector<double>& dq,
                     std::vector<double>& dk, std::vector<double>& dv) {
        const AttentionShape sh{1, len, NH, NKV, HS, true, window};
        std::vector<double> lse(static_cast<size_t>(NH) * len), probs(saved ? lse.size() * len : 0);
        out.assign(len * q_row, 0), dq.assign(len * q_row, 0), dk.assign(len * kv_row, 0), dv.assign(len * kv_row, 0);
        cpu::flash_attention_fwd<double>(out.data(), lse.data(), q.data() + t0 * q_row, k.data() + t0 * kv_row,
                                         v.data() + t0 * kv_row, sh, {}, saved ? probs.data() : nullptr, sg);
        cpu::flash_attention_bwd<double>(dq.data(), dk.data(), dv.data(), dout.data() + t0 * q_row,
                                         q.data() + t0 * q_row, k.data() + t0 * kv_row, v.data() + t0 * kv_row,
                                         out.data(), lse.data(), sh, {}, saved ? probs.data() : nullptr, sg);
      };
      std::vector<double> o, dq, dk, dv, o1, dq1, dk1, dv1, o2, dq2, dk2, dv2;
      run(0, T, seg.data(), o, dq, dk, dv);
      run(0, n1, nullptr, o1, dq1, dk1, dv1);
      run(n1, T - n1, nullptr, o2, dq2, dk2, dv2);
      auto cat = [](std::vector<double> a, const std::vector<double>& b) {
        a.insert(a.end(), b.begin(), b.end());
        return a;
      };
      EXPECT_TRUE(all_close(o, cat(o1, o2), testing::kTolF64)) << window << saved;
      EXPECT_TRUE(all_close(dq, cat(dq1, dq2), testing::kTolF64)) << window << saved;
      EXPECT_TRUE(all_close(dk, cat(dk1, dk2), testing::kTolF64)) << window << saved;
      EXPECT_TRUE(all_close(dv, cat(dv1, dv2), testing::kTolF64)) << window << saved;
    }
  }
}

TEST(Packing, RejectsPositionsOutsideTheModel) {
  Transformer<float> m(tiny(Family::kGpt2));
  const std::vector<int32_t> tokens = {1, 2, 3, 4}, pos = {0, 1, 10, 0}, seg = {0, 0, 0, 1};
  EXPECT_THROW(m.loss(tokens.data(), tokens.data(), 1, 4, {pos.data(), seg.data()}), Error);
  const std::vector<int32_t> neg = {0, -1, 0, 1};
  EXPECT_THROW(m.logits_of(tokens.data(), 1, 4, {neg.data(), seg.data()}), Error);
}

}  // namespace
}  // namespace forge
