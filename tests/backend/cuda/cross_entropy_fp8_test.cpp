// The LM head + cross-entropy with FP8 products (ops.h's LmHeadFp8: FORGE_FP8's recipes).
//
// 1. The row kernel's FP8 dlogits (ce_rows_bf16 with d8): its bf16 output and losses are the
//    same bits as without FP8 rows, and the FP8 bytes and descales are exactly what
//    cpu::cast_fp8_rows gives for those bf16 dlogits — although the kernel takes the row's amax
//    from its softmax statistics, before it has written a value (cross_entropy.cu). Rows cover
//    the target dominant and not, one other token taking nearly all the probability (the value
//    off the target then ties the target's), ignored rows, ties for the largest logit, targets
//    in the first and the last column, and rows longer than the kernel's 65,536-column register
//    segment.
// 2. The whole op with FP8, in row chunks: inputs are chosen exact in E4M3 after any per-row
//    power-of-two scale (x in {0, ±1, ±2}, w in {0, ±1/8, ±1/4}; padded rows of w in {±1, ±2}),
//    so the FP8 logits product is exact — every product is a multiple of 2^14 in the scaled
//    domain and every sum below 2^23 — and the logits equal the CPU's double ones, which are
//    exact bf16 (multiples of 1/8 below 2^5, padded ones integers ≤ 256). The row kernel run on
//    those logits then gives the reference losses (equal bit for bit), bf16 dlogits and FP8
//    dlogits; dx must be dx0 + decoded FP8 dlogits · w (w exact in FP8 too) and dw the bf16
//    dlogitsᵀ · x + dw0, within f32 accumulation and (dx) bf16 output rounding.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "cuda_testing.h"
#include "forge/backend/cuda/cross_entropy.h"
#include "forge/backend/cuda/ops.h"
#include "forge/core/error.h"
#include "forge/io/fp8.h"
#include "forge/ops/fp8.h"

namespace forge::cuda {
namespace {

using namespace forge::cuda::testing;
using forge::testing::random_ids;

float decode(DType t, uint8_t v) {
  return t == DType::kF8E4M3 ? e4m3_to_f32(v) : e5m2_to_f32(v);
}

class CrossEntropyFp8Test : public CudaTest {};

struct RowsCase {
  int rows, V, ld;
};

TEST_F(CrossEntropyFp8Test, DlogitRowsAreTheCastOfTheBf16Dlogits) {
  const RowsCase cases[] = {{96, 1000, 1024}, {40, 50257, 50304}, {6, 70000, 70016}};
  for (DType gt : {DType::kF8E4M3, DType::kF8E5M2})
    for (const RowsCase& c : cases) {
      SCOPED_TRACE(::testing::Message()
                   << dtype_name(gt) << " rows=" << c.rows << " V=" << c.V << " ld=" << c.ld);
      // Logits: N(0, σ²) with σ from 0.3 to 6 by row (flat to peaked softmaxes); padded columns
      // [V, ld) hold large values the kernel must mask.
      std::vector<float> logits = random_normal<float>(size_t(c.rows) * c.ld, 7 + c.V);
      std::vector<int32_t> targets = random_ids(c.rows, c.V, 8 + c.V);
      for (int r = 0; r < c.rows; ++r) {
        float* row = logits.data() + size_t(r) * c.ld;
        const float sigma = 0.3f + 5.7f * static_cast<float>(r % 8) / 7.0f;
        for (int j = 0; j < c.ld; ++j) row[j] = j < c.V ? row[j] * sigma : 1e4f;
        if (r % 3 == 0) row[targets[r]] = *std::max_element(row, row + c.V) + 0.5f * (r % 5);
        if (r % 7 == 5) row[(targets[r] + 3) % c.V] = *std::max_element(row, row + c.V) + 40.0f;
      }
      targets[0] = 0, targets[1] = c.V - 1, targets[2] = -1;  // first, last column; ignored
      if (c.rows > 4) {  // a tie for the largest logit, off the target
        float* row = logits.data() + size_t(4) * c.ld;
        const float top = *std::max_element(row, row + c.V) + 1.0f;
        row[(targets[4] + 1) % c.V] = top, row[(targets[4] + 2) % c.V] = top;
      }
      logits = round_bf16(logits);
      const float dloss = 1.0f / 4096.0f * 0.73f;

      auto ids = upload(targets);
      auto dl = upload(std::vector<float>{dloss});
      auto plain = to_device(DType::kBF16, logits), with8 = to_device(DType::kBF16, logits);
      auto loss_plain = poisoned<float>(c.rows), loss8 = poisoned<float>(c.rows);
      auto d8 = poisoned<uint8_t>(size_t(c.rows) * c.ld);
      auto ds = poisoned<float>(c.rows);
      ce_rows_bf16(ctx(), plain.data(), c.ld, loss_plain.data(), ids.data(), dl.data(), c.rows,
                   c.V);
      ce_rows_bf16(ctx(), with8.data(), c.ld, loss8.data(), ids.data(), dl.data(), c.rows, c.V,
                   d8.data(), ds.data(), gt);
      const std::vector<char> a = download(plain), b = download(with8);
      EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size())) << "bf16 dlogits changed";
      EXPECT_EQ(download(loss_plain), download(loss8)) << "losses changed";

