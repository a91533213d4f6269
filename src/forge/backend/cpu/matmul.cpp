// CPU matmul: OpenBLAS for speed, plus a plain-loop reference with a double accumulator.
//
// Threading: OpenBLAS runs single-threaded and we split C in chunks of rows or columns over
// OpenMP threads. Two thread pools (OpenBLAS's pthreads and libgomp's) on the same cores fight:
// libgomp's threads spin after every parallel region while OpenBLAS's wait for a core. Measured
// on the 2-core CI machine, tiny preset at 16×128 tokens: ~1,100 tokens/s with both pools,
// ~4,000 with OpenBLAS alone on one core. With one pool all cores work on every product.
//
// Determinism: OpenBLAS's result for an element of C depends on the shape of the call that
// computes it (its edge kernels and its blocking sum in another order), so splitting the rows
// by thread count made C depend on the thread count (1 vs 3 threads on 237×70×149: 140 of 16,590
// elements differ in the last bits). The chunks are now a function of the shape only (split_of
// below) and a thread takes whole chunks, so every call OpenBLAS sees is the same for any
// thread count.
#include "forge/ops/matmul.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>

#include "forge/core/error.h"

namespace forge::cpu {
namespace {

// The block C[m0 : m0 + rows, n0 : n0 + cols] of the product; every leading dimension is that
// of the full matrix.
struct Block {
  int m0, rows, n0, cols;
};

void gemm_block(float* c, const float* a, const float* b, int M, int N, int K, bool ta, bool tb,
                float alpha, float beta, Block blk) {
  // Row m0 of op(A): A(m0, 0) when A is (M, K), column m0 of A when A is (K, M); likewise
  // column n0 of op(B).
  const float* a0 = ta ? a + blk.m0 : a + static_cast<int64_t>(blk.m0) * K;
  const float* b0 = tb ? b + static_cast<int64_t>(blk.n0) * K : b + blk.n0;
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
              blk.rows, blk.cols, K, alpha, a0, ta ? M : K, b0, tb ? K : N, beta,
              c + static_cast<int64_t>(blk.m0) * N + blk.n0, N);
}

void gemm_block(double* c, const double* a, const double* b, int M, int N, int K, bool ta, bool tb,
                double alpha, double beta, Block blk) {
  const double* a0 = ta ? a + blk.m0 : a + static_cast<int64_t>(blk.m0) * K;
  const double* b0 = tb ? b + static_cast<int64_t>(blk.n0) * K : b + blk.n0;
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
              blk.rows, blk.cols, K, alpha, a0, ta ? M : K, b0, tb ? K : N, beta,
              c + static_cast<int64_t>(blk.m0) * N + blk.n0, N);
}

// How a product is cut into independent calls: `count` chunks of `size` rows (or columns) of C,
// the last one possibly shorter. A function of (M, N, K) alone, never of the thread count.
struct Split {
  bool columns;  // chunks of columns of C rather than of rows
  int size, count;
};

Split split_of(int M, int N, int K) {
  // OpenBLAS packs the whole of op(B) once per call for a chunk of rows, the whole of op(A) for
  // a chunk of columns; every chunk beyond the first repeats that packing, so the longer side of
  // C is the one cut (the repeated operand is then the smaller one). All products of a tiny-preset
  // step, best of 12 on two cores of an H200 host: 290 ms with 2 threads against 352 ms for the
  // old split of rows by thread count (419 vs 401 ms with 1 thread, where the old code made one
  // call). Below ~1 MFLOP per chunk a fork costs more than it saves; at least 64 rows or columns
  // per chunk keep the repeated packing small next to the work; a power-of-two count splits
  // evenly over 2 or 4 threads.
  constexpr int64_t kFlopsPerChunk = 1000000;
  constexpr int kMaxChunks = 8;  // also caps one product at 8 threads, plenty for a reference
  constexpr int kMinSize = 64;
  constexpr int kAlign = 16;  // whole micro-tiles for OpenBLAS's usual unrolls (4, 8, 16)
  const bool columns = N > M;
  const int extent = columns ? N : M;
  const int64_t flops = 2LL * M * N * K;
  const int64_t want = std::min<int64_t>({flops / kFlopsPerChunk, kMaxChunks, extent / kMinSize});
  int count = 1;
  while (count * 2 <= want) count *= 2;
  const int size = ((extent + count - 1) / count + kAlign - 1) / kAlign * kAlign;
  return {columns, size, (extent + size - 1) / size};
}

