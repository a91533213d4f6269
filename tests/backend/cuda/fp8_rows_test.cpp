// Per-row scaled FP8 (ops/fp8_rows.h): cuda::cast_fp8_rows / cast_transpose_fp8_rows against their
// CPU twins bit for bit (bytes and descales), cast_fp8_rows_bias (those bytes and the column
// sums), and cuBLASLt's FP8 products with row scales (gemm.h's row_scales: OUTER_VEC_32F) against
// a double-precision product of the bytes the GPU was given, decoded on the CPU and multiplied by the descales — with each epilogue the FP8
// training products use (none, bias, GELU aux + bias, DGELU) and beta 1.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

#include "cuda_testing.h"
#include "forge/backend/cuda/gemm.h"
#include "forge/backend/cuda/ops.h"
#include "forge/core/error.h"
#include "forge/io/fp8.h"
#include "forge/ops/fp8.h"

namespace forge::cuda {
namespace {

using namespace forge::cuda::testing;

class Fp8RowsTest : public CudaTest {
 protected:
  bool has_row_scales() const { return ctx_->props().major >= 9; }  // OUTER_VEC FP8: Hopper
};

float decode(DType t, uint8_t v) {
  return t == DType::kF8E4M3 ? e4m3_to_f32(v) : e5m2_to_f32(v);
}

// Random normals, row r times 10^(r % span − span / 2) (each row its own scale), one zero row,
// a NaN and an inf in two others (where the input type can hold the magnitudes).
std::vector<float> row_inputs(int rows, int cols, uint64_t seed, int span) {
  std::vector<float> x = random_normal<float>(static_cast<size_t>(rows) * cols, seed);
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c)
      x[static_cast<size_t>(r) * cols + c] *=
          std::pow(10.0f, static_cast<float>(r % span - span / 2));
  if (rows > 3) {
    for (int c = 0; c < cols; ++c) x[static_cast<size_t>(1) * cols + c] = 0.0f;
    x[static_cast<size_t>(2) * cols + cols / 2] = std::numeric_limits<float>::quiet_NaN();
    x[static_cast<size_t>(3) * cols] = std::numeric_limits<float>::infinity();
  }
  return x;
}

TEST_F(Fp8RowsTest, CastRowsMatchesTheCpuBitForBit) {
  const std::pair<int, int> shapes[] = {
      {40, 64}, {26, 40}, {13, 7}, {70, 3072}, {9, 1000}};  // vector and scalar paths
  for (DType xt : {DType::kF32, DType::kBF16, DType::kF16})
    for (DType yt : {DType::kF8E4M3, DType::kF8E5M2})
      for (const auto& [rows, cols] : shapes) {
        SCOPED_TRACE(::testing::Message()
                     << dtype_name(xt) << " -> " << dtype_name(yt) << " " << rows << "x" << cols);
        const std::vector<float> x =
            round_to(xt, row_inputs(rows, cols, 3 + rows, xt == DType::kF16 ? 7 : 13));
        std::vector<uint8_t> want(x.size());
        std::vector<float> want_d(rows);
        cpu::cast_fp8_rows(yt, want.data(), want_d.data(), x.data(), rows, cols);
        auto dx = to_device(xt, x);
        auto dy = poisoned<uint8_t>(x.size());
        auto dd = poisoned<float>(rows);
        cast_fp8_rows(ctx(), yt, dy.data(), dd.data(), xt, dx.data(), rows, cols);
        const std::vector<uint8_t> got = download(dy);
        size_t diff = 0;  // a NaN's code is not specified (io/fp8.h): any NaN for a NaN
        for (size_t i = 0; i < got.size(); ++i)
          diff += got[i] != want[i] && !(std::isnan(decode(yt, got[i])) && std::isnan(decode(yt, want[i])));
        EXPECT_EQ(diff, 0u);
        EXPECT_EQ(download(dd), want_d);
      }
}

// cast_fp8_rows_bias: the bytes and descales of cast_fp8_rows bit for bit, and dbias += the
// column sums (pre-filled, so += is checked) against a double-precision sum, the f32 sums' bound
// beside it; the same bits on a second call. Shapes: one pass for each register tier (cols ≤ 1,024,
// 2,048, 3,072), a partial last block of rows (1,000 = 15 · 64 + 40) and a partial last chunk
// (cols 776, 2,312: lanes past the row); the two-op fallback past 3,072 columns, for cols not a
// multiple of 8 and for f32.
TEST_F(Fp8RowsTest, CastRowsWithBiasSumsMatchesTheCpu) {
  struct Shape {
    int rows, cols;
    DType xt;
  };
  const Shape shapes[] = {{1000, 768, DType::kBF16},  {130, 2304, DType::kBF16},
                          {300, 3072, DType::kBF16},  {77, 776, DType::kBF16},
                          {200, 2312, DType::kBF16},  {64, 1536, DType::kBF16},
                          {90, 4096, DType::kBF16},   {50, 36, DType::kBF16},
                          {70, 520, DType::kF32}};
  for (DType yt : {DType::kF8E4M3, DType::kF8E5M2})
    for (const Shape& sh : shapes) {
      const int rows = sh.rows, cols = sh.cols;
      SCOPED_TRACE(::testing::Message() << dtype_name(sh.xt) << " -> " << dtype_name(yt) << " "
                                        << rows << "x" << cols);
      // Rows of different magnitudes (no NaN: the sums are checked), a zero row.
      std::vector<float> x = random_normal<float>(static_cast<size_t>(rows) * cols, 7 + cols);
      for (int r = 0; r < rows; ++r)
        for (int c = 0; c < cols; ++c)
          x[static_cast<size_t>(r) * cols + c] *= std::pow(4.0f, float(r % 7) - 3.0f);
      for (int c = 0; c < cols; ++c) x[static_cast<size_t>(1) * cols + c] = 0.0f;
      x = round_to(sh.xt, x);
      const std::vector<float> b0 = random_normal<float>(cols, 8 + cols);
      std::vector<uint8_t> want(x.size());
      std::vector<float> want_d(rows);
      cpu::cast_fp8_rows(yt, want.data(), want_d.data(), x.data(), rows, cols);
      auto dx = to_device(sh.xt, x);
      std::vector<uint8_t> first;
      std::vector<float> first_b;
      for (int call = 0; call < 2; ++call) {
        auto dy = poisoned<uint8_t>(x.size());
        auto dd = poisoned<float>(rows);
        auto db = upload(b0);
        cast_fp8_rows_bias(ctx(), yt, dy.data(), dd.data(), db.data(), sh.xt, dx.data(), rows,
                           cols);
        const std::vector<uint8_t> got = download(dy);
        const std::vector<float> got_b = download(db);
        if (call == 1) {
          EXPECT_EQ(got, first);
          EXPECT_EQ(got_b, first_b) << "the sums' order changed between calls";
          continue;
        }
        size_t diff = 0;
        for (size_t i = 0; i < got.size(); ++i) diff += got[i] != want[i];
        EXPECT_EQ(diff, 0u);
        EXPECT_EQ(download(dd), want_d);
        int bad = 0;
        for (int c = 0; c < cols; ++c) {
          double s = b0[c], a = std::fabs(b0[c]);
          for (int r = 0; r < rows; ++r) {
            s += x[static_cast<size_t>(r) * cols + c];
            a += std::fabs(x[static_cast<size_t>(r) * cols + c]);
          }
          // f32 sums of ≤ 1,001 terms in any order: within rows · 2^-24 of Σ|terms| (×4 margin).
          if (std::fabs(got_b[c] - s) > 4.0 * (rows + 1) * 0x1p-24 * a && ++bad <= 3)
            ADD_FAILURE() << "dbias[" << c << "] " << got_b[c] << " vs " << s;
        }
        first = got, first_b = got_b;
      }
    }
}

TEST_F(Fp8RowsTest, CastTransposeRowsMatchesTheCpuBitForBit) {
  const std::pair<int, int> shapes[] = {
      {48, 100}, {768, 64}, {16, 3}, {272, 130}};  // rows % 16 == 0
  for (DType xt : {DType::kF32, DType::kBF16})
    for (DType yt : {DType::kF8E4M3, DType::kF8E5M2})
      for (const auto& [rows, cols] : shapes) {
        SCOPED_TRACE(::testing::Message()
                     << dtype_name(xt) << " -> " << dtype_name(yt) << " " << rows << "x" << cols);
        std::vector<float> x =
            round_to(xt, random_normal<float>(static_cast<size_t>(rows) * cols, 9 + rows));
        for (int r = 0; r < rows; ++r)  // columns of different magnitudes: a scale each
          for (int c = 0; c < cols; ++c)
            x[static_cast<size_t>(r) * cols + c] *= std::pow(4.0f, float(c % 9) - 4.0f);
        x = round_to(xt, x);
        std::vector<uint8_t> want(x.size());
        std::vector<float> want_d(cols);
        cpu::cast_transpose_fp8_rows(yt, want.data(), want_d.data(), x.data(), rows, cols);
        auto dx = to_device(xt, x);
        auto dy = poisoned<uint8_t>(x.size());
        auto dd = poisoned<float>(cols);
        cast_transpose_fp8_rows(ctx(), yt, dy.data(), dd.data(), xt, dx.data(), rows, cols);
        const std::vector<uint8_t> got = download(dy);
        size_t diff = 0;
        for (size_t i = 0; i < got.size(); ++i) diff += got[i] != want[i];
        EXPECT_EQ(diff, 0u);
        EXPECT_EQ(download(dd), want_d);
      }
}

// The norm forwards' E4M3 copy of their output (ops.h: out8, descale8) is cast_fp8_rows of the
// bf16 output they wrote, bit for bit; a row wider than the registers hold is not (false).
TEST_F(Fp8RowsTest, NormForwardsWriteTheirOutputsRows) {
  const int N = 48;
  for (int C : {256, 576, 768, 1024, 2048})  // RMSNorm rows of ≤ 128 share warps: not fused
    for (int kind = 0; kind < 4;
         ++kind) {  // layernorm, residual layernorm, rmsnorm, residual rmsnorm
      SCOPED_TRACE(::testing::Message() << "C=" << C << " kind " << kind);
      const size_t n = static_cast<size_t>(N) * C;
      std::vector<float> a = random_normal<float>(n, 40 + C), b = random_normal<float>(n, 41 + C);
      for (int r = 0; r < N; ++r)  // rows of different magnitudes
        for (int c = 0; c < C; ++c)
          a[static_cast<size_t>(r) * C + c] *= 1.0f + static_cast<float>(r % 5);
      auto da = to_device(DType::kBF16, a), db = to_device(DType::kBF16, b);
      auto dw = to_device(DType::kBF16, random_normal<float>(C, 42, 2.0));
      auto dbias = to_device(DType::kBF16, random_normal<float>(C, 43));
      auto out = poisoned<uint16_t>(n), res = poisoned<uint16_t>(n);
      auto mean = poisoned<float>(N), rstd = poisoned<float>(N);
      auto q = poisoned<uint8_t>(n);
      auto d = poisoned<float>(N);
      bool wrote = false;
      switch (kind) {
        case 0:
          wrote =
              layernorm_fwd(ctx(), DType::kBF16, out.data(), mean.data(), rstd.data(), da.data(),
                            dw.data(), dbias.data(), N, C, 1e-5f, q.data(), d.data());
          break;
        case 1:
          wrote = residual_layernorm_fwd(ctx(), DType::kBF16, res.data(), out.data(), mean.data(),
                                         rstd.data(), da.data(), db.data(), dw.data(), dbias.data(),
                                         N, C, 1e-5f, q.data(), d.data());
          break;
        case 2:
          wrote = rmsnorm_fwd(ctx(), DType::kBF16, out.data(), rstd.data(), da.data(), dw.data(), N,
                              C, 1e-5f, q.data(), d.data());
          break;
        default:
          wrote = residual_rmsnorm_fwd(ctx(), DType::kBF16, res.data(), out.data(), rstd.data(),
                                       da.data(), db.data(), dw.data(), N, C, 1e-5f, q.data(),
                                       d.data());
      }
      ASSERT_EQ(wrote, C <= 1024);
      if (!wrote) continue;
      const std::vector<float> y = from_bf16(download(out));
      std::vector<uint8_t> want(n);
      std::vector<float> want_d(N);
      cpu::cast_fp8_rows(DType::kF8E4M3, want.data(), want_d.data(), y.data(), N, C);
      const std::vector<uint8_t> got = download(q);
      size_t diff = 0;
      for (size_t i = 0; i < n; ++i) diff += got[i] != want[i];
      EXPECT_EQ(diff, 0u);
      EXPECT_EQ(download(d), want_d);
    }
}

double gelu(double x) {
  return 0.5 * x * (1 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
}
double gelu_grad(double x) {
  const double u = 0.7978845608028654 * (x + 0.044715 * x * x * x), t = std::tanh(u);
  return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * 0.7978845608028654 * (1 + 3 * 0.044715 * x * x);
}

// C (M, N) = da[i]·db[j]·Σ_k A[i][k]·B[j][k] with each epilogue of the FP8 training products.
TEST_F(Fp8RowsTest, RowScaledProductsMatchTheDecodedOperands) {
  if (!has_row_scales()) GTEST_SKIP() << "FP8 products with row scales need compute capability 9.0";
  const int M = 128, N = 96, K = 256;
  enum class Ep { kNone, kBias, kGeluAux, kDGelu, kAccumulate };
  struct Case {
    std::string name;
    DType a;
    Ep ep;
  };
  const Case cases[] = {{"forward", DType::kF8E4M3, Ep::kNone},
                        {"forward + bias", DType::kF8E4M3, Ep::kBias},
                        {"forward + gelu aux", DType::kF8E4M3, Ep::kGeluAux},
                        {"dX e4m3", DType::kF8E4M3, Ep::kAccumulate},
                        {"dX e5m2", DType::kF8E5M2, Ep::kNone},
                        {"dX + dgelu", DType::kF8E4M3, Ep::kDGelu},
                        {"dX e5m2 + dgelu", DType::kF8E5M2, Ep::kDGelu}};
  uint64_t seed = 300;
  for (const Case& cs : cases) {
    SCOPED_TRACE(cs.name);
    // Operands through the CPU twin: rows of different magnitudes, so the descales differ.
    std::vector<float> xa = random_normal<float>(size_t(M) * K, seed++),
                       xb = random_normal<float>(size_t(N) * K, seed++);
    for (int i = 0; i < M; ++i)
      for (int k = 0; k < K; ++k) xa[size_t(i) * K + k] *= std::pow(3.0f, float(i % 5) - 2.0f);
    for (int j = 0; j < N; ++j)
      for (int k = 0; k < K; ++k)
        xb[size_t(j) * K + k] *= 0.05f * std::pow(2.0f, float(j % 5) - 2.0f);
    std::vector<uint8_t> qa(xa.size()), qb(xb.size());
    std::vector<float> sa(M), sb(N);
    cpu::cast_fp8_rows(cs.a, qa.data(), sa.data(), xa.data(), M, K);
    cpu::cast_fp8_rows(DType::kF8E4M3, qb.data(), sb.data(), xb.data(), N, K);
    const auto bias = round_bf16(random_normal<float>(N, seed++));
    const auto c0 = round_bf16(random_normal<float>(size_t(M) * N, seed++));
    const auto aux_in = round_bf16(random_normal<float>(size_t(M) * N, seed++));
    std::vector<double> ref(size_t(M) * N), ref_aux(size_t(M) * N);
    for (int i = 0; i < M; ++i)
      for (int j = 0; j < N; ++j) {
        double s = 0;
        for (int k = 0; k < K; ++k)
          s += double{decode(cs.a, qa[size_t(i) * K + k])} *
               decode(DType::kF8E4M3, qb[size_t(j) * K + k]);
        s *= double{sa[i]} * sb[j];
        const size_t o = size_t(i) * N + j;
        if (cs.ep == Ep::kBias || cs.ep == Ep::kGeluAux) s += bias[j];
        if (cs.ep == Ep::kAccumulate) s += c0[o];
        ref_aux[o] = s;
        if (cs.ep == Ep::kGeluAux) s = gelu(s);
        if (cs.ep == Ep::kDGelu) s *= gelu_grad(aux_in[o]);
        ref[o] = s;
      }
    auto da = upload(qa), db = upload(qb);
    auto dsa = upload(sa), dsb = upload(sb);
    auto dbias = upload(to_bf16(bias));
    auto dc = cs.ep == Ep::kAccumulate ? upload(to_bf16(c0)) : poisoned<uint16_t>(size_t(M) * N);
    auto daux = cs.ep == Ep::kDGelu ? upload(to_bf16(aux_in)) : poisoned<uint16_t>(size_t(M) * N);
    GemmArgs g;
    g.M = M, g.N = N, g.K = K, g.trans_b = true;
    g.ab_type = cs.a, g.b_type = DType::kF8E4M3, g.c_type = DType::kBF16;
    g.a_scale = dsa.data(), g.b_scale = dsb.data(), g.row_scales = true, g.fast_accum = true;
    if (cs.ep == Ep::kBias) g.epilogue = GemmEpilogue::kBias, g.bias = dbias.data();
    if (cs.ep == Ep::kGeluAux)
      g.epilogue = GemmEpilogue::kBiasGeluAux, g.bias = dbias.data(), g.aux = daux.data();
    if (cs.ep == Ep::kDGelu) g.epilogue = GemmEpilogue::kDGelu, g.aux = daux.data();
    if (cs.ep == Ep::kAccumulate) g.beta = 1.0f;
    try {
      gemm(ctx(), g, da.data(), db.data(), dc.data());
    } catch (const Error& e) {
      ADD_FAILURE() << e.what();
      continue;
    }
    // bf16 output (2^-8) and Hopper's FP8 accumulation (fast accumulation: ~1e-2 of the partial
    // sums, fp8_test.cpp): an operand or scale read wrongly is off by O(1).
    EXPECT_TRUE(
        all_close(from_bf16(download(dc)), std::vector<float>(ref.begin(), ref.end()), kTolBf16));
    if (cs.ep == Ep::kGeluAux) {
      EXPECT_TRUE(all_close(from_bf16(download(daux)),
                            std::vector<float>(ref_aux.begin(), ref_aux.end()), kTolBf16));
    }
  }
}

}  // namespace
}  // namespace forge::cuda
