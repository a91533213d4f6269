#include "forge/ops/rope.h"

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "forge/core/error.h"
#include "testing.h"

namespace forge::cpu {
namespace {

using forge::testing::all_close;
using forge::testing::random_normal;

constexpr RopeStyle kStyles[] = {RopeStyle::kRotateHalf, RopeStyle::kInterleaved};

const char* name(RopeStyle s) {
  return s == RopeStyle::kRotateHalf ? "rotate_half" : "interleaved";
}

// Hugging Face Llama, transcribed from modeling_llama.py for one (HS) vector at position pos:
//   inv_freq = 1 / base^(arange(0, HS, 2) / HS);  freqs = pos · inv_freq
//   emb = cat(freqs, freqs);  cos, sin = emb.cos(), emb.sin()
//   rotate_half(x) = cat(−x[HS/2:], x[:HS/2]);  out = x·cos + rotate_half(x)·sin
std::vector<double> hf_llama_rope(const std::vector<double>& x, double pos, double base) {
  const size_t hs = x.size(), half = hs / 2;
  std::vector<double> emb(hs), rot(hs), out(hs);
  for (size_t i = 0; i < half; ++i) {
    const double inv_freq = 1.0 / std::pow(base, static_cast<double>(2 * i) / hs);
    emb[i] = emb[i + half] = pos * inv_freq;
  }
  for (size_t i = 0; i < half; ++i) {
    rot[i] = -x[i + half];
    rot[i + half] = x[i];
  }
  for (size_t d = 0; d < hs; ++d) out[d] = x[d] * std::cos(emb[d]) + rot[d] * std::sin(emb[d]);
  return out;
}

// GPT-J (modeling_gptj.py): sin/cos repeated interleaved (repeat_interleave(2)), and
//   rotate_every_two(x)[2i] = −x[2i+1], rotate_every_two(x)[2i+1] = x[2i];
//   out = x·cos + rotate_every_two(x)·sin
std::vector<double> gptj_rope(const std::vector<double>& x, double pos, double base) {
  const size_t hs = x.size();
  std::vector<double> emb(hs), rot(hs), out(hs);
  for (size_t d = 0; d < hs; ++d) {
    const size_t i = d / 2;
    emb[d] = pos / std::pow(base, static_cast<double>(2 * i) / hs);
  }
  for (size_t i = 0; i < hs / 2; ++i) {
    rot[2 * i] = -x[2 * i + 1];
    rot[2 * i + 1] = x[2 * i];
  }
  for (size_t d = 0; d < hs; ++d) out[d] = x[d] * std::cos(emb[d]) + rot[d] * std::sin(emb[d]);
  return out;
}

// Applies a per-vector reference to every (b, t, h) row of x (B, T, H, HS).
template <typename F>
std::vector<double> apply_reference(const std::vector<double>& x, int B, int T, int H, int HS,
                                    int pos0, double base, F ref) {
  std::vector<double> out(x.size());
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t)
      for (int h = 0; h < H; ++h) {
        const size_t off = ((static_cast<size_t>(b) * T + t) * H + h) * HS;
        std::vector<double> v(x.begin() + off, x.begin() + off + HS);
        auto r = ref(v, pos0 + t, base);
        std::copy(r.begin(), r.end(), out.begin() + off);
      }
  return out;
}

TEST(Rope, RotateHalfMatchesHuggingFaceFormula) {
  const int B = 2, T = 5, H = 3, HS = 8, pos0 = 7;
  const float base = 10000.0f;
  auto x = random_normal<double>(B * T * H * HS, 1);
  auto want = apply_reference(x, B, T, H, HS, pos0, base, hf_llama_rope);
  rope_fwd<double>(x.data(), B, T, H, HS, Rope{base, RopeStyle::kRotateHalf}, pos0);
  EXPECT_TRUE(all_close(x, want, forge::testing::kTolF64));
}

TEST(Rope, InterleavedMatchesGptjFormula) {
  const int B = 2, T = 5, H = 3, HS = 8, pos0 = 7;
  const float base = 500000.0f;
  auto x = random_normal<double>(B * T * H * HS, 2);
  auto want = apply_reference(x, B, T, H, HS, pos0, base, gptj_rope);
  rope_fwd<double>(x.data(), B, T, H, HS, Rope{base, RopeStyle::kInterleaved}, pos0);
  EXPECT_TRUE(all_close(x, want, forge::testing::kTolF64));
}

// HS = 4, base = 100: inv_freq = {1, 0.1}. At position 1, rotate_half pairs (x0, x2) by 1 rad
// and (x1, x3) by 0.1 rad, counter-clockwise: (1, 0) → (cos θ, sin θ).
TEST(Rope, HandComputedRotation) {
  std::vector<double> x = {1, 1, 0, 0};
  rope_fwd<double>(x.data(), 1, 1, 1, 4, Rope{100.0f, RopeStyle::kRotateHalf}, 1);
  EXPECT_NEAR(x[0], std::cos(1.0), 1e-15);
  EXPECT_NEAR(x[2], std::sin(1.0), 1e-15);
  EXPECT_NEAR(x[1], std::cos(0.1), 1e-15);
  EXPECT_NEAR(x[3], std::sin(0.1), 1e-15);
  std::vector<double> y = {1, 0, 1, 0};  // interleaved: pairs (y0, y1) at 1 rad, (y2, y3) at 0.1
  rope_fwd<double>(y.data(), 1, 1, 1, 4, Rope{100.0f, RopeStyle::kInterleaved}, 1);
  EXPECT_NEAR(y[0], std::cos(1.0), 1e-15);
  EXPECT_NEAR(y[1], std::sin(1.0), 1e-15);
  EXPECT_NEAR(y[2], std::cos(0.1), 1e-15);
  EXPECT_NEAR(y[3], std::sin(0.1), 1e-15);
}

TEST(Rope, PositionZeroIsIdentity) {
  for (RopeStyle style : kStyles) {
    const int B = 2, T = 1, H = 3, HS = 6;
    auto x = random_normal<double>(B * T * H * HS, 3);
    auto y = x;
    rope_fwd<double>(y.data(), B, T, H, HS, Rope{10000.0f, style}, 0);
    for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(y[i], x[i]) << name(style) << " i=" << i;
  }
}

// Each rotated pair keeps its length: checks the pairing (a wrong partner channel changes the
// pair norms even when the whole-vector norm survives).
TEST(Rope, PreservesNormOfEachPair) {
  const int B = 1, T = 9, H = 2, HS = 10, pos0 = 100;
  for (RopeStyle style : kStyles) {
    auto x = random_normal<double>(B * T * H * HS, 4);
    auto y = x;
    rope_fwd<double>(y.data(), B, T, H, HS, Rope{10000.0f, style}, pos0);
    const int half = HS / 2;
    for (int row = 0; row < B * T * H; ++row) {
      for (int i = 0; i < half; ++i) {
        const int a = style == RopeStyle::kRotateHalf ? i : 2 * i;
        const int b = style == RopeStyle::kRotateHalf ? i + half : 2 * i + 1;
        const double* xr = x.data() + row * HS;
        const double* yr = y.data() + row * HS;
        const double n0 = std::hypot(xr[a], xr[b]), n1 = std::hypot(yr[a], yr[b]);
        EXPECT_NEAR(n1, n0, 1e-12 * (1 + n0)) << name(style) << " row " << row << " pair " << i;
      }
    }
  }
}

TEST(Rope, BackwardInvertsForward) {
  const int B = 2, T = 6, H = 2, HS = 8, pos0 = 3;
  for (RopeStyle style : kStyles) {
    auto x = random_normal<double>(B * T * H * HS, 5);
    auto y = x;
    rope_fwd<double>(y.data(), B, T, H, HS, Rope{10000.0f, style}, pos0);
    EXPECT_FALSE(all_close(y, x, forge::testing::kTolF64)) << "forward did nothing";
    rope_bwd<double>(y.data(), B, T, H, HS, Rope{10000.0f, style}, pos0);
    EXPECT_TRUE(all_close(y, x, forge::testing::kTolF64)) << name(style);
  }
}

// loss = Σ rope(x)·w; the gradient rope_bwd(w) against central differences.
TEST(Rope, BackwardMatchesFiniteDifferences) {
  const int B = 2, T = 3, H = 2, HS = 6, pos0 = 5;
  const float base = 100.0f;  // small base: the high channels rotate by visible angles too
  for (RopeStyle style : kStyles) {
    auto x = random_normal<double>(B * T * H * HS, 6);
    auto w = random_normal<double>(x.size(), 7);
    auto loss = [&] {
      auto y = x;
      rope_fwd<double>(y.data(), B, T, H, HS, Rope{base, style}, pos0);
      return forge::testing::dot(y, w);
    };
    auto fd = forge::testing::finite_diff(x, loss);
    auto dx = w;
    rope_bwd<double>(dx.data(), B, T, H, HS, Rope{base, style}, pos0);
    EXPECT_TRUE(all_close(dx, fd, forge::testing::kTolFiniteDiff)) << name(style);
  }
}

// rope_bias_bwd (Qwen2's q/k bias gradient from the rotation): loss = Σ rope(y + bias)·u with
// the bias (H·HS) broadcast over the (b, t) rows; the rotated gradient and dbias (accumulated onto
// a nonzero start) against central differences, plain and packed positions.
TEST(Rope, BiasBackwardMatchesFiniteDifferences) {
  const int B = 2, T = 3, H = 2, HS = 6;
  const std::vector<int32_t> pos = {4, 0, 1, 0, 7, 8};  // (B, T)
  for (RopeStyle style : kStyles)
    for (const int32_t* p : {static_cast<const int32_t*>(nullptr), pos.data()}) {
      const Rope rope{100.0f, style};
      auto y = random_normal<double>(B * T * H * HS, 16);
      auto bias = random_normal<double>(H * HS, 17);
      const auto u = random_normal<double>(y.size(), 18);
      auto loss = [&] {
        auto x = y;
        for (size_t i = 0; i < x.size(); ++i) x[i] += bias[i % (H * HS)];
        rope_fwd<double>(x.data(), B, T, H, HS, rope, 0, p);
        return forge::testing::dot(x, u);
      };
      const auto fd_y = forge::testing::finite_diff(y, loss), fd_bias = forge::testing::finite_diff(bias, loss);
      auto dx = u;
      const auto db0 = random_normal<double>(H * HS, 19);
      auto db = db0;
      rope_bias_bwd<double>(dx.data(), db.data(), B, T, H, HS, rope, p);
      for (int c = 0; c < H * HS; ++c) db[c] -= db0[c];
      EXPECT_TRUE(all_close(dx, fd_y, forge::testing::kTolFiniteDiff)) << name(style);
      EXPECT_TRUE(all_close(db, fd_bias, forge::testing::kTolFiniteDiff)) << name(style);
      auto plain = u;  // without dbias it is rope_bwd
      rope_bias_bwd<double>(plain.data(), nullptr, B, T, H, HS, rope, p);
      EXPECT_EQ(plain, dx) << name(style);
    }
}

// The float instantiation on float-rounded inputs against the double one on the same values.
// Large positions: the angle table is double in both, so only the final rotation rounds.
TEST(Rope, FloatMatchesDouble) {
  const int B = 2, T = 7, H = 3, HS = 16, pos0 = 4000;
  for (RopeStyle style : kStyles) {
    auto xf = random_normal<float>(B * T * H * HS, 8);
    auto xd = forge::testing::to_double(xf);
    rope_fwd<float>(xf.data(), B, T, H, HS, Rope{10000.0f, style}, pos0);
    rope_fwd<double>(xd.data(), B, T, H, HS, Rope{10000.0f, style}, pos0);
    EXPECT_TRUE(all_close(xf, xd, forge::testing::kTolF32)) << name(style) << " fwd";
    rope_bwd<float>(xf.data(), B, T, H, HS, Rope{10000.0f, style}, pos0);
    rope_bwd<double>(xd.data(), B, T, H, HS, Rope{10000.0f, style}, pos0);
    EXPECT_TRUE(all_close(xf, xd, forge::testing::kTolF32)) << name(style) << " bwd";
  }
}

// ---- scaling (rope_inv_freq, ops/rope.cpp) --------------------------------------------------

// Llama 3.1's rope_scaling (config.json of Meta-Llama-3.1-8B): factor 8, low_freq_factor 1,
// high_freq_factor 4, original_max_position_embeddings 8192, rope_theta 500000; HS = 128.
Rope llama31(RopeStyle style = RopeStyle::kRotateHalf) {
  return Rope{500000.0f, style, RopeScaling::kLlama3, 8.0f, 1.0f, 4.0f, 8192};
}

TEST(RopeInvFreq, UnscaledIsThetaPowerAndDynamicIsUnscaled) {
  const int HS = 128;
  const std::vector<double> f = rope_inv_freq(Rope{500000.0f}, HS);
  ASSERT_EQ(f.size(), 64u);
  for (int i = 0; i < 64; ++i) EXPECT_DOUBLE_EQ(f[i], 1.0 / std::pow(500000.0, 2.0 * i / HS)) << i;
  // Within original_max_positions, dynamic NTK is the default RoPE (the factor is not applied).
  Rope dynamic{500000.0f};
  dynamic.scaling = RopeScaling::kDynamic;
  dynamic.factor = 4.0f;
  dynamic.original_max_positions = 4096;
  EXPECT_EQ(rope_inv_freq(dynamic, HS), f);
}

TEST(RopeInvFreq, LinearDividesEveryFrequencyByFactor) {
  const int HS = 64;
  const std::vector<double> f = rope_inv_freq(Rope{10000.0f}, HS);
  const std::vector<double> g =
      rope_inv_freq(Rope{10000.0f, RopeStyle::kRotateHalf, RopeScaling::kLinear, 2.5f}, HS);
  ASSERT_EQ(g.size(), f.size());
  for (size_t i = 0; i < f.size(); ++i) EXPECT_EQ(g[i], f[i] / 2.5) << i;  // exactly
}

// transformers' _compute_llama3_parameters written out for one index, on its own: wavelengths
// above 8192 are divided by 8, below 8192/4 = 2048 kept, in between blended linearly in
// 8192/wavelen. For HS 128 and theta 500000 that is i ≤ 28 kept, 29 ≤ i ≤ 34 blended, i ≥ 35
// divided (wavelengths 1956 at i = 28, 2402 at 29, 6695 at 34, 8219 at 35).
double llama31_inv_freq(int i) {
  const double inv = 1.0 / std::pow(500000.0, 2.0 * i / 128.0);
  const double wavelen = 2.0 * M_PI / inv;
  if (wavelen < 8192.0 / 4.0) return inv;
  if (wavelen > 8192.0 / 1.0) return inv / 8.0;
  const double smooth = (8192.0 / wavelen - 1.0) / (4.0 - 1.0);
  return (1.0 - smooth) * inv / 8.0 + smooth * inv;
}

TEST(RopeInvFreq, Llama3MatchesTransformersInEachBand) {
  const std::vector<double> base = rope_inv_freq(Rope{500000.0f}, 128);
  const std::vector<double> f = rope_inv_freq(llama31(), 128);
  ASSERT_EQ(f.size(), 64u);
  for (int i = 0; i < 64; ++i)
    EXPECT_NEAR(f[i], llama31_inv_freq(i), 1e-14 * llama31_inv_freq(i)) << "i=" << i;
  // One index per band: high frequency kept (bit for bit), low divided by 8 (bit for bit), and
  // i = 32 blended, pinned to the value computed by hand (Python, double): inv = 500000^-0.5,
  // wavelen = 4442.88, smooth = 0.281283, (1 − smooth)·inv/8 + smooth·inv.
  EXPECT_EQ(f[20], base[20]);
  EXPECT_EQ(f[50], base[50] / 8.0);
  EXPECT_NEAR(f[32], 5.248461609929547e-4, 1e-12 * 5.248461609929547e-4);
  EXPECT_GT(f[32], base[32] / 8.0);
  EXPECT_LT(f[32], base[32]);
  // The band edges land where the wavelengths say.
  EXPECT_EQ(f[28], base[28]);
  EXPECT_LT(f[29], base[29]);
  EXPECT_GT(f[34], base[34] / 8.0);
  EXPECT_EQ(f[35], base[35] / 8.0);
}

// The blend is continuous at both edges, so the frequencies stay strictly decreasing in i, and
// every one lies between the interpolated (inv/8) and the original value.
TEST(RopeInvFreq, Llama3IsMonotonicAndBetweenTheTwoLimits) {
  for (int HS : {128, 64, 20}) {
    const std::vector<double> base = rope_inv_freq(Rope{500000.0f}, HS);
    const std::vector<double> f = rope_inv_freq(llama31(), HS);
    for (size_t i = 0; i < f.size(); ++i) {
      EXPECT_LE(f[i], base[i]) << "HS=" << HS << " i=" << i;
      EXPECT_GE(f[i], base[i] / 8.0) << "HS=" << HS << " i=" << i;
      if (i > 0) {
        EXPECT_LT(f[i], f[i - 1]) << "HS=" << HS << " i=" << i;
      }
    }
  }
}

// Linear scaling by f is position interpolation: the rotation at position p is the unscaled
// rotation at p/f. A property of the rotated vectors, independent of how the table is built.
TEST(Rope, LinearScalingAtPositionIsUnscaledAtPositionOverFactor) {
  const int B = 1, T = 33, H = 2, HS = 16, pos0 = 8, factor = 4;
  for (RopeStyle style : kStyles) {
    const auto x = random_normal<double>(static_cast<size_t>(B) * T * H * HS, 9);
    auto y = x;
    rope_fwd<double>(y.data(), B, T, H, HS,
                     Rope{10000.0f, style, RopeScaling::kLinear, static_cast<float>(factor)}, pos0);
    int checked = 0;
    for (int t = 0; t < T; ++t) {
      const int p = pos0 + t;
      if (p % factor != 0) continue;
      const size_t off = static_cast<size_t>(t) * H * HS;
      std::vector<double> want(x.begin() + off, x.begin() + off + H * HS);
      rope_fwd<double>(want.data(), 1, 1, H, HS, Rope{10000.0f, style}, p / factor);
      const std::vector<double> got(y.begin() + off, y.begin() + off + H * HS);
      EXPECT_TRUE(all_close(got, want, forge::testing::kTolF64))
          << name(style) << " position " << p;
      ++checked;
    }
    EXPECT_EQ(checked, 9);
  }
}

// The scaled forward and backward are still a rotation and its inverse, and the backward is
// still the gradient (frequencies from any scaling are just other angles).
TEST(Rope, Llama3BackwardMatchesFiniteDifferencesAndInvertsForward) {
  const int B = 1, T = 3, H = 2, HS = 20, pos0 = 9000;
  for (RopeStyle style : kStyles) {
    auto x = random_normal<double>(static_cast<size_t>(B) * T * H * HS, 10);
    auto w = random_normal<double>(x.size(), 11);
    auto loss = [&] {
      auto y = x;
      rope_fwd<double>(y.data(), B, T, H, HS, llama31(style), pos0);
      return forge::testing::dot(y, w);
    };
    auto fd = forge::testing::finite_diff(x, loss);
    auto dx = w;
    rope_bwd<double>(dx.data(), B, T, H, HS, llama31(style), pos0);
    EXPECT_TRUE(all_close(dx, fd, forge::testing::kTolFiniteDiff)) << name(style);
    auto y = x;
    rope_fwd<double>(y.data(), B, T, H, HS, llama31(style), pos0);
    rope_bwd<double>(y.data(), B, T, H, HS, llama31(style), pos0);
    EXPECT_TRUE(all_close(y, x, forge::testing::kTolF64)) << name(style);
  }
}

TEST(RopeInvFreq, BadArgumentsThrow) {
  const Rope plain{10000.0f};
  EXPECT_THROW(rope_inv_freq(plain, 7), Error);       // odd HS
  EXPECT_THROW(rope_inv_freq(plain, 0), Error);       // HS 0
  EXPECT_THROW(rope_inv_freq(plain, -4), Error);      // negative HS
  EXPECT_THROW(rope_inv_freq(Rope{0.0f}, 8), Error);  // theta 0
  for (RopeScaling sc : {RopeScaling::kLinear, RopeScaling::kLlama3, RopeScaling::kDynamic})
    for (float factor : {0.0f, -2.0f, NAN}) {
      Rope r = llama31();
      r.scaling = sc;
      r.factor = factor;
      EXPECT_THROW(rope_inv_freq(r, 8), Error) << static_cast<int>(sc) << " factor " << factor;
    }
  Rope r = llama31();
  r.original_max_positions = 0;
  EXPECT_THROW(rope_inv_freq(r, 128), Error);
  r = llama31();
  r.high_freq_factor = r.low_freq_factor;
  EXPECT_THROW(rope_inv_freq(r, 128), Error);
  r = llama31();
  std::swap(r.low_freq_factor, r.high_freq_factor);
  EXPECT_THROW(rope_inv_freq(r, 128), Error);
  r = llama31();
  r.low_freq_factor = 0.0f;
  EXPECT_THROW(rope_inv_freq(r, 128), Error);
  // The op surfaces the error (a user's config), it does not abort.
  std::vector<double> x(16);
  EXPECT_THROW(rope_fwd<double>(x.data(), 1, 1, 1, 16,
                                Rope{10000.0f, RopeStyle::kRotateHalf, RopeScaling::kLinear, 0.0f}),
               Error);
}

}  // namespace
}  // namespace forge::cpu

