// CPU row sampler (backend/cpu/sample.cpp) against ops/sample.h's definition, and the exact f32
// math it shares with the CUDA twin (ops/sample_math.h). Kept sets are observed by sampling the
// same logits at many positions (the noise is counter-based, so every test is deterministic) and
// compared with references computed here independently, in double, by sorting.
#include "forge/ops/sample.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <numeric>
#include <set>
#include <vector>

#include "forge/core/error.h"
#include "forge/ops/sample_math.h"
#include "testing.h"

namespace forge::cpu {
namespace {

using forge::testing::random_normal;

// One row's logits sampled at positions 0 … N−1 (N rows of one call, so slots differ too).
std::vector<int32_t> sample_positions(const std::vector<float>& logits, const SamplerSettings& st,
                                      int N) {
  const int V = static_cast<int>(logits.size());
  std::vector<float> rows(static_cast<size_t>(N) * V);
  for (int r = 0; r < N; ++r)
    std::copy(logits.begin(), logits.end(), rows.begin() + static_cast<size_t>(r) * V);
  std::vector<SamplerSettings> settings(N, st);
  std::vector<int32_t> pos(N), out(N, -1);
  std::iota(pos.begin(), pos.end(), 0);
  sample_rows<float>(out.data(), rows.data(), settings.data(), nullptr, pos.data(), N, V, V);
  return out;
}

std::set<int32_t> distinct(const std::vector<int32_t>& ids) {
  return {ids.begin(), ids.end()};
}

// Softmax of logits / temperature in double.
std::vector<double> softmax(const std::vector<float>& logits, double temperature) {
  const double m = *std::max_element(logits.begin(), logits.end()) / temperature;
  std::vector<double> p(logits.size());
  double sum = 0;
  for (size_t i = 0; i < p.size(); ++i) sum += p[i] = std::exp(logits[i] / temperature - m);
  for (double& x : p) x /= sum;
  return p;
}

// The top-p set by definition, in double: ids sorted by probability, whole groups of equal
// values added until the head holds top_p. `margin` receives the distance of the two head sums
// around the cut from top_p, so a test can make sure rounding cannot decide it.
std::set<int32_t> top_p_reference(const std::vector<float>& logits, double temperature,
                                  double top_p, double* margin) {
  const std::vector<double> p = softmax(logits, temperature);
  std::vector<int32_t> order(p.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int a, int b) { return logits[a] > logits[b]; });
  std::set<int32_t> kept;
  double head = 0;
  for (size_t i = 0; i < order.size();) {
    const float v = logits[order[i]];
    const double before = head;
    for (; i < order.size() && logits[order[i]] == v; ++i) {
      head += p[order[i]];
      kept.insert(order[i]);
    }
    if (head >= top_p) {
      *margin = std::min(head - top_p, top_p - before);
      return kept;
    }
  }
  *margin = 1;
  return kept;
}

// ---- the shared math --------------------------------------------------------------------------

double ulps(float got, double want) {
  if (want == 0) return got == 0 ? 0 : 1e9;
  int e = 0;
  std::frexp(want, &e);  // |want| in [2^(e−1), 2^e): an f32 ulp there is 2^(e−24)
  return std::fabs(got - want) / std::ldexp(1.0, e - 24);
}

TEST(SampleMath, LogAndExpWithinOneUlp) {
  Rng rng(1, 0);
  double worst_log = 0, worst_exp = 0;
  for (int i = 0; i < 200000; ++i) {
    // x = 2^e · (1 + u) over the whole positive range, subnormals included.
    const float x = std::ldexp(1.0f + rng.uniform(), static_cast<int>(rng.below(276)) - 149);
    if (x == 0 || std::isinf(x)) continue;
    worst_log = std::max(worst_log, ulps(sampling::log_f32(x), std::log(static_cast<double>(x))));
    const float y = -64.0f * rng.uniform();
    worst_exp = std::max(worst_exp, ulps(sampling::exp_f32(y), std::exp(static_cast<double>(y))));
  }
  for (float x : {1.0f, 0.5f, 2.0f, 0.70710677f, 1.4142135f, 0x1p-126f, 0x1p-149f, 3.4e38f})
    worst_log = std::max(worst_log, ulps(sampling::log_f32(x), std::log(static_cast<double>(x))));
  std::printf("log_f32 within %.2f ulp, exp_f32 within %.2f ulp\n", worst_log, worst_exp);
  EXPECT_LE(worst_log, 1.0);
  EXPECT_LE(worst_exp, 1.0);
  EXPECT_EQ(sampling::log_f32(1.0f), 0.0f);
  EXPECT_EQ(sampling::exp_f32(0.0f), 1.0f);
  EXPECT_EQ(sampling::log_f32(0.0f), -sampling::kInf);
  EXPECT_TRUE(std::isnan(sampling::log_f32(-1.0f)));
  EXPECT_EQ(sampling::exp_f32(-65.0f), 0.0f);
  EXPECT_EQ(sampling::exp_f32(-sampling::kInf), 0.0f);
}

// Every one of the 2^24 uniforms: the noise is within 2e-6 of −ln(−ln u) in double, and below
// its bucket's bound (the pruning in both twins relies on it).
TEST(SampleMath, GumbelAccurateAndBelowItsBucketBoundForEveryWord) {
  std::vector<float> bound(256);
  for (uint32_t b = 0; b < 256; ++b) bound[b] = sampling::gumbel_bucket_bound(b);
  double worst = 0;
  uint32_t bad_bound = 0;
  for (uint32_t n = 0; n < (1u << 24); ++n) {
    const uint32_t w = n << 8 | (n & 0xffu);
    const double u = (n + 0.5) / 16777216.0;
    const float g = sampling::gumbel(w);
    worst = std::max(worst, std::fabs(g - -std::log(-std::log(u))));
    if (!(g <= bound[w >> 24])) ++bad_bound;
  }
  std::printf("gumbel within %.3g of double\n", worst);
  EXPECT_LE(worst, 2e-6);
  EXPECT_EQ(bad_bound, 0u);
}

TEST(SampleMath, OrderKeyPreservesOrder) {
  const std::vector<float> v = {-sampling::kInf, -3e38f, -1.5f, -1e-40f, 0.0f,
                                1e-40f,          1.0f,   2.5f,  3e38f,   sampling::kInf};
  for (size_t i = 0; i + 1 < v.size(); ++i) {
    EXPECT_LT(sampling::order_key(v[i]), sampling::order_key(v[i + 1])) << v[i];
    EXPECT_EQ(sampling::key_value(sampling::order_key(v[i])), v[i]);
  }
  EXPECT_EQ(sampling::scaled(-0.0f, 1.0f), 0.0f);
  EXPECT_FALSE(std::signbit(sampling::scaled(-0.0f, 1.0f)));
}

// ---- the sampler ------------------------------------------------------------------------------

TEST(SampleCpu, GreedyIsTheFirstArgmaxAndIgnoresPadding) {
  const int S = 6, V = 1000, Vp = 1024;
  std::vector<float> logits = random_normal<float>(static_cast<size_t>(S) * Vp, 10, 2.0);
  std::vector<int32_t> want(S);
  for (int s = 0; s < S; ++s) {
    float* row = logits.data() + static_cast<size_t>(s) * Vp;
    for (int i = V; i < Vp; ++i) row[i] = 1e30f;  // padding: must never win
    row[7 * s + 3] = std::nanf("");               // NaN: never wins
    const int top = static_cast<int>(std::max_element(row, row + V) - row);
    // Ties: the maximum again at a later id in every row, and at an earlier one in odd rows.
    row[std::min(V - 1, top + 100 + s)] = row[top];
    if (s % 2) row[s] = row[top];
    want[s] = s % 2 && s < top ? s : top;
  }
  std::vector<SamplerSettings> st(S);  // temperature 0: greedy
  std::vector<int32_t> pos(S, 5), out(S, -1);
  sample_rows<float>(out.data(), logits.data(), st.data(), nullptr, pos.data(), S, V, Vp);
  EXPECT_EQ(out, want);
}

// CTRL / Hugging Face: a seen positive logit is divided by rp, a seen negative one multiplied.
TEST(SampleCpu, RepetitionPenaltyDividesPositiveAndMultipliesNegativeLogits) {
  const int V = 5;
  struct Case {
    std::vector<float> logits;
    std::vector<uint8_t> seen;
    float rp;
    int32_t want;
  };
  const Case cases[] = {
      {{0.1f, 2.0f, 1.5f, -1.0f, 0.0f}, {0, 1, 0, 0, 0}, 1.5f, 2},    // 2.0/1.5 = 1.33 < 1.5
      {{0.1f, 2.0f, 1.5f, -1.0f, 0.0f}, {0, 1, 0, 0, 0}, 1.2f, 1},    // 2.0/1.2 = 1.67 > 1.5
      {{-3.f, -1.0f, -1.2f, -2.0f, -5.f}, {0, 1, 0, 0, 0}, 1.5f, 2},  // −1.0·1.5 = −1.5 < −1.2
      {{-3.f, -1.0f, -1.2f, -2.0f, -5.f}, {0, 1, 0, 0, 0}, 1.1f, 1},  // −1.1 > −1.2
      {{-3.f, -1.0f, -1.2f, -2.0f, -5.f}, {0, 1, 0, 0, 0}, 0.5f, 1},  // rp < 1 boosts: −0.5
      {{-3.f, -1.0f, -1.2f, -2.0f, -5.f}, {0, 0, 1, 0, 0}, 0.5f, 2},  // −1.2·0.5 = −0.6 > −1.0
      {{0.1f, 2.0f, 1.5f, -1.0f, 0.0f}, {0, 1, 0, 0, 0}, 1.0f, 1},    // rp = 1: off
  };
  for (const Case& c : cases) {
    SamplerSettings st;
    st.repetition_penalty = c.rp;
    std::vector<uint8_t> seen = c.seen;
    int32_t pos = 0, out = -1;
    sample_rows<float>(&out, c.logits.data(), &st, seen.data(), &pos, 1, V, V);
    EXPECT_EQ(out, c.want) << "rp=" << c.rp << " logit[1]=" << c.logits[1];
    // Without seen flags there is no penalty: the plain argmax.
    sample_rows<float>(&out, c.logits.data(), &st, nullptr, &pos, 1, V, V);
    EXPECT_EQ(out, 1);
  }
}

TEST(SampleCpu, TopKKeepsExactlyTheKLargestWithTies) {
  const int V = 64;
  const std::vector<float> logits = random_normal<float>(V, 20, 0.5);
  std::vector<int32_t> order(V);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int a, int b) { return logits[a] > logits[b]; });
  for (int k : {1, 5, 17})
    for (bool tie : {false, true}) {
      std::vector<float> l = logits;
      // The tie: the (k+1)-th largest takes the k-th largest value, and must stay too.
      if (tie) l[order[k]] = l[order[k - 1]];
      std::set<int32_t> want(order.begin(), order.begin() + k + (tie ? 1 : 0));
      SamplerSettings st;
      st.temperature = 2.0f;  // flat: every kept id shows up in 4000 draws
      st.top_k = k;
      st.seed = 7;
      EXPECT_EQ(distinct(sample_positions(l, st, 4000)), want) << "k=" << k << " tie=" << tie;
    }
  // top_k >= V and top_k <= 0 are off: all 64 ids appear.
  for (int k : {0, V, V + 5}) {
    SamplerSettings st;
    st.temperature = 50.0f;
    st.top_k = k;
    EXPECT_EQ(distinct(sample_positions(logits, st, 20000)).size(), static_cast<size_t>(V))
        << "k=" << k;
  }
}

