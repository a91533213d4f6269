// CUDA fused LM head + cross-entropy against the CPU composition it replaces, in double:
// logits = cpu::linear_fwd (kOutIn), cpu::cross_entropy_fwd/bwd, cpu::linear_bwd. Inputs are
// rounded to the kernel dtype first. Cases: V = 1000 padded to 1024 (one partial chunk), GPT-2's
// V = 50257 padded to 50304 with N = 64, which spans seven 8192-column f32 chunks with a partial
// last one, and V = 70000, whose bf16 rows are longer than the row kernel's 65,536-column
// register segment. The bf16 path chunks rows instead: lm_head_cross_entropy_bf16 (cross_entropy.h)
// takes the chunk size, so small N can span several row chunks with a partial last one.
//
// The padded rows of w hold random values ~10× the real ones (padded logits ~N(0, 16²)), so a
// kernel that let a padded column into the softmax would change every loss grossly; the padded
// rows of dw must come back bit-identical (the f32 path never touches them, the bf16 path adds
// exact zeros), and the dx rows of ignored targets too.
// Rows include ignored targets (−1) in the first and the last row chunk and targets in the first
// and the last real column.
//
// bf16 logits: the kernel rounds each logit to bf16 before the softmax, so the reference does the
// same (the tolerance measures the kernel, not the rounding). To make the two roundings agree bit
// for bit, the bf16 inputs are quantised: x to multiples of 1/16 in [−4, 4], w to multiples of
// 1/256 in [−0.5, 0.5] (both exact in bf16). Every product is then a multiple of 2^-12 below 2 in
// magnitude and every partial sum over C ≤ 64 terms is below 2^7: 19 significant bits, exact in
// f32 in any summation order, so the GPU's f32-accumulated logits equal the double ones exactly
// and round to the same bf16. With that, the losses keep the f32 tolerance.
//
// Gradient tolerances scale with Σ|terms| of each output element (|prefill| + |dlogits|·|w| for
// dx, |dlogits|ᵀ·|x| for dw): with V = 50257 most dlogits are ~1/V, so one absolute tolerance
// would either drown the softmax part of dw or fail on the onehot part.
#include "forge/ops/cross_entropy.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "cuda_testing.h"
#include "forge/backend/cuda/cross_entropy.h"
#include "forge/backend/cuda/ops.h"
#include "forge/ops/linear.h"

