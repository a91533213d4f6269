#include "forge/backend/cuda/gemm.h"

#include <cmath>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include "cuda_testing.h"
#include "forge/core/error.h"
#include "forge/ops/activation.h"
#include "forge/ops/matmul.h"

namespace forge::cuda {
namespace {

using namespace forge::cuda::testing;

class GemmTest : public CudaTest {};

// fp32 (no TF32) against the CPU reference, every transpose combination, awkward sizes,
// alpha/beta, and a batched case.
TEST_F(GemmTest, Fp32AllLayoutsMatchCpu) {
  const int M = 67, N = 45, K = 129;
  uint64_t seed = 1;
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      auto a = random_normal<float>(M * K, seed++), b = random_normal<float>(K * N, seed++);
      auto c0 = random_normal<float>(M * N, seed++);
      auto da = upload(a), db = upload(b), dc = upload(c0);
      GemmArgs g;
      g.M = M, g.N = N, g.K = K, g.trans_a = ta, g.trans_b = tb, g.alpha = 0.5f, g.beta = 2.0f;
      gemm(ctx(), g, da.data(), db.data(), dc.data());
      std::vector<float> ref = c0;
      cpu::matmul_reference<float>(ref.data(), a.data(), b.data(), M, N, K, ta, tb, 0.5f, 2.0f);
      // f32 accumulation of 129 products in another order: ~1e-6 relative.
      EXPECT_TRUE(all_close(download(dc), ref, {1e-5, 1e-5})) << "ta=" << ta << " tb=" << tb;
    }
}

TEST_F(GemmTest, Bf16WithBiasAndBatchMatchCpu) {
  const int M = 130, N = 96, K = 200, batch = 3;
  auto a = round_bf16(random_normal<float>(batch * M * K, 11));
  auto b = round_bf16(random_normal<float>(batch * N * K, 12));
  auto bias = round_bf16(random_normal<float>(N, 13));
  auto da = upload(to_bf16(a)), db = upload(to_bf16(b)), dbias = upload(to_bf16(bias));
  auto dc = poisoned<uint16_t>(batch * M * N);
  GemmArgs g;
  g.M = M, g.N = N, g.K = K, g.trans_b = true;  // the forward layout: X · Wᵀ
  g.ab_type = g.c_type = DType::kBF16;
  g.epilogue = GemmEpilogue::kBias;
  g.bias = dbias.data();
  g.batch = batch, g.stride_a = M * K, g.stride_b = N * K, g.stride_c = M * N;
  gemm(ctx(), g, da.data(), db.data(), dc.data());
  std::vector<float> ref(batch * M * N);
  for (int i = 0; i < batch; ++i) {
    cpu::matmul_reference<float>(ref.data() + i * M * N, a.data() + i * M * K, b.data() + i * N * K,
                                 M, N, K, false, true);
    for (int r = 0; r < M; ++r)
      for (int c = 0; c < N; ++c) ref[(i * M + r) * N + c] += bias[c];
  }
  // Output rounded to bf16 (8 bits): relative 2^-8 ≈ 4e-3 plus accumulation noise.
  EXPECT_TRUE(all_close(from_bf16(download(dc)), ref, {2e-2, 1e-2}));
}

TEST_F(GemmTest, GeluEpilogueMatchesCpuGelu) {
  const int M = 64, N = 80, K = 48;
  auto a = random_normal<float>(M * K, 21, 0.3), b = random_normal<float>(K * N, 22, 0.3);
  auto bias = random_normal<float>(N, 23);
  auto da = upload(a), db = upload(b), dbias = upload(bias);
  auto dc = poisoned<float>(M * N), daux = poisoned<float>(M * N);
  GemmArgs g;
  g.M = M, g.N = N, g.K = K;
  g.epilogue = GemmEpilogue::kBiasGeluAux;
  g.bias = dbias.data();
  g.aux = daux.data();
  gemm(ctx(), g, da.data(), db.data(), dc.data());
  std::vector<float> pre(M * N), ref(M * N);
  cpu::matmul_reference<float>(pre.data(), a.data(), b.data(), M, N, K, false, false);
  for (int r = 0; r < M; ++r)
    for (int c = 0; c < N; ++c) pre[r * N + c] += bias[c];
  cpu::gelu_fwd<float>(ref.data(), pre.data(), M * N);
  EXPECT_TRUE(all_close(download(daux), pre, {1e-5, 1e-5}));
  // cuBLASLt's GELU is the tanh form too; its tanh approximation differs in the last bits.
  EXPECT_TRUE(all_close(download(dc), ref, {1e-4, 1e-3}));
}

// The GELU backward fused into the dX product (cuBLASLt's DGELU epilogue), as the MLP's
// backward uses it: C = (A·B) ∘ gelu'(aux) against the CPU's gelu_bwd of the same product, in
// f32 and bf16 (inputs rounded to bf16 first; bf16 output: 2^-8 relative plus accumulation).
TEST_F(GemmTest, DGeluEpilogueMatchesCpuGeluBackward) {
  const int M = 64, N = 96, K = 40;
  for (DType dt : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(dtype_name(dt));
    const bool f32 = dt == DType::kF32;
    auto rounded = [f32](std::vector<float> v) { return f32 ? v : round_bf16(v); };
    const auto a = rounded(random_normal<float>(M * K, 31, 0.3));
    const auto b = rounded(random_normal<float>(K * N, 32, 0.3));
    const auto pre = rounded(random_normal<float>(M * N, 33, 1.5));  // the saved pre-GELU values
    auto da = to_device(dt, a), db = to_device(dt, b), daux = to_device(dt, pre);
    auto dc = to_device(dt, std::vector<float>(M * N, 1e30f));  // beta 0: must be overwritten
    GemmArgs g;
    g.M = M, g.N = N, g.K = K;
    g.ab_type = g.c_type = dt;
    g.epilogue = GemmEpilogue::kDGelu;
    g.aux = daux.data();
    gemm(ctx(), g, da.data(), db.data(), dc.data());
    std::vector<float> dy(M * N), ref(M * N, 0.0f);
    cpu::matmul_reference<float>(dy.data(), a.data(), b.data(), M, N, K, false, false);
    cpu::gelu_bwd<float>(ref.data(), pre.data(), dy.data(), M * N);
    // f32: cuBLASLt's tanh differs from std::tanh in the last bits.
    EXPECT_TRUE(all_close(to_host(dt, dc), ref, f32 ? forge::testing::Tol{1e-4, 1e-3} : kTolBf16));
  }
}

// Strided views (lda/ldb/ldc with batch strides), as attention uses for per-head slices of a
// (B, T, NH, HS) tensor: every transpose combination, views that start off the 256-byte
// alignment cuBLASLt assumes by default (4 bytes in f32, 8 in bf16), row strides that are not a
// multiple of 16 bytes (odd in f32; the bf16 rows of 37 or 28 elements are 2- or 8-byte aligned,
// as attention's (T, T) probabilities are for odd T), alpha and beta = 1 (accumulation). Elements
// of C outside the view must keep their sentinel value: a wrong ldc would overwrite them.
TEST_F(GemmTest, StridedViewsMatchCpu) {
  const int M = 33, N = 20, K = 24, batch = 2;
  const float kSentinel = 7.0f;  // exact in bf16
  uint64_t seed = 40;
  for (DType dt : {DType::kF32, DType::kBF16})
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " ta=" << ta << " tb=" << tb);
        const bool f32 = dt == DType::kF32;
        const int pad = f32 ? 3 : 4;  // extra elements per row and per batch entry
        const int off = f32 ? 1 : 4;  // the view starts 4 (f32) or 8 (bf16) bytes in
        const int a_rows = ta ? K : M, a_cols = ta ? M : K;
        const int b_rows = tb ? N : K, b_cols = tb ? K : N;
        const int64_t lda = a_cols + pad, ldb = b_cols + 2 * pad, ldc = N + pad;
        const int64_t sa = a_rows * lda + pad, sb = b_rows * ldb + pad, sc = M * ldc + pad;
        auto rounded = [f32](std::vector<float> v) { return f32 ? v : round_bf16(v); };
        const auto a = rounded(random_normal<float>(size_t(batch) * a_rows * a_cols, seed++));
        const auto b = rounded(random_normal<float>(size_t(batch) * b_rows * b_cols, seed++));
        const auto c0 = rounded(random_normal<float>(size_t(batch) * M * N, seed++));
        // Scatter packed (batch, rows, cols) into strided storage full of sentinels.
        auto scatter = [&](const std::vector<float>& packed, int rows, int cols, int64_t ld,
                           int64_t stride) {
          std::vector<float> st(off + batch * stride, kSentinel);
          for (int i = 0; i < batch; ++i)
            for (int r = 0; r < rows; ++r)
              for (int c = 0; c < cols; ++c)
                st[off + i * stride + r * ld + c] = packed[(size_t(i) * rows + r) * cols + c];
          return st;
        };
        auto a_st = scatter(a, a_rows, a_cols, lda, sa), b_st = scatter(b, b_rows, b_cols, ldb, sb);
        auto c_st = scatter(c0, M, N, ldc, sc);