TEST(SampleCpu, TopPKeepsTheSmallestHeadHoldingTopP) {
  const int V = 50;
  const std::vector<float> logits = random_normal<float>(V, 30, 1.0);
  for (float temperature : {0.7f, 1.0f})
    for (float top_p : {0.2f, 0.5f, 0.8f, 0.95f})
      for (bool tie : {false, true}) {
        std::vector<float> l = logits;
        double margin = 0;
        std::set<int32_t> want = top_p_reference(l, temperature, top_p, &margin);
        if (tie) {
          // The first id outside the head takes the value of the last one inside: the cut now
          // falls inside a group of equal values, which stays whole.
          float last = 1e30f;
          for (int32_t i : want) last = std::min(last, l[i]);
          int32_t next = -1;
          for (int i = 0; i < V; ++i)
            if (l[i] < last && (next < 0 || l[i] > l[next])) next = i;
          l[next] = last;
          want = top_p_reference(l, temperature, top_p, &margin);
          ASSERT_TRUE(want.count(next));
        }
        // The f32 / fixed-point computation could decide a cut differently only when a head sum
        // is within ~1e-6 of top_p; these inputs keep every cut far from that.
        ASSERT_GT(margin, 1e-4) << "ambiguous case T=" << temperature << " top_p=" << top_p;
        SamplerSettings st;
        st.temperature = temperature;
        st.top_p = top_p;
        st.seed = 11;
        EXPECT_EQ(distinct(sample_positions(l, st, 20000)), want)
            << "T=" << temperature << " top_p=" << top_p << " tie=" << tie;
      }
}

