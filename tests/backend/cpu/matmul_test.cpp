#include "forge/ops/matmul.h"

#include "testing.h"

namespace forge::cpu {
namespace {

using forge::testing::all_close;
using forge::testing::random_normal;

// Every transpose combination, awkward sizes, alpha/beta, against the double-accumulator loop.
TEST(Matmul, AllTransposesMatchReference) {
  const int M = 17, N = 13, K = 29;
  uint64_t seed = 100;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      auto a = random_normal<float>(M * K, seed++);
      auto b = random_normal<float>(K * N, seed++);
      auto c = random_normal<float>(M * N, seed++);
      auto ref = c;
      matmul<float>(c.data(), a.data(), b.data(), M, N, K, ta, tb, 0.5f, 2.0f);
      matmul_reference<float>(ref.data(), a.data(), b.data(), M, N, K, ta, tb, 0.5f, 2.0f);
      EXPECT_TRUE(all_close(c, ref, forge::testing::kTolF32)) << "ta=" << ta << " tb=" << tb;
    }
  }
}

// Products big enough to be cut into chunks of rows (M >= N) or of columns (N > M), with short
// last chunks, in both dtypes: every chunk's operand offsets and leading dimensions are right.
TEST(Matmul, SplitProductsMatchReference) {
  const int shapes[][3] = {{237, 70, 149}, {45, 397, 120}, {3, 509, 700}};
  uint64_t seed = 200;
  for (const auto& s : shapes) {
    const int M = s[0], N = s[1], K = s[2];
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) {
        auto a = random_normal<double>(M * K, seed++);
        auto b = random_normal<double>(K * N, seed++);
        auto c = random_normal<double>(M * N, seed++);
        auto ref = c;
        matmul<double>(c.data(), a.data(), b.data(), M, N, K, ta, tb, 0.5, 2.0);
        matmul_reference<double>(ref.data(), a.data(), b.data(), M, N, K, ta, tb, 0.5, 2.0);
        EXPECT_TRUE(all_close(c, ref, forge::testing::kTolF64))
            << "M=" << M << " N=" << N << " K=" << K << " ta=" << ta << " tb=" << tb;
        std::vector<float> af(a.begin(), a.end()), bf(b.begin(), b.end()), cf(M * N);
        matmul<float>(cf.data(), af.data(), bf.data(), M, N, K, ta, tb);
        matmul_reference<double>(ref.data(), a.data(), b.data(), M, N, K, ta, tb);
        // f32 sums of K products of unit normals: the rounding error grows like eps·K (a few
        // 1e-5 at K = 700 where the sum cancels to a small value), beyond kTolF32's 1e-5 floor
        // (seen: 2e-5 at K = 700 on one machine's OpenBLAS kernels); a wrong chunk offset is O(1).
        const forge::testing::Tol tol{2e-7 * K, forge::testing::kTolF32.rtol};
        EXPECT_TRUE(all_close(cf, ref, tol))
            << "float M=" << M << " N=" << N << " K=" << K << " ta=" << ta << " tb=" << tb;
      }
    }
  }
}

TEST(Matmul, ReferenceMatchesHandComputedProduct) {
  // [[1,2],[3,4]] · [[5,6],[7,8]] = [[19,22],[43,50]]
  const double a[] = {1, 2, 3, 4}, b[] = {5, 6, 7, 8};
  double c[4];
  matmul_reference<double>(c, a, b, 2, 2, 2, false, false);
  EXPECT_EQ(c[0], 19);
  EXPECT_EQ(c[1], 22);
  EXPECT_EQ(c[2], 43);
  EXPECT_EQ(c[3], 50);
  matmul_reference<double>(c, a, b, 2, 2, 2, true, false);  // Aᵀ·B = [[26,30],[38,44]]
  EXPECT_EQ(c[0], 26);
  EXPECT_EQ(c[3], 44);
}

TEST(Matmul, BatchedUsesStrides) {
  const int M = 5, N = 6, K = 7, batch = 3;
  auto a = random_normal<double>(batch * M * K, 1);
  auto b = random_normal<double>(batch * K * N, 2);
  std::vector<double> c(batch * M * N), ref(batch * M * N);
  matmul_batched<double>(c.data(), a.data(), b.data(), M, N, K, false, true, batch, M * K, K * N,
                         M * N);
  for (int i = 0; i < batch; ++i)
    matmul_reference<double>(ref.data() + i * M * N, a.data() + i * M * K, b.data() + i * K * N, M,
                             N, K, false, true);
  EXPECT_TRUE(all_close(c, ref, forge::testing::kTolF64));
}

}  // namespace
}  // namespace forge::cpu
