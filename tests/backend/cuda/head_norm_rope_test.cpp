// CUDA head norm + RoPE (backend/cuda/head_norm_rope.cu) against its CPU twin
// (backend/cpu/head_norm_rope.cpp), f32, bf16 and f16, both RoPE pairings, plain and packed
// positions, and without RoPE. Shapes (B, T, H, HS): HS 64 and 128 take the vector path (4 or 8
// lanes per head in bf16, 8 or 16 in f32); HS 20 (HS/2 = 10) and 500 (HS/2 = 250) the
// element-by-element one, 500 with 8 chunks per lane; HS 512 in f32 two 16-byte chunks per lane;
// (2, 37, 3, 64) leaves the last group of heads part-filled and the backward's last row split
// short; (4, 256, 4, 128) is 4096 heads in 64 splits for the weight gradient; (16, 1024, 8, 64)
// (rotate_half only) 512 splits of 256 heads, several backward steps a block. The backward takes
// the CPU forward's rstd, so both sides start from identical statistics; d(x_raw) starts poisoned
// (it must be written, not accumulated) and dweight starts random (it must accumulate).
#include "forge/ops/head_norm_rope.h"

#include <string>
#include <vector>

#include "forge/backend/cuda/ops.h"
#include "model/packed_layout.h"
#include "op_testing.h"

