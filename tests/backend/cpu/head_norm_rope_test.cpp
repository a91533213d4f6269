// The CPU head norm + RoPE (ops/head_norm_rope.h): the unfused sequence the model ran before
// (rmsnorm_fwd over the heads, rope_fwd; rope_bwd, a zeroed d(x_raw), rmsnorm_bwd) bit for bit,
// the backward's contract (d(x_raw) written, in place allowed, dweight accumulated), and its
// gradients against central differences, both RoPE pairings, plain and packed positions, and
// without RoPE (a NoPE layer).
#include "forge/ops/head_norm_rope.h"

#include <algorithm>
#include <string>
#include <vector>

#include "forge/ops/rmsnorm.h"
#include "forge/ops/rope.h"
#include "testing.h"

namespace forge::cpu {
namespace {

using forge::testing::all_close;
using forge::testing::random_normal;

constexpr float kEps = 1e-6f;
constexpr RopeStyle kStyles[] = {RopeStyle::kRotateHalf, RopeStyle::kInterleaved};

std::string name(RopeStyle s, bool rope, bool packed) {
  return std::string(s == RopeStyle::kRotateHalf ? "rotate_half" : "interleaved") +
         (rope ? "" : " no-rope") + (packed ? " packed" : "");
}

TEST(HeadNormRope, EqualsTheUnfusedSequenceBitForBit) {
  const int B = 2, T = 7, H = 3, HS = 16;
  const size_t n = static_cast<size_t>(B) * T * H * HS, rows = static_cast<size_t>(B) * T * H;
  const std::vector<int32_t> pos = {3, 4, 5, 0, 1, 2, 3,
                                    9, 0, 1, 2, 3, 4, 5};  // (B, T) packed rows
  uint64_t seed = 900;
  for (RopeStyle style : kStyles)
    for (bool use_rope : {true, false})
      for (bool packed : {false, true}) {
        const Rope rope{1000.0f, style};
        const Rope* r = use_rope ? &rope : nullptr;
        const int32_t* p = packed ? pos.data() : nullptr;
        const auto x_raw = random_normal<float>(n, seed++);
        const auto w = random_normal<float>(HS, seed++, 0.5);
        const auto dx = random_normal<float>(n, seed++);
        const auto dw0 = random_normal<float>(HS, seed++);  // dweight accumulates onto this
        // The unfused sequence.
        std::vector<float> ref_x(n), ref_rstd(rows);
        rmsnorm_fwd<float>(ref_x.data(), ref_rstd.data(), x_raw.data(), w.data(),
                           static_cast<int>(rows), HS, kEps);
        if (r) rope_fwd<float>(ref_x.data(), B, T, H, HS, rope, 0, p);
        std::vector<float> g = dx, ref_dx_raw(n, 0.0f), ref_dw = dw0;
        if (r) rope_bwd<float>(g.data(), B, T, H, HS, rope, 0, p);
        rmsnorm_bwd<float>(ref_dx_raw.data(), ref_dw.data(), g.data(), x_raw.data(), w.data(),
                           ref_rstd.data(), static_cast<int>(rows), HS);
        // The fused op; d(x_raw) starts as garbage (written, not accumulated).
        std::vector<float> x(n), rstd(rows);
        head_norm_rope_fwd<float>(x.data(), rstd.data(), x_raw.data(), w.data(), B, T, H, HS, kEps,
                                  r, p);
        EXPECT_EQ(x, ref_x) << name(style, use_rope, packed);
        EXPECT_EQ(rstd, ref_rstd) << name(style, use_rope, packed);
        std::vector<float> dx_raw = random_normal<float>(n, seed++), dw = dw0;
        head_norm_rope_bwd<float>(dx_raw.data(), dw.data(), dx.data(), x_raw.data(), w.data(),
                                  rstd.data(), B, T, H, HS, r, p);
        EXPECT_EQ(dx_raw, ref_dx_raw) << name(style, use_rope, packed);
        EXPECT_EQ(dw, ref_dw) << name(style, use_rope, packed);
        // In place (the model's call: d(x_raw) over dx), and no dweight (a frozen gain).
        std::vector<float> inplace = dx;
        head_norm_rope_bwd<float>(inplace.data(), nullptr, inplace.data(), x_raw.data(), w.data(),
                                  rstd.data(), B, T, H, HS, r, p);
        EXPECT_EQ(inplace, ref_dx_raw) << name(style, use_rope, packed) << " in place";
      }
}

// loss = Σ x·u, x = head_norm_rope_fwd(x_raw, w): d(x_raw) and dweight from the backward with
// dx = u against central differences, in double.
// H0 = 1 of H = 3: two groups of heads with gains (2, HS) (the model's q and k in one call).
TEST(HeadNormRope, BackwardMatchesFiniteDifferences) {
  const int B = 2, T = 3, HS = 6;
  const std::vector<int32_t> pos = {2, 0, 1, 5, 6, 0};  // (B, T)
  uint64_t seed = 950;
  for (int H0 : {0, 1})
  for (RopeStyle style : kStyles)
    for (bool use_rope : {true, false})
      for (bool packed : {false, true}) {
        if (!use_rope && packed) continue;
        const int H = H0 > 0 ? 3 : 2, groups = H0 > 0 ? 2 : 1;
        const Rope rope{100.0f, style};  // small base: every pair rotates by a visible angle
        const Rope* r = use_rope ? &rope : nullptr;
        const int32_t* p = packed ? pos.data() : nullptr;
        const size_t n = static_cast<size_t>(B) * T * H * HS;
        auto x_raw = random_normal<double>(n, seed++);
        auto w = random_normal<double>(groups * HS, seed++);
        const auto u = random_normal<double>(n, seed++);
        auto loss = [&] {
          std::vector<double> x(n), rstd(n / HS);
          head_norm_rope_fwd<double>(x.data(), rstd.data(), x_raw.data(), w.data(), B, T, H, HS,
                                     kEps, r, p, 0, H0);
          return forge::testing::dot(x, u);
        };
        std::vector<double> x(n), rstd(n / HS);
        head_norm_rope_fwd<double>(x.data(), rstd.data(), x_raw.data(), w.data(), B, T, H, HS, kEps,
                                   r, p, 0, H0);
        std::vector<double> dx_raw(n), dw(groups * HS, 0.0);
        head_norm_rope_bwd<double>(dx_raw.data(), dw.data(), u.data(), x_raw.data(), w.data(),
                                   rstd.data(), B, T, H, HS, r, p, 0, H0);
        const std::string where = name(style, use_rope, packed) + " H0=" + std::to_string(H0);
        EXPECT_TRUE(all_close(dx_raw, forge::testing::finite_diff(x_raw, loss),
                              forge::testing::kTolFiniteDiff))
            << where;
        EXPECT_TRUE(
            all_close(dw, forge::testing::finite_diff(w, loss), forge::testing::kTolFiniteDiff))
            << where;
      }
}

// Shapes and aliasing are the model's invariants (FORGE_CHECK): a violation aborts naming the op.
TEST(HeadNormRopeDeathTest, RejectsAliasingAndBadShapes) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  std::vector<float> x(16), y(16), rstd(2), w(8);
  EXPECT_DEATH(head_norm_rope_fwd<float>(x.data(), rstd.data(), x.data(), w.data(), 1, 1, 2, 8,
                                         kEps, nullptr),
               "head_norm_rope_fwd.*alias");
  EXPECT_DEATH(head_norm_rope_fwd<float>(y.data(), rstd.data(), x.data(), w.data(), 1, 1, 0, 8,
                                         kEps, nullptr),
               "head_norm_rope_fwd.*bad shape");
  EXPECT_DEATH(head_norm_rope_fwd<float>(y.data(), rstd.data(), x.data(), w.data(), 1, 1, 2, 8,
                                         kEps, nullptr, nullptr, 0, 2),
               "head_norm_rope_fwd.*first group of 2 heads outside");
  EXPECT_DEATH(head_norm_rope_bwd<float>(y.data(), w.data(), x.data(), x.data(), w.data(), rstd.data(), 1, 1, 2, 8,
                                         nullptr, nullptr, 0, -1),
               "head_norm_rope_bwd.*first group of -1 heads outside");
}

}  // namespace
}  // namespace forge::cpu

