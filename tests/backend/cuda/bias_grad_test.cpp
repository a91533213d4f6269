// CUDA bias_grad against a double-precision host sum (cpu::bias_grad<double>), f32 and bf16:
// (4096, 768) a GPT-2 projection; (1, 2304) and (513, 2304) one row and a short last split at
// the qkv width; (37, 100) and (1, 3) widths that are not a multiple of the vector (bf16: 8) or,
// for OC = 3, of anything; a misaligned dout view; and N = 65536 rows, where the 512-split cap
// gives 128-row splits, on a constant input whose sum is known.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>

#include "forge/backend/cuda/ops.h"
#include "forge/ops/linear.h"
#include "op_testing.h"

namespace forge::cuda {
namespace {

using namespace forge::cuda::testing;

class BiasGradTest : public DtypeTest<CudaTest> {};

struct Shape {
  int N, OC;
};

std::string where(const Shape& s) {
  return "N=" + std::to_string(s.N) + " OC=" + std::to_string(s.OC);
}

// dbias0 + Σ_n dout[n, :] in double.
std::vector<double> host_sum(const std::vector<float>& dout, const std::vector<float>& dbias0,
                             const Shape& s) {
  std::vector<double> ref(dbias0.begin(), dbias0.end());
  const auto dout_d = forge::testing::to_double(dout);
  cpu::bias_grad<double>(ref.data(), dout_d.data(), s.N, s.OC);
  return ref;
}

// Accumulates onto a non-zero dbias, matches the host sum, and two runs are bit-identical.
TEST_P(BiasGradTest, AddsColumnSumsDeterministically) {
  const Shape shapes[] = {{4096, 768}, {1, 2304}, {513, 2304}, {37, 100}, {1, 3}};
  uint64_t seed = 10;
  for (const Shape& s : shapes) {
    const size_t n = static_cast<size_t>(s.N) * s.OC;
    const auto dout = as_dt(dt(), random_normal<float>(n, seed++));
    const auto dbias0 = random_normal<float>(s.OC, seed++);
    const auto ref = host_sum(dout, dbias0, s);
    auto ddout = up(dout);
    std::vector<float> got[2];
    for (int run = 0; run < 2; ++run) {
      auto ddbias = upload(dbias0);
      bias_grad(ctx(), dt(), ddbias.data(), ddout.data(), s.N, s.OC);
      got[run] = download(ddbias);
    }
    EXPECT_TRUE(all_close(got[0], ref, kTolWgrad)) << where(s);
    EXPECT_TRUE(same_bits(got[0], got[1])) << "rerun " << where(s);
  }
}

// A column slice of wider rows (Qwen2's v slice of the fused q|k|v gradient): (4096, 256) at
// column 1152 of rows 1664 wide (the vector kernel) and (37, 100) at column 3 of rows 211 (the
// element one); the columns around it must not leak in.
TEST_P(BiasGradTest, StridedSliceMatchesTheDenseSum) {
  struct Case {
    int N, OC, off, ld;
  };
  uint64_t seed = 60;
  for (const Case& c : {Case{4096, 256, 1152, 1664}, Case{37, 100, 3, 211}}) {
    const Shape s{c.N, c.OC};
    const auto full = as_dt(dt(), random_normal<float>(static_cast<size_t>(c.N) * c.ld, seed++));
    std::vector<float> slice;
    for (int r = 0; r < c.N; ++r)
      slice.insert(slice.end(), full.begin() + static_cast<size_t>(r) * c.ld + c.off,
                   full.begin() + static_cast<size_t>(r) * c.ld + c.off + c.OC);
    const auto dbias0 = random_normal<float>(c.OC, seed++);
    auto dfull = up(full);
    auto ddbias = upload(dbias0);
    bias_grad(ctx(), dt(), ddbias.data(), dfull.at(c.off), c.N, c.OC, c.ld);
    EXPECT_TRUE(all_close(download(ddbias), host_sum(slice, dbias0, s), kTolWgrad)) << where(s) << " ld=" << c.ld;
  }
}

// dout one element past a 16-byte boundary: OC = 768 would take the vector kernel, the
// misaligned view must take the element one.
TEST_P(BiasGradTest, MisalignedDout) {
  const Shape s{300, 768};
  const size_t n = static_cast<size_t>(s.N) * s.OC;
  const auto dout = as_dt(dt(), random_normal<float>(n, 30));
  const auto dbias0 = random_normal<float>(s.OC, 31);
  std::vector<float> padded(n + 1, 0.0f);
  std::copy(dout.begin(), dout.end(), padded.begin() + 1);
  auto ddout = up(padded);
  auto ddbias = upload(dbias0);
  bias_grad(ctx(), dt(), ddbias.data(), ddout.at(1), s.N, s.OC);
  EXPECT_TRUE(all_close(download(ddbias), host_sum(dout, dbias0, s), kTolWgrad)) << where(s);
}

// N = 65536 (a GPT-2 step's B·T) filled with the byte 0x3C: every element is the same value v
// (bf16 0x3C3C = 0.011474609375, whose multiples up to 2^16·v are exact in f32, so the bf16
// sum is exactly 752; f32 0x3C3C3C3C, summed with rounding). Also prints the time per call at
// the widths of GPT-2's biased projections (768: attention and MLP output, 2304: qkv, 3072: fc).
TEST_P(BiasGradTest, LargeNConstantInput) {
  const int N = 65536;
  const size_t elem = dtype_size(dt());
  float v = 0.0f;
  if (dt() == DType::kF32) {
    const uint32_t bits = 0x3C3C3C3Cu;
    std::memcpy(&v, &bits, sizeof(v));
  } else if (dt() == DType::kF16) {
    v = f16_to_f32(0x3C3C);  // 1.05859375: partial sums past 2^14 round in f32, as f32's do
  } else {
    v = bf16_to_f32(0x3C3C);
  }
  for (const int OC : {768, 2304, 3072}) {
    const size_t n = static_cast<size_t>(N) * OC;
    DeviceBuffer<char> ddout(ctx().allocator(), n * elem);
    FORGE_CUDA_CHECK(cudaMemsetAsync(ddout.data(), 0x3C, n * elem, ctx().stream()));
    auto ddbias = upload(std::vector<float>(OC, 1.0f));
    bias_grad(ctx(), dt(), ddbias.data(), ddout.data(), N, OC);
    const std::vector<double> want(OC, 1.0 + static_cast<double>(N) * v);
    const auto got = download(ddbias);
    if (dt() == DType::kBF16) {
      EXPECT_TRUE(all_close(got, want, Tol{0, 0})) << "OC=" << OC;
    } else {
      EXPECT_TRUE(all_close(got, want, kTolWgrad)) << "OC=" << OC;
    }

    constexpr int kReps = 20;
    cudaEvent_t start, stop;
    FORGE_CUDA_CHECK(cudaEventCreate(&start));
    FORGE_CUDA_CHECK(cudaEventCreate(&stop));
    FORGE_CUDA_CHECK(cudaEventRecord(start, ctx().stream()));
    for (int r = 0; r < kReps; ++r) bias_grad(ctx(), dt(), ddbias.data(), ddout.data(), N, OC);
    FORGE_CUDA_CHECK(cudaEventRecord(stop, ctx().stream()));
    FORGE_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0.0f;
    FORGE_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    FORGE_CUDA_CHECK(cudaEventDestroy(start));
    FORGE_CUDA_CHECK(cudaEventDestroy(stop));
    const double us = 1e3 * ms / kReps;
    std::printf("  bias_grad %s N=%d OC=%d: %.1f us/call, %.0f GB/s of dout\n", dt_name(dt()), N,
                OC, us, static_cast<double>(n * elem) / (us * 1e3));
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, BiasGradTest,
                         ::testing::Values(DType::kF32, DType::kBF16, DType::kF16),
                         [](const auto& info) { return std::string(dt_name(info.param)); });

}  // namespace
}  // namespace forge::cuda
