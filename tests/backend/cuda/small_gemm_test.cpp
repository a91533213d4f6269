// The small-N linear kernels (backend/cuda/small_gemm.cu) against their CPU twins, for f32, bf16
// and f16: cpu::linear_fwd (both weight layouts, with and without bias) and cpu::linear_fwd twice
// + cpu::swiglu_fwd, on fresh random inputs rounded to the kernel's dtype. References are
// computed in double (cpu::linear_fwd<double>), so the tolerance measures the kernel alone.
// Shapes: row counts 1, 3, 8, 17 (past one 16- and two 8-row tiles) and 32 (the maximum);
// SmolLM2's and GPT-2's shapes, the LM head's 49152 columns, and awkward ones — OC or FF odd,
// C not a multiple of the 32- or 16-wide k-step. Also: every forced tiling, which shapes are
// supported and which eligible (taken by CudaBackend), bit-identical reruns, the fused SwiGLU
// equal bit for bit to the small-N unfused pair, and CudaBackend's linear ops (small-N path vs
// its cuBLASLt path, and misaligned views falling back to cuBLASLt).
#include "forge/backend/cuda/small_gemm.h"

#include <cmath>
#include <cstdint>
#include <vector>

#include "forge/backend/cuda/backend.h"
#include "forge/backend/cuda/gemm.h"
#include "forge/backend/cuda/ops.h"
#include "forge/model/params.h"
#include "forge/ops/activation.h"
#include "forge/ops/linear.h"
#include "model/small_configs.h"
#include "op_testing.h"