namespace forge::cuda {
namespace {

using namespace forge::cuda::testing;
using forge::testing::random_ids;

struct CeShape {
  int N, C, V, Vp;
};

// |got − ref| <= atol + rtol·bound per element; prints the first mismatches.
::testing::AssertionResult close_within_bound(const std::vector<float>& got,
                                              const std::vector<double>& ref,
                                              const std::vector<double>& bound, double rtol,
                                              double atol) {
  if (got.size() != ref.size()) return ::testing::AssertionFailure() << "size mismatch";
  size_t bad = 0;
  std::string first;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(double(got[i]) - ref[i]);
    if (!(err <= atol + rtol * bound[i])) {
      if (bad < 5)
        first += "\n  [" + std::to_string(i) + "] got " + std::to_string(got[i]) + " want " +
                 std::to_string(ref[i]) + " bound " + std::to_string(bound[i]);
      ++bad;
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad << " of " << got.size() << " differ:" << first;
}

std::vector<double> abs_of(const std::vector<double>& v) {
  std::vector<double> a(v.size());
  for (size_t i = 0; i < v.size(); ++i) a[i] = std::fabs(v[i]);
  return a;
}

class CrossEntropyTest : public CudaTest {
 protected:
  struct Inputs {
    std::vector<float> x, w, dx0, dw0;
    std::vector<int32_t> targets;
    float dloss = 0.37f;
  };
  // Multiples of 1/scale, clamped to ±limit (see the file comment: exact bf16 logits).
  static std::vector<float> quantised(std::vector<float> v, double scale, double limit) {
    for (float& e : v)
      e = static_cast<float>(std::clamp(std::round(e * scale), -limit * scale, limit * scale) /
                             scale);
    return v;
  }
  static Inputs make_inputs(DType dt, const CeShape& s, uint64_t seed) {
    auto rounded = [dt](std::vector<float> v) { return round_to(dt, v); };
    const bool bf16 = dt != DType::kF32;  // both 16-bit types: the quantised inputs below
    Inputs in;
    in.x = random_normal<float>(size_t(s.N) * s.C, seed);
    // Logits ~ N(0, 1.6²): a softmax that is neither flat nor one-hot.
    in.w = random_normal<float>(size_t(s.V) * s.C, seed + 1, 0.2);
    if (bf16) {
      if (s.C > 64) ADD_FAILURE() << "C = " << s.C << " > 64: bf16 logits no longer exact in f32";
      in.x = quantised(in.x, 16, 4), in.w = quantised(in.w, 256, 0.5);
    }
    in.x = rounded(in.x);
    const std::vector<float> padded = random_normal<float>(size_t(s.Vp - s.V) * s.C, seed + 5, 2.0);
    in.w.insert(in.w.end(), padded.begin(), padded.end());
    in.w = rounded(in.w);
    in.dx0 = rounded(random_normal<float>(size_t(s.N) * s.C, seed + 2, 0.1));
    in.dw0 = random_normal<float>(size_t(s.Vp) * s.C, seed + 3, 1e-4);  // f32 always
    // f16: dloss as fp16 training passes it, times a loss scale (2^10 here), so dlogits ~ dloss/V
    // are normal f16 numbers rather than subnormals with 2^-24 absolute steps.
    if (dt == DType::kF16) in.dloss *= 1024.0f;
    in.targets = random_ids(s.N, s.V, seed + 4);
    in.targets[0] = 0;
    in.targets[1] = s.V - 1;                // in the last (partial) vocabulary chunk
    in.targets[3] = -1;                     // ignored
    if (s.N > 6) in.targets[s.N - 2] = -1;  // ignored, in the last row chunk
    return in;
  }

  struct Outputs {
    std::vector<float> losses_fwd_only, losses, dx, dw;
  };
  // chunk_rows > 0: the bf16 path with that many rows per chunk; 0: the op of ops.h.
  Outputs run_gpu(DType dt, const CeShape& s, const Inputs& in, int chunk_rows = 0) {
    auto x = to_device(dt, in.x), w = to_device(dt, in.w), dx = to_device(dt, in.dx0);
    auto dw = upload(in.dw0);
    auto targets = upload(in.targets);
    auto dloss = upload(std::vector<float>{in.dloss});
    auto losses1 = poisoned<float>(s.N), losses2 = poisoned<float>(s.N);
    auto op = [&](float* losses, void* dx_p, float* dw_p, const float* dloss_p) {
      if (chunk_rows > 0)
        lm_head_cross_entropy_bf16(ctx(), losses, dx_p, dw_p, x.data(), w.data(), targets.data(),
                                   dloss_p, s.N, s.C, s.V, s.Vp, chunk_rows);
      else
        lm_head_cross_entropy(ctx(), dt, losses, dx_p, dw_p, x.data(), w.data(), targets.data(),
                              dloss_p, s.N, s.C, s.V, s.Vp);
    };
    op(losses1.data(), nullptr, nullptr, nullptr);
    op(losses2.data(), dx.data(), dw.data(), dloss.data());
    return {download(losses1), download(losses2), to_host(dt, dx), download(dw)};
  }

  // rtol_grad: relative to Σ|terms| (see the file comment).
  void check_against_cpu(DType dt, const CeShape& s, double rtol_grad, int chunk_rows = 0) {
    SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " N=" << s.N << " C=" << s.C << " V="
                                      << s.V << " Vp=" << s.Vp << " chunk_rows=" << chunk_rows);
    const Inputs in = make_inputs(dt, s, 1000 + s.V);
    const Outputs gpu = run_gpu(dt, s, in, chunk_rows);

    const std::vector<double> x(in.x.begin(), in.x.end()), w(in.w.begin(), in.w.end());
    std::vector<double> logits(size_t(s.N) * s.Vp), losses(s.N), dlogits(logits.size());
    cpu::linear_fwd<double>(logits.data(), x.data(), w.data(), nullptr, s.N, s.C, s.Vp,
                            WeightLayout::kOutIn);
    if (dt == DType::kBF16)  // the kernel's bf16 logits (exact f32 values, see the file comment)
      for (double& l : logits) l = bf16_to_f32(f32_to_bf16(static_cast<float>(l)));
    if (dt == DType::kF16)  // likewise f16 (x and w are exact in f16 too: 7 and 8 bits)
      for (double& l : logits) l = f16_to_f32(f32_to_f16(static_cast<float>(l)));
    cpu::cross_entropy_fwd<double>(losses.data(), logits.data(), in.targets.data(), s.N, s.V, s.Vp);
    cpu::cross_entropy_bwd<double>(dlogits.data(), logits.data(), in.targets.data(), in.dloss, s.N,
                                   s.V, s.Vp);
    std::vector<double> dx(in.dx0.begin(), in.dx0.end()), dw(in.dw0.begin(), in.dw0.end());
    cpu::linear_bwd<double>(dx.data(), dw.data(), nullptr, dlogits.data(), x.data(), w.data(), s.N,
                            s.C, s.Vp, WeightLayout::kOutIn);
    std::vector<double> dx_bound = abs_of(std::vector<double>(in.dx0.begin(), in.dx0.end()));
    std::vector<double> dw_bound = abs_of(std::vector<double>(in.dw0.begin(), in.dw0.end()));
    cpu::linear_bwd<double>(dx_bound.data(), dw_bound.data(), nullptr, abs_of(dlogits).data(),
                            abs_of(x).data(), abs_of(w).data(), s.N, s.C, s.Vp,
                            WeightLayout::kOutIn);

    // Losses: in both dtypes the reference sees the kernel's logits (f32 GEMM sums; for bf16,
    // the same values rounded to bf16) and the softmax statistics are f32: the f32 tolerance,
    // atol 1e-5, rtol 1e-4.
    const forge::testing::Tol tol_loss{1e-5, 1e-4};
    EXPECT_TRUE(all_close(gpu.losses_fwd_only, losses, tol_loss)) << "forward-only losses";
    EXPECT_TRUE(all_close(gpu.losses, losses, tol_loss)) << "losses with backward";
    // atol 1e-12: far below the smallest gradient terms (~dloss·x/V ≈ 1e-6).
    EXPECT_TRUE(close_within_bound(gpu.dx, dx, dx_bound, rtol_grad, 1e-12)) << "dx";
    EXPECT_TRUE(close_within_bound(gpu.dw, dw, dw_bound, rtol_grad, 1e-12)) << "dw";
    // Exact: ignored rows get loss 0 and leave dx alone; padded rows of dw receive nothing.
    for (int n = 0; n < s.N; ++n) {
      if (in.targets[n] >= 0) continue;
      EXPECT_EQ(gpu.losses[n], 0.0f) << "ignored row " << n;
      EXPECT_EQ(gpu.losses_fwd_only[n], 0.0f) << "ignored row " << n;
      EXPECT_EQ(0, std::memcmp(gpu.dx.data() + size_t(n) * s.C, in.dx0.data() + size_t(n) * s.C,
                               sizeof(float) * s.C))
          << "dx of ignored row " << n;
    }
    EXPECT_EQ(0, std::memcmp(gpu.dw.data() + size_t(s.V) * s.C, in.dw0.data() + size_t(s.V) * s.C,
                             sizeof(float) * size_t(s.Vp - s.V) * s.C))
        << "dw of the padded rows";
  }
};

// f32: GEMM and softmax rounding in f32, summed over up to 50257 terms: ~sqrt(V)·6e-8 ≈ 1.3e-5
// of Σ|terms| typically -> rtol 1e-4.
TEST_F(CrossEntropyTest, F32SmallVocabMatchesCpu) {
  check_against_cpu(DType::kF32, {37, 64, 1000, 1024}, 1e-4);
}
TEST_F(CrossEntropyTest, F32GptVocabManyChunksMatchesCpu) {
  check_against_cpu(DType::kF32, {64, 64, 50257, 50304}, 1e-4);
}
TEST_F(CrossEntropyTest, F32Vocab70kMatchesCpu) {
  check_against_cpu(DType::kF32, {8, 32, 70000, 70016}, 1e-4);
}
// bf16: dlogits rounded to bf16 as a GEMM operand (≤ 2^-8 of each term) and dx stored in bf16
// (≤ 2^-8 of |dx| ≤ bound): at most 2·2^-8 ≈ 7.8e-3 of Σ|terms| -> rtol 1e-2. (The logits' own
// bf16 rounding is in the reference, see the file comment.)
TEST_F(CrossEntropyTest, Bf16SmallVocabMatchesCpu) {
  check_against_cpu(DType::kBF16, {37, 64, 1000, 1024}, 1e-2);
}
TEST_F(CrossEntropyTest, Bf16GptVocabMatchesCpu) {
  check_against_cpu(DType::kBF16, {64, 64, 50257, 50304}, 1e-2);
}
// Rows longer than one 65,536-column register segment: the write pass re-reads the first one;
// target V − 1 lies in the second.
TEST_F(CrossEntropyTest, Bf16Vocab70kBeyondOneRegisterSegmentMatchesCpu) {
  check_against_cpu(DType::kBF16, {8, 32, 70000, 70016}, 1e-2);
}
// Several row chunks with a partial last one (128 + 128 + 77 and 48 + 48 + 4 rows): dx rows are
// written by their own chunk only, dw accumulates over the chunks.
TEST_F(CrossEntropyTest, Bf16RowChunksWithPartialLastChunkMatchCpu) {
  check_against_cpu(DType::kBF16, {333, 64, 1000, 1024}, 1e-2, 128);
  check_against_cpu(DType::kBF16, {100, 64, 50257, 50304}, 1e-2, 48);
}

// f16 (fp16 training) on the same row-chunk path: dlogits rounded to f16 as a GEMM operand
// (<= 2^-11 of each term, dloss scaled so none is subnormal) and dx stored in f16: 2e-3 of
// Σ|terms|, the same ~4x margin the bf16 cases have over 2^-8.
TEST_F(CrossEntropyTest, F16SmallVocabMatchesCpu) {
  check_against_cpu(DType::kF16, {37, 64, 1000, 1024}, 2e-3);
}
TEST_F(CrossEntropyTest, F16GptVocabMatchesCpu) {
  check_against_cpu(DType::kF16, {64, 64, 50257, 50304}, 2e-3);
}

TEST_F(CrossEntropyTest, RunsAreBitIdentical) {
  const CeShape s{64, 64, 50257, 50304};
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    const Inputs in = make_inputs(dt, s, 77);
    const Outputs a = run_gpu(dt, s, in), b = run_gpu(dt, s, in);
    auto same = [](const std::vector<float>& p, const std::vector<float>& q) {
      return p.size() == q.size() && std::memcmp(p.data(), q.data(), p.size() * 4) == 0;
    };
    EXPECT_TRUE(same(a.losses, b.losses)) << dtype_name(dt);
    EXPECT_TRUE(same(a.dx, b.dx)) << dtype_name(dt);
    EXPECT_TRUE(same(a.dw, b.dw)) << dtype_name(dt);
  }
  const Inputs in = make_inputs(DType::kBF16, s, 78);  // three row chunks
  const Outputs a = run_gpu(DType::kBF16, s, in, 24), b = run_gpu(DType::kBF16, s, in, 24);
  EXPECT_EQ(0, std::memcmp(a.losses.data(), b.losses.data(), a.losses.size() * 4));
  EXPECT_EQ(0, std::memcmp(a.dx.data(), b.dx.data(), a.dx.size() * 4));
  EXPECT_EQ(0, std::memcmp(a.dw.data(), b.dw.data(), a.dw.size() * 4));
}

}  // namespace
}  // namespace forge::cuda
