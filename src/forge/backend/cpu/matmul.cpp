// CPU matmul: OpenBLAS for speed, plus a plain-loop reference with a double accumulator.
//
// Threading: OpenBLAS runs single-threaded and we split the rows of C across OpenMP threads.
// Two thread pools (OpenBLAS's pthreads and libgomp's) on the same cores fight: libgomp's
// threads spin after every parallel region while OpenBLAS's wait for a core. Measured on the
// 2-core CI machine, tiny preset at 16×128 tokens: ~1,100 tokens/s with both pools, ~4,000
// with OpenBLAS alone on one core. With one pool all cores work on every product.
//
// Determinism: OpenBLAS's result for a row of C depends on how many rows the call has (its
// edge kernels and its blocking along that dimension sum in another order), so splitting the
// rows by thread count made C depend on the thread count (1 vs 3 threads on 237×70×149: 140 of
// 16,590 elements differ in the last bits). The row chunks are therefore a function of the
// shape only — at most kMaxChunks chunks of a multiple of kRowAlign rows, one per ~1 MFLOP —
// and a thread takes whole chunks, so every call OpenBLAS sees is the same for any thread count.
#include "forge/ops/matmul.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>

#include "forge/core/error.h"

namespace forge::cpu {
namespace {

// Rows [m0, m0 + rows) of C; lda is the full A's leading dimension.
void gemm_rows(float* c, const float* a, const float* b, int rows, int N, int K, bool ta,
               bool tb, int lda, float alpha, float beta) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
              rows, N, K, alpha, a, lda, b, tb ? K : N, beta, c, N);
}

void gemm_rows(double* c, const double* a, const double* b, int rows, int N, int K, bool ta,
               bool tb, int lda, double alpha, double beta) {
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
              rows, N, K, alpha, a, lda, b, tb ? K : N, beta, c, N);
}

// C's rows in chunks of `rows` (the last may be shorter): a function of (M, N, K) alone.
struct RowChunks {
  int rows, count;
};

RowChunks row_chunks(int M, int N, int K) {
  // Below ~1 MFLOP per chunk a fork costs more than it saves. The cap bounds the extra packing:
  // OpenBLAS packs all of op(B) once per call, so each chunk beyond the thread count repeats it
  // (all products of a tiny-preset step, run serially: 490 ms in 2 chunks, 481 ms in 8, 492 ms
  // in 16). It also caps one product at 8 threads, plenty for a reference backend.
  constexpr int64_t kFlopsPerChunk = 1000000;
  constexpr int kMaxChunks = 8;
  constexpr int kRowAlign = 16;  // whole micro-tiles for OpenBLAS's usual unrolls (4, 8, 16)
  const int64_t flops = 2LL * M * N * K;
  const int want = static_cast<int>(std::clamp<int64_t>(flops / kFlopsPerChunk, 1, kMaxChunks));
  const int per_chunk = (M + want - 1) / want;
  const int rows = (per_chunk + kRowAlign - 1) / kRowAlign * kRowAlign;
  return {rows, (M + rows - 1) / rows};
}

template <typename T>
void gemm(T* c, const T* a, const T* b, int M, int N, int K, bool ta, bool tb, T alpha, T beta) {
  static const bool single = [] {
    openblas_set_num_threads(1);
    return true;
  }();
  (void)single;
  const int lda = ta ? M : K;
  const RowChunks chunks = row_chunks(M, N, K);
  const int threads = std::min(chunks.count, omp_get_max_threads());
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1)
  for (int i = 0; i < chunks.count; ++i) {
    const int m0 = i * chunks.rows, rows = std::min(chunks.rows, M - m0);
    // Row m0 of op(A): A(m0, 0) when A is (M, K); column m0 of A when A is (K, M).
    const T* a0 = ta ? a + m0 : a + static_cast<int64_t>(m0) * K;
    gemm_rows(c + static_cast<int64_t>(m0) * N, a0, b, rows, N, K, ta, tb, lda, alpha, beta);
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
