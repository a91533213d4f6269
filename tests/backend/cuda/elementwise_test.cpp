// CUDA elementwise ops against their CPU twins (backend/cpu/activation.cpp), for f32, bf16, f16.
// Sizes: 1; 37·201 = 7437 (not a multiple of 8: the element-by-element tail after the 8-wide
// body); 4096·768 (the vector body, many grid-stride steps). Offset-by-one views force the
// scalar (misaligned) instantiation. Outputs are poisoned first, backward gradients pre-filled
// with random values: GELU's backward must add to them (+=), SwiGLU's must overwrite them.
#include <cmath>
#include <iterator>
#include <limits>

#include "forge/backend/cuda/ops.h"
#include "forge/ops/activation.h"
#include "op_testing.h"

namespace forge::cuda {
namespace {

using namespace forge::cuda::testing;

class ElementwiseTest : public DtypeTest<CudaTest> {};

const int64_t kSizes[] = {1, 37 * 201, 4096 * 768};

TEST_P(ElementwiseTest, ResidualFwdMatchesCpuIncludingInPlace) {
  uint64_t seed = 100;
  for (int64_t n : kSizes)
    for (bool in_place : {false, true}) {
      const auto a = as_dt(dt(), random_normal<float>(n, seed++));
      const auto b = as_dt(dt(), random_normal<float>(n, seed++));
      std::vector<float> ref(n);
      cpu::residual_fwd<float>(ref.data(), a.data(), b.data(), n);
      auto da = up(a), db = up(b);
      DevTensor dout = in_place ? DevTensor{} : poison(n);
      residual_fwd(ctx(), dt(), in_place ? da.data() : dout.data(), da.data(), db.data(), n);
      EXPECT_TRUE(all_close(down(in_place ? da : dout), ref, tol_for(dt())))
          << "n=" << n << " in_place=" << in_place;
    }
}

TEST_P(ElementwiseTest, AddInplaceMatchesCpu) {
  uint64_t seed = 200;
  for (int64_t n : kSizes) {
    const auto dst = as_dt(dt(), random_normal<float>(n, seed++));
    const auto src = as_dt(dt(), random_normal<float>(n, seed++));
    std::vector<float> ref(n);
    for (int64_t i = 0; i < n; ++i) ref[i] = dst[i] + src[i];
    auto ddst = up(dst), dsrc = up(src);
    add_inplace(ctx(), dt(), ddst.data(), dsrc.data(), n);
    EXPECT_TRUE(all_close(down(ddst), ref, tol_for(dt()))) << "n=" << n;
  }
}

TEST_P(ElementwiseTest, GeluFwdBwdMatchCpu) {
  uint64_t seed = 300;
  for (int64_t n : kSizes) {
    const auto x = as_dt(dt(), random_normal<float>(n, seed++, 3.0));  // reaches saturation
    const auto dout = as_dt(dt(), random_normal<float>(n, seed++));
    const auto dinp0 = as_dt(dt(), random_normal<float>(n, seed++));
    std::vector<float> ref_out(n), ref_dinp = dinp0;
    cpu::gelu_fwd<float>(ref_out.data(), x.data(), n);
    cpu::gelu_bwd<float>(ref_dinp.data(), x.data(), dout.data(), n);
    auto dx = up(x), ddout = up(dout), ddinp = up(dinp0), dy = poison(n);
    gelu_fwd(ctx(), dt(), dy.data(), dx.data(), n);
    gelu_bwd(ctx(), dt(), ddinp.data(), dx.data(), ddout.data(), n);
    EXPECT_TRUE(all_close(down(dy), ref_out, tol_for(dt()))) << "fwd n=" << n;
    EXPECT_TRUE(all_close(down(ddinp), ref_dinp, tol_for(dt()))) << "bwd n=" << n;
  }
}

TEST_P(ElementwiseTest, SwigluFwdBwdMatchCpu) {
  uint64_t seed = 400;
  for (int64_t n : kSizes) {
    const auto gate = as_dt(dt(), random_normal<float>(n, seed++, 3.0));
    const auto upv = as_dt(dt(), random_normal<float>(n, seed++));
    const auto dout = as_dt(dt(), random_normal<float>(n, seed++));
    // Random (not zero) initial gradients: the op writes them, as the CPU twin does.
    const auto dgate0 = as_dt(dt(), random_normal<float>(n, seed++));
    const auto dup0 = as_dt(dt(), random_normal<float>(n, seed++));
    std::vector<float> ref_out(n), ref_dgate = dgate0, ref_dup = dup0;
    cpu::swiglu_fwd<float>(ref_out.data(), gate.data(), upv.data(), n);
    cpu::swiglu_bwd<float>(ref_dgate.data(), ref_dup.data(), dout.data(), gate.data(), upv.data(),
                           n);
    auto dg = up(gate), du = up(upv), ddout = up(dout), ddg = up(dgate0), ddu = up(dup0);
    auto dy = poison(n);
    swiglu_fwd(ctx(), dt(), dy.data(), dg.data(), du.data(), n);
    swiglu_bwd(ctx(), dt(), ddg.data(), ddu.data(), ddout.data(), dg.data(), du.data(), n);
    EXPECT_TRUE(all_close(down(dy), ref_out, tol_for(dt()))) << "fwd n=" << n;
    EXPECT_TRUE(all_close(down(ddg), ref_dgate, tol_for(dt()))) << "dgate n=" << n;
    EXPECT_TRUE(all_close(down(ddu), ref_dup, tol_for(dt()))) << "dup n=" << n;
  }
}

// The row-strided SwiGLU of a fused gate|up product: gate|up (rows, ld) with gate at column 0
// and up at column ff, out and dout dense (rows, ff). Shapes: ff 1536, ld 2·ff (the model's, the
// 8-wide rows kernel); ff 37, ld 2·37 + 3 (odd: the element-by-element one). The gradient buffer
// is poisoned, so the columns of each row past 2·ff (the ld − 2·ff gap) must stay NaN: a wrong
// stride would write there. Tolerance: the dense ops' (tol_for), the same arithmetic.
TEST_P(ElementwiseTest, SwigluRowsMatchCpu) {
  uint64_t seed = 450;
  const int shapes[][3] = {{333, 1536, 3072}, {301, 37, 77}};  // rows, ff, ld
  for (const auto& sh : shapes) {
    const int rows = sh[0], ff = sh[1];
    const int64_t ld = sh[2], n_gu = rows * ld, n = static_cast<int64_t>(rows) * ff;
    const auto gu = as_dt(dt(), random_normal<float>(n_gu, seed++, 3.0));
    const auto dout = as_dt(dt(), random_normal<float>(n, seed++));
    std::vector<float> ref_out(n), ref_d(n_gu, std::numeric_limits<float>::quiet_NaN());
    cpu::swiglu_fwd_rows<float>(ref_out.data(), gu.data(), gu.data() + ff, rows, ff, ld);
    cpu::swiglu_bwd_rows<float>(ref_d.data(), ref_d.data() + ff, dout.data(), gu.data(), gu.data() + ff, rows, ff,
                                ld);
    auto dgu = up(gu), ddout = up(dout), dy = poison(n), dd = poison(n_gu);
    swiglu_fwd_rows(ctx(), dt(), dy.data(), dgu.data(), dgu.at(ff), rows, ff, ld);
    swiglu_bwd_rows(ctx(), dt(), dd.data(), dd.at(ff), ddout.data(), dgu.data(), dgu.at(ff), rows, ff, ld);
    EXPECT_TRUE(all_close(down(dy), ref_out, tol_for(dt()))) << "fwd ff=" << ff;
    const auto got = down(dd);
    std::vector<float> got_rows, ref_rows;
    size_t gap_written = 0;
    for (int r = 0; r < rows; ++r)
      for (int64_t c = 0; c < ld; ++c) {
        const size_t i = static_cast<size_t>(r * ld + c);
        if (c < 2 * ff) got_rows.push_back(got[i]), ref_rows.push_back(ref_d[i]);
        else gap_written += !std::isnan(got[i]);
      }
    EXPECT_TRUE(all_close(got_rows, ref_rows, tol_for(dt()))) << "dgate|dup ff=" << ff;
    EXPECT_EQ(gap_written, 0u) << "wrote between rows, ff=" << ff;
  }
}

// Views one element past a 256-byte-aligned allocation: not 16-byte aligned, so the kN = 1
// instantiation runs. Poisoned element 0 must stay untouched.
TEST_P(ElementwiseTest, MisalignedViewsMatchCpu) {
  const int64_t n = 1001;
  const auto x = as_dt(dt(), random_normal<float>(n + 1, 500, 2.0));
  const auto upv = as_dt(dt(), random_normal<float>(n + 1, 501));
  std::vector<float> ref(n + 1);
  cpu::swiglu_fwd<float>(ref.data() + 1, x.data() + 1, upv.data() + 1, n);
  auto dx = up(x), du = up(upv), dy = poison(n + 1);
  swiglu_fwd(ctx(), dt(), dy.at(1), dx.at(1), du.at(1), n);
  const auto got = down(dy);
  EXPECT_TRUE(std::isnan(got[0])) << "wrote before the view";
  EXPECT_TRUE(all_close(std::vector<float>(got.begin() + 1, got.end()),
                        std::vector<float>(ref.begin() + 1, ref.end()), tol_for(dt())));
}

INSTANTIATE_TEST_SUITE_P(Dtypes, ElementwiseTest,
                         ::testing::Values(DType::kF32, DType::kBF16, DType::kF16),
                         [](const auto& info) { return std::string(dt_name(info.param)); });

class ConvertTest : public CudaTest {};

// f32 → bf16 is round to nearest even, bit for bit the CPU's f32_to_bf16 (NaN only has to stay
// NaN: the payload of the hardware's canonical NaN differs); bf16 → f32 is exact; same-type
// conversion is a copy.
TEST_F(ConvertTest, F32Bf16RoundTripIsBitExact) {
  for (int64_t n : {int64_t{37 * 201}, int64_t{4096 * 768 + 3}}) {
    auto v = random_normal<float>(n, 600 + n);
    const float specials[] = {0.0f,
                              -0.0f,
                              std::numeric_limits<float>::infinity(),
                              -std::numeric_limits<float>::infinity(),
                              std::numeric_limits<float>::quiet_NaN(),
                              1e-40f,
                              -3e-39f,
                              3.4e38f,
                              1.00390625f /* tie → even (down) */,
                              1.01171875f /* tie → even (up) */,
                              65504.0f};
    for (size_t i = 0; i < std::size(specials); ++i) v[i] = specials[i];
    auto dv = upload(v);
    auto db = poisoned<uint16_t>(n);
    convert(ctx(), DType::kBF16, db.data(), DType::kF32, dv.data(), n);
    const auto got = download(db);
    int64_t bad = 0;
    for (int64_t i = 0; i < n; ++i) {
      const bool ok =
          std::isnan(v[i]) ? std::isnan(bf16_to_f32(got[i])) : got[i] == f32_to_bf16(v[i]);
      if (!ok && bad++ < 5)
        ADD_FAILURE() << "[" << i << "] " << v[i] << " → 0x" << std::hex << got[i] << " want 0x"
                      << f32_to_bf16(v[i]) << std::dec;
    }
    EXPECT_EQ(bad, 0) << "n=" << n;

    auto back = poisoned<float>(n);
    convert(ctx(), DType::kF32, back.data(), DType::kBF16, db.data(), n);
    const auto widened = download(back);
    for (int64_t i = 0; i < n; ++i) {
      if (!std::isnan(v[i])) {
        ASSERT_EQ(widened[i], bf16_to_f32(got[i])) << "i=" << i;
      }
    }

    auto copy32 = poisoned<float>(n);
    convert(ctx(), DType::kF32, copy32.data(), DType::kF32, dv.data(), n);
    EXPECT_TRUE(bit_identical(download(copy32), v));
    auto copy16 = poisoned<uint16_t>(n);
    convert(ctx(), DType::kBF16, copy16.data(), DType::kBF16, db.data(), n);
    EXPECT_TRUE(bit_identical(download(copy16), got));
  }
}

// f32 → f16 is IEEE round to nearest even, bit for bit the CPU's f32_to_f16, including values
// past 65504 (→ inf: what f16 loss scaling detects) and f16 subnormals; f16 → f32 is exact.
TEST_F(ConvertTest, F16RoundTripMatchesCpu) {
  const int64_t n = 4099;
  auto v = random_normal<float>(n, 702);
  for (int64_t i = 0; i < n; i += 7) v[i] *= 3e4f;     // some beyond the f16 range
  for (int64_t i = 3; i < n; i += 11) v[i] *= 1e-6f;   // f16 subnormals
  auto dv = upload(v);
  auto dh = poisoned<uint16_t>(n);
  convert(ctx(), DType::kF16, dh.data(), DType::kF32, dv.data(), n);
  const auto got = download(dh);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(got[i], f32_to_f16(v[i])) << "i=" << i << " v=" << v[i];
  auto back = poisoned<float>(n);
  convert(ctx(), DType::kF32, back.data(), DType::kF16, dh.data(), n);
  const auto widened = download(back);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(widened[i], f16_to_f32(got[i])) << "i=" << i;
}

TEST_F(ConvertTest, MisalignedF32ToBf16MatchesCpu) {
  const int64_t n = 999;
  const auto v = random_normal<float>(n + 1, 700);
  auto dv = upload(v);
  auto db = poisoned<uint16_t>(n + 1);
  convert(ctx(), DType::kBF16, db.data() + 1, DType::kF32, dv.data() + 1, n);
  const auto got = download(db);
  EXPECT_EQ(got[0], 0xFFFF);
  for (int64_t i = 1; i <= n; ++i) ASSERT_EQ(got[i], f32_to_bf16(v[i])) << "i=" << i;
}

using ElementwiseDeathTest = CudaTest;

TEST_F(ElementwiseDeathTest, UnsupportedDtypeNamesTheOp) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(gelu_fwd(ctx(), DType::kF64, nullptr, nullptr, 16), "gelu_fwd.*f64");
}

}  // namespace
}  // namespace forge::cuda