      const std::vector<float> dlog = to_host(DType::kBF16, with8);
      std::vector<uint8_t> want(dlog.size());
      std::vector<float> want_d(c.rows);
      cpu::cast_fp8_rows(gt, want.data(), want_d.data(), dlog.data(), c.rows, c.ld);
      const std::vector<uint8_t> got = download(d8);
      size_t diff = 0;
      for (size_t i = 0; i < got.size(); ++i) diff += got[i] != want[i];
      EXPECT_EQ(diff, 0u) << "FP8 bytes";
      EXPECT_EQ(download(ds), want_d) << "descales";

      // The amax's two terms: off the target every |dlogit| is at most 1 − p(target) = Σ of
      // the others, the target's own, so the target's term is the amax but where rounding ties
      // them: rows where one other token takes nearly all the probability (r % 7 == 5, above)
      // make the largest value off the target equal the target's.
      int ties = 0;
      for (int r = 0; r < c.rows; ++r) {
        if (targets[r] < 0) continue;
        const float* row = dlog.data() + size_t(r) * c.ld;
        float off = 0.0f;
        for (int j = 0; j < c.ld; ++j)
          if (j != targets[r]) off = std::max(off, std::fabs(row[j]));
        ties += off == std::fabs(row[targets[r]]);
      }
      if (c.rows > 7) EXPECT_GT(ties, 0);
    }
}

struct HeadCase {
  int N, C, V, Vp, chunk_rows;
};

class CrossEntropyFp8HeadTest : public CrossEntropyFp8Test {
 protected:
  // Values exact in E4M3 after any power-of-two scale: {0, ±1, ±2} · unit.
  static std::vector<float> e4m3_exact(size_t n, uint64_t seed, float unit) {
    const std::vector<int32_t> k = random_ids(static_cast<int>(n), 5, seed);
    std::vector<float> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = static_cast<float>(k[i] - 2) * unit;
    return v;
  }

