// Matrix products, row-major. Transposes are flags, never copies.
// CPU: OpenBLAS (Debian's libopenblas) for float/double; matmul_reference is the plain triple
// loop with a double accumulator that tests compare against.
#pragma once

#include <cstdint>

namespace forge::cpu {

// C (M, N) = alpha · op(A) · op(B) + beta · C. op(A) is (M, K): A is stored (M, K), or (K, M)
// when trans_a. op(B) is (K, N): B is stored (K, N), or (N, K) when trans_b.
template <typename T>
void matmul(T* c, const T* a, const T* b, int M, int N, int K, bool trans_a, bool trans_b,
            T alpha = T(1), T beta = T(0));

// `batch` independent products; operand i starts at a + i·stride_a (and so on), in elements.
template <typename T>
void matmul_batched(T* c, const T* a, const T* b, int M, int N, int K, bool trans_a,
                    bool trans_b, int batch, int64_t stride_a, int64_t stride_b,
                    int64_t stride_c, T alpha = T(1), T beta = T(0));

// Same contract as matmul, computed with plain loops and a double accumulator (test reference).
template <typename T>
void matmul_reference(T* c, const T* a, const T* b, int M, int N, int K, bool trans_a,
                      bool trans_b, T alpha = T(1), T beta = T(0));

}  // namespace forge::cpu