        std::vector<float> c_ref_st = c_st;
        std::vector<float> c_ref = c0;
        for (int i = 0; i < batch; ++i)
          cpu::matmul_reference<float>(
              c_ref.data() + size_t(i) * M * N, a.data() + size_t(i) * a_rows * a_cols,
              b.data() + size_t(i) * b_rows * b_cols, M, N, K, ta, tb, 0.5f, 1.0f);
        for (int i = 0; i < batch; ++i)
          for (int r = 0; r < M; ++r)
            for (int c = 0; c < N; ++c)
              c_ref_st[off + i * sc + r * ldc + c] = c_ref[(size_t(i) * M + r) * N + c];

        GemmArgs g;
        g.M = M, g.N = N, g.K = K, g.trans_a = ta, g.trans_b = tb;
        g.ab_type = g.c_type = dt;
        g.alpha = 0.5f, g.beta = 1.0f;
        g.batch = batch, g.stride_a = sa, g.stride_b = sb, g.stride_c = sc;
        g.lda = lda, g.ldb = ldb, g.ldc = ldc;
        std::vector<float> got;
        if (f32) {
          auto da = upload(a_st), db = upload(b_st), dc = upload(c_st);
          gemm(ctx(), g, da.data() + off, db.data() + off, dc.data() + off);
          got = download(dc);
        } else {
          auto da = upload(to_bf16(a_st)), db = upload(to_bf16(b_st)), dc = upload(to_bf16(c_st));
          gemm(ctx(), g, da.data() + off, db.data() + off, dc.data() + off);
          got = from_bf16(download(dc));
        }
        // Inside the view, f32: 1e-5 as above; bf16: output rounded to bf16 (2^-9) -> 1e-2.
        // Outside it, the sentinels must be untouched (exact check below).
        const forge::testing::Tol tol =
            f32 ? forge::testing::Tol{1e-5, 1e-5} : forge::testing::Tol{1e-2, 1e-2};
        EXPECT_TRUE(all_close(got, c_ref_st, tol));
        size_t sentinel_changed = 0;
        for (size_t i = 0; i < got.size(); ++i)
          if (c_ref_st[i] == kSentinel && c_st[i] == kSentinel && got[i] != kSentinel)
            ++sentinel_changed;
        EXPECT_EQ(sentinel_changed, 0u);
      }
}

