// CUDA fused LM head + cross-entropy against the CPU composition it replaces, in double:
// logits = cpu::linear_fwd (kOutIn), cpu::cross_entropy_fwd/bwd, cpu::linear_bwd. Inputs are
// rounded to the kernel dtype first. Cases: V = 1000 padded to 1024 (one partial chunk), and
// GPT-2's V = 50257 padded to 50304 with N = 64, which spans seven 8192-column chunks with a
// partial last one. The padded rows of w hold random values, so a kernel that let padded
// columns into the softmax would change every loss. Rows include an ignored target (−1) and
// targets in the first and the last real column.
//
// Gradient tolerances scale with Σ|terms| of each output element (|prefill| + |dlogits|·|w| for
// dx, |dlogits|ᵀ·|x| for dw): with V = 50257 most dlogits are ~1/V, so one absolute tolerance
// would either drown the softmax part of dw or fail on the onehot part.
#include "forge/ops/cross_entropy.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "cuda_testing.h"
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
  static Inputs make_inputs(DType dt, const CeShape& s, uint64_t seed) {
    auto rounded = [dt](std::vector<float> v) { return dt == DType::kBF16 ? round_bf16(v) : v; };
    Inputs in;
    in.x = rounded(random_normal<float>(size_t(s.N) * s.C, seed));
    // Logits ~ N(0, 1.6²): a softmax that is neither flat nor one-hot.
    in.w = rounded(random_normal<float>(size_t(s.Vp) * s.C, seed + 1, 0.2));
    in.dx0 = rounded(random_normal<float>(size_t(s.N) * s.C, seed + 2, 0.1));
    in.dw0 = random_normal<float>(size_t(s.Vp) * s.C, seed + 3, 1e-4);  // f32 always
    in.targets = random_ids(s.N, s.V, seed + 4);
    in.targets[0] = 0;
    in.targets[1] = s.V - 1;  // in the last (partial) chunk
    in.targets[3] = -1;       // ignored
    return in;
  }

  struct Outputs {
    std::vector<float> losses_fwd_only, losses, dx, dw;
  };
  Outputs run_gpu(DType dt, const CeShape& s, const Inputs& in) {
    auto x = to_device(dt, in.x), w = to_device(dt, in.w), dx = to_device(dt, in.dx0);
    auto dw = upload(in.dw0);
    auto targets = upload(in.targets);
    auto dloss = upload(std::vector<float>{in.dloss});
    auto losses1 = poisoned<float>(s.N), losses2 = poisoned<float>(s.N);
    lm_head_cross_entropy(ctx(), dt, losses1.data(), nullptr, nullptr, x.data(), w.data(),
                          targets.data(), nullptr, s.N, s.C, s.V, s.Vp);
    lm_head_cross_entropy(ctx(), dt, losses2.data(), dx.data(), dw.data(), x.data(), w.data(),
                          targets.data(), dloss.data(), s.N, s.C, s.V, s.Vp);
    return {download(losses1), download(losses2), to_host(dt, dx), download(dw)};
  }

  // rtol_grad: relative to Σ|terms| (see the file comment).
  void check_against_cpu(DType dt, const CeShape& s, double rtol_grad) {
    SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " N=" << s.N << " C=" << s.C
                                      << " V=" << s.V << " Vp=" << s.Vp);
    const Inputs in = make_inputs(dt, s, 1000 + s.V);
    const Outputs gpu = run_gpu(dt, s, in);

    const std::vector<double> x(in.x.begin(), in.x.end()), w(in.w.begin(), in.w.end());
    std::vector<double> logits(size_t(s.N) * s.Vp), losses(s.N), dlogits(logits.size());
    cpu::linear_fwd<double>(logits.data(), x.data(), w.data(), nullptr, s.N, s.C, s.Vp,
                            cpu::WeightLayout::kOutIn);
    cpu::cross_entropy_fwd<double>(losses.data(), logits.data(), in.targets.data(), s.N, s.V, s.Vp);
    cpu::cross_entropy_bwd<double>(dlogits.data(), logits.data(), in.targets.data(), in.dloss, s.N,
                                   s.V, s.Vp);
    std::vector<double> dx(in.dx0.begin(), in.dx0.end()), dw(in.dw0.begin(), in.dw0.end());
    cpu::linear_bwd<double>(dx.data(), dw.data(), nullptr, dlogits.data(), x.data(), w.data(), s.N,
                            s.C, s.Vp, cpu::WeightLayout::kOutIn);
    std::vector<double> dx_bound = abs_of(std::vector<double>(in.dx0.begin(), in.dx0.end()));
    std::vector<double> dw_bound = abs_of(std::vector<double>(in.dw0.begin(), in.dw0.end()));
    cpu::linear_bwd<double>(dx_bound.data(), dw_bound.data(), nullptr, abs_of(dlogits).data(),
                            abs_of(x).data(), abs_of(w).data(), s.N, s.C, s.Vp,
                            cpu::WeightLayout::kOutIn);

    // Losses: in both dtypes the logits are exact products of the (rounded) inputs summed in
    // f32, and the softmax statistics are f32: the brief's f32 tolerance, atol 1e-5, rtol 1e-4.
    const forge::testing::Tol tol_loss{1e-5, 1e-4};
    EXPECT_TRUE(all_close(gpu.losses_fwd_only, losses, tol_loss)) << "forward-only losses";
    EXPECT_TRUE(all_close(gpu.losses, losses, tol_loss)) << "losses with backward";
    EXPECT_EQ(gpu.losses[3], 0.0f) << "ignored row";
    // atol 1e-12: far below the smallest gradient terms (~dloss·x/V ≈ 1e-6).
    EXPECT_TRUE(close_within_bound(gpu.dx, dx, dx_bound, rtol_grad, 1e-12)) << "dx";
    EXPECT_TRUE(close_within_bound(gpu.dw, dw, dw_bound, rtol_grad, 1e-12)) << "dw";
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
// bf16: dlogits rounded to bf16 as a GEMM operand (2^-9 of each term) and dx stored in bf16
// (2^-9 of |dx| ≤ bound): at most ~4e-3 of Σ|terms| -> rtol 1e-2.
TEST_F(CrossEntropyTest, Bf16SmallVocabMatchesCpu) {
  check_against_cpu(DType::kBF16, {37, 64, 1000, 1024}, 1e-2);
}
TEST_F(CrossEntropyTest, Bf16GptVocabManyChunksMatchesCpu) {
  check_against_cpu(DType::kBF16, {64, 64, 50257, 50304}, 1e-2);
}

TEST_F(CrossEntropyTest, RunsAreBitIdentical) {
  const CeShape s{64, 64, 50257, 50304};
  for (DType dt : {DType::kF32, DType::kBF16}) {
    const Inputs in = make_inputs(dt, s, 77);
    const Outputs a = run_gpu(dt, s, in), b = run_gpu(dt, s, in);
    auto same = [](const std::vector<float>& p, const std::vector<float>& q) {
      return p.size() == q.size() && std::memcmp(p.data(), q.data(), p.size() * 4) == 0;
    };
    EXPECT_TRUE(same(a.losses, b.losses)) << dtype_name(dt);
    EXPECT_TRUE(same(a.dx, b.dx)) << dtype_name(dt);
    EXPECT_TRUE(same(a.dw, b.dw)) << dtype_name(dt);
  }
}

}  // namespace
}  // namespace forge::cuda
