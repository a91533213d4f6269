// Fused finishing of per-channel gradient sums (Context::set_fused_finish): the last block of
// each column strip of the partial kernel adds the splits where a separate kernel did. The
// additions and their order are the same, so every weight and bias gradient must be the same
// bits as with the separate kernel (which norm_test.cpp, bias_grad_test.cpp and
// head_norm_rope_test.cpp check against the CPU twins). Shapes: one strip and many (C = 3072
// bias: 12 strips of 256), grouped narrow rows (RMSNorm over C = 64: two rows as one), the
// element path (C = 100), LayerNorm's two sums, 2 to 512 splits; Qwen3's head norms and Qwen2's
// q/k bias sums (rope_bias_bwd); f32, bf16, f16. Each fused call runs twice, so the counters must
// be left at zero for the next call.
#include <string>
#include <vector>

#include "forge/backend/cuda/ops.h"
#include "op_testing.h"

namespace forge::cuda {
namespace {

using namespace forge::cuda::testing;

class WgradFinishTest : public DtypeTest<CudaTest> {
 protected:
  // fn(dweight, dbias) enqueues the op on gradients that start random (n_w and n_b values; 0:
  // null); [dweight, dbias] after it with the separate kernel, then twice with fused finishing.
  template <class Fn>
  void expect_same(int n_w, int n_b, uint64_t seed, Fn fn, const std::string& where) {
    const std::vector<float> w0 = random_normal<float>(n_w, seed),
                             b0 = random_normal<float>(n_b, seed + 1);
    std::vector<float> init = w0, want;
    init.insert(init.end(), b0.begin(), b0.end());
    for (bool fused : {false, true, true}) {
      ctx().set_fused_finish(fused);
      auto dw = upload(w0), db = upload(b0);
      fn(n_w ? dw.data() : nullptr, n_b ? db.data() : nullptr);
      std::vector<float> got = download(dw);
      const std::vector<float> b = download(db);
      got.insert(got.end(), b.begin(), b.end());
      if (!fused) {
        want = got;
        EXPECT_FALSE(bit_identical(got, init)) << "the op changed nothing " << where;
      } else {
        EXPECT_TRUE(same_bits(got, want)) << where;
      }
    }
  }
};

struct Rows {
  int N, C;
};

TEST_P(WgradFinishTest, NormsAndBiasesEqualTheSeparateKernel) {
  uint64_t seed = 700;
  for (const Rows r : {Rows{64, 768}, Rows{4096, 768}, Rows{65536, 64}, Rows{1000, 100},
                       Rows{300, 3072}, Rows{8192, 576}}) {
    const size_t n = static_cast<size_t>(r.N) * r.C;
    const auto dout = up(as_dt(dt(), random_normal<float>(n, seed++)));
    const auto inp = up(as_dt(dt(), random_normal<float>(n, seed++)));
    const auto w = up(as_dt(dt(), random_normal<float>(r.C, seed++)));
    auto mean = upload(random_normal<float>(r.N, seed++));
    std::vector<float> rs = random_normal<float>(r.N, seed++);
    for (float& x : rs) x = 1.0f + 0.1f * x;
    auto rstd = upload(rs);
    const std::string at = "N=" + std::to_string(r.N) + " C=" + std::to_string(r.C);
    auto dinp = poison(n);
    expect_same(
        r.C, r.C, seed++,
        [&](float* dw, float* db) {
          layernorm_bwd(ctx(), dt(), dinp.data(), dw, db, dout.data(), inp.data(), w.data(),
                        mean.data(), rstd.data(), r.N, r.C);
        },
        "layernorm " + at);
    expect_same(
        r.C, 0, seed++,
        [&](float* dw, float*) {
          auto di = poison(n);
          rmsnorm_bwd(ctx(), dt(), di.data(), dw, dout.data(), inp.data(), w.data(), rstd.data(),
                      r.N, r.C);
        },
        "rmsnorm " + at);
    expect_same(
        0, r.C, seed++,
        [&](float*, float* db) { bias_grad(ctx(), dt(), db, dout.data(), r.N, r.C); },
        "bias " + at);
  }
}

// Qwen3's head norm backward: one strip of HS channels over up to 512 splits.
TEST_P(WgradFinishTest, HeadNormEqualsTheSeparateKernel) {
  uint64_t seed = 800;
  const Rope rope{1000000.0f, RopeStyle::kRotateHalf};
  struct Shape {
    int B, T, H, HS;
  };
  for (const Shape s : {Shape{2, 37, 3, 64}, Shape{16, 1024, 8, 64}, Shape{4, 256, 4, 128}})
    for (HeadNormRopeSplit split : {HeadNormRopeSplit::kPerHead, HeadNormRopeSplit::kPerPosition}) {
      const size_t rows = static_cast<size_t>(s.B) * s.T * s.H, n = rows * s.HS;
      const auto x_raw = up(as_dt(dt(), random_normal<float>(n, seed++)));
      const auto dx = up(as_dt(dt(), random_normal<float>(n, seed++)));
      std::vector<float> wv = random_normal<float>(s.HS, seed++, 0.3);
      for (float& v : wv) v += 1.0f;
      const auto w = up(as_dt(dt(), wv));
      std::vector<float> rs = random_normal<float>(rows, seed++);
      for (float& x : rs) x = 1.0f + 0.1f * x;
      auto rstd = upload(rs);
      const std::string at = "B=" + std::to_string(s.B) + " T=" + std::to_string(s.T) +
                             " H=" + std::to_string(s.H) + " HS=" + std::to_string(s.HS) +
                             (split == HeadNormRopeSplit::kPerHead ? " per-head" : " per-position");
      expect_same(
          s.HS, 0, seed++,
          [&](float* dw, float*) {
            auto dx_raw = poison(n);
            head_norm_rope_bwd(ctx(), dt(), dx_raw.data(), dw, dx.data(), x_raw.data(), w.data(),
                               rstd.data(), s.B, s.T, s.H, s.HS, &rope, nullptr, split);
          },
          "head norm " + at);
    }
}

// Qwen2's q/k bias sums kept by the backward rotation: one strip (q of llama-100m's shape), strips
// of whole heads (H·HS above the 256 chunks a strip takes), both pairings; and a head size whose
// chunks do not divide a strip (HS 80, 5 chunks a head in bf16/f16), where the separate kernel
// stays.
TEST_P(WgradFinishTest, RopeBiasEqualsTheSeparateKernel) {
  uint64_t seed = 900;
  struct Shape {
    int B, T, H, HS;
    RopeStyle style;
  };
  for (const Shape s : {Shape{4, 256, 12, 64, RopeStyle::kRotateHalf}, Shape{2, 128, 40, 128, RopeStyle::kRotateHalf},
                        Shape{2, 128, 40, 128, RopeStyle::kInterleaved}, Shape{2, 64, 64, 80, RopeStyle::kRotateHalf},
                        Shape{3, 33, 4, 64, RopeStyle::kInterleaved}}) {
    const Rope rope{10000.0f, s.style};
    const size_t n = static_cast<size_t>(s.B) * s.T * s.H * s.HS;
    const std::vector<float> dx0 = random_normal<float>(n, seed++);
    const std::string at = "B=" + std::to_string(s.B) + " T=" + std::to_string(s.T) + " H=" + std::to_string(s.H) +
                           " HS=" + std::to_string(s.HS) +
                           (s.style == RopeStyle::kRotateHalf ? " rotate-half" : " interleaved");
    std::vector<float> rotated;  // dx after the op: the same with either finishing
    expect_same(
        0, s.H * s.HS, seed++,
        [&](float*, float* db) {
          auto dx = up(as_dt(dt(), dx0));
          rope_bias_bwd(ctx(), dt(), dx.data(), db, s.B, s.T, s.H, s.HS, rope, nullptr);
          const std::vector<float> got = down(dx);
          if (rotated.empty()) rotated = got;
          EXPECT_TRUE(same_bits(got, rotated)) << "rotated dx " << at;
        },
        "rope bias " + at);
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, WgradFinishTest,
                         ::testing::Values(DType::kF32, DType::kBF16, DType::kF16),
                         [](const auto& info) { return std::string(dt_name(info.param)); });

}  // namespace
}  // namespace forge::cuda