// A timed Context::gemm_algo: the first call of each plan times the heuristic's candidates on the
// call's own operands before the real product (kTimed: only those with the first's bits; kTimedAny:
// all). The calls training makes, each checked against
// the CPU: the weight gradient (bf16 in, f32 C, beta 1: C must be saved and put back, or the
// timing's ~6 products per candidate would be added to it), the forward with bias + GELU and its
// aux output, the DGELU backward, and a strided beta-1 view whose untouched elements must keep
// their sentinels. Shapes large enough that the heuristic offers several candidates.
TEST_F(GemmTest, TimedAlgorithmChoiceMatchesCpu) {
  for (const GemmAlgo algo : {GemmAlgo::kTimed, GemmAlgo::kTimedAny}) {
    SCOPED_TRACE(gemm_algo_name(algo));
    ctx_ = std::make_unique<Context>(0);  // plans are built, and their algorithms chosen, once a context
    ctx().set_gemm_algo(algo);
    const int M = 192, N = 160, K = 512;
    // bf16 inputs, f32 accumulation over 512 products in another order: ~1e-5 relative.
    const forge::testing::Tol f32_out{1e-4, 1e-4};
    {  // dW (M, N) f32 += Aᵀ (M, K)ᵀ · B (K, N), A stored (K, M)
      const auto a = round_bf16(random_normal<float>(K * M, 51)), b = round_bf16(random_normal<float>(K * N, 52));
      const auto c0 = random_normal<float>(M * N, 53);
      auto da = upload(to_bf16(a)), db = upload(to_bf16(b));
      auto dc = upload(c0);
      GemmArgs g;
      g.M = M, g.N = N, g.K = K, g.trans_a = true, g.beta = 1.0f;
      g.ab_type = DType::kBF16, g.c_type = DType::kF32;
      EXPECT_GE(gemm_candidates(ctx(), g, da.data(), db.data(), dc.data()), 1);
      gemm(ctx(), g, da.data(), db.data(), dc.data());
      std::vector<float> ref = c0;
      cpu::matmul_reference<float>(ref.data(), a.data(), b.data(), M, N, K, true, false, 1.0f, 1.0f);
      EXPECT_TRUE(all_close(download(dc), ref, f32_out)) << "accumulating weight gradient";
    }
    {  // forward X · Wᵀ + bias, GELU, pre-GELU values to aux (bf16)
      const auto a = round_bf16(random_normal<float>(M * K, 54, 0.1));
      const auto b = round_bf16(random_normal<float>(N * K, 55, 0.1));
      const auto bias = round_bf16(random_normal<float>(N, 56));
      auto da = upload(to_bf16(a)), db = upload(to_bf16(b)), dbias = upload(to_bf16(bias));
      auto dc = poisoned<uint16_t>(M * N), daux = poisoned<uint16_t>(M * N);
      GemmArgs g;
      g.M = M, g.N = N, g.K = K, g.trans_b = true;
      g.ab_type = g.c_type = DType::kBF16;
      g.epilogue = GemmEpilogue::kBiasGeluAux, g.bias = dbias.data(), g.aux = daux.data();
      gemm(ctx(), g, da.data(), db.data(), dc.data());
      std::vector<float> pre(M * N), ref(M * N);
      cpu::matmul_reference<float>(pre.data(), a.data(), b.data(), M, N, K, false, true);
      for (int r = 0; r < M; ++r)
        for (int c = 0; c < N; ++c) pre[r * N + c] += bias[c];
      cpu::gelu_fwd<float>(ref.data(), pre.data(), M * N);
      EXPECT_TRUE(all_close(from_bf16(download(daux)), pre, kTolBf16)) << "aux";
      EXPECT_TRUE(all_close(from_bf16(download(dc)), ref, kTolBf16)) << "GELU output";
    }
    {  // dX = (dY · W) ∘ gelu'(pre), bf16
      const auto a = round_bf16(random_normal<float>(M * K, 57, 0.3));
      const auto b = round_bf16(random_normal<float>(K * N, 58, 0.3));
      const auto pre = round_bf16(random_normal<float>(M * N, 59, 1.5));
      auto da = upload(to_bf16(a)), db = upload(to_bf16(b)), daux = upload(to_bf16(pre));
      auto dc = poisoned<uint16_t>(M * N);
      GemmArgs g;
      g.M = M, g.N = N, g.K = K;
      g.ab_type = g.c_type = DType::kBF16;
      g.epilogue = GemmEpilogue::kDGelu, g.aux = daux.data();
      gemm(ctx(), g, da.data(), db.data(), dc.data());
      std::vector<float> dy(M * N), ref(M * N, 0.0f);
      cpu::matmul_reference<float>(dy.data(), a.data(), b.data(), M, N, K, false, false);
      cpu::gelu_bwd<float>(ref.data(), pre.data(), dy.data(), M * N);
      EXPECT_TRUE(all_close(from_bf16(download(dc)), ref, kTolBf16)) << "DGELU";
    }
    {  // a strided f32 view, beta 1: rows of ldc = N + 5 with sentinels between them
      const int64_t ldc = N + 5;
      const float kSentinel = 7.0f;
      const auto a = random_normal<float>(M * K, 60), b = random_normal<float>(K * N, 61);
      const auto c0 = random_normal<float>(M * N, 62);
      std::vector<float> c_st(M * ldc, kSentinel), ref_st = c_st, ref = c0;
      for (int r = 0; r < M; ++r)
        for (int c = 0; c < N; ++c) c_st[r * ldc + c] = c0[r * N + c];
      cpu::matmul_reference<float>(ref.data(), a.data(), b.data(), M, N, K, false, false, 1.0f, 1.0f);
      for (int r = 0; r < M; ++r)
        for (int c = 0; c < N; ++c) ref_st[r * ldc + c] = ref[r * N + c];
      auto da = upload(a), db = upload(b), dc = upload(c_st);
      GemmArgs g;
      g.M = M, g.N = N, g.K = K, g.beta = 1.0f, g.ldc = ldc;
      gemm(ctx(), g, da.data(), db.data(), dc.data());
      const auto got = download(dc);
      EXPECT_TRUE(all_close(got, ref_st, {1e-4, 1e-4})) << "strided view";
      for (int r = 0; r < M; ++r)
        for (int64_t c = N; c < ldc; ++c) ASSERT_EQ(got[r * ldc + c], kSentinel) << r << "," << c;
    }
  }
}

