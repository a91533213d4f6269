// CUDA RoPE against the CPU twin (backend/cpu/rope.cpp): both pairings, forward and backward,
// unscaled, linear and llama3 frequencies, f32, bf16 and f16. HS = 64 takes the vector path
// (HS/2 a multiple of 8), HS = 20 the element-by-element one (HS/2 = 10). pos0 = 8150 puts the
// positions at 8150…8186: the angle must be as accurate there as at t = 0 (an f32 angle alone
// would be off by ~5e-4 rad). Packed rows (positions pos (B, T)): random layouts, positions
// restarting at random segment boundaries, also offset to 8000+.
#include "forge/ops/rope.h"

#include <cmath>
#include <string>
#include <vector>

#include "forge/backend/cuda/ops.h"
#include "model/packed_layout.h"
#include "op_testing.h"

namespace forge::cuda {
namespace {

using namespace forge::cuda::testing;

class RopeTest : public DtypeTest<CudaTest> {};

struct Shape {
  int B, T, H, HS, pos0;
};
const Shape kShapes[] = {{2, 37, 3, 64, 0},
                         {2, 37, 3, 64, 8150},
                         {2, 37, 3, 20, 8150},
                         {3, 5, 2, 2, 7},
                         {4, 1024, 12, 64, 0}};

// The scalings the ops take from rope_inv_freq (ops/rope.h). Llama 3.1's llama3 parameters put
// all three bands in HS 64 (pairs 0-14 kept, 15-17 blended, 18-31 divided by 8) and in HS 20
// (0-4, 5, 6-9).
std::vector<Rope> ropes(RopeStyle style) {
  return {Rope{10000.0f, style}, Rope{10000.0f, style, RopeScaling::kLinear, 4.0f},
          Rope{500000.0f, style, RopeScaling::kLlama3, 8.0f, 1.0f, 4.0f, 8192}};
}

TEST_P(RopeTest, FwdBwdMatchCpuBothStylesAndScalings) {
  uint64_t seed = 50;
  for (RopeStyle style : {RopeStyle::kRotateHalf, RopeStyle::kInterleaved})
    for (const Rope& rope : ropes(style)) {
      // Whether some case tells this scaling from plain RoPE beyond the tolerance: a GPU that
      // ignored the scaling then fails. (llama3 only moves the low frequencies, so short
      // positions in bf16 may not; the long ones do.)
      bool told_apart = rope.scaling == RopeScaling::kNone;
      for (const Shape& s : kShapes)
        for (bool backward : {false, true}) {
          const size_t n = static_cast<size_t>(s.B) * s.T * s.H * s.HS;
          const auto x = as_dt(dt(), random_normal<float>(n, seed++));
          std::vector<float> ref = x, plain = x;
          const Rope unscaled{rope.theta, rope.style};
          if (backward) {
            cpu::rope_bwd<float>(ref.data(), s.B, s.T, s.H, s.HS, rope, s.pos0);
            cpu::rope_bwd<float>(plain.data(), s.B, s.T, s.H, s.HS, unscaled, s.pos0);
          } else {
            cpu::rope_fwd<float>(ref.data(), s.B, s.T, s.H, s.HS, rope, s.pos0);
            cpu::rope_fwd<float>(plain.data(), s.B, s.T, s.H, s.HS, unscaled, s.pos0);
          }
          told_apart = told_apart || !all_close(plain, ref, tol_for(dt()));
          auto dx = up(x);
          if (backward)
            rope_bwd(ctx(), dt(), dx.data(), s.B, s.T, s.H, s.HS, rope, s.pos0);
          else
            rope_fwd(ctx(), dt(), dx.data(), s.B, s.T, s.H, s.HS, rope, s.pos0);
          EXPECT_TRUE(all_close(down(dx), ref, tol_for(dt())))
              << (backward ? "bwd" : "fwd") << " style=" << static_cast<int>(style)
              << " scaling=" << static_cast<int>(rope.scaling) << " B=" << s.B << " T=" << s.T
              << " H=" << s.H << " HS=" << s.HS << " pos0=" << s.pos0;
        }
      EXPECT_TRUE(told_apart) << "no case distinguishes scaling " << static_cast<int>(rope.scaling)
                              << " from unscaled RoPE";
    }
}

// The backward is the inverse rotation: bwd(fwd(x)) = x up to rounding (f32 only; in bf16 the
// intermediate rounding dominates).
TEST_P(RopeTest, BwdInvertsFwd) {
  if (dt() != DType::kF32) GTEST_SKIP() << "f32 only";
  const int B = 2, T = 64, H = 4, HS = 128;
  const auto x = random_normal<float>(static_cast<size_t>(B) * T * H * HS, 60);
  for (RopeStyle style : {RopeStyle::kRotateHalf, RopeStyle::kInterleaved})
    for (const Rope& rope : ropes(style)) {
      auto dx = up(x);
      rope_fwd(ctx(), dt(), dx.data(), B, T, H, HS, rope, 4000);
      rope_bwd(ctx(), dt(), dx.data(), B, T, H, HS, rope, 4000);
      EXPECT_TRUE(all_close(down(dx), x, {1e-6, 1e-5}))
          << "style=" << static_cast<int>(style) << " scaling=" << static_cast<int>(rope.scaling);
    }
}

// Packed rows: the angle at pos[b, t], forward and backward, both styles and every scaling, the
// vector (HS 64) and element (HS 20) paths. Positions from random layouts (segments of 1 to T
// tokens), and the same shifted by 8000 (accuracy at long positions). Tolerance: the dtype's,
// as for the unpacked op (the same rotation, one rounding of the output).
TEST_P(RopeTest, PackedPositionsMatchCpu) {
  struct Case {
    int B, T, H, HS, max_len, shift;
  };
  const Case cases[] = {{3, 37, 3, 64, 9, 0}, {3, 37, 3, 20, 37, 8000}, {4, 256, 4, 64, 40, 0}};
  uint64_t seed = 70;
  for (RopeStyle style : {RopeStyle::kRotateHalf, RopeStyle::kInterleaved})
    for (const Rope& rope : ropes(style))
      for (const Case& c : cases)
        for (bool backward : {false, true}) {
          forge::testing::PackedLayout lay =
              forge::testing::random_packed_layout(c.B, c.T, c.max_len, seed++);
          for (int32_t& p : lay.pos) p += c.shift;
          const size_t n = static_cast<size_t>(c.B) * c.T * c.H * c.HS;
          const auto x = as_dt(dt(), random_normal<float>(n, seed++));
          std::vector<float> ref = x, plain = x;
          if (backward) {
            cpu::rope_bwd<float>(ref.data(), c.B, c.T, c.H, c.HS, rope, 0, lay.pos.data());
            cpu::rope_bwd<float>(plain.data(), c.B, c.T, c.H, c.HS, rope, 0);
          } else {
            cpu::rope_fwd<float>(ref.data(), c.B, c.T, c.H, c.HS, rope, 0, lay.pos.data());
            cpu::rope_fwd<float>(plain.data(), c.B, c.T, c.H, c.HS, rope, 0);
          }
          const std::string where = std::string(backward ? "bwd" : "fwd") +
                                    " style=" + std::to_string(static_cast<int>(style)) +
                                    " scaling=" + std::to_string(static_cast<int>(rope.scaling)) +
                                    " T=" + std::to_string(c.T) + " HS=" + std::to_string(c.HS) +
                                    " shift=" + std::to_string(c.shift);
          // The positions matter: rotating at t instead is far off.
          EXPECT_FALSE(all_close(plain, ref, tol_for(dt()))) << where;
          auto dpos = upload(lay.pos);
          auto dx = up(x);
          if (backward)
            rope_bwd(ctx(), dt(), dx.data(), c.B, c.T, c.H, c.HS, rope, 0, dpos.data());
          else
            rope_fwd(ctx(), dt(), dx.data(), c.B, c.T, c.H, c.HS, rope, 0, dpos.data());
          EXPECT_TRUE(all_close(down(dx), ref, tol_for(dt()))) << where;
        }
}

// pos[b, t] = t is the unpacked op bit for bit (the same kernel, the same angles).
TEST_P(RopeTest, PositionsTAreTheUnpackedOpBitForBit) {
  const int B = 2, T = 40, H = 3, HS = 64;
  std::vector<int32_t> pos(B * T);
  for (int i = 0; i < B * T; ++i) pos[i] = i % T;
  const auto x = as_dt(dt(), random_normal<float>(static_cast<size_t>(B) * T * H * HS, 80));
  auto dpos = upload(pos);
  for (bool backward : {false, true}) {
    auto a = up(x), b = up(x);
    if (backward) {
      rope_bwd(ctx(), dt(), a.data(), B, T, H, HS, Rope{}, 0, dpos.data());
      rope_bwd(ctx(), dt(), b.data(), B, T, H, HS, Rope{});
    } else {
      rope_fwd(ctx(), dt(), a.data(), B, T, H, HS, Rope{}, 0, dpos.data());
      rope_fwd(ctx(), dt(), b.data(), B, T, H, HS, Rope{});
    }
    EXPECT_TRUE(same_bits(down(a), down(b))) << (backward ? "bwd" : "fwd");
  }
}

// rope_bias_bwd (Qwen2's q/k bias gradient from the backward rotation's pass) against
// cpu::rope_bias_bwd (rope_bwd, then bias_grad), both pairings, plain and packed positions:
// the rotated dx (the dtype's tolerance: one rounding of an f32 rotation), dbias accumulated onto
// a random start (kTolWgrad: f32 sums over up to 1024 rows in another order than the CPU's
// double), bit-identical on a rerun, and with dbias null exactly rope_bwd. Shapes (B, T, H, HS):
// llama-100m's q and k heads (12 and 4 of 64: one strip of 48 or 16 chunks in bf16), HS 20 (the
// element path), 40 heads of 128 (2 strips in bf16, 3 in f32: strip boundaries inside a row),
// and 74 rows in 2 splits of 37.
TEST_P(RopeTest, BiasBwdMatchesCpuAndIsDeterministic) {
  struct Case {
    int B, T, H, HS;
  };
  const Case cases[] = {
      {4, 256, 12, 64}, {4, 256, 4, 64}, {2, 37, 3, 20}, {2, 16, 40, 128}, {2, 37, 5, 64}};
  uint64_t seed = 90;
  for (RopeStyle style : {RopeStyle::kRotateHalf, RopeStyle::kInterleaved})
    for (const Case& c : cases)
      for (bool packed : {false, true}) {
        const Rope rope{1000000.0f, style};
        forge::testing::PackedLayout lay =
            forge::testing::random_packed_layout(c.B, c.T, 11, seed++);
        for (int32_t& p : lay.pos) p += 2000;
        const size_t n = static_cast<size_t>(c.B) * c.T * c.H * c.HS;
        const size_t C = static_cast<size_t>(c.H) * c.HS;
        const auto x = as_dt(dt(), random_normal<float>(n, seed++));
        const auto db0 = random_normal<float>(C, seed++);
        std::vector<float> ref = x, ref_db = db0;
        cpu::rope_bias_bwd<float>(ref.data(), ref_db.data(), c.B, c.T, c.H, c.HS, rope,
                                  packed ? lay.pos.data() : nullptr);
        const std::string where =
            std::string(style == RopeStyle::kRotateHalf ? "rotate_half" : "interleaved") +
            " B=" + std::to_string(c.B) + " T=" + std::to_string(c.T) +
            " H=" + std::to_string(c.H) + " HS=" + std::to_string(c.HS) + (packed ? " packed" : "");
        auto dpos = upload(lay.pos);
        const int32_t* pos = packed ? dpos.data() : nullptr;
        std::vector<float> got[2], got_db[2];
        for (int run = 0; run < 2; ++run) {
          auto dx = up(x);
          auto ddb = upload(db0);
          rope_bias_bwd(ctx(), dt(), dx.data(), ddb.data(), c.B, c.T, c.H, c.HS, rope, pos);
          got[run] = down(dx);
          got_db[run] = download(ddb);
        }
        EXPECT_TRUE(all_close(got[0], ref, tol_for(dt()))) << "dx " << where;
        EXPECT_TRUE(all_close(got_db[0], ref_db, kTolWgrad)) << "dbias " << where;
        EXPECT_TRUE(same_bits(got[1], got[0])) << "dx rerun " << where;
        EXPECT_TRUE(same_bits(got_db[1], got_db[0])) << "dbias rerun " << where;
        auto plain = up(x), fused = up(x);
        rope_bwd(ctx(), dt(), plain.data(), c.B, c.T, c.H, c.HS, rope, 0, pos);
        rope_bias_bwd(ctx(), dt(), fused.data(), nullptr, c.B, c.T, c.H, c.HS, rope, pos);
        EXPECT_TRUE(same_bits(down(fused), down(plain))) << "no dbias " << where;
      }
}

// Views of H heads at column `off` of rows `ld` wide (slices of a fused q|k|v row) against the
// CPU's strided op: HS 64 with ld and off multiples of 8 (the vector path), HS 64 with an odd ld
// and HS 20 (the element path). Columns outside the view come back unchanged, bit for bit.
TEST_P(RopeTest, StridedViewsMatchCpu) {
  struct Case {
    int B, T, H, HS, off, ld;
  };
  const Case cases[] = {{2, 37, 3, 64, 64, 64 * 7}, {2, 37, 3, 64, 3, 3 + 64 * 3 + 4}, {3, 5, 2, 20, 20, 20 * 5}};
  uint64_t seed = 700;
  for (const Case& c : cases)
    for (bool backward : {false, true}) {
      const Rope rope{10000.0f, RopeStyle::kRotateHalf};
      const size_t n = static_cast<size_t>(c.B) * c.T * c.ld;
      const auto x = as_dt(dt(), random_normal<float>(n, seed++));
      std::vector<float> ref = x;
      auto dx = up(x);
      if (backward) {
        cpu::rope_bwd<float>(ref.data() + c.off, c.B, c.T, c.H, c.HS, rope, 100, nullptr, c.ld);
        rope_bwd(ctx(), dt(), dx.at(c.off), c.B, c.T, c.H, c.HS, rope, 100, nullptr, c.ld);
      } else {
        cpu::rope_fwd<float>(ref.data() + c.off, c.B, c.T, c.H, c.HS, rope, 100, nullptr, c.ld);
        rope_fwd(ctx(), dt(), dx.at(c.off), c.B, c.T, c.H, c.HS, rope, 100, nullptr, c.ld);
      }
      const auto got = down(dx);
      std::vector<float> got_in, ref_in, got_out, ref_out;
      for (size_t i = 0; i < n; ++i) {
        const int col = static_cast<int>(i % c.ld);
        const bool in = col >= c.off && col < c.off + c.H * c.HS;
        (in ? got_in : got_out).push_back(got[i]);
        (in ? ref_in : ref_out).push_back(ref[i]);
      }
      const std::string where = (backward ? "bwd" : "fwd") + std::string(" HS=") + std::to_string(c.HS) +
                                " ld=" + std::to_string(c.ld);
      EXPECT_TRUE(all_close(got_in, ref_in, tol_for(dt()))) << where;
      EXPECT_TRUE(same_bits(got_out, ref_out)) << "outside the view " << where;
    }
}

// rope_bias_bwd on a view of H heads at column `off` of rows `ld` wide (Qwen2's q slice of the
// fused gradient) against the CPU's strided op: rotation, bias sums, and the columns outside.
TEST_P(RopeTest, StridedBiasBwdMatchesCpu) {
  const int B = 4, T = 256, H = 4, HS = 64, off = 64, ld = 64 * 8;
  const Rope rope{1000000.0f, RopeStyle::kRotateHalf};
  const size_t n = static_cast<size_t>(B) * T * ld;
  const auto x = as_dt(dt(), random_normal<float>(n, 95));
  const auto db0 = random_normal<float>(H * HS, 96);
  std::vector<float> ref = x, ref_db = db0;
  cpu::rope_bias_bwd<float>(ref.data() + off, ref_db.data(), B, T, H, HS, rope, nullptr, ld);
  auto dx = up(x);
  auto ddb = upload(db0);
  rope_bias_bwd(ctx(), dt(), dx.at(off), ddb.data(), B, T, H, HS, rope, nullptr, ld);
  const auto got = down(dx);
  std::vector<float> got_in, ref_in, got_out, ref_out;
  for (size_t i = 0; i < n; ++i) {
    const int col = static_cast<int>(i % ld);
    const bool in = col >= off && col < off + H * HS;
    (in ? got_in : got_out).push_back(got[i]);
    (in ? ref_in : ref_out).push_back(ref[i]);
  }
  EXPECT_TRUE(all_close(got_in, ref_in, tol_for(dt())));
  EXPECT_TRUE(same_bits(got_out, ref_out)) << "outside the view";
  EXPECT_TRUE(all_close(download(ddb), ref_db, kTolWgrad)) << "dbias";
}

INSTANTIATE_TEST_SUITE_P(Dtypes, RopeTest,
                         ::testing::Values(DType::kF32, DType::kBF16, DType::kF16),
                         [](const auto& info) { return std::string(dt_name(info.param)); });

}  // namespace
}  // namespace forge::cuda
