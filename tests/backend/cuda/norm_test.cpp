// CUDA LayerNorm and RMSNorm against their CPU twins, f32, bf16 and f16. Shapes (N, C): (1, 8);
// (37, 201) — C not a multiple of 4 or 8, the element-by-element kernels; (37, 200) — vector
// kernels on a small case; (1000, 520) — several row splits with a short last one and a partial
// channel strip in the weight-gradient pass; (4096, 768) — the GPT-2 size. The backward's
// fused kernel (norm_bwd_fused.cuh: rows of ≤ 32 values a lane) takes (1, 8), (37, 200),
// (1000, 520) (a part-filled last chunk), (4096, 768), (5000, 256) (79 splits, the last short)
// (300, 1024) (its widest row) and (66000, 264) (1,016 splits: the 32-group finishing pass adds 32
// partials a thread); (64, 1032) is one vector too wide for it in every dtype and
// takes the row kernel + channel_grad, as do C = 201 and the narrow rows. Both backward tests
// also take the residual sum (dres += Σ_rows of the updated dinp) and check that it leaves the
// other outputs bit for bit as without it. The backward takes
// the CPU forward's mean/rstd as input, so both sides start from identical statistics.
// The forwards keep a row of ≤ 32 values a lane in registers (C ≤ 1,024 when C is a multiple of
// the 16-byte vector: 1 to 4 chunks in bf16/f16, up to 8 in f32 among these shapes) and sweep the
// others (C = 1032, and C = 201 element by element), so both forms meet the CPU here.
// The residual-fused forwards are checked against their CPU twins and, bit for bit, against
// residual_fwd followed by the plain forward on the GPU; C = 100 and 201 take the element
// kernels (bf16; both dtypes), C = 768 the vector ones.
#include <algorithm>

#include "forge/backend/cuda/ops.h"
#include "forge/ops/layernorm.h"
#include "forge/ops/linear.h"
#include "forge/ops/rmsnorm.h"
#include "op_testing.h"