// Each of the heuristic's candidates (GemmArgs::candidate, what forge bench gemm --algos times)
// computes the same product: bf16 with a bias, against the CPU.
TEST_F(GemmTest, EveryCandidateMatchesCpu) {
  const int M = 256, N = 192, K = 384;
  const auto a = round_bf16(random_normal<float>(M * K, 71)), b = round_bf16(random_normal<float>(N * K, 72));
  const auto bias = round_bf16(random_normal<float>(N, 73));
  auto da = upload(to_bf16(a)), db = upload(to_bf16(b)), dbias = upload(to_bf16(bias));
  std::vector<float> ref(M * N);
  cpu::matmul_reference<float>(ref.data(), a.data(), b.data(), M, N, K, false, true);
  for (int r = 0; r < M; ++r)
    for (int c = 0; c < N; ++c) ref[r * N + c] += bias[c];
  GemmArgs g;
  g.M = M, g.N = N, g.K = K, g.trans_b = true;
  g.ab_type = g.c_type = DType::kBF16;
  g.epilogue = GemmEpilogue::kBias, g.bias = dbias.data();
  auto dc = poisoned<uint16_t>(M * N);
  const int n = gemm_candidates(ctx(), g, da.data(), db.data(), dc.data());
  ASSERT_GE(n, 1);
  ASSERT_LE(n, 8);
  for (int k = 0; k < n; ++k) {
    auto out = poisoned<uint16_t>(M * N);
    g.candidate = k;
    gemm(ctx(), g, da.data(), db.data(), out.data());
    EXPECT_TRUE(all_close(from_bf16(download(out)), ref, kTolBf16)) << "candidate " << k << " of " << n;
  }
}