// top_k first, then top_p over the renormalised top k (the order sample.h defines).
TEST(SampleCpu, TopPRenormalisesOverTheTopK) {
  const int V = 40, k = 8;
  const std::vector<float> logits = random_normal<float>(V, 31, 1.0);
  std::vector<int32_t> order(V);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int a, int b) { return logits[a] > logits[b]; });
  std::vector<float> top(k);
  for (int j = 0; j < k; ++j) top[j] = logits[order[j]];
  double margin = 0;
  const std::set<int32_t> want_local = top_p_reference(top, 1.0, 0.6, &margin);
  ASSERT_GT(margin, 1e-4);
  std::set<int32_t> want;
  for (int32_t j : want_local) want.insert(order[j]);
  SamplerSettings st;
  st.temperature = 1.0f;
  st.top_k = k;
  st.top_p = 0.6f;
  EXPECT_EQ(distinct(sample_positions(logits, st, 20000)), want);
}

TEST(SampleCpu, MinPKeepsProbabilityAtLeastMinPTimesTheMaximum) {
  const int V = 60;
  const std::vector<float> logits = random_normal<float>(V, 40, 1.5);
  for (float min_p : {0.03f, 0.1f, 0.4f}) {
    const std::vector<double> p = softmax(logits, 1.0);
    const double pmax = *std::max_element(p.begin(), p.end());
    std::set<int32_t> want;
    for (int i = 0; i < V; ++i) {
      ASSERT_GT(std::fabs(p[i] / pmax - min_p), 1e-3 * min_p) << "ambiguous case min_p=" << min_p;
      if (p[i] >= min_p * pmax) want.insert(i);
    }
    SamplerSettings st;
    st.temperature = 1.0f;
    st.min_p = min_p;
    EXPECT_EQ(distinct(sample_positions(logits, st, 20000)), want) << "min_p=" << min_p;
  }
}