namespace forge::cpu {
namespace {

// Views of H heads at column `off` of rows `ld` wide (slices of fused q|k|v rows, the model's
// q|k|v call): forward and in-place backward equal the dense op on the gathered heads bit for
// bit, and columns outside the views are untouched.
TEST(HeadNormRope, StridedViewsEqualTheDenseOpBitForBit) {
  const int B = 2, T = 5, H = 3, HS = 16, off = 16, ld = off + H * HS + 32;
  const size_t BT = static_cast<size_t>(B) * T, n = BT * H * HS, rows = BT * H;
  uint64_t seed = 1300;
  for (RopeStyle style : kStyles) {
    const Rope rope{1000.0f, style};
    const auto raw_rows = random_normal<float>(BT * ld, seed++), dx_rows = random_normal<float>(BT * ld, seed++);
    const auto w = random_normal<float>(HS, seed++, 0.5);
    auto gather = [&](const std::vector<float>& full) {
      std::vector<float> d(n);
      for (size_t r = 0; r < BT; ++r) std::copy_n(full.begin() + r * ld + off, H * HS, d.begin() + r * H * HS);
      return d;
    };
    const std::vector<float> x_raw = gather(raw_rows), dx = gather(dx_rows);
    std::vector<float> ref_x(n), ref_rstd(rows), ref_dx_raw(n), ref_dw(HS, 0.0f), dw(HS, 0.0f);
    head_norm_rope_fwd<float>(ref_x.data(), ref_rstd.data(), x_raw.data(), w.data(), B, T, H, HS, kEps, &rope);
    head_norm_rope_bwd<float>(ref_dx_raw.data(), ref_dw.data(), dx.data(), x_raw.data(), w.data(), ref_rstd.data(),
                              B, T, H, HS, &rope);
    std::vector<float> x_rows = random_normal<float>(BT * ld, seed++), rstd(rows);
    const std::vector<float> x_before = x_rows;
    head_norm_rope_fwd<float>(x_rows.data() + off, rstd.data(), raw_rows.data() + off, w.data(), B, T, H, HS, kEps,
                              &rope, nullptr, ld);
    std::vector<float> d_rows = dx_rows;
    head_norm_rope_bwd<float>(d_rows.data() + off, dw.data(), d_rows.data() + off, raw_rows.data() + off, w.data(),
                              rstd.data(), B, T, H, HS, &rope, nullptr, ld);
    EXPECT_EQ(gather(x_rows), ref_x) << name(style, true, false);
    EXPECT_EQ(rstd, ref_rstd);
    EXPECT_EQ(gather(d_rows), ref_dx_raw);
    EXPECT_EQ(dw, ref_dw);
    size_t outside_changed = 0;
    for (size_t r = 0; r < BT; ++r)
      for (int c = 0; c < ld; ++c)
        if (c < off || c >= off + H * HS) {
          outside_changed += x_rows[r * ld + c] != x_before[r * ld + c];
          outside_changed += d_rows[r * ld + c] != dx_rows[r * ld + c];
        }
    EXPECT_EQ(outside_changed, 0u);
  }
}

}  // namespace
}  // namespace forge::cpu