namespace forge::cpu {
namespace {

// A view of H heads at column `off` of rows `ld` wide (a slice of a fused q|k|v row): the
// rotation of the view is the dense op's on the gathered heads, bit for bit, and the columns
// outside the view are untouched. Both pairings, positions t and packed, forward and backward.
TEST(Rope, StridedBiasBackwardEqualsTheDenseOpBitForBit) {
  const int B = 2, T = 5, H = 3, HS = 8, off = 6, ld = off + H * HS + 10;
  const auto rows = random_normal<double>(static_cast<size_t>(B) * T * ld, 1250);
  const auto db0 = random_normal<double>(H * HS, 1251);
  std::vector<double> dense(static_cast<size_t>(B) * T * H * HS);
  for (int r = 0; r < B * T; ++r) std::copy_n(rows.begin() + r * ld + off, H * HS, dense.begin() + r * H * HS);
  const Rope rope{10000.0f, RopeStyle::kRotateHalf};
  std::vector<double> got = rows, db_dense = db0, db = db0;
  rope_bias_bwd<double>(dense.data(), db_dense.data(), B, T, H, HS, rope);
  rope_bias_bwd<double>(got.data() + off, db.data(), B, T, H, HS, rope, nullptr, ld);
  EXPECT_EQ(db, db_dense);
  size_t differ = 0;
  for (int r = 0; r < B * T; ++r)
    for (int c = 0; c < ld; ++c) {
      const size_t i = static_cast<size_t>(r) * ld + c;
      const bool in = c >= off && c < off + H * HS;
      differ += got[i] != (in ? dense[static_cast<size_t>(r) * H * HS + c - off] : rows[i]);
    }
  EXPECT_EQ(differ, 0u);
}

TEST(Rope, StridedViewEqualsTheDenseOpBitForBit) {
  const int B = 2, T = 5, H = 3, HS = 8, off = 6, ld = off + H * HS + 10;
  const std::vector<int32_t> pos = {2, 3, 0, 1, 2, 7, 0, 1, 2, 3};
  uint64_t seed = 1200;
  for (RopeStyle style : {RopeStyle::kRotateHalf, RopeStyle::kInterleaved})
    for (const int32_t* p : {static_cast<const int32_t*>(nullptr), pos.data()})
      for (bool backward : {false, true}) {
        const Rope rope{10000.0f, style};
        const auto rows = random_normal<double>(static_cast<size_t>(B) * T * ld, seed++);
        std::vector<double> dense(static_cast<size_t>(B) * T * H * HS);
        for (int r = 0; r < B * T; ++r)
          std::copy_n(rows.begin() + r * ld + off, H * HS, dense.begin() + r * H * HS);
        std::vector<double> got = rows;
        if (backward) {
          rope_bwd<double>(dense.data(), B, T, H, HS, rope, 0, p);
          rope_bwd<double>(got.data() + off, B, T, H, HS, rope, 0, p, ld);
        } else {
          rope_fwd<double>(dense.data(), B, T, H, HS, rope, 0, p);
          rope_fwd<double>(got.data() + off, B, T, H, HS, rope, 0, p, ld);
        }
        size_t differ = 0, outside_changed = 0;
        for (int r = 0; r < B * T; ++r)
          for (int c = 0; c < ld; ++c) {
            const size_t i = static_cast<size_t>(r) * ld + c;
            if (c >= off && c < off + H * HS) differ += got[i] != dense[static_cast<size_t>(r) * H * HS + c - off];
            else outside_changed += got[i] != rows[i];
          }
        EXPECT_EQ(differ, 0u) << "style " << static_cast<int>(style) << " packed " << (p != nullptr) << " bwd " << backward;
        EXPECT_EQ(outside_changed, 0u);
      }
}

}  // namespace
}  // namespace forge::cpu
