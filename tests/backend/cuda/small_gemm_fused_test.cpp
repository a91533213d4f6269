// The decode step's fused small-N products (backend/cuda/small_gemm.cu, SmallLinearFusion): the
// RMSNorm prologue (product of rmsnorm(x)·g) and the residual epilogue (out += product), on
// fresh random inputs rounded to the kernel's dtype, bf16 and f16, each against
//  - the unfused GPU ops it replaces (rmsnorm_fwd, then the small-N product; the product, then
//    add_inplace), bit for bit: the norm prologue repeats rmsnorm_fwd's arithmetic for rows of
//    C ≥ 256 (one warp a row, the same order), the epilogue rounds the product before the add;
//  - the CPU composition in double, within the dtype's tolerance;
// and with programmatic dependent launch off (the same bits). Rows 1, 3, 16, 17 (two row tiles),
// 32; SmolLM2's q|k|v (576 → 960), o_proj (576 → 576), gate|up (576 → 2·1536), down (1536 → 576).
#include <cmath>
#include <cstdint>
#include <vector>

#include "forge/backend/cuda/ops.h"
#include "forge/backend/cuda/small_gemm.h"
#include "forge/ops/activation.h"
#include "forge/ops/linear.h"
#include "forge/ops/rmsnorm.h"
#include "op_testing.h"