// GemmAlgo::kTimed keeps the heuristic's results bit for bit, whichever candidate its timing
// picks: the same products through a heuristic context and a kTimed one, compared exactly — an
// accumulating f32 weight gradient, a forward with bias + GELU and its aux output, and the DGELU
// backward, at shapes where the heuristic offers several candidates, with outputs enough
// (M·N ≥ 2²⁰) that kTimed compares candidates instead of keeping the first (gemm.cu).
TEST_F(GemmTest, TimedKeepsTheHeuristicsBits) {
  const int M = 2048, N = 768, K = 1024;
  const auto a = to_bf16(random_normal<float>(M * K, 81, 0.2)), b = to_bf16(random_normal<float>(N * K, 82, 0.2));
  const auto bias = to_bf16(random_normal<float>(N, 83)), pre = to_bf16(random_normal<float>(M * N, 84, 1.5));
  const auto c0 = random_normal<float>(M * N, 85);
  using Outputs = std::vector<std::vector<uint16_t>>;
  auto run = [&](GemmAlgo algo, int* candidates) {
    ctx_ = std::make_unique<Context>(0);
    ctx().set_gemm_algo(algo);
    Outputs out;
    auto da = upload(a), db = upload(b), dbias = upload(bias);
    {  // dW (M, N) f32 += A (K, M)ᵀ · B (K, N)
      auto dc = upload(c0);
      GemmArgs g;
      g.M = M, g.N = N, g.K = K, g.trans_a = true, g.beta = 1.0f;
      g.ab_type = DType::kBF16, g.c_type = DType::kF32;
      *candidates = gemm_candidates(ctx(), g, da.data(), db.data(), dc.data());
      gemm(ctx(), g, da.data(), db.data(), dc.data());
      const auto f = download(dc);
      std::vector<uint16_t> halves(2 * f.size());
      std::memcpy(halves.data(), f.data(), f.size() * sizeof(float));
      out.push_back(halves);
    }
    {  // forward A (M, K) · B (N, K)ᵀ + bias, GELU, aux
      auto dc = poisoned<uint16_t>(M * N), daux = poisoned<uint16_t>(M * N);
      GemmArgs g;
      g.M = M, g.N = N, g.K = K, g.trans_b = true;
      g.ab_type = g.c_type = DType::kBF16;
      g.epilogue = GemmEpilogue::kBiasGeluAux, g.bias = dbias.data(), g.aux = daux.data();
      gemm(ctx(), g, da.data(), db.data(), dc.data());
      out.push_back(download(dc));
      out.push_back(download(daux));
    }
    {  // dX = (A (M, K) · B (N, K)ᵀ) ∘ gelu'(pre)
      auto dc = poisoned<uint16_t>(M * N), daux = upload(pre);
      GemmArgs g;
      g.M = M, g.N = N, g.K = K, g.trans_b = true;
      g.ab_type = g.c_type = DType::kBF16;
      g.epilogue = GemmEpilogue::kDGelu, g.aux = daux.data();
      gemm(ctx(), g, da.data(), db.data(), dc.data());
      out.push_back(download(dc));
    }
    return out;
  };
  int candidates = 0;
  const Outputs heuristic = run(GemmAlgo::kHeuristic, &candidates);
  const Outputs timed = run(GemmAlgo::kTimed, &candidates);
  EXPECT_GE(candidates, 2) << "the heuristic offered one algorithm: nothing was chosen";
  const char* what[] = {"weight gradient", "GELU output", "GELU aux", "DGELU"};
  for (size_t i = 0; i < heuristic.size(); ++i) EXPECT_EQ(heuristic[i], timed[i]) << what[i];
}

