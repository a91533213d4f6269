// FP8 GEMM operands and products (Hopper): cuda::cast_fp8 and cast_transpose_fp8 against their
// CPU twins bit for bit (the bytes and amax), and cuBLASLt's FP8 products (TN layout, E4M3 and
// E5M2 operands with their scales, bf16 / f32 output, bias, beta 1) against a double-precision
// product of the operands the GPU was given (the fp8 bytes decoded on the CPU).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "cuda_testing.h"
#include "forge/backend/cuda/gemm.h"
#include "forge/backend/cuda/ops.h"
#include "forge/core/error.h"
#include "forge/io/fp8.h"
#include "forge/ops/fp8.h"

namespace forge::cuda {
namespace {

using namespace forge::cuda::testing;

class Fp8Test : public CudaTest {
 protected:
  // The device's compute capability: FP8 tensor cores need 8.9 or newer (the casts run anywhere).
  bool has_fp8_mma() const { return ctx_->props().major * 10 + ctx_->props().minor >= 89; }
  DeviceBuffer<float> scalar(float v) { return upload(std::vector<float>{v}); }
};

float decode(DType t, uint8_t v) { return t == DType::kF8E4M3 ? e4m3_to_f32(v) : e5m2_to_f32(v); }

// Random normals times `spread` (so E4M3's 448 and E5M2's 57344 saturate for some scales),
// with the special values at fixed places: ±inf, ±0, a huge and a tiny value.
std::vector<float> cast_inputs(size_t n, uint64_t seed, float spread) {
  std::vector<float> x = random_normal<float>(n, seed, spread);
  const float special[] = {INFINITY, -INFINITY, 0.0f, -0.0f, 1e30f, 1e-30f, -3e-5f};
  for (size_t i = 0; i < std::size(special) && i * 97 < n; ++i) x[i * 97] = special[i];
  return x;
}

TEST_F(Fp8Test, CastMatchesTheCpuBitForBit) {
  for (DType xt : {DType::kF32, DType::kBF16, DType::kF16})
    for (DType yt : {DType::kF8E4M3, DType::kF8E5M2})
      for (size_t n : {size_t{1000}, size_t{1003}, size_t{65544}}) {  // 1003: the one-a-thread path
        SCOPED_TRACE(::testing::Message() << dtype_name(xt) << " -> " << dtype_name(yt) << " n=" << n);
        const float spread = xt == DType::kF16 ? 50.0f : 300.0f;  // f16 tops out at 65504
        const std::vector<float> x = round_to(xt, cast_inputs(n, 7 + n, spread));
        const float s = yt == DType::kF8E4M3 ? 1.7f : 37.0f;
        std::vector<uint8_t> want(n);
        const float want_amax = cpu::cast_fp8(yt, want.data(), x.data(), static_cast<int64_t>(n), s);
        auto dx = to_device(xt, x);
        auto dy = poisoned<uint8_t>(n);
        auto dscale = scalar(s);
        auto damax = poisoned<float>(1);
        cast_fp8(ctx(), yt, dy.data(), xt, dx.data(), static_cast<int64_t>(n), dscale.data(), damax.data());
        const std::vector<uint8_t> got = download(dy);
        size_t diff = 0;
        for (size_t i = 0; i < n; ++i) diff += got[i] != want[i];
        EXPECT_EQ(diff, 0u);
        EXPECT_EQ(download(damax)[0], want_amax);  // inf: the inputs hold ±inf
      }
}

TEST_F(Fp8Test, CastAmaxOfFiniteInputsAndNaN) {
  std::vector<float> x = random_normal<float>(4096, 3, 2.0f);
  x[1234] = -17.25f;  // the largest magnitude, negative
  auto dx = to_device(DType::kF32, x);
  auto dy = poisoned<uint8_t>(x.size());
  auto dscale = scalar(1.0f);
  auto damax = poisoned<float>(1);
  cast_fp8(ctx(), DType::kF8E4M3, dy.data(), DType::kF32, dx.data(), 4096, dscale.data(), damax.data());
  EXPECT_EQ(download(damax)[0], 17.25f);
  x[77] = std::numeric_limits<float>::quiet_NaN();
  auto dx2 = to_device(DType::kF32, x);
  cast_fp8(ctx(), DType::kF8E4M3, dy.data(), DType::kF32, dx2.data(), 4096, dscale.data(), damax.data());
  EXPECT_TRUE(std::isnan(download(damax)[0]));
}

TEST_F(Fp8Test, CastTransposeMatchesTheCpuBitForBit) {
  const int shapes[][2] = {{48, 100}, {128, 64}, {16, 3}, {272, 130}};  // rows % 16 == 0, ragged tiles
  for (DType xt : {DType::kF32, DType::kBF16})
    for (DType yt : {DType::kF8E4M3, DType::kF8E5M2})
      for (const auto& [rows, cols] : shapes) {
        SCOPED_TRACE(::testing::Message() << dtype_name(xt) << " -> " << dtype_name(yt) << " " << rows << "x" << cols);
        const size_t n = static_cast<size_t>(rows) * cols;
        const std::vector<float> x = round_to(xt, cast_inputs(n, 11 + n, 200.0f));
        const float s = yt == DType::kF8E4M3 ? 0.9f : 11.0f;
        std::vector<uint8_t> want(n);
        const float want_amax = cpu::cast_transpose_fp8(yt, want.data(), x.data(), rows, cols, s);
        auto dx = to_device(xt, x);
        auto dy = poisoned<uint8_t>(n);
        auto dscale = scalar(s);
        auto damax = poisoned<float>(1);
        cast_transpose_fp8(ctx(), yt, dy.data(), xt, dx.data(), rows, cols, dscale.data(), damax.data());
        const std::vector<uint8_t> got = download(dy);
        size_t diff = 0;
        for (size_t i = 0; i < n; ++i) diff += got[i] != want[i];
        EXPECT_EQ(diff, 0u);
        EXPECT_EQ(download(damax)[0], want_amax);
      }
}

// C (M, N) = sa·sb·A (M, K)·B (N, K)ᵀ (+ bias) (+ C), A and B fp8 bytes made by cast_fp8 from
// random values; the reference decodes the same bytes on the CPU and sums in double.
TEST_F(Fp8Test, GemmMatchesTheDecodedOperands) {
  if (!has_fp8_mma()) GTEST_SKIP() << "FP8 tensor cores need compute capability 8.9+";
  const int M = 128, N = 96, K = 256;
  struct Case {
    DType a, b, c;
    bool bias, accumulate, fast;
  };
  const Case cases[] = {
      {DType::kF8E4M3, DType::kF8E4M3, DType::kBF16, false, false, false},  // forward: X·Wᵀ
      {DType::kF8E4M3, DType::kF8E4M3, DType::kBF16, true, false, true},    // with bias, fast accumulation
      {DType::kF8E5M2, DType::kF8E4M3, DType::kBF16, false, false, false},  // dX: gradient × weight
      {DType::kF8E5M2, DType::kF8E4M3, DType::kF32, false, true, false},    // dW into f32, beta 1
  };
  uint64_t seed = 100;
  for (const Case& cs : cases) {
    SCOPED_TRACE(::testing::Message() << dtype_name(cs.a) << " x " << dtype_name(cs.b) << " -> " << dtype_name(cs.c)
                                      << (cs.bias ? " +bias" : "") << (cs.accumulate ? " beta 1" : "")
                                      << (cs.fast ? " fast" : ""));
    const float sa = 8.0f, sb = 0.5f;  // the casts' scales; the GEMM gets their inverses
    const auto xa = random_normal<float>(size_t(M) * K, seed++), xb = random_normal<float>(size_t(N) * K, seed++);
    std::vector<uint8_t> qa(xa.size()), qb(xb.size());
    cpu::cast_fp8(cs.a, qa.data(), xa.data(), static_cast<int64_t>(qa.size()), sa);
    cpu::cast_fp8(cs.b, qb.data(), xb.data(), static_cast<int64_t>(qb.size()), sb);
    const auto bias = round_bf16(random_normal<float>(N, seed++));
    const auto c0 = random_normal<float>(size_t(M) * N, seed++);
    std::vector<double> ref(size_t(M) * N);
    for (int i = 0; i < M; ++i)
      for (int j = 0; j < N; ++j) {
        double s = 0;
        for (int k = 0; k < K; ++k)
          s += double{decode(cs.a, qa[size_t(i) * K + k])} * decode(cs.b, qb[size_t(j) * K + k]);
        s /= double{sa} * sb;
        if (cs.bias) s += bias[j];
        if (cs.accumulate) s += c0[size_t(i) * N + j];
        ref[size_t(i) * N + j] = s;
      }
    auto da = upload(qa), db = upload(qb);
    auto dbias = upload(to_bf16(bias));
    auto dsa = scalar(1.0f / sa), dsb = scalar(1.0f / sb);
    GemmArgs g;
    g.M = M, g.N = N, g.K = K, g.trans_b = true;
    g.ab_type = cs.a, g.b_type = cs.b, g.c_type = cs.c;
    g.a_scale = dsa.data(), g.b_scale = dsb.data(), g.fast_accum = cs.fast;
    if (cs.bias) g.epilogue = GemmEpilogue::kBias, g.bias = dbias.data();
    if (cs.accumulate) g.beta = 1.0f;
    std::vector<float> got;
    if (cs.c == DType::kF32) {
      auto dc = upload(c0);
      gemm(ctx(), g, da.data(), db.data(), dc.data());
      got = download(dc);
    } else {
      auto dc = poisoned<uint16_t>(size_t(M) * N);
      gemm(ctx(), g, da.data(), db.data(), dc.data());
      got = from_bf16(download(dc));
    }
    // Hopper's FP8 tensor cores accumulate in fewer bits than f32 (~14, by DeepSeek-V3's report):
    // measured on an H100 at K = 256 without fast accumulation, 1.4e-4 relative for e4m3 × e4m3
    // but 3.7e-3 absolute for e5m2 × e4m3 (outputs ~1; the partial sums reach ~60 before the
    // 1/(8·0.5) scale, where a 14-bit step is ~4e-3). So f32 output is held to 1e-2 absolute, as
    // fast accumulation is; bf16 output to bf16's 2^-8. An operand read wrongly (layout, scale,
    // format) is off by O(1).
    const forge::testing::Tol tol = cs.c == DType::kF32 ? forge::testing::Tol{1e-2, 1e-2}
                                    : cs.fast           ? forge::testing::Tol{1e-2, 2e-2}
                                                        : kTolBf16;
    EXPECT_TRUE(all_close(got, std::vector<float>(ref.begin(), ref.end()), tol));
  }
}

}  // namespace
}  // namespace forge::cuda
