#include "forge/ops/rope.h"

#include <algorithm>
#include <cmath>
#include <vector>

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
  rope_fwd<double>(x.data(), B, T, H, HS, base, RopeStyle::kRotateHalf, pos0);
  EXPECT_TRUE(all_close(x, want, forge::testing::kTolF64));
}

TEST(Rope, InterleavedMatchesGptjFormula) {
  const int B = 2, T = 5, H = 3, HS = 8, pos0 = 7;
  const float base = 500000.0f;
  auto x = random_normal<double>(B * T * H * HS, 2);
  auto want = apply_reference(x, B, T, H, HS, pos0, base, gptj_rope);
  rope_fwd<double>(x.data(), B, T, H, HS, base, RopeStyle::kInterleaved, pos0);
  EXPECT_TRUE(all_close(x, want, forge::testing::kTolF64));
}

// HS = 4, base = 100: inv_freq = {1, 0.1}. At position 1, rotate_half pairs (x0, x2) by 1 rad
// and (x1, x3) by 0.1 rad, counter-clockwise: (1, 0) → (cos θ, sin θ).
TEST(Rope, HandComputedRotation) {
  std::vector<double> x = {1, 1, 0, 0};
  rope_fwd<double>(x.data(), 1, 1, 1, 4, 100.0f, RopeStyle::kRotateHalf, 1);
  EXPECT_NEAR(x[0], std::cos(1.0), 1e-15);
  EXPECT_NEAR(x[2], std::sin(1.0), 1e-15);
  EXPECT_NEAR(x[1], std::cos(0.1), 1e-15);
  EXPECT_NEAR(x[3], std::sin(0.1), 1e-15);
  std::vector<double> y = {1, 0, 1, 0};  // interleaved: pairs (y0, y1) at 1 rad, (y2, y3) at 0.1
  rope_fwd<double>(y.data(), 1, 1, 1, 4, 100.0f, RopeStyle::kInterleaved, 1);
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
    rope_fwd<double>(y.data(), B, T, H, HS, 10000.0f, style, 0);
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
    rope_fwd<double>(y.data(), B, T, H, HS, 10000.0f, style, pos0);
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
    rope_fwd<double>(y.data(), B, T, H, HS, 10000.0f, style, pos0);
    EXPECT_FALSE(all_close(y, x, forge::testing::kTolF64)) << "forward did nothing";
    rope_bwd<double>(y.data(), B, T, H, HS, 10000.0f, style, pos0);
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
      rope_fwd<double>(y.data(), B, T, H, HS, base, style, pos0);
      return forge::testing::dot(y, w);
    };
    auto fd = forge::testing::finite_diff(x, loss);
    auto dx = w;
    rope_bwd<double>(dx.data(), B, T, H, HS, base, style, pos0);
    EXPECT_TRUE(all_close(dx, fd, forge::testing::kTolFiniteDiff)) << name(style);
  }
}

// The float instantiation on float-rounded inputs against the double one on the same values.
// Large positions: the angle table is double in both, so only the final rotation rounds.
TEST(Rope, FloatMatchesDouble) {
  const int B = 2, T = 7, H = 3, HS = 16, pos0 = 4000;
  for (RopeStyle style : kStyles) {
    auto xf = random_normal<float>(B * T * H * HS, 8);
    auto xd = forge::testing::to_double(xf);
    rope_fwd<float>(xf.data(), B, T, H, HS, 10000.0f, style, pos0);
    rope_fwd<double>(xd.data(), B, T, H, HS, 10000.0f, style, pos0);
    EXPECT_TRUE(all_close(xf, xd, forge::testing::kTolF32)) << name(style) << " fwd";
    rope_bwd<float>(xf.data(), B, T, H, HS, 10000.0f, style, pos0);
    rope_bwd<double>(xd.data(), B, T, H, HS, 10000.0f, style, pos0);
    EXPECT_TRUE(all_close(xf, xd, forge::testing::kTolF32)) << name(style) << " bwd";
  }
}

}  // namespace
}  // namespace forge::cpu