// gemm_candidate_same_bits(k) says whether candidate k's output equals candidate 0's bit for bit:
// checked against the two outputs computed here, for every candidate of an accumulating product
// (and C is as it was afterwards) and of a forward with a GELU aux output (aux compared too).
TEST_F(GemmTest, CandidateSameBitsAgreesWithTheOutputs) {
  const int M = 256, N = 384, K = 1024;
  const auto a = to_bf16(random_normal<float>(M * K, 91, 0.2)), b = to_bf16(random_normal<float>(N * K, 92, 0.2));
  const auto bias = to_bf16(random_normal<float>(N, 93));
  const auto c0 = random_normal<float>(M * N, 94);
  auto da = upload(a), db = upload(b), dbias = upload(bias);
  {
    GemmArgs g;
    g.M = M, g.N = N, g.K = K, g.trans_a = true, g.beta = 1.0f;
    g.ab_type = DType::kBF16, g.c_type = DType::kF32;
    auto dc = upload(c0);
    const int n = gemm_candidates(ctx(), g, da.data(), db.data(), dc.data());
    std::vector<std::vector<float>> outs;
    for (int k = 0; k < n; ++k) {
      auto ck = upload(c0);
      g.candidate = k;
      gemm(ctx(), g, da.data(), db.data(), ck.data());
      outs.push_back(download(ck));
    }
    g.candidate = -1;
    for (int k = 0; k < n; ++k) {
      const bool same = std::memcmp(outs[k].data(), outs[0].data(), outs[0].size() * sizeof(float)) == 0;
      EXPECT_EQ(gemm_candidate_same_bits(ctx(), g, da.data(), db.data(), dc.data(), k), same) << "candidate " << k;
      EXPECT_EQ(download(dc), c0) << "C not put back after candidate " << k;
    }
  }
  {
    GemmArgs g;
    g.M = M, g.N = N, g.K = K, g.trans_b = true;
    g.ab_type = g.c_type = DType::kBF16;
    g.epilogue = GemmEpilogue::kBiasGeluAux, g.bias = dbias.data();
    auto dc = poisoned<uint16_t>(M * N), daux = poisoned<uint16_t>(M * N);
    g.aux = daux.data();
    const int n = gemm_candidates(ctx(), g, da.data(), db.data(), dc.data());
    std::vector<std::pair<std::vector<uint16_t>, std::vector<uint16_t>>> outs;
    for (int k = 0; k < n; ++k) {
      auto ck = poisoned<uint16_t>(M * N), ak = poisoned<uint16_t>(M * N);
      g.candidate = k, g.aux = ak.data();
      gemm(ctx(), g, da.data(), db.data(), ck.data());
      outs.emplace_back(download(ck), download(ak));
    }
    g.candidate = -1, g.aux = daux.data();
    for (int k = 0; k < n; ++k)
      EXPECT_EQ(gemm_candidate_same_bits(ctx(), g, da.data(), db.data(), dc.data(), k), outs[k] == outs[0])
          << "GELU forward, candidate " << k;
  }
}