template <typename T>
void gemm(T* c, const T* a, const T* b, int M, int N, int K, bool ta, bool tb, T alpha, T beta) {
  static const bool single = [] {
    openblas_set_num_threads(1);
    return true;
  }();
  (void)single;
  const Split split = split_of(M, N, K);
  const int extent = split.columns ? N : M;
  const int threads = std::min(split.count, omp_get_max_threads());
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1)
  for (int i = 0; i < split.count; ++i) {
    const int e0 = i * split.size, len = std::min(split.size, extent - e0);
    const Block blk = split.columns ? Block{0, M, e0, len} : Block{e0, len, 0, N};
    gemm_block(c, a, b, M, N, K, ta, tb, alpha, beta, blk);
  }
}

}  // namespace

template <typename T>
void matmul(T* c, const T* a, const T* b, int M, int N, int K, bool trans_a, bool trans_b,
            T alpha, T beta) {
  FORGE_CHECK(M >= 0 && N >= 0 && K >= 0, "[matmul] negative dims ", M, " ", N, " ", K);
  if (M == 0 || N == 0) return;
  if (K == 0) {  // BLAS leaves C untouched for K = 0 only when beta = 1; make it explicit.
    for (int64_t i = 0; i < static_cast<int64_t>(M) * N; ++i) c[i] = beta == T(0) ? T(0) : beta * c[i];
    return;
  }
  gemm(c, a, b, M, N, K, trans_a, trans_b, alpha, beta);
}

template <typename T>
void matmul_batched(T* c, const T* a, const T* b, int M, int N, int K, bool trans_a,
                    bool trans_b, int batch, int64_t stride_a, int64_t stride_b,
                    int64_t stride_c, T alpha, T beta) {
  for (int i = 0; i < batch; ++i)
    matmul(c + i * stride_c, a + i * stride_a, b + i * stride_b, M, N, K, trans_a, trans_b, alpha,
           beta);
}

template <typename T>
void matmul_reference(T* c, const T* a, const T* b, int M, int N, int K, bool trans_a,
                      bool trans_b, T alpha, T beta) {
  for (int i = 0; i < M; ++i) {
    for (int j = 0; j < N; ++j) {
      double acc = 0;
      for (int k = 0; k < K; ++k) {
        const double av = trans_a ? a[static_cast<int64_t>(k) * M + i] : a[static_cast<int64_t>(i) * K + k];
        const double bv = trans_b ? b[static_cast<int64_t>(j) * K + k] : b[static_cast<int64_t>(k) * N + j];
        acc += av * bv;
      }
      T& out = c[static_cast<int64_t>(i) * N + j];
      out = static_cast<T>(alpha * acc + (beta == T(0) ? 0.0 : static_cast<double>(beta) * out));
    }
  }
}

#define FORGE_INSTANTIATE(T)                                                                   \
  template void matmul<T>(T*, const T*, const T*, int, int, int, bool, bool, T, T);           \
  template void matmul_batched<T>(T*, const T*, const T*, int, int, int, bool, bool, int,     \
                                  int64_t, int64_t, int64_t, T, T);                           \
  template void matmul_reference<T>(T*, const T*, const T*, int, int, int, bool, bool, T, T);
FORGE_INSTANTIATE(float)
FORGE_INSTANTIATE(double)
#undef FORGE_INSTANTIATE

}  // namespace forge::cpu