namespace forge::cuda {
namespace {

using namespace forge::cuda::testing;

constexpr WeightLayout kOutIn = WeightLayout::kOutIn;
constexpr float kEps = 1e-5f;
const std::vector<int> kRows = {1, 3, 16, 17, 32};

class SmallLinearFusedTest : public DtypeTest<CudaTest> {
 protected:
  struct Inputs {
    std::vector<float> x, g, w, bias, res;  // as the kernels see them (rounded to dt)
    DevTensor dx, dg, dw, dbias;
  };
  // x (N, C) normal(0, 2) (the norm rescales it), g normal(1, 0.2), W normal(0, 1/sqrt(C)),
  // bias normal(0, 1) or none, a residual stream normal(0, 1).
  Inputs inputs(int N, int C, int OC, bool bias, uint64_t seed) {
    Inputs in;
    in.x = as_dt(dt(), random_normal<float>(static_cast<size_t>(N) * C, seed, 2.0));
    in.g = random_normal<float>(C, seed + 1, 0.2);
    for (float& v : in.g) v += 1.0f;
    in.g = as_dt(dt(), in.g);
    in.w = as_dt(dt(), random_normal<float>(static_cast<size_t>(OC) * C, seed + 2,
                                            1.0 / std::sqrt(static_cast<double>(C))));
    if (bias) in.bias = as_dt(dt(), random_normal<float>(OC, seed + 3));
    in.res = as_dt(dt(), random_normal<float>(static_cast<size_t>(N) * OC, seed + 4));
    in.dx = up(in.x), in.dg = up(in.g), in.dw = up(in.w);
    if (bias) in.dbias = up(in.bias);
    return in;
  }
  const void* bias_ptr(const Inputs& in) const {
    return in.bias.empty() ? nullptr : in.dbias.data();
  }
  // rmsnorm(x)·g in double, rounded to dt (what the kernels feed the product).
  std::vector<float> ref_norm(const Inputs& in, int N, int C) const {
    std::vector<double> x(in.x.begin(), in.x.end()), g(in.g.begin(), in.g.end());
    std::vector<double> y(x.size()), rstd(N);
    cpu::rmsnorm_fwd<double>(y.data(), rstd.data(), x.data(), g.data(), N, C, kEps);
    return as_dt(dt(), std::vector<float>(y.begin(), y.end()));
  }
  std::vector<float> ref_linear(const std::vector<float>& x, const std::vector<float>& w,
                                const std::vector<float>& bias, int N, int C, int OC) const {
    const std::vector<double> xd(x.begin(), x.end()), wd(w.begin(), w.end());
    const std::vector<double> bd(bias.begin(), bias.end());
    std::vector<double> out(static_cast<size_t>(N) * OC);
    cpu::linear_fwd<double>(out.data(), xd.data(), wd.data(), bias.empty() ? nullptr : bd.data(),
                            N, C, OC, kOutIn);
    return std::vector<float>(out.begin(), out.end());
  }
  // The unfused GPU norm: rmsnorm_fwd into a buffer of its own.
  DevTensor gpu_norm(const Inputs& in, int N, int C) {
    DevTensor ln = poison(static_cast<size_t>(N) * C);
    DeviceBuffer<float> rstd(ctx().allocator(), N);
    rmsnorm_fwd(ctx(), dt(), ln.data(), rstd.data(), in.dx.data(), in.dg.data(), N, C, kEps);
    ctx().synchronize();
    return ln;
  }
  // Runs f with PDL on, then off; both results must be the same bits. Returns the first.
  template <class F>
  std::vector<float> with_and_without_pdl(F f) {
    const std::vector<float> on = f();
    ctx().set_pdl(false);
    const std::vector<float> off = f();
    ctx().set_pdl(true);
    EXPECT_TRUE(same_bits(on, off)) << "PDL on vs off";
    return on;
  }
};

TEST_P(SmallLinearFusedTest, RmsnormPrologueEqualsNormThenProduct) {
  uint64_t seed = 100;
  for (int OC : {960, 576})
    for (int N : kRows)
      for (bool bias : {false, true}) {
        const int C = 576;
        SCOPED_TRACE(::testing::Message() << dt_name(dt()) << " N=" << N << " C=" << C
                                          << " OC=" << OC << " bias=" << bias);
        const SmallLinearFusion f{nullptr, kEps, false};
        const Inputs in = inputs(N, C, OC, bias, seed += 5);
        const SmallLinearFusion fn{in.dg.data(), kEps, false};
        ASSERT_TRUE(small_linear_fusion_supported(dt(), N, C, OC, kOutIn, fn));
        const size_t n = static_cast<size_t>(N) * OC;
        const auto got = with_and_without_pdl([&] {
          DevTensor out = poison(n);
          small_linear_fwd(ctx(), dt(), out.data(), in.dx.data(), in.dw.data(), bias_ptr(in), N,
                           C, OC, kOutIn, {}, fn);
          return down(out);
        });
        DevTensor ln = gpu_norm(in, N, C), unfused = poison(n);
        small_linear_fwd(ctx(), dt(), unfused.data(), ln.data(), in.dw.data(), bias_ptr(in), N, C,
                         OC, kOutIn, {}, f);
        EXPECT_TRUE(same_bits(got, down(unfused))) << "vs rmsnorm_fwd + small_linear_fwd";
        const auto ref = ref_linear(ref_norm(in, N, C), in.w, in.bias, N, C, OC);
        EXPECT_TRUE(all_close(got, ref, tol_for(dt())));  // bf16 1e-2 + 2e-2·|ref|
      }
}

TEST_P(SmallLinearFusedTest, RmsnormPrologueSwigluEqualsNormThenSwiglu) {
  uint64_t seed = 200;
  const int C = 576, FF = 1536;
  for (int N : kRows) {
    SCOPED_TRACE(::testing::Message() << dt_name(dt()) << " N=" << N);
    const Inputs in = inputs(N, C, 2 * FF, false, seed += 5);
    const SmallLinearFusion fn{in.dg.data(), kEps, false};
    const size_t nff = static_cast<size_t>(N) * FF, ffc = static_cast<size_t>(FF) * C;
    const auto got = with_and_without_pdl([&] {
      DevTensor hidden = poison(nff);
      small_linear_swiglu_fwd(ctx(), dt(), hidden.data(), in.dx.data(), in.dw.data(), N, C, FF, {},
                              fn);
      return down(hidden);
    });
    DevTensor ln = gpu_norm(in, N, C), unfused = poison(nff);
    small_linear_swiglu_fwd(ctx(), dt(), unfused.data(), ln.data(), in.dw.data(), N, C, FF);
    EXPECT_TRUE(same_bits(got, down(unfused))) << "vs rmsnorm_fwd + small_linear_swiglu_fwd";
    // CPU: the two products of the rounded norm, each rounded to dt, then SwiGLU.
    const auto xn = ref_norm(in, N, C);
    const std::vector<float> wg(in.w.begin(), in.w.begin() + ffc), wu(in.w.begin() + ffc, in.w.end());
    const auto gate = as_dt(dt(), ref_linear(xn, wg, {}, N, C, FF));
    const auto upv = as_dt(dt(), ref_linear(xn, wu, {}, N, C, FF));
    std::vector<float> ref(nff);
    cpu::swiglu_fwd<float>(ref.data(), gate.data(), upv.data(), static_cast<int64_t>(nff));
    EXPECT_TRUE(all_close(got, ref, tol_for(dt())));
  }
}

TEST_P(SmallLinearFusedTest, ResidualEpilogueEqualsProductThenAdd) {
  uint64_t seed = 300;
  for (int C : {576, 1536})
    for (int N : kRows)
      for (bool bias : {false, true}) {
        const int OC = 576;
        SCOPED_TRACE(::testing::Message() << dt_name(dt()) << " N=" << N << " C=" << C
                                          << " bias=" << bias);
        const Inputs in = inputs(N, C, OC, bias, seed += 5);
        const SmallLinearFusion fr{nullptr, 0.0f, true};
        ASSERT_TRUE(small_linear_fusion_supported(dt(), N, C, OC, kOutIn, fr));
        const size_t n = static_cast<size_t>(N) * OC;
        const auto got = with_and_without_pdl([&] {
          DevTensor res = up(in.res);  // updated in place
          small_linear_fwd(ctx(), dt(), res.data(), in.dx.data(), in.dw.data(), bias_ptr(in), N, C,
                           OC, kOutIn, {}, fr);
          return down(res);
        });
        DevTensor prod = poison(n), res = up(in.res);
        small_linear_fwd(ctx(), dt(), prod.data(), in.dx.data(), in.dw.data(), bias_ptr(in), N, C,
                         OC, kOutIn);
        add_inplace(ctx(), dt(), res.data(), prod.data(), static_cast<int64_t>(n));
        EXPECT_TRUE(same_bits(got, down(res))) << "vs small_linear_fwd + add_inplace";
        // CPU: the product rounded to dt, added to the residual in double.
        const auto p = as_dt(dt(), ref_linear(in.x, in.w, in.bias, N, C, OC));
        std::vector<float> ref(n);
        for (size_t i = 0; i < n; ++i) ref[i] = static_cast<float>(double{in.res[i]} + p[i]);
        EXPECT_TRUE(all_close(got, ref, tol_for(dt())));
      }
}

// Fusions exist for the 16-bit W (OC, C) kernels only; the other calls must be refused, not
// computed wrongly.
TEST_P(SmallLinearFusedTest, FusionSupportRules) {
  const DevTensor g = up(std::vector<float>(576, 1.0f));
  const SmallLinearFusion norm{g.data(), kEps, false}, res{nullptr, 0.0f, true};
  EXPECT_TRUE(small_linear_fusion_supported(dt(), 1, 576, 576, kOutIn, {}));
  EXPECT_FALSE(small_linear_fusion_supported(dt(), 1, 576, 576, WeightLayout::kInOut, norm));
  EXPECT_FALSE(small_linear_fusion_supported(dt(), 1, 576, 576, WeightLayout::kInOut, res));
  EXPECT_FALSE(small_linear_fusion_supported(dt(), 1, kSmallLinearMaxNormC + 8, 64, kOutIn, norm));
  EXPECT_FALSE(small_linear_fusion_supported(DType::kF32, 1, 576, 576, kOutIn, norm));
  EXPECT_FALSE(small_linear_fusion_supported(dt(), 33, 576, 576, kOutIn, res));  // rows > 32
}

INSTANTIATE_TEST_SUITE_P(SmallGemm, SmallLinearFusedTest,
                         ::testing::Values(DType::kBF16, DType::kF16),
                         [](const auto& info) { return std::string(dt_name(info.param)); });

}  // namespace
}  // namespace forge::cuda
