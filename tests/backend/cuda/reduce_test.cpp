// CUDA sum_in_order against its CPU twin (backend/cpu/reduce.cpp): equal bit for bit, since both
// add in index order in f64. Sizes around the kernel's 16-element unrolled body (0, 1, 15, 16,
// 17), a step's worth of losses (65,536 + 3), and views at offset 1 (misaligned: no float4s).
#include "forge/ops/reduce.h"

#include <cmath>

#include "cuda_testing.h"
#include "forge/backend/cuda/ops.h"

namespace forge::cuda {
namespace {

using namespace forge::cuda::testing;

class ReduceTest : public CudaTest {};

TEST_F(ReduceTest, SumInOrderEqualsTheCpuLoop) {
  for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{15}, int64_t{16}, int64_t{17}, int64_t{65539}})
    for (int offset : {0, 1}) {
      // Cross-entropy-like values: positive, spread over several binades, so the order matters.
      auto x = random_normal<float>(n + offset, 200 + n);
      for (float& v : x) v = std::exp(2.0f * v);
      auto dx = upload(x);
      auto out = poisoned<double>(1);
      sum_in_order(ctx(), out.data(), dx.data() + offset, n);
      const double want = cpu::sum_in_order(x.data() + offset, n);
      const double got = download(out)[0];
      EXPECT_EQ(got, want) << "n=" << n << " offset=" << offset;
    }
}

}  // namespace
}  // namespace forge::cuda