namespace forge::cuda {
namespace {

using namespace forge::cuda::testing;
using forge::testing::Tol;

constexpr WeightLayout kOutIn = WeightLayout::kOutIn, kInOut = WeightLayout::kInOut;

const char* layout_name(WeightLayout l) {
  return l == kOutIn ? "(OC, C)" : "(C, OC)";
}

// out (N, OC) = x · op(W) + bias in double: the reference.
std::vector<float> ref_linear(const std::vector<float>& x, const std::vector<float>& w,
                              const std::vector<float>& bias, int N, int C, int OC,
                              WeightLayout layout) {
  const std::vector<double> xd(x.begin(), x.end()), wd(w.begin(), w.end());
  const std::vector<double> bd(bias.begin(), bias.end());
  std::vector<double> out(static_cast<size_t>(N) * OC);
  cpu::linear_fwd<double>(out.data(), xd.data(), wd.data(), bias.empty() ? nullptr : bd.data(), N,
                          C, OC, layout);
  return std::vector<float>(out.begin(), out.end());
}

// Tolerance of one small-N output: bf16 and f16 are rounded once (tol_for's table); f32 is
// f32 sums of up to 3072 products of O(1/sqrt(C)) in another order than the double reference,
// ~sqrt(C)·2^-24 ≈ 3e-6 typical, so 3e-5 absolute leaves a margin.
Tol linear_tol(DType dt) {
  return dt == DType::kF32 ? Tol{3e-5, 1e-4} : tol_for(dt);
}

struct Shape {
  int C, OC;
};
const std::vector<int> kRows = {1, 3, 8, 17, 32};

class SmallLinearTest : public DtypeTest<CudaTest> {
 protected:
  struct Inputs {
    std::vector<float> x, w, bias;  // as the kernel sees them (rounded to dt)
    DevTensor dx, dw, dbias;
  };
  // x (N, C) normal(0, 1), W normal(0, 1/sqrt(C)) (outputs O(1)), bias normal(0, 1) or none.
  Inputs inputs(int N, int C, int OC, bool bias, uint64_t seed) {
    Inputs in;
    in.x = as_dt(dt(), random_normal<float>(static_cast<size_t>(N) * C, seed));
    in.w = as_dt(dt(), random_normal<float>(static_cast<size_t>(C) * OC, seed + 1,
                                            1.0 / std::sqrt(static_cast<double>(C))));
    if (bias) in.bias = as_dt(dt(), random_normal<float>(OC, seed + 2));
    in.dx = up(in.x), in.dw = up(in.w);
    if (bias) in.dbias = up(in.bias);
    return in;
  }
  std::vector<float> run(const Inputs& in, int N, int C, int OC, WeightLayout layout,
                         SmallLinearTiling tiling = {}) {
    DevTensor out = poison(static_cast<size_t>(N) * OC);
    small_linear_fwd(ctx(), dt(), out.data(), in.dx.data(), in.dw.data(),
                     in.bias.empty() ? nullptr : in.dbias.data(), N, C, OC, layout, tiling);
    return down(out);
  }
  void expect_matches_cpu(const std::vector<Shape>& shapes, WeightLayout layout,
                          const std::vector<int>& rows, uint64_t seed) {
    for (const Shape& s : shapes)
      for (int N : rows)
        for (bool bias : {false, true}) {
          SCOPED_TRACE(::testing::Message()
                       << dt_name(dt()) << " W " << layout_name(layout) << " N=" << N
                       << " C=" << s.C << " OC=" << s.OC << " bias=" << bias);
          ASSERT_TRUE(small_linear_supported(dt(), N, s.C, s.OC, layout));
          const Inputs in = inputs(N, s.C, s.OC, bias, seed += 3);
          const auto ref = ref_linear(in.x, in.w, in.bias, N, s.C, s.OC, layout);
          EXPECT_TRUE(all_close(run(in, N, s.C, s.OC, layout), ref, linear_tol(dt())));
        }
  }
};

TEST_P(SmallLinearTest, OutInMatchesCpu) {
  // SmolLM2's fused q|k|v (960) and its down projection; OC odd with C = 4·32 + 8.
  expect_matches_cpu({{576, 960}, {1536, 576}, {136, 203}}, kOutIn, kRows, 1000);
}

TEST_P(SmallLinearTest, OutInLmHeadMatchesCpu) {
  expect_matches_cpu({{576, 49152}}, kOutIn, {3, 32}, 2000);  // the widest weight tiles
}

TEST_P(SmallLinearTest, InOutMatchesCpu) {
  // GPT-2's c_attn and mlp.c_proj; C = 12·16 + 10 (a partial k-step), OC not a multiple of 64.
  expect_matches_cpu({{768, 2304}, {3072, 768}, {202, 136}}, kInOut, kRows, 3000);
}

// Every tiling a caller may force computes the same product (in another summation order).
TEST_P(SmallLinearTest, EveryTilingMatchesCpu) {
  uint64_t seed = 4000;
  for (WeightLayout layout : {kOutIn, kInOut})
    for (int N : {5, 32})
      for (int ct : {1, 2, 4})
        for (int warps : {1, 3, 16}) {
          if (layout == kInOut && ct != 1) continue;  // kInOut has one tile shape
          const int C = layout == kOutIn ? 136 : 202, OC = layout == kOutIn ? 203 : 136;
          SCOPED_TRACE(::testing::Message()
                       << dt_name(dt()) << " W " << layout_name(layout) << " N=" << N
                       << " col_tiles=" << ct << " warps=" << warps);
          const Inputs in = inputs(N, C, OC, true, seed += 3);
          const auto ref = ref_linear(in.x, in.w, in.bias, N, C, OC, layout);
          EXPECT_TRUE(all_close(run(in, N, C, OC, layout, {ct, warps}), ref, linear_tol(dt())));
        }
}

TEST_P(SmallLinearTest, RerunsAreBitIdentical) {
  for (WeightLayout layout : {kOutIn, kInOut})
    for (int N : {1, 17, 32}) {
      const int C = layout == kOutIn ? 576 : 768, OC = layout == kOutIn ? 960 : 2304;
      SCOPED_TRACE(::testing::Message()
                   << dt_name(dt()) << " W " << layout_name(layout) << " N=" << N);
      const Inputs in = inputs(N, C, OC, true, 5000 + N);
      EXPECT_TRUE(same_bits(run(in, N, C, OC, layout), run(in, N, C, OC, layout)));
    }
}

// Supported: shapes whose weight rows are not whole 16-byte vectors, row counts out of range and
// other dtypes are refused; the vector width follows the dtype.
TEST_P(SmallLinearTest, SupportedShapesFollowTheVectorRule) {
  const int v = dt() == DType::kF32 ? 4 : 8;
  EXPECT_TRUE(small_linear_supported(dt(), 1, 2 * v, 3, kOutIn));
  EXPECT_FALSE(small_linear_supported(dt(), 1, 2 * v + 2, 3, kOutIn));  // C % v != 0
  EXPECT_TRUE(small_linear_supported(dt(), 1, 6, 2 * v, kInOut));
  EXPECT_FALSE(small_linear_supported(dt(), 1, 6, 2 * v + 2, kInOut));                // OC % v != 0
  EXPECT_EQ(small_linear_supported(dt(), 1, 7, 2 * v, kInOut), dt() == DType::kF32);  // C odd
  EXPECT_FALSE(small_linear_supported(dt(), 0, 64, 64, kOutIn));
  EXPECT_TRUE(small_linear_supported(dt(), kSmallLinearMaxRows, 64, 64, kOutIn));
  EXPECT_FALSE(small_linear_supported(dt(), kSmallLinearMaxRows + 1, 64, 64, kOutIn));
  EXPECT_FALSE(small_linear_supported(DType::kF64, 1, 64, 64, kOutIn));
  EXPECT_TRUE(small_linear_swiglu_supported(dt(), 4, 64, 203));
  EXPECT_FALSE(small_linear_swiglu_supported(dt(), 4, 2 * v + 2, 64));
  EXPECT_FALSE(small_linear_swiglu_supported(dt(), kSmallLinearMaxRows + 1, 64, 64));
  int x = 0;
  EXPECT_FALSE(small_linear_aligned(&x, &x, reinterpret_cast<char*>(&x) + 2));
}

// Eligible (what CudaBackend takes): only where the H200 measurements favour the kernels.
TEST_P(SmallLinearTest, EligibleOnlyWhereMeasuredFaster) {
  const bool b16 = dt() != DType::kF32;  // f32, the parity mode, keeps cuBLASLt
  EXPECT_EQ(small_linear_eligible(dt(), 1, 576, 960, kOutIn), b16);
  EXPECT_EQ(small_linear_eligible(dt(), kSmallLinearEligibleRows, 1536, 576, kOutIn), b16);
  EXPECT_EQ(small_linear_eligible(dt(), 8, 576, 3072, kOutIn), b16);
  EXPECT_FALSE(small_linear_eligible(dt(), kSmallLinearEligibleRows + 1, 576, 960, kOutIn));
  EXPECT_FALSE(small_linear_eligible(dt(), 1, 576, 49152, kOutIn));     // the LM head
  EXPECT_FALSE(small_linear_eligible(dt(), 1, 768, 2304, kInOut));      // GPT-2's Conv1D
  EXPECT_FALSE(small_linear_eligible(dt(), 1, 2 * 8 + 2, 64, kOutIn));  // not supported
  EXPECT_EQ(small_linear_swiglu_eligible(dt(), kSmallLinearMaxRows, 576, 1536), b16);
  EXPECT_FALSE(small_linear_swiglu_eligible(dt(), kSmallLinearMaxRows + 1, 576, 1536));
  EXPECT_FALSE(small_linear_swiglu_eligible(dt(), 1, 2048, 8192));  // 32M weights
}

// ---- gate/up + SwiGLU -------------------------------------------------------------------------

TEST_P(SmallLinearTest, SwigluMatchesCpuAndTheUnfusedPair) {
  uint64_t seed = 6000;
  for (const Shape& s : std::vector<Shape>{{576, 1536}, {136, 203}})
    for (int N : kRows) {
      const int C = s.C, FF = s.OC;
      SCOPED_TRACE(::testing::Message()
                   << dt_name(dt()) << " N=" << N << " C=" << C << " FF=" << FF);
      ASSERT_TRUE(small_linear_swiglu_supported(dt(), N, C, FF));
      const Inputs in = inputs(N, C, 2 * FF, false, seed += 3);
      const size_t nff = static_cast<size_t>(N) * FF, ffc = static_cast<size_t>(FF) * C;
      // CPU: the two products, each rounded to dt as linear_fwd stores it, then swiglu_fwd.
      const std::vector<float> wg(in.w.begin(), in.w.begin() + ffc),
          wu(in.w.begin() + ffc, in.w.end());
      const auto gate = as_dt(dt(), ref_linear(in.x, wg, {}, N, C, FF, kOutIn));
      const auto upv = as_dt(dt(), ref_linear(in.x, wu, {}, N, C, FF, kOutIn));
      std::vector<float> ref(nff);
      cpu::swiglu_fwd<float>(ref.data(), gate.data(), upv.data(), static_cast<int64_t>(nff));

      DevTensor hidden = poison(nff);
      small_linear_swiglu_fwd(ctx(), dt(), hidden.data(), in.dx.data(), in.dw.data(), N, C, FF);
      const auto got = down(hidden);
      // One dt rounding of g or u can flip against the reference's (the sums differ in the last
      // f32 bits), then the output rounds once more: tol_for covers both for bf16 and f16.
      EXPECT_TRUE(all_close(got, ref, linear_tol(dt())));

      // The unfused small-N pair: the same sums in the same order, the same SwiGLU arithmetic.
      // (Gate and up in buffers of their own: N·FF elements into one is not 16-byte aligned.)
      DevTensor dgate = poison(nff), dup = poison(nff), unfused = poison(nff);
      small_linear_fwd(ctx(), dt(), dgate.data(), in.dx.data(), in.dw.data(), nullptr, N, C, FF,
                       kOutIn);
      small_linear_fwd(ctx(), dt(), dup.data(), in.dx.data(), in.dw.at(ffc), nullptr, N, C, FF,
                       kOutIn);
      swiglu_fwd(ctx(), dt(), unfused.data(), dgate.data(), dup.data(), static_cast<int64_t>(nff));
      EXPECT_TRUE(same_bits(got, down(unfused)));
    }
}

TEST_P(SmallLinearTest, SwigluEveryTilingAndRerunsBitIdentical) {
  const int C = 136, FF = 203;
  uint64_t seed = 7000;
  for (int N : {5, 32})
    for (int ct : {2, 4})
      for (int warps : {1, 3, 16}) {
        SCOPED_TRACE(::testing::Message()
                     << dt_name(dt()) << " N=" << N << " col_tiles=" << ct << " warps=" << warps);
        const Inputs in = inputs(N, C, 2 * FF, false, seed += 3);
        const size_t nff = static_cast<size_t>(N) * FF, ffc = static_cast<size_t>(FF) * C;
        const std::vector<float> wg(in.w.begin(), in.w.begin() + ffc),
            wu(in.w.begin() + ffc, in.w.end());
        const auto gate = as_dt(dt(), ref_linear(in.x, wg, {}, N, C, FF, kOutIn));
        const auto upv = as_dt(dt(), ref_linear(in.x, wu, {}, N, C, FF, kOutIn));
        std::vector<float> ref(nff);
        cpu::swiglu_fwd<float>(ref.data(), gate.data(), upv.data(), static_cast<int64_t>(nff));
        std::vector<float> runs[2];
        for (auto& r : runs) {
          DevTensor hidden = poison(nff);
          small_linear_swiglu_fwd(ctx(), dt(), hidden.data(), in.dx.data(), in.dw.data(), N, C, FF,
                                  {ct, warps});
          r = down(hidden);
        }
        EXPECT_TRUE(all_close(runs[0], ref, linear_tol(dt())));
        EXPECT_TRUE(same_bits(runs[0], runs[1]));
      }
}

INSTANTIATE_TEST_SUITE_P(SmallGemm, SmallLinearTest,
                         ::testing::Values(DType::kF32, DType::kBF16, DType::kF16),
                         [](const auto& info) { return std::string(dt_name(info.param)); });

// ---- CudaBackend: the small-N path against the cuBLASLt path it replaces ------------------------

class SmallGemmBackendTest : public CudaTest {
 protected:
  // What CudaBackend::linear_fwd enqueues when the small-N kernels do not take a call.
  void cublaslt_linear(DType dt, void* out, const void* x, const void* w, const void* bias, int N,
                       int C, int OC, WeightLayout layout) {
    GemmArgs g;
    g.M = N, g.N = OC, g.K = C, g.trans_b = layout == kOutIn;
    g.ab_type = g.c_type = dt;
    if (bias) g.epilogue = GemmEpilogue::kBias, g.bias = bias;
    gemm(ctx(), g, x, w, out);
  }
};

TEST_F(SmallGemmBackendTest, LinearMatchesTheCublasLtPath) {
  const ModelConfig cfg = forge::testing::small_config(Family::kLlama);
  uint64_t seed = 8000;
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    CudaModelOptions o;
    o.dtype = dt;
    CudaBackend be(cfg, ParamTable(cfg), ctx(), o);
    struct Case {
      int N, C, OC;
      WeightLayout layout;
    };
    // Eligible ones (bf16/f16, W (OC, C), N <= 16) take the small-N kernels; the others (f32,
    // W (C, OC), N = 32 or 40) are the very GEMM cublaslt_linear enqueues.
    for (const Case& c :
         {Case{1, 576, 960, kOutIn}, Case{8, 576, 576, kOutIn}, Case{16, 1536, 576, kOutIn},
          Case{32, 576, 576, kOutIn}, Case{1, 768, 2304, kInOut}, Case{8, 3072, 768, kInOut},
          Case{32, 768, 768, kInOut}, Case{40, 576, 576, kOutIn}})
      for (bool misaligned : {false, true}) {  // an output view 8 (f32: 4) bytes in: cuBLASLt
        SCOPED_TRACE(::testing::Message()
                     << dt_name(dt) << " N=" << c.N << " C=" << c.C << " OC=" << c.OC << " W "
                     << layout_name(c.layout) << " misaligned=" << misaligned);
        const size_t n_out = static_cast<size_t>(c.N) * c.OC;
        auto x = to_device(dt, random_normal<float>(static_cast<size_t>(c.N) * c.C, seed++));
        auto w = to_device(dt, random_normal<float>(static_cast<size_t>(c.C) * c.OC, seed++,
                                                    1.0 / std::sqrt(static_cast<double>(c.C))));
        auto bias = to_device(dt, random_normal<float>(c.OC, seed++));
        // Sentinels (7, exact in every dtype) where the view does not reach.
        auto a = to_device(dt, std::vector<float>(n_out + 4, 7.0f));
        auto b = to_device(dt, std::vector<float>(n_out + 4, 7.0f));
        const size_t off = misaligned ? (dt == DType::kF32 ? 4 : 8) : 0;
        be.linear_fwd(a.data() + off, x.data(), w.data(), bias.data(), c.N, c.C, c.OC, c.layout);
        cublaslt_linear(dt, b.data() + off, x.data(), w.data(), bias.data(), c.N, c.C, c.OC,
                        c.layout);
        const bool small = !misaligned && small_linear_eligible(dt, c.N, c.C, c.OC, c.layout);
        if (small) {
          // Two f32 sums in different orders, each rounded once to dt.
          EXPECT_TRUE(all_close(to_host(dt, a), to_host(dt, b), linear_tol(dt)));
        } else {
          EXPECT_TRUE(same_bits(to_host(dt, a), to_host(dt, b)));
        }
      }
  }
}

// linear_swiglu_fwd: small N through the fused kernel, N = 40 through two GEMMs + swiglu_fwd;
// both against the CPU composition the CPU backend runs.
TEST_F(SmallGemmBackendTest, LinearSwigluMatchesCpuOnBothPaths) {
  const ModelConfig cfg = forge::testing::small_config(Family::kLlama);
  const int C = 576, FF = 1536;
  uint64_t seed = 9000;
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    CudaModelOptions o;
    o.dtype = dt;
    CudaBackend be(cfg, ParamTable(cfg), ctx(), o);
    for (int N : {1, 8, 32, 40}) {
      SCOPED_TRACE(::testing::Message() << dt_name(dt) << " N=" << N);
      const size_t nff = static_cast<size_t>(N) * FF, ffc = static_cast<size_t>(FF) * C;
      const auto x = round_to(dt, random_normal<float>(static_cast<size_t>(N) * C, seed++));
      const auto w =
          round_to(dt, random_normal<float>(2 * ffc, seed++, 1.0 / std::sqrt(double(C))));
      const std::vector<float> wg(w.begin(), w.begin() + ffc), wu(w.begin() + ffc, w.end());
      const auto gate = round_to(dt, ref_linear(x, wg, {}, N, C, FF, kOutIn));
      const auto upv = round_to(dt, ref_linear(x, wu, {}, N, C, FF, kOutIn));
      std::vector<float> ref(nff);
      cpu::swiglu_fwd<float>(ref.data(), gate.data(), upv.data(), static_cast<int64_t>(nff));
      auto dx = to_device(dt, x), dw = to_device(dt, w);
      auto hidden = to_device(dt, std::vector<float>(nff, 7.0f));
      auto scratch = to_device(dt, std::vector<float>(2 * nff, 7.0f));
      be.linear_swiglu_fwd(hidden.data(), scratch.data(), dx.data(), dw.data(), N, C, FF);
      EXPECT_TRUE(all_close(to_host(dt, hidden), ref, linear_tol(dt)));
    }
  }
}

}  // namespace
}  // namespace forge::cuda