// Pearson's chi-square of N = 20000 draws against N·p. The noise is counter-based, so the
// statistic is one fixed number: the bound is the 0.999 quantile of χ²(df) (27.88 for 9 degrees
// of freedom, 16.27 for 3), which a sampler off by a few percent in any probability exceeds.
TEST(SampleCpu, GumbelMaxFrequenciesMatchTheSoftmax) {
  const int V = 10, N = 20000;
  const std::vector<float> logits = random_normal<float>(V, 50, 0.8);
  struct Case {
    float temperature;
    int top_k;
    double bound;
  };
  for (const Case& c : {Case{1.0f, 0, 27.88}, Case{0.6f, 0, 27.88}, Case{1.3f, 4, 16.27}}) {
    std::vector<double> p = softmax(logits, c.temperature);
    if (c.top_k > 0) {  // renormalise over the top k
      std::vector<double> sorted = p;
      std::sort(sorted.begin(), sorted.end(), std::greater<>());
      double kept = 0;
      for (double& x : p) x = x >= sorted[c.top_k - 1] ? x : 0.0;
      for (double x : p) kept += x;
      for (double& x : p) x /= kept;
    }
    SamplerSettings st;
    st.temperature = c.temperature;
    st.top_k = c.top_k;
    st.seed = 1234;
    std::vector<int> count(V, 0);
    for (int32_t id : sample_positions(logits, st, N)) ++count[id];
    double chi2 = 0;
    for (int i = 0; i < V; ++i) {
      if (p[i] == 0) {
        EXPECT_EQ(count[i], 0) << "id " << i << " is outside the top k";
        continue;
      }
      chi2 += (count[i] - N * p[i]) * (count[i] - N * p[i]) / (N * p[i]);
    }
    EXPECT_LT(chi2, c.bound) << "T=" << c.temperature << " top_k=" << c.top_k;
  }
}