// Where candidate 0's output cannot tell algorithms apart — all zero bits (a zero operand, such as
// a LoRA B at initialisation) or C unchanged by an accumulating call — the comparison refuses
// instead of calling every candidate the same, and the timed choice (made when gemm_candidates
// builds the plan) leaves C as it found it.
TEST_F(GemmTest, SameBitsRefusesABlindComparison) {
  ctx().set_gemm_algo(GemmAlgo::kTimed);  // before any plan is built
  const int M = 256, N = 384, K = 1024;
  const auto a = to_bf16(random_normal<float>(M * K, 101, 0.2));
  const std::vector<uint16_t> zeros(N * K, 0);
  const auto c0 = random_normal<float>(M * N, 102);
  auto da = upload(a), dzero = upload(zeros);
  GemmArgs g;
  g.M = M, g.N = N, g.K = K, g.trans_b = true;
  g.ab_type = g.c_type = DType::kBF16;
  {  // C = A · 0ᵀ: all zeros whatever the algorithm
    auto dc = poisoned<uint16_t>(M * N);
    const int last = gemm_candidates(ctx(), g, da.data(), dzero.data(), dc.data()) - 1;
    EXPECT_THROW(gemm_candidate_same_bits(ctx(), g, da.data(), dzero.data(), dc.data(), last), Error);
  }
  g.c_type = DType::kF32, g.beta = 1.0f;
  {  // C += A · 0ᵀ: C as it was
    auto dc = upload(c0);
    const int last = gemm_candidates(ctx(), g, da.data(), dzero.data(), dc.data()) - 1;
    EXPECT_EQ(download(dc), c0) << "the timed choice did not put C back";
    EXPECT_THROW(gemm_candidate_same_bits(ctx(), g, da.data(), dzero.data(), dc.data(), last), Error);
    EXPECT_EQ(download(dc), c0) << "the refused comparison did not put C back";
    gemm(ctx(), g, da.data(), dzero.data(), dc.data());
    EXPECT_EQ(download(dc), c0);
  }
}

}  // namespace
}  // namespace forge::cuda