  void check(const HeadCase& s, DType gt) {
    SCOPED_TRACE(::testing::Message() << dtype_name(gt) << " N=" << s.N << " C=" << s.C << " V="
                                      << s.V << " Vp=" << s.Vp << " chunk_rows=" << s.chunk_rows);
    const int ld = (s.Vp + 63) / 64 * 64;
    const std::vector<float> x = e4m3_exact(size_t(s.N) * s.C, 21, 1.0f);
    std::vector<float> w = e4m3_exact(size_t(s.V) * s.C, 22, 0.125f);
    const std::vector<float> padded = e4m3_exact(size_t(s.Vp - s.V) * s.C, 23, 1.0f);
    w.insert(w.end(), padded.begin(), padded.end());
    const std::vector<float> dx0 = round_bf16(random_normal<float>(size_t(s.N) * s.C, 24, 0.1));
    const std::vector<float> dw0 = random_normal<float>(size_t(s.Vp) * s.C, 25, 1e-4);
    std::vector<int32_t> targets = random_ids(s.N, s.V, 26);
    targets[0] = 0, targets[1] = s.V - 1, targets[3] = -1, targets[s.N - 2] = -1;
    const float dloss = 0.37f;

    // The reference: exact logits (bf16 values), the row kernel over them.
    std::vector<float> logits(size_t(s.N) * ld, 0.0f);
    for (int n = 0; n < s.N; ++n)
      for (int j = 0; j < s.Vp; ++j) {
        double acc = 0;
        for (int c = 0; c < s.C; ++c)
          acc += double(x[size_t(n) * s.C + c]) * w[size_t(j) * s.C + c];
        logits[size_t(n) * ld + j] = static_cast<float>(acc);
      }
    ASSERT_EQ(round_bf16(logits), logits) << "the inputs' logits are not exact in bf16";
    auto ids = upload(targets);
    auto dl = upload(std::vector<float>{dloss});
    auto ref_rows = to_device(DType::kBF16, logits);
    auto ref_loss = poisoned<float>(s.N);
    auto ref8 = poisoned<uint8_t>(size_t(s.N) * ld);
    auto ref_ds = poisoned<float>(s.N);
    ce_rows_bf16(ctx(), ref_rows.data(), ld, ref_loss.data(), ids.data(), dl.data(), s.N, s.V,
                 ref8.data(), ref_ds.data(), gt);
    const std::vector<float> dlog = to_host(DType::kBF16, ref_rows);
    const std::vector<uint8_t> d8 = download(ref8);
    const std::vector<float> ds = download(ref_ds);
    std::vector<double> dx(dx0.begin(), dx0.end()), dx_bound(dx.size());
    std::vector<double> dw(dw0.begin(), dw0.end()), dw_bound(dw.size());
    for (size_t i = 0; i < dx.size(); ++i) dx_bound[i] = std::fabs(dx[i]);
    for (size_t i = 0; i < dw.size(); ++i) dw_bound[i] = std::fabs(dw[i]);
    for (int n = 0; n < s.N; ++n)
      for (int j = 0; j < s.Vp; ++j) {
        const double q = double(decode(gt, d8[size_t(n) * ld + j])) * ds[n];
        const double g = dlog[size_t(n) * ld + j];
        for (int c = 0; c < s.C; ++c) {
          const double wv = w[size_t(j) * s.C + c], xv = x[size_t(n) * s.C + c];
          dx[size_t(n) * s.C + c] += q * wv, dx_bound[size_t(n) * s.C + c] += std::fabs(q * wv);
          dw[size_t(j) * s.C + c] += g * xv, dw_bound[size_t(j) * s.C + c] += std::fabs(g * xv);
        }
      }

    // The op, x cast inside and x's rows given (as the final norm gives them): the same bits.
    auto run = [&](bool given_x8, std::vector<float>& losses, std::vector<float>& dx_out,
                   std::vector<float>& dw_out) {
      auto dx_d = to_device(DType::kBF16, dx0), x_d = to_device(DType::kBF16, x),
           w_d = to_device(DType::kBF16, w);
      auto dw_d = upload(dw0);
      auto loss_d = poisoned<float>(s.N);
      DeviceBuffer<uint8_t> x8(ctx().allocator(), size_t(s.N) * s.C);
      DeviceBuffer<float> xs(ctx().allocator(), s.N);
      LmHeadFp8 f8;
      f8.grad_type = gt;
      if (given_x8) {
        cast_fp8_rows(ctx(), DType::kF8E4M3, x8.data(), xs.data(), DType::kBF16, x_d.data(), s.N,
                      s.C);
        f8.x8 = x8.data(), f8.x_descale = xs.data();
      }
      lm_head_cross_entropy_bf16(ctx(), loss_d.data(), dx_d.data(), dw_d.data(), x_d.data(),
                                 w_d.data(), ids.data(), dl.data(), s.N, s.C, s.V, s.Vp,
                                 s.chunk_rows, &f8);
      losses = download(loss_d), dx_out = to_host(DType::kBF16, dx_d), dw_out = download(dw_d);
    };
    std::vector<float> losses, got_dx, got_dw, losses2, got_dx2, got_dw2;
    run(false, losses, got_dx, got_dw);
    run(true, losses2, got_dx2, got_dw2);
    EXPECT_EQ(losses, losses2);
    EXPECT_EQ(got_dx, got_dx2);
    EXPECT_EQ(got_dw, got_dw2);

    EXPECT_EQ(losses, download(ref_loss)) << "losses (the FP8 logits are exact here)";
    // dx: f32 accumulation and one bf16 rounding of the output: 2^-8 of Σ|terms|, doubled.
    // dw: f32 accumulation of the bf16 dlogits' products: 1e-4 of Σ|terms| (the f32 test's).
    size_t bad_dx = 0, bad_dw = 0;
    for (size_t i = 0; i < dx.size(); ++i)
      bad_dx += !(std::fabs(got_dx[i] - dx[i]) <= 1e-12 + 2.0 / 256 * dx_bound[i]);
    for (size_t i = 0; i < dw.size(); ++i)
      bad_dw += !(std::fabs(got_dw[i] - dw[i]) <= 1e-12 + 1e-4 * dw_bound[i]);
    EXPECT_EQ(bad_dx, 0u) << "dx elements outside the bound";
    EXPECT_EQ(bad_dw, 0u) << "dw elements outside the bound";
    // The padded rows of dw receive exact zeros; ignored rows' dx is left alone.
    EXPECT_EQ(0, std::memcmp(got_dw.data() + size_t(s.V) * s.C, dw0.data() + size_t(s.V) * s.C,
                             sizeof(float) * size_t(s.Vp - s.V) * s.C));
    for (int n : {3, s.N - 2})
      EXPECT_EQ(0, std::memcmp(got_dx.data() + size_t(n) * s.C, dx0.data() + size_t(n) * s.C,
                               sizeof(float) * s.C))
          << "dx of ignored row " << n;
  }
};

TEST_F(CrossEntropyFp8HeadTest, ProductsMatchTheDecodedOperands) {
  for (DType gt : {DType::kF8E4M3, DType::kF8E5M2}) {
    check({80, 64, 1000, 1008, 32}, gt);    // chunks of 32, 32, 16 rows
    check({48, 64, 50257, 50304, 16}, gt);  // GPT-2's vocabulary: K = 50,304 in the dx product
  }
}

}  // namespace
}  // namespace forge::cuda
