// CPU elementwise activations (GELU tanh form, SwiGLU) and the residual add.
// All elementwise and computed in T: there is no reduction, so nothing needs a double
// accumulator. Each element is independent, so a plain parallel loop is deterministic.
//
// GELU (tanh form), with u = √(2/π)·(x + 0.044715·x³):
//   y  = 0.5·x·(1 + tanh u)
//   y' = 0.5·(1 + tanh u) + 0.5·x·(1 − tanh² u)·√(2/π)·(1 + 3·0.044715·x²)
// SwiGLU, with σ the logistic function and silu(g) = g·σ(g):
//   d/dg silu(g) = σ(g)·(1 + g·(1 − σ(g)))
// σ is written 1 / (1 + exp(−g)): for very negative g, exp overflows to inf and σ → 0, which is
// the right limit, so no branch is needed.
#include "forge/ops/activation.h"

#include <cmath>
#include <type_traits>

namespace forge::cpu {
namespace {

constexpr double kGeluScale = 0.7978845608028654;  // √(2/π)
constexpr double kGeluCubic = 0.044715;

// tanh through one exp: tanh u = 1 − 2/(e^{2u} + 1). glibc's tanhf goes through expm1f and was
// ~20% of a CPU training step of the tiny preset (perf, 2-core machine); this form costs one
// expf. Its absolute error stays ~1e-7 (it loses relative accuracy only near u = 0, where GELU
// multiplies by 1 + tanh u anyway). Saturates cleanly: e^{2u} = inf gives 1, 0 gives −1.
template <typename T>
T tanh_via_exp(T u) {
  if constexpr (std::is_same_v<T, double>) {
    return std::tanh(u);  // the double path is the reference: keep libm's
  } else {
    return T(1) - T(2) / (std::exp(T(2) * u) + T(1));
  }
}

template <typename T>
T sigmoid(T z) {
  return T(1) / (T(1) + std::exp(-z));
}

}  // namespace

template <typename T>
void gelu_fwd(T* out, const T* inp, int64_t n) {
  const T k = static_cast<T>(kGeluScale), a = static_cast<T>(kGeluCubic);
#pragma omp parallel for
  for (int64_t i = 0; i < n; ++i) {
    const T x = inp[i];
    out[i] = T(0.5) * x * (T(1) + tanh_via_exp(k * (x + a * x * x * x)));
  }
}

template <typename T>
void gelu_bwd(T* dinp, const T* inp, const T* dout, int64_t n) {
  const T k = static_cast<T>(kGeluScale), a = static_cast<T>(kGeluCubic);
#pragma omp parallel for
  for (int64_t i = 0; i < n; ++i) {
    const T x = inp[i];
    const T th = tanh_via_exp(k * (x + a * x * x * x));
    const T du_dx = k * (T(1) + T(3) * a * x * x);
    const T grad = T(0.5) * (T(1) + th) + T(0.5) * x * (T(1) - th * th) * du_dx;
    dinp[i] += grad * dout[i];
  }
}

// One element of SwiGLU and of its backward, shared by the dense and the row-strided ops so
// that both give the same bits.
namespace {
template <typename T>
T swiglu_of(T g, T u) {
  return g * sigmoid(g) * u;
}
template <typename T>
void swiglu_grads_of(T g, T u, T d, T* dg, T* du) {
  const T s = sigmoid(g);
  *dg = d * u * s * (T(1) + g * (T(1) - s));
  *du = d * g * s;
}
}  // namespace

template <typename T>
void swiglu_fwd(T* out, const T* gate, const T* up, int64_t n) {
#pragma omp parallel for
  for (int64_t i = 0; i < n; ++i) out[i] = swiglu_of(gate[i], up[i]);
}

template <typename T>
void swiglu_bwd(T* dgate, T* dup, const T* dout, const T* gate, const T* up, int64_t n) {
#pragma omp parallel for
  for (int64_t i = 0; i < n; ++i) swiglu_grads_of(gate[i], up[i], dout[i], &dgate[i], &dup[i]);
}

template <typename T>
void swiglu_fwd_rows(T* out, const T* gate, const T* up, int64_t rows, int ff, int64_t ld) {
#pragma omp parallel for
  for (int64_t r = 0; r < rows; ++r)
    for (int c = 0; c < ff; ++c) out[r * ff + c] = swiglu_of(gate[r * ld + c], up[r * ld + c]);
}

template <typename T>
void swiglu_bwd_rows(T* dgate, T* dup, const T* dout, const T* gate, const T* up, int64_t rows, int ff,
                     int64_t ld) {
#pragma omp parallel for
  for (int64_t r = 0; r < rows; ++r)
    for (int c = 0; c < ff; ++c) {
      const int64_t i = r * ld + c;
      swiglu_grads_of(gate[i], up[i], dout[r * ff + c], &dgate[i], &dup[i]);
    }
}

template <typename T>
void residual_fwd(T* out, const T* a, const T* b, int64_t n) {
#pragma omp parallel for
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

template <typename T>
void residual_bwd(T* da, T* db, const T* dout, int64_t n) {
#pragma omp parallel for
  for (int64_t i = 0; i < n; ++i) {
    da[i] += dout[i];
    db[i] += dout[i];
  }
}

#define FORGE_INSTANTIATE(T)                                                  \
  template void gelu_fwd<T>(T*, const T*, int64_t);                           \
  template void gelu_bwd<T>(T*, const T*, const T*, int64_t);                 \
  template void swiglu_fwd<T>(T*, const T*, const T*, int64_t);               \
  template void swiglu_bwd<T>(T*, T*, const T*, const T*, const T*, int64_t); \
  template void swiglu_fwd_rows<T>(T*, const T*, const T*, int64_t, int, int64_t); \
  template void swiglu_bwd_rows<T>(T*, T*, const T*, const T*, const T*, int64_t, int, int64_t); \
  template void residual_fwd<T>(T*, const T*, const T*, int64_t);             \
  template void residual_bwd<T>(T*, T*, const T*, int64_t);
FORGE_INSTANTIATE(float)
FORGE_INSTANTIATE(double)
#undef FORGE_INSTANTIATE

}  // namespace forge::cpu