namespace forge::cuda {
namespace {

using namespace forge::cuda::testing;

class NormTest : public DtypeTest<CudaTest> {};

struct Shape {
  int N, C;
};
// {37, 64}, {1000, 128}, {4096, 64}: attention heads as rows (Qwen3's q/k norm), which several rows
// share a warp for (8 or 16 lanes each; 37 leaves the last warp part-filled) and whose weight
// gradient groups 2 or 4 rows into one (kernels::channel_grad).
const Shape kShapes[] = {{1, 8},      {37, 201},   {37, 200},  {1000, 520}, {4096, 768}, {37, 64},
                         {1000, 128}, {4096, 64},  {5000, 256}, {300, 1024}, {64, 1032},
                         {66000, 264}};

std::string where(const Shape& s) {
  return "N=" + std::to_string(s.N) + " C=" + std::to_string(s.C);
}

// Rows with a nonzero mean (0.5): the two-pass variance must not cancel.
std::vector<float> rows(const Shape& s, uint64_t seed) {
  auto x = random_normal<float>(static_cast<size_t>(s.N) * s.C, seed);
  for (auto& v : x) v += 0.5f;
  return x;
}
std::vector<float> gains(int C, uint64_t seed) {
  auto w = random_normal<float>(C, seed, 0.2);
  for (auto& v : w) v += 1.0f;
  return w;
}

TEST_P(NormTest, LayerNormFwdMatchesCpu) {
  uint64_t seed = 10;
  for (const Shape& s : kShapes) {
    const size_t n = static_cast<size_t>(s.N) * s.C;
    const auto x = as_dt(dt(), rows(s, seed++));
    const auto w = as_dt(dt(), gains(s.C, seed++));
    const auto b = as_dt(dt(), random_normal<float>(s.C, seed++, 0.2));
    std::vector<float> ref(n), ref_mean(s.N), ref_rstd(s.N);
    cpu::layernorm_fwd<float>(ref.data(), ref_mean.data(), ref_rstd.data(), x.data(), w.data(),
                              b.data(), s.N, s.C, 1e-5f);
    auto dx = up(x), dw = up(w), db = up(b), dy = poison(n);
    auto dmean = poisoned<float>(s.N), drstd = poisoned<float>(s.N);
    layernorm_fwd(ctx(), dt(), dy.data(), dmean.data(), drstd.data(), dx.data(), dw.data(),
                  db.data(), s.N, s.C, 1e-5f);
    EXPECT_TRUE(all_close(down(dy), ref, tol_for(dt()))) << where(s);
    // Statistics are f32 in both modes, from the same (rounded) inputs.
    EXPECT_TRUE(all_close(download(dmean), ref_mean, forge::testing::kTolF32)) << where(s);
    EXPECT_TRUE(all_close(download(drstd), ref_rstd, forge::testing::kTolF32)) << where(s);
  }
}

// dres: dres0 + Σ_rows of the dinp the kernel stored (got_dinp, as f32), the CPU's bias_grad of
// it in double: only the f32 summation order differs (kTolWgrad).
void expect_residual_sum(const std::vector<float>& got, const std::vector<float>& dres0,
                         const std::vector<float>& dinp, const Shape& s) {
  std::vector<double> ref(dres0.begin(), dres0.end()), dinp_d(dinp.begin(), dinp.end());
  cpu::bias_grad<double>(ref.data(), dinp_d.data(), s.N, s.C);
  EXPECT_TRUE(all_close(got, std::vector<float>(ref.begin(), ref.end()), kTolWgrad)) << "dres " << where(s);
}

TEST_P(NormTest, LayerNormBwdMatchesCpuAndIsDeterministic) {
  uint64_t seed = 20;
  for (const Shape& s : kShapes) {
    const size_t n = static_cast<size_t>(s.N) * s.C;
    const auto x = as_dt(dt(), rows(s, seed++));
    const auto w = as_dt(dt(), gains(s.C, seed++));
    const auto b = as_dt(dt(), random_normal<float>(s.C, seed++, 0.2));
    const auto dout = as_dt(dt(), random_normal<float>(n, seed++));
    const auto dinp0 = as_dt(dt(), random_normal<float>(n, seed++));
    const auto dw0 = random_normal<float>(s.C, seed++), db0 = random_normal<float>(s.C, seed++);
    std::vector<float> y(n), mean(s.N), rstd(s.N);
    cpu::layernorm_fwd<float>(y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), s.N,
                              s.C, 1e-5f);
    std::vector<float> ref_dinp = dinp0, ref_dw = dw0, ref_db = db0;
    cpu::layernorm_bwd<float>(ref_dinp.data(), ref_dw.data(), ref_db.data(), dout.data(), x.data(),
                              w.data(), mean.data(), rstd.data(), s.N, s.C);
    auto dx = up(x), dwt = up(w), ddout = up(dout);
    auto dmean = upload(mean), drstd = upload(rstd);
    const auto dres0 = random_normal<float>(s.C, seed++);
    std::vector<float> got_dinp[3], got_dw[3], got_db[3], got_dres[3];
    for (int run = 0; run < 3; ++run) {  // 0, 1: with the residual sum; 2: without
      auto ddinp = up(dinp0);
      auto ddw = upload(dw0), ddb = upload(db0), ddres = upload(dres0);
      layernorm_bwd(ctx(), dt(), ddinp.data(), ddw.data(), ddb.data(), ddout.data(), dx.data(),
                    dwt.data(), dmean.data(), drstd.data(), s.N, s.C, run < 2 ? ddres.data() : nullptr);
      got_dinp[run] = down(ddinp);
      got_dw[run] = download(ddw);
      got_db[run] = download(ddb);
      got_dres[run] = download(ddres);
    }
    EXPECT_TRUE(all_close(got_dinp[0], ref_dinp, tol_for(dt()))) << "dinp " << where(s);
    EXPECT_TRUE(all_close(got_dw[0], ref_dw, kTolWgrad)) << "dweight " << where(s);
    EXPECT_TRUE(all_close(got_db[0], ref_db, kTolWgrad)) << "dbias " << where(s);
    expect_residual_sum(got_dres[0], dres0, got_dinp[0], s);
    EXPECT_TRUE(bit_identical(got_dres[2], dres0)) << "dres untouched when null " << where(s);
    for (int run : {1, 2}) {  // reruns, and the sum changes nothing else
      EXPECT_TRUE(bit_identical(got_dinp[0], got_dinp[run])) << where(s) << " run " << run;
      EXPECT_TRUE(bit_identical(got_dw[0], got_dw[run])) << where(s) << " run " << run;
      EXPECT_TRUE(bit_identical(got_db[0], got_db[run])) << where(s) << " run " << run;
    }
    EXPECT_TRUE(bit_identical(got_dres[0], got_dres[1])) << where(s);
  }
}

TEST_P(NormTest, RmsNormFwdMatchesCpu) {
  uint64_t seed = 30;
  for (const Shape& s : kShapes) {
    const size_t n = static_cast<size_t>(s.N) * s.C;
    const auto x = as_dt(dt(), rows(s, seed++));
    const auto w = as_dt(dt(), gains(s.C, seed++));
    std::vector<float> ref(n), ref_rstd(s.N);
    cpu::rmsnorm_fwd<float>(ref.data(), ref_rstd.data(), x.data(), w.data(), s.N, s.C, 1e-6f);
    auto dx = up(x), dw = up(w), dy = poison(n);
    auto drstd = poisoned<float>(s.N);
    rmsnorm_fwd(ctx(), dt(), dy.data(), drstd.data(), dx.data(), dw.data(), s.N, s.C, 1e-6f);
    EXPECT_TRUE(all_close(down(dy), ref, tol_for(dt()))) << where(s);
    EXPECT_TRUE(all_close(download(drstd), ref_rstd, forge::testing::kTolF32)) << where(s);
  }
}

// head_rmsnorm (the decode step's Qwen3 q/k norm): in place over H heads of HS inside rows of a
// wider stride (the fused q|k|v row). Tolerance: the dtype's (tol_for), as rmsnorm_fwd. The
// columns past the heads (k and v of the row) must come back untouched, bit for bit. HS 24 and a
// stride of 7 take the element-by-element path; the others the 16-byte one.
TEST_P(NormTest, HeadRmsNormInPlaceMatchesCpu) {
  struct HeadShape {
    int N, H, HS;
    int64_t stride;
  };
  uint64_t seed = 90;
  for (const HeadShape& s : {HeadShape{1, 9, 64, 9 * 64 + 2 * 3 * 64}, HeadShape{7, 4, 128, 8 * 128},
                             HeadShape{3, 2, 24, 2 * 24 + 7}, HeadShape{33, 16, 16, 16 * 16 + 64}}) {
    const size_t n = static_cast<size_t>(s.N) * s.stride;
    const auto x = as_dt(dt(), random_normal<float>(n, seed++));
    const auto w = as_dt(dt(), gains(s.HS, seed++));
    std::vector<float> ref = x;
    cpu::head_rmsnorm<float>(ref.data(), w.data(), s.N, s.H, s.HS, s.stride, 1e-6f);
    auto dx = up(x), dw = up(w);
    head_rmsnorm(ctx(), dt(), dx.data(), dw.data(), s.N, s.H, s.HS, s.stride, 1e-6f);
    const std::vector<float> got = down(dx);
    const std::string at = "N=" + std::to_string(s.N) + " H=" + std::to_string(s.H) +
                           " HS=" + std::to_string(s.HS) + " stride=" + std::to_string(s.stride);
    EXPECT_TRUE(all_close(got, ref, tol_for(dt()))) << at;
    for (int r = 0; r < s.N; ++r)
      for (int64_t c = static_cast<int64_t>(s.H) * s.HS; c < s.stride; ++c)
        ASSERT_EQ(got[r * s.stride + c], x[r * s.stride + c]) << at << " untouched column " << c;
  }
}

TEST_P(NormTest, RmsNormBwdMatchesCpuAndIsDeterministic) {
  uint64_t seed = 40;
  for (const Shape& s : kShapes) {
    const size_t n = static_cast<size_t>(s.N) * s.C;
    const auto x = as_dt(dt(), rows(s, seed++));
    const auto w = as_dt(dt(), gains(s.C, seed++));
    const auto dout = as_dt(dt(), random_normal<float>(n, seed++));
    const auto dinp0 = as_dt(dt(), random_normal<float>(n, seed++));
    const auto dw0 = random_normal<float>(s.C, seed++);
    std::vector<float> y(n), rstd(s.N);
    cpu::rmsnorm_fwd<float>(y.data(), rstd.data(), x.data(), w.data(), s.N, s.C, 1e-6f);
    std::vector<float> ref_dinp = dinp0, ref_dw = dw0;
    cpu::rmsnorm_bwd<float>(ref_dinp.data(), ref_dw.data(), dout.data(), x.data(), w.data(),
                            rstd.data(), s.N, s.C);
    auto dx = up(x), dwt = up(w), ddout = up(dout);
    auto drstd = upload(rstd);
    const auto dres0 = random_normal<float>(s.C, seed++);
    std::vector<float> got_dinp[3], got_dw[3], got_dres[3];
    for (int run = 0; run < 3; ++run) {  // 0, 1: with the residual sum; 2: without
      auto ddinp = up(dinp0);
      auto ddw = upload(dw0), ddres = upload(dres0);
      rmsnorm_bwd(ctx(), dt(), ddinp.data(), ddw.data(), ddout.data(), dx.data(), dwt.data(),
                  drstd.data(), s.N, s.C, run < 2 ? ddres.data() : nullptr);
      got_dinp[run] = down(ddinp);
      got_dw[run] = download(ddw);
      got_dres[run] = download(ddres);
    }
    EXPECT_TRUE(all_close(got_dinp[0], ref_dinp, tol_for(dt()))) << "dinp " << where(s);
    EXPECT_TRUE(all_close(got_dw[0], ref_dw, kTolWgrad)) << "dweight " << where(s);
    expect_residual_sum(got_dres[0], dres0, got_dinp[0], s);
    EXPECT_TRUE(bit_identical(got_dres[2], dres0)) << "dres untouched when null " << where(s);
    for (int run : {1, 2}) {  // reruns, and the sum changes nothing else
      EXPECT_TRUE(bit_identical(got_dinp[0], got_dinp[run])) << where(s) << " run " << run;
      EXPECT_TRUE(bit_identical(got_dw[0], got_dw[run])) << where(s) << " run " << run;
    }
    EXPECT_TRUE(bit_identical(got_dres[0], got_dres[1])) << where(s);
  }
}

const Shape kResidualShapes[] = {{1, 8}, {37, 100}, {37, 201}, {4096, 768}};

TEST_P(NormTest, ResidualLayerNormFwdMatchesCpuAndUnfusedBitForBit) {
  uint64_t seed = 50;
  for (const Shape& s : kResidualShapes) {
    const size_t n = static_cast<size_t>(s.N) * s.C;
    const auto a = as_dt(dt(), rows(s, seed++));
    const auto b = as_dt(dt(), random_normal<float>(n, seed++, 0.5));
    const auto w = as_dt(dt(), gains(s.C, seed++));
    const auto bias = as_dt(dt(), random_normal<float>(s.C, seed++, 0.2));
    std::vector<float> ref_res(n), ref(n), ref_mean(s.N), ref_rstd(s.N);
    cpu::residual_layernorm_fwd<float>(ref_res.data(), ref.data(), ref_mean.data(), ref_rstd.data(),
                                       a.data(), b.data(), w.data(), bias.data(), s.N, s.C, 1e-5f);
    auto da = up(a), db = up(b), dw = up(w), dbias = up(bias);
    auto res = poison(n), y = poison(n);
    auto mean = poisoned<float>(s.N), rstd = poisoned<float>(s.N);
    residual_layernorm_fwd(ctx(), dt(), res.data(), y.data(), mean.data(), rstd.data(), da.data(),
                           db.data(), dw.data(), dbias.data(), s.N, s.C, 1e-5f);
    auto res2 = poison(n), y2 = poison(n);
    auto mean2 = poisoned<float>(s.N), rstd2 = poisoned<float>(s.N);
    residual_fwd(ctx(), dt(), res2.data(), da.data(), db.data(), static_cast<int64_t>(n));
    layernorm_fwd(ctx(), dt(), y2.data(), mean2.data(), rstd2.data(), res2.data(), dw.data(),
                  dbias.data(), s.N, s.C, 1e-5f);
    const auto got_res = down(res), got = down(y);
    const auto got_mean = download(mean), got_rstd = download(rstd);
    // a + b in f32, rounded to nearest even: the same bits on both sides.
    EXPECT_TRUE(same_bits(got_res, as_dt(dt(), ref_res))) << "res " << where(s);
    // In bf16 the CPU twin normalises the unrounded f32 sum, hence the bf16 tolerance on the
    // statistics; the bit-for-bit comparison with the unfused pair below is the tight check.
    EXPECT_TRUE(all_close(got, ref, tol_for(dt()))) << where(s);
    EXPECT_TRUE(all_close(got_mean, ref_mean, tol_for(dt()))) << where(s);
    EXPECT_TRUE(all_close(got_rstd, ref_rstd, tol_for(dt()))) << where(s);
    EXPECT_TRUE(same_bits(got_res, down(res2))) << "res vs residual_fwd " << where(s);
    EXPECT_TRUE(same_bits(got, down(y2))) << "out vs unfused " << where(s);
    EXPECT_TRUE(same_bits(got_mean, download(mean2))) << "mean vs unfused " << where(s);
    EXPECT_TRUE(same_bits(got_rstd, download(rstd2))) << "rstd vs unfused " << where(s);
  }
}

TEST_P(NormTest, ResidualRmsNormFwdMatchesCpuAndUnfusedBitForBit) {
  uint64_t seed = 60;
  for (const Shape& s : kResidualShapes) {
    const size_t n = static_cast<size_t>(s.N) * s.C;
    const auto a = as_dt(dt(), rows(s, seed++));
    const auto b = as_dt(dt(), random_normal<float>(n, seed++, 0.5));
    const auto w = as_dt(dt(), gains(s.C, seed++));
    std::vector<float> ref_res(n), ref(n), ref_rstd(s.N);
    cpu::residual_rmsnorm_fwd<float>(ref_res.data(), ref.data(), ref_rstd.data(), a.data(),
                                     b.data(), w.data(), s.N, s.C, 1e-6f);
    auto da = up(a), db = up(b), dw = up(w);
    auto res = poison(n), y = poison(n);
    auto rstd = poisoned<float>(s.N);
    residual_rmsnorm_fwd(ctx(), dt(), res.data(), y.data(), rstd.data(), da.data(), db.data(),
                         dw.data(), s.N, s.C, 1e-6f);
    auto res2 = poison(n), y2 = poison(n);
    auto rstd2 = poisoned<float>(s.N);
    residual_fwd(ctx(), dt(), res2.data(), da.data(), db.data(), static_cast<int64_t>(n));
    rmsnorm_fwd(ctx(), dt(), y2.data(), rstd2.data(), res2.data(), dw.data(), s.N, s.C, 1e-6f);
    const auto got_res = down(res), got = down(y), got_rstd = download(rstd);
    EXPECT_TRUE(same_bits(got_res, as_dt(dt(), ref_res))) << "res " << where(s);
    EXPECT_TRUE(all_close(got, ref, tol_for(dt()))) << where(s);
    EXPECT_TRUE(all_close(got_rstd, ref_rstd, tol_for(dt()))) << where(s);
    EXPECT_TRUE(same_bits(got_res, down(res2))) << "res vs residual_fwd " << where(s);
    EXPECT_TRUE(same_bits(got, down(y2))) << "out vs unfused " << where(s);
    EXPECT_TRUE(same_bits(got_rstd, download(rstd2))) << "rstd vs unfused " << where(s);
  }
}

// `a` one element past a 16-byte boundary (C = 768 otherwise takes the vector kernels): the
// fused forwards must fall back to the element kernels and still match the CPU.
TEST_P(NormTest, ResidualNormFwdMisalignedInput) {
  const Shape s{37, 768};
  const size_t n = static_cast<size_t>(s.N) * s.C;
  uint64_t seed = 70;
  const auto a = as_dt(dt(), rows(s, seed++));
  const auto b = as_dt(dt(), random_normal<float>(n, seed++, 0.5));
  const auto w = as_dt(dt(), gains(s.C, seed++));
  const auto bias = as_dt(dt(), random_normal<float>(s.C, seed++, 0.2));
  std::vector<float> a_host(n + 1, 0.0f);
  std::copy(a.begin(), a.end(), a_host.begin() + 1);
  auto da = up(a_host), db = up(b), dw = up(w), dbias = up(bias);
  std::vector<float> ref_res(n), ref(n), ref_mean(s.N), ref_rstd(s.N);

  cpu::residual_layernorm_fwd<float>(ref_res.data(), ref.data(), ref_mean.data(), ref_rstd.data(),
                                     a.data(), b.data(), w.data(), bias.data(), s.N, s.C, 1e-5f);
  auto res = poison(n), y = poison(n);
  auto mean = poisoned<float>(s.N), rstd = poisoned<float>(s.N);
  residual_layernorm_fwd(ctx(), dt(), res.data(), y.data(), mean.data(), rstd.data(), da.at(1),
                         db.data(), dw.data(), dbias.data(), s.N, s.C, 1e-5f);
  EXPECT_TRUE(same_bits(down(res), as_dt(dt(), ref_res))) << "layernorm res";
  EXPECT_TRUE(all_close(down(y), ref, tol_for(dt()))) << "layernorm out";
  EXPECT_TRUE(all_close(download(mean), ref_mean, tol_for(dt()))) << "layernorm mean";
  EXPECT_TRUE(all_close(download(rstd), ref_rstd, tol_for(dt()))) << "layernorm rstd";

  cpu::residual_rmsnorm_fwd<float>(ref_res.data(), ref.data(), ref_rstd.data(), a.data(), b.data(),
                                   w.data(), s.N, s.C, 1e-6f);
  auto res2 = poison(n), y2 = poison(n);
  auto rstd2 = poisoned<float>(s.N);
  residual_rmsnorm_fwd(ctx(), dt(), res2.data(), y2.data(), rstd2.data(), da.at(1), db.data(),
                       dw.data(), s.N, s.C, 1e-6f);
  EXPECT_TRUE(same_bits(down(res2), as_dt(dt(), ref_res))) << "rmsnorm res";
  EXPECT_TRUE(all_close(down(y2), ref, tol_for(dt()))) << "rmsnorm out";
  EXPECT_TRUE(all_close(download(rstd2), ref_rstd, tol_for(dt()))) << "rmsnorm rstd";
}

INSTANTIATE_TEST_SUITE_P(Dtypes, NormTest,
                         ::testing::Values(DType::kF32, DType::kBF16, DType::kF16),
                         [](const auto& info) { return std::string(dt_name(info.param)); });

}  // namespace
}  // namespace forge::cuda
