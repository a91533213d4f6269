#include "forge/ops/attention.h"

#include <omp.h>

#include <cmath>
#include <string>
#include <vector>

#include "testing.h"

namespace forge::cpu {
namespace {

using forge::testing::all_close;
using forge::testing::random_normal;

std::string describe(const AttentionShape& s) {
  return "B=" + std::to_string(s.B) + " T=" + std::to_string(s.T) + " NH=" + std::to_string(s.NH) +
         " NKV=" + std::to_string(s.NKV) + " HS=" + std::to_string(s.HS) +
         " causal=" + std::to_string(s.causal) + " window=" + std::to_string(s.window);
}

size_t q_size(const AttentionShape& s) {
  return static_cast<size_t>(s.B) * s.T * s.NH * s.HS;
}
size_t kv_size(const AttentionShape& s) {
  return static_cast<size_t>(s.B) * s.T * s.NKV * s.HS;
}
size_t att_size(const AttentionShape& s) {
  return static_cast<size_t>(s.B) * s.NH * s.T * s.T;
}

// Index into a (B, T, H, HS) buffer.
size_t at(int b, int t, int h, int d, int T, int H, int HS) {
  return ((static_cast<size_t>(b) * T + t) * H + h) * HS + d;
}

// The textbook formula, written independently of the kernel: a mask predicate instead of key
// ranges, softmax without max subtraction (inputs here are small), kv head by h·NKV/NH.
struct Reference {
  std::vector<double> out, att;
};

Reference reference_attention(const std::vector<double>& q, const std::vector<double>& k,
                              const std::vector<double>& v, const AttentionShape& s) {
  Reference r{std::vector<double>(q_size(s)), std::vector<double>(att_size(s))};
  for (int b = 0; b < s.B; ++b) {
    for (int h = 0; h < s.NH; ++h) {
      const int kvh = h * s.NKV / s.NH;
      for (int i = 0; i < s.T; ++i) {
        std::vector<double> e(s.T, 0.0);
        double z = 0;
        for (int j = 0; j < s.T; ++j) {
          const bool visible = (!s.causal || j <= i) && (s.window == 0 || i - j < s.window);
          if (!visible) continue;
          double logit = 0;
          for (int d = 0; d < s.HS; ++d)
            logit += q[at(b, i, h, d, s.T, s.NH, s.HS)] * k[at(b, j, kvh, d, s.T, s.NKV, s.HS)];
          e[j] = std::exp(logit / std::sqrt(static_cast<double>(s.HS)));
          z += e[j];
        }
        for (int j = 0; j < s.T; ++j) {
          const double p = e[j] / z;
          r.att[((static_cast<size_t>(b) * s.NH + h) * s.T + i) * s.T + j] = p;
          for (int d = 0; d < s.HS; ++d)
            r.out[at(b, i, h, d, s.T, s.NH, s.HS)] += p * v[at(b, j, kvh, d, s.T, s.NKV, s.HS)];
        }
      }
    }
  }
  return r;
}

AttentionShape shape(int B, int T, int NH, int NKV, int HS, bool causal, int window = 0) {
  AttentionShape s{B, T, NH, NKV, HS};
  s.causal = causal;
  s.window = window;
  return s;
}

// Causal and not, GQA ratios 1, 2 and 4, sliding windows, odd T.
const std::vector<AttentionShape> kShapes = {
    shape(2, 3, 2, 2, 4, true),    shape(2, 3, 2, 2, 4, false),   shape(1, 5, 4, 2, 3, true),
    shape(1, 5, 4, 2, 3, false),   shape(2, 5, 2, 1, 4, true, 2), shape(1, 5, 4, 1, 2, false, 2),
    shape(1, 4, 2, 2, 5, true, 3),
};

TEST(Attention, ForwardMatchesHandWrittenSoftmax) {
  uint64_t seed = 10;
  for (const AttentionShape& s : kShapes) {
    auto q = random_normal<double>(q_size(s), seed++);
    auto k = random_normal<double>(kv_size(s), seed++);
    auto v = random_normal<double>(kv_size(s), seed++);
    std::vector<double> out(q_size(s)), att(att_size(s), -7.0);  // -7: every entry is written
    attention_fwd<double>(out.data(), att.data(), q.data(), k.data(), v.data(), s);
    const Reference ref = reference_attention(q, k, v, s);
    EXPECT_TRUE(all_close(out, ref.out, forge::testing::kTolF64)) << describe(s);
    EXPECT_TRUE(all_close(att, ref.att, forge::testing::kTolF64)) << describe(s);
  }
}

// Masked probabilities are exactly 0 (not tiny), visible ones are positive and sum to 1.
TEST(Attention, MaskedEntriesAreExactlyZero) {
  const AttentionShape s = shape(1, 5, 2, 1, 4, true, 2);
  auto q = random_normal<double>(q_size(s), 20);
  auto k = random_normal<double>(kv_size(s), 21);
  auto v = random_normal<double>(kv_size(s), 22);
  std::vector<double> out(q_size(s)), att(att_size(s), 1.0);
  attention_fwd<double>(out.data(), att.data(), q.data(), k.data(), v.data(), s);
  for (int h = 0; h < s.NH; ++h) {
    for (int i = 0; i < s.T; ++i) {
      double sum = 0;
      for (int j = 0; j < s.T; ++j) {
        const double p = att[(static_cast<size_t>(h) * s.T + i) * s.T + j];
        const bool visible = j <= i && i - j < 2;
        if (visible) {
          EXPECT_GT(p, 0.0) << "h=" << h << " i=" << i << " j=" << j;
        } else {
          EXPECT_EQ(p, 0.0) << "h=" << h << " i=" << i << " j=" << j;
        }
        sum += p;
      }
      EXPECT_NEAR(sum, 1.0, 1e-14) << "h=" << h << " i=" << i;
    }
  }
}

// One key: every query head outputs the v row of its own kv head, exactly.
TEST(Attention, SingleStepOutputsValueOfItsKvHead) {
  for (bool causal : {true, false}) {
    const AttentionShape s = shape(2, 1, 6, 3, 4, causal);
    auto q = random_normal<double>(q_size(s), 30);
    auto k = random_normal<double>(kv_size(s), 31);
    auto v = random_normal<double>(kv_size(s), 32);
    std::vector<double> out(q_size(s)), att(att_size(s));
    attention_fwd<double>(out.data(), att.data(), q.data(), k.data(), v.data(), s);
    for (int b = 0; b < s.B; ++b)
      for (int h = 0; h < s.NH; ++h)
        for (int d = 0; d < s.HS; ++d)
          EXPECT_EQ(out[at(b, 0, h, d, 1, s.NH, s.HS)], v[at(b, 0, h / 2, d, 1, s.NKV, s.HS)])
              << "b=" << b << " h=" << h << " d=" << d;
  }
}

// Causal: query 0 sees only key 0, whatever the scores of the later keys.
TEST(Attention, CausalFirstRowAttendsOnlyToFirstKey) {
  const AttentionShape s = shape(2, 4, 4, 2, 3, true);
  auto q = random_normal<double>(q_size(s), 40, 5.0);
  auto k = random_normal<double>(kv_size(s), 41, 5.0);
  auto v = random_normal<double>(kv_size(s), 42);
  std::vector<double> out(q_size(s)), att(att_size(s));
  attention_fwd<double>(out.data(), att.data(), q.data(), k.data(), v.data(), s);
  for (int b = 0; b < s.B; ++b) {
    for (int h = 0; h < s.NH; ++h) {
      const double* row0 = att.data() + (static_cast<size_t>(b) * s.NH + h) * s.T * s.T;
      EXPECT_EQ(row0[0], 1.0);
      for (int j = 1; j < s.T; ++j) EXPECT_EQ(row0[j], 0.0) << "j=" << j;
      for (int d = 0; d < s.HS; ++d)
        EXPECT_EQ(out[at(b, 0, h, d, s.T, s.NH, s.HS)], v[at(b, 0, h / 2, d, s.T, s.NKV, s.HS)]);
    }
  }
}

// loss = Σ out·w. dq, dk, dv start from random values: the backward must add to them.
TEST(Attention, BackwardMatchesFiniteDifferencesAndAccumulates) {
  uint64_t seed = 100;
  for (const AttentionShape& s : kShapes) {
    auto q = random_normal<double>(q_size(s), seed++);
    auto k = random_normal<double>(kv_size(s), seed++);
    auto v = random_normal<double>(kv_size(s), seed++);
    auto w = random_normal<double>(q_size(s), seed++);
    std::vector<double> out(q_size(s)), att(att_size(s));
    auto loss = [&] {
      attention_fwd<double>(out.data(), att.data(), q.data(), k.data(), v.data(), s);
      return forge::testing::dot(out, w);
    };
    const auto fd_q = forge::testing::finite_diff(q, loss);
    const auto fd_k = forge::testing::finite_diff(k, loss);
    const auto fd_v = forge::testing::finite_diff(v, loss);

    const auto dq0 = random_normal<double>(q_size(s), seed++);
    const auto dk0 = random_normal<double>(kv_size(s), seed++);
    const auto dv0 = random_normal<double>(kv_size(s), seed++);
    auto dq = dq0, dk = dk0, dv = dv0;
    loss();  // att for the unperturbed inputs
    attention_bwd<double>(dq.data(), dk.data(), dv.data(), w.data(), q.data(), k.data(), v.data(),
                          att.data(), s);
    auto plus = [](std::vector<double> a, const std::vector<double>& b) {
      for (size_t i = 0; i < a.size(); ++i) a[i] += b[i];
      return a;
    };
    EXPECT_TRUE(all_close(dq, plus(dq0, fd_q), forge::testing::kTolFiniteDiff)) << describe(s);
    EXPECT_TRUE(all_close(dk, plus(dk0, fd_k), forge::testing::kTolFiniteDiff)) << describe(s);
    EXPECT_TRUE(all_close(dv, plus(dv0, fd_v), forge::testing::kTolFiniteDiff)) << describe(s);
  }
}

// Float instantiation on float-rounded inputs against double on the same values. Both
// accumulate in double; float rounds att, out and the gradients once (~6e-8 relative).
TEST(Attention, FloatMatchesDouble) {
  uint64_t seed = 200;
  for (AttentionShape s : kShapes) {
    s.B = 2;
    s.T = 7;
    s.HS = 8;
    auto qf = random_normal<float>(q_size(s), seed++);
    auto kf = random_normal<float>(kv_size(s), seed++);
    auto vf = random_normal<float>(kv_size(s), seed++);
    auto gf = random_normal<float>(q_size(s), seed++);
    auto qd = forge::testing::to_double(qf), kd = forge::testing::to_double(kf),
         vd = forge::testing::to_double(vf), gd = forge::testing::to_double(gf);
    std::vector<float> outf(q_size(s)), attf(att_size(s));
    std::vector<double> outd(q_size(s)), attd(att_size(s));
    attention_fwd<float>(outf.data(), attf.data(), qf.data(), kf.data(), vf.data(), s);
    attention_fwd<double>(outd.data(), attd.data(), qd.data(), kd.data(), vd.data(), s);
    EXPECT_TRUE(all_close(outf, outd, forge::testing::kTolF32)) << describe(s);
    EXPECT_TRUE(all_close(attf, attd, forge::testing::kTolF32)) << describe(s);
    std::vector<float> dqf(q_size(s)), dkf(kv_size(s)), dvf(kv_size(s));
    std::vector<double> dqd(q_size(s)), dkd(kv_size(s)), dvd(kv_size(s));
    attention_bwd<float>(dqf.data(), dkf.data(), dvf.data(), gf.data(), qf.data(), kf.data(),
                         vf.data(), attf.data(), s);
    attention_bwd<double>(dqd.data(), dkd.data(), dvd.data(), gd.data(), qd.data(), kd.data(),
                          vd.data(), attd.data(), s);
    EXPECT_TRUE(all_close(dqf, dqd, forge::testing::kTolF32)) << describe(s);
    EXPECT_TRUE(all_close(dkf, dkd, forge::testing::kTolF32)) << describe(s);
    EXPECT_TRUE(all_close(dvf, dvd, forge::testing::kTolF32)) << describe(s);
  }
}

// Bit-identical results with 1 thread and with several.
TEST(Attention, IndependentOfThreadCount) {
  const AttentionShape s = shape(3, 9, 4, 2, 8, true, 4);
  auto q = random_normal<float>(q_size(s), 300);
  auto k = random_normal<float>(kv_size(s), 301);
  auto v = random_normal<float>(kv_size(s), 302);
  auto g = random_normal<float>(q_size(s), 303);
  auto run = [&](int threads) {
    const int saved = omp_get_max_threads();
    omp_set_num_threads(threads);
    std::vector<float> out(q_size(s)), att(att_size(s));
    std::vector<float> dq(q_size(s)), dk(kv_size(s)), dv(kv_size(s));
    attention_fwd<float>(out.data(), att.data(), q.data(), k.data(), v.data(), s);
    attention_bwd<float>(dq.data(), dk.data(), dv.data(), g.data(), q.data(), k.data(), v.data(),
                         att.data(), s);
    omp_set_num_threads(saved);
    return std::vector<std::vector<float>>{out, att, dq, dk, dv};
  };
  const auto one = run(1), many = run(5);
  for (size_t i = 0; i < one.size(); ++i) EXPECT_EQ(one[i], many[i]) << "buffer " << i;
}

}  // namespace
}  // namespace forge::cpu