namespace forge::cuda {
namespace {

using namespace forge::cuda::testing;

class HeadNormRopeTest : public DtypeTest<CudaTest> {};

struct Shape {
  int B, T, H, HS;
};
const Shape kShapes[] = {
    {2, 37, 3, 64}, {4, 256, 4, 128}, {3, 5, 2, 20}, {1, 6, 2, 500}, {1, 4, 3, 512}};

// rstd is f32 on both sides; the GPU sums Σx² in f32 in another order than the CPU's double.
constexpr Tol kTolRstd{1e-6, 1e-5};

struct Case {
  Shape s;
  RopeStyle style;
  bool rope, packed;
};
std::string where(const Case& c) {
  return "B=" + std::to_string(c.s.B) + " T=" + std::to_string(c.s.T) +
         " H=" + std::to_string(c.s.H) + " HS=" + std::to_string(c.s.HS) +
         (c.style == RopeStyle::kRotateHalf ? " rotate_half" : " interleaved") +
         (c.rope ? "" : " no-rope") + (c.packed ? " packed" : "");
}

std::vector<Case> cases() {
  std::vector<Case> out;
  for (const Shape& s : kShapes)
    for (RopeStyle style : {RopeStyle::kRotateHalf, RopeStyle::kInterleaved}) {
      out.push_back({s, style, true, false});
      out.push_back({s, style, true, true});
    }
  out.push_back({kShapes[0], RopeStyle::kRotateHalf, false, false});
  out.push_back({kShapes[2], RopeStyle::kRotateHalf, false, false});
  // 131,072 heads of 64 (a 16 × 1024 batch of 8 heads): 512 splits of 256 rows, so every
  // backward block steps several times with both of its rows a step valid (kRows = 2).
  out.push_back({{16, 1024, 8, 64}, RopeStyle::kRotateHalf, true, false});
  return out;
}

TEST_P(HeadNormRopeTest, FwdBwdMatchCpuAndAreDeterministic) {
  uint64_t seed = 300;
  for (const Case& c : cases()) {
    const Shape& s = c.s;
    const Rope rope{1000000.0f, c.style};  // Qwen3's base
    const Rope* r = c.rope ? &rope : nullptr;
    const size_t rows = static_cast<size_t>(s.B) * s.T * s.H, n = rows * s.HS;
    forge::testing::PackedLayout lay = forge::testing::random_packed_layout(s.B, s.T, 9, seed++);
    for (int32_t& p : lay.pos) p += 3000;  // long positions: the angle's accuracy matters
    const int32_t* hpos = c.packed ? lay.pos.data() : nullptr;
    const auto x_raw = as_dt(dt(), random_normal<float>(n, seed++));
    auto wv = random_normal<float>(s.HS, seed++, 0.3);
    for (float& v : wv) v += 1.0f;
    const auto w = as_dt(dt(), wv);
    const auto dx = as_dt(dt(), random_normal<float>(n, seed++));
    const auto dw0 = random_normal<float>(s.HS, seed++);

    std::vector<float> ref_x(n), ref_rstd(rows);
    cpu::head_norm_rope_fwd<float>(ref_x.data(), ref_rstd.data(), x_raw.data(), w.data(), s.B, s.T,
                                   s.H, s.HS, 1e-6f, r, hpos);
    std::vector<float> ref_dx_raw(n), ref_dw = dw0;
    cpu::head_norm_rope_bwd<float>(ref_dx_raw.data(), ref_dw.data(), dx.data(), x_raw.data(),
                                   w.data(), ref_rstd.data(), s.B, s.T, s.H, s.HS, r, hpos);

    auto dpos = upload(lay.pos);
    const int32_t* pos = c.packed ? dpos.data() : nullptr;
    auto d_x_raw = up(x_raw), d_w = up(w), d_dx = up(dx);
    auto d_x = poison(n);
    auto d_rstd = poisoned<float>(rows);
    head_norm_rope_fwd(ctx(), dt(), d_x.data(), d_rstd.data(), d_x_raw.data(), d_w.data(), s.B, s.T,
                       s.H, s.HS, 1e-6f, r, pos);
    // One rounding of the output to dt (the normalised value is rotated in f32).
    EXPECT_TRUE(all_close(down(d_x), ref_x, tol_for(dt()))) << "x " << where(c);
    EXPECT_TRUE(all_close(download(d_rstd), ref_rstd, kTolRstd)) << "rstd " << where(c);

    auto d_ref_rstd = upload(ref_rstd);
    std::vector<float> got_dx_raw[2], got_dw[2];
    for (int run = 0; run < 2; ++run) {
      auto d_dx_raw = poison(n);
      auto d_dw = upload(dw0);
      head_norm_rope_bwd(ctx(), dt(), d_dx_raw.data(), d_dw.data(), d_dx.data(), d_x_raw.data(),
                         d_w.data(), d_ref_rstd.data(), s.B, s.T, s.H, s.HS, r, pos);
      got_dx_raw[run] = down(d_dx_raw);
      got_dw[run] = download(d_dw);
    }
    // d(x_raw): one rounding to dt of an f32 computation on the same inputs.
    EXPECT_TRUE(all_close(got_dx_raw[0], ref_dx_raw, tol_for(dt()))) << "dx_raw " << where(c);
    // dweight: f32 sums over up to 4096 heads in another order than the CPU's. Over 131,072
    // heads (the CPU twin sums in f32 too) the rounding walk of sums of ~362 is ~eps·n ≈ 8e-3.
    const Tol tol_dw = rows > 4096 ? Tol{2e-2, 1e-4} : kTolWgrad;
    EXPECT_TRUE(all_close(got_dw[0], ref_dw, tol_dw)) << "dweight " << where(c);
    EXPECT_TRUE(same_bits(got_dx_raw[1], got_dx_raw[0])) << "dx_raw rerun " << where(c);
    EXPECT_TRUE(same_bits(got_dw[1], got_dw[0])) << "dweight rerun " << where(c);

    // In place over dx (the model's call) without dweight (a frozen gain): the same d(x_raw).
    auto d_inplace = up(dx);
    head_norm_rope_bwd(ctx(), dt(), d_inplace.data(), nullptr, d_inplace.data(), d_x_raw.data(),
                       d_w.data(), d_ref_rstd.data(), s.B, s.T, s.H, s.HS, r, pos);
    EXPECT_TRUE(same_bits(down(d_inplace), got_dx_raw[0])) << "in place " << where(c);
  }
}

// Views of H heads at column `off` of rows `ld` wide (the model's q|k|v slices; the forward's x
// and x_raw, the backward's dx, in place, and x_raw all take ld) against the CPU's strided op:
// HS 64 with ld a multiple of 8 (the vector path) and HS 20 (the element path). Columns outside
// the views come back unchanged, bit for bit.
TEST_P(HeadNormRopeTest, StridedViewsMatchCpu) {
  struct Case {
    Shape s;
    int off, ld;
  };
  const Case cases[] = {{{2, 37, 3, 64}, 64, 64 * 6}, {{3, 5, 2, 20}, 20, 20 * 5}};
  uint64_t seed = 800;
  for (const Case& c : cases) {
    const Shape& s = c.s;
    const Rope rope{1000000.0f, RopeStyle::kRotateHalf};
    const size_t BT = static_cast<size_t>(s.B) * s.T, n = BT * c.ld, rows = BT * s.H;
    const auto raw = as_dt(dt(), random_normal<float>(n, seed++));
    const auto x0 = as_dt(dt(), random_normal<float>(n, seed++));  // what x holds outside the view
    const auto dx = as_dt(dt(), random_normal<float>(n, seed++));
    auto wv = random_normal<float>(s.HS, seed++, 0.3);
    for (float& v : wv) v += 1.0f;
    const auto w = as_dt(dt(), wv);
    std::vector<float> ref_x = x0, ref_rstd(rows), ref_d = dx, ref_dw(s.HS, 0.0f);
    cpu::head_norm_rope_fwd<float>(ref_x.data() + c.off, ref_rstd.data(), raw.data() + c.off, w.data(), s.B, s.T,
                                   s.H, s.HS, 1e-6f, &rope, nullptr, c.ld);
    cpu::head_norm_rope_bwd<float>(ref_d.data() + c.off, ref_dw.data(), ref_d.data() + c.off, raw.data() + c.off,
                                   w.data(), ref_rstd.data(), s.B, s.T, s.H, s.HS, &rope, nullptr, c.ld);
    auto d_raw = up(raw), d_x = up(x0), d_d = up(dx), d_w = up(w);
    auto d_rstd = poisoned<float>(rows);
    auto d_ref_rstd = upload(ref_rstd);
    auto d_dw = upload(std::vector<float>(s.HS, 0.0f));
    head_norm_rope_fwd(ctx(), dt(), d_x.at(c.off), d_rstd.data(), d_raw.at(c.off), d_w.data(), s.B, s.T, s.H, s.HS,
                       1e-6f, &rope, nullptr, c.ld);
    head_norm_rope_bwd(ctx(), dt(), d_d.at(c.off), d_dw.data(), d_d.at(c.off), d_raw.at(c.off), d_w.data(),
                       d_ref_rstd.data(), s.B, s.T, s.H, s.HS, &rope, nullptr, c.ld);
    const auto got_x = down(d_x), got_d = down(d_d);
    std::vector<float> gx, rx, gd, rd, g_out, r_out;
    for (size_t i = 0; i < n; ++i) {
      const int col = static_cast<int>(i % c.ld);
      if (col >= c.off && col < c.off + s.H * s.HS) {
        gx.push_back(got_x[i]), rx.push_back(ref_x[i]), gd.push_back(got_d[i]), rd.push_back(ref_d[i]);
      } else {
        g_out.push_back(got_x[i]), r_out.push_back(x0[i]), g_out.push_back(got_d[i]), r_out.push_back(dx[i]);
      }
    }
    const std::string where = "HS=" + std::to_string(s.HS) + " ld=" + std::to_string(c.ld);
    EXPECT_TRUE(all_close(gx, rx, tol_for(dt()))) << "x " << where;
    EXPECT_TRUE(all_close(download(d_rstd), ref_rstd, kTolRstd)) << "rstd " << where;
    EXPECT_TRUE(all_close(gd, rd, tol_for(dt()))) << "dx_raw " << where;
    EXPECT_TRUE(all_close(download(d_dw), ref_dw, kTolWgrad)) << "dweight " << where;
    EXPECT_TRUE(same_bits(g_out, r_out)) << "outside the views " << where;
  }
}

// Two groups of heads in one call (H0 > 0: the model's q and k, adjacent in the fused q|k|v row,
// with q_norm's and k_norm's gains adjacent): against the CPU twin (which is two calls), and bit
// for bit against two GPU calls for what does not depend on the weight-gradient split (x, rstd,
// d(x_raw)); dweight (2, HS) within kTolWgrad of the CPU (f32 sums, another order), rerun bit for
// bit. v's columns (after k's) come back unchanged. Cases: bf16/f16 vector path with a
// part-filled last group (NKV = 1), the element path (HS 20), Qwen3-like 12 + 4 heads over many
// splits, HS 128, interleaved pairs with packed positions, a NoPE layer.
TEST_P(HeadNormRopeTest, TwoGroupsInOneCallMatchTwoCalls) {
  struct Case {
    int B, T, NH, NKV, HS;
    RopeStyle style;
    bool rope, packed;
  };
  const Case cases[] = {{2, 37, 3, 1, 64, RopeStyle::kRotateHalf, true, false},
                        {3, 5, 2, 2, 20, RopeStyle::kRotateHalf, true, false},
                        {4, 256, 12, 4, 64, RopeStyle::kRotateHalf, true, false},
                        {2, 9, 2, 1, 128, RopeStyle::kRotateHalf, true, false},
                        {2, 33, 4, 2, 64, RopeStyle::kInterleaved, true, true},
                        {2, 17, 3, 1, 64, RopeStyle::kRotateHalf, false, false}};
  uint64_t seed = 900;
  for (const Case& c : cases) {
    const int H = c.NH + c.NKV, HS = c.HS;
    const int64_t ld = int64_t{c.NH + 2 * c.NKV} * HS, koff = int64_t{c.NH} * HS;
    const size_t BT = static_cast<size_t>(c.B) * c.T, n = BT * ld, rows = BT * H;
    const std::string where = "B=" + std::to_string(c.B) + " T=" + std::to_string(c.T) + " NH=" +
                              std::to_string(c.NH) + " NKV=" + std::to_string(c.NKV) + " HS=" + std::to_string(HS) +
                              (c.rope ? "" : " no-rope") + (c.packed ? " packed" : "");
    const Rope rope{1000000.0f, c.style};
    const Rope* r = c.rope ? &rope : nullptr;
    forge::testing::PackedLayout lay = forge::testing::random_packed_layout(c.B, c.T, 7, seed++);
    for (int32_t& p : lay.pos) p += 3000;
    const int32_t* hpos = c.packed ? lay.pos.data() : nullptr;
    const auto raw = as_dt(dt(), random_normal<float>(n, seed++));
    const auto x0 = as_dt(dt(), random_normal<float>(n, seed++));  // what x holds outside the views
    const auto dx = as_dt(dt(), random_normal<float>(n, seed++));
    auto wv = random_normal<float>(2 * HS, seed++, 0.3);  // q's gain, then k's
    for (float& v : wv) v += 1.0f;
    const auto w = as_dt(dt(), wv);
    const auto dw0 = random_normal<float>(2 * HS, seed++);

    std::vector<float> ref_x = x0, ref_rstd(rows), ref_d = dx, ref_dw = dw0;
    cpu::head_norm_rope_fwd<float>(ref_x.data(), ref_rstd.data(), raw.data(), w.data(), c.B, c.T, H, HS, 1e-6f, r,
                                   hpos, ld, c.NH);
    cpu::head_norm_rope_bwd<float>(ref_d.data(), ref_dw.data(), ref_d.data(), raw.data(), w.data(), ref_rstd.data(),
                                   c.B, c.T, H, HS, r, hpos, ld, c.NH);

    auto dpos = upload(lay.pos);
    const int32_t* pos = c.packed ? dpos.data() : nullptr;
    auto d_raw = up(raw), d_w = up(w), d_x1 = up(x0), d_x2 = up(x0);
    auto d_rstd1 = poisoned<float>(rows), d_rstd2 = poisoned<float>(rows);
    head_norm_rope_fwd(ctx(), dt(), d_x1.data(), d_rstd1.data(), d_raw.data(), d_w.data(), c.B, c.T, H, HS, 1e-6f,
                       r, pos, ld, c.NH);
    head_norm_rope_fwd(ctx(), dt(), d_x2.data(), d_rstd2.data(), d_raw.data(), d_w.data(), c.B, c.T, c.NH, HS,
                       1e-6f, r, pos, ld);
    head_norm_rope_fwd(ctx(), dt(), d_x2.at(koff), d_rstd2.data() + BT * c.NH, d_raw.at(koff), d_w.at(HS), c.B,
                       c.T, c.NKV, HS, 1e-6f, r, pos, ld);
    const auto got_x = down(d_x1), got_rstd = download(d_rstd1);
    EXPECT_TRUE(all_close(got_x, ref_x, tol_for(dt()))) << "x " << where;  // v's columns: x0 on both
    EXPECT_TRUE(all_close(got_rstd, ref_rstd, kTolRstd)) << "rstd " << where;
    EXPECT_TRUE(same_bits(got_x, down(d_x2))) << "x, one call against two " << where;
    EXPECT_TRUE(same_bits(got_rstd, download(d_rstd2))) << "rstd, one call against two " << where;

    auto d_ref_rstd = upload(ref_rstd);
    std::vector<float> got_d[2], got_dw[2];
    for (int run = 0; run < 2; ++run) {  // in place over dx, as the model calls it
      auto d_d = up(dx);
      auto d_dw = upload(dw0);
      head_norm_rope_bwd(ctx(), dt(), d_d.data(), d_dw.data(), d_d.data(), d_raw.data(), d_w.data(),
                         d_ref_rstd.data(), c.B, c.T, H, HS, r, pos, ld, c.NH);
      got_d[run] = down(d_d);
      got_dw[run] = download(d_dw);
    }
    auto d_d2 = up(dx);
    head_norm_rope_bwd(ctx(), dt(), d_d2.data(), nullptr, d_d2.data(), d_raw.data(), d_w.data(), d_ref_rstd.data(),
                       c.B, c.T, c.NH, HS, r, pos, ld);
    head_norm_rope_bwd(ctx(), dt(), d_d2.at(koff), nullptr, d_d2.at(koff), d_raw.at(koff), d_w.at(HS),
                       d_ref_rstd.data() + BT * c.NH, c.B, c.T, c.NKV, HS, r, pos, ld);
    auto d_frozen = up(dx);  // a frozen gain: no dweight, the same d(x_raw)
    head_norm_rope_bwd(ctx(), dt(), d_frozen.data(), nullptr, d_frozen.data(), d_raw.data(), d_w.data(),
                       d_ref_rstd.data(), c.B, c.T, H, HS, r, pos, ld, c.NH);
    EXPECT_TRUE(all_close(got_d[0], ref_d, tol_for(dt()))) << "dx_raw " << where;
    EXPECT_TRUE(all_close(got_dw[0], ref_dw, kTolWgrad)) << "dweight " << where;
    EXPECT_TRUE(same_bits(got_d[0], down(d_d2))) << "dx_raw, one call against two " << where;
    EXPECT_TRUE(same_bits(got_d[0], down(d_frozen))) << "dx_raw without dweight " << where;
    EXPECT_TRUE(same_bits(got_d[1], got_d[0])) << "dx_raw rerun " << where;
    EXPECT_TRUE(same_bits(got_dw[1], got_dw[0])) << "dweight rerun " << where;
  }
}

// The shape checks (FORGE_CHECK: the model's invariants) abort naming the op: an odd head size,
// one above 512, x over x_raw, and a first group of heads not below H.
TEST_P(HeadNormRopeTest, RejectsBadShapes) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const Rope rope{};
  auto a = up(std::vector<float>(8 * 1024, 1.0f)), b = up(std::vector<float>(8 * 1024, 1.0f));
  auto w = up(std::vector<float>(1024, 1.0f));
  auto rstd = poisoned<float>(16);
  EXPECT_DEATH(head_norm_rope_fwd(ctx(), dt(), a.data(), rstd.data(), b.data(), w.data(), 1, 2, 2,
                                  7, 1e-6f, &rope),
               "head_norm_rope_fwd.*even");
  EXPECT_DEATH(head_norm_rope_fwd(ctx(), dt(), a.data(), rstd.data(), b.data(), w.data(), 1, 2, 2,
                                  1024, 1e-6f, &rope),
               "head_norm_rope_fwd.*above the supported");
  EXPECT_DEATH(head_norm_rope_fwd(ctx(), dt(), a.data(), rstd.data(), a.data(), w.data(), 1, 2, 2,
                                  64, 1e-6f, &rope),
               "head_norm_rope_fwd.*alias");
  EXPECT_DEATH(head_norm_rope_fwd(ctx(), dt(), a.data(), rstd.data(), b.data(), w.data(), 1, 2, 2,
                                  64, 1e-6f, &rope, nullptr, 0, 2),
               "head_norm_rope_fwd.*first group of 2 heads outside");
}

INSTANTIATE_TEST_SUITE_P(Dtypes, HeadNormRopeTest,
                         ::testing::Values(DType::kF32, DType::kBF16, DType::kF16),
                         [](const auto& info) { return std::string(dt_name(info.param)); });

}  // namespace
}  // namespace forge::cuda