// The noise is keyed by (seed, position, id) only: a row sampled alone or as slot 4 of 6 (with
// other rows around it, a different padded width) chooses the same id; other seeds differ.
TEST(SampleCpu, SameSeedAndPositionGiveTheSameIdInAnySlot) {
  const int V = 300;
  const std::vector<float> row = random_normal<float>(V, 60, 0.3);
  SamplerSettings st;
  st.temperature = 1.0f;
  st.seed = 0x123456789abcull;
  for (int32_t p : {0, 1, 77, 4095, 1 << 20}) {
    int32_t alone = -1;
    sample_rows<float>(&alone, row.data(), &st, nullptr, &p, 1, V, V);
    const int S = 6, Vp = 320;
    std::vector<float> batch = random_normal<float>(static_cast<size_t>(S) * Vp, 61 + p, 0.3);
    std::copy(row.begin(), row.end(), batch.begin() + 4 * Vp);
    for (int i = V; i < Vp; ++i) batch[4 * Vp + i] = 1e30f;  // padding never counts
    std::vector<SamplerSettings> sts(S);
    for (int s = 0; s < S; ++s) sts[s].temperature = 1.0f, sts[s].seed = s;
    sts[4] = st;
    std::vector<int32_t> pos(S, 3), out(S, -1);
    pos[4] = p;
    sample_rows<float>(out.data(), batch.data(), sts.data(), nullptr, pos.data(), S, V, Vp);
    EXPECT_EQ(out[4], alone) << "pos " << p;
  }
  // Seeds that differ (also only in the high 32 bits) give different sequences: on 300 nearly
  // uniform ids two independent draws agree with probability ~1/300.
  auto draws = [&](uint64_t seed) {
    SamplerSettings s2 = st;
    s2.seed = seed;
    return sample_positions(row, s2, 400);
  };
  const auto a = draws(1), b = draws(2), c = draws(1 + (1ull << 32)), a2 = draws(1);
  EXPECT_EQ(a, a2);
  int same_ab = 0, same_ac = 0;
  for (int i = 0; i < 400; ++i) same_ab += a[i] == b[i], same_ac += a[i] == c[i];
  EXPECT_LT(same_ab, 10);
  EXPECT_LT(same_ac, 10);
}

TEST(SampleCpu, SetsTheSeenFlagOfTheChosenId) {
  const int S = 5, V = 200, Vp = 208;
  const std::vector<float> logits = random_normal<float>(static_cast<size_t>(S) * Vp, 70, 1.0);
  std::vector<uint8_t> seen(static_cast<size_t>(S) * V, 0);
  seen[3] = seen[V + 9] = 1;  // earlier flags stay
  std::vector<uint8_t> want = seen;
  std::vector<SamplerSettings> st(S);
  for (int s = 0; s < S; ++s)
    st[s].temperature = s % 2 ? 1.0f : 0.0f, st[s].repetition_penalty = 1.3f;
  std::vector<int32_t> pos(S, 1), out(S, -1);
  sample_rows<float>(out.data(), logits.data(), st.data(), seen.data(), pos.data(), S, V, Vp);
  for (int s = 0; s < S; ++s) {
    ASSERT_GE(out[s], 0);
    ASSERT_LT(out[s], V);
    want[static_cast<size_t>(s) * V + out[s]] = 1;
  }
  EXPECT_EQ(seen, want);
}

TEST(SampleCpu, DoubleLogitsChooseAsTheirFloatValues) {
  const int S = 8, V = 500;
  const std::vector<float> f = random_normal<float>(static_cast<size_t>(S) * V, 80, 2.0);
  const std::vector<double> d(f.begin(), f.end());
  std::vector<SamplerSettings> st(S);
  for (int s = 0; s < S; ++s) {
    st[s].temperature = 0.5f * s;
    st[s].top_k = 3 * s;
    st[s].top_p = s % 3 ? 0.9f : 1.0f;
    st[s].min_p = s % 4 == 1 ? 0.05f : 0.0f;
    st[s].seed = 99 + s;
  }
  std::vector<int32_t> pos(S, 12), a(S), b(S);
  sample_rows<float>(a.data(), f.data(), st.data(), nullptr, pos.data(), S, V, V);
  sample_rows<double>(b.data(), d.data(), st.data(), nullptr, pos.data(), S, V, V);
  EXPECT_EQ(a, b);
}

TEST(SampleCpu, RejectsBadShapes) {
  std::vector<float> logits(16, 0.0f);
  SamplerSettings st;
  int32_t pos = 0, out = 0;
  EXPECT_THROW(sample_rows<float>(&out, logits.data(), &st, nullptr, &pos, 1, 17, 16), Error);
  EXPECT_THROW(sample_rows<float>(&out, logits.data(), &st, nullptr, &pos, -1, 8, 16), Error);
  EXPECT_THROW(sample_rows<float>(&out, logits.data(), &st, nullptr, &pos, 1, 0, 16), Error);
  sample_rows<float>(&out, logits.data(), &st, nullptr, &pos, 0, 8, 16);  // S = 0: nothing
}

}  // namespace
}  // namespace forge::cpu
