// CPU fused softmax + cross-entropy (reference). Per row of logits (N, Vp): max over the V real
// columns, Σ exp(x − max) in double, loss = log Σ − (x_target − max). The padded columns
// [V, Vp) exist only so the vocabulary matmul has a friendly width; they are never read here,
// never enter the softmax, and get gradient exactly 0.
//
// The backward may run in place (dlogits == logits, saving an (N, Vp) buffer at large vocab):
// each row's max and sum are computed completely before the first write, and each column is
// read just before it is overwritten. OpenMP over rows; a row is owned by one thread, so the
// result does not depend on the thread count.
#include "forge/ops/cross_entropy.h"

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <cstdint>
#include <vector>

#include "forge/core/error.h"
#include "forge/ops/linear.h"

namespace forge::cpu {
namespace {

constexpr int32_t kIgnoreIndex = -1;

void check_args(int N, int V, int Vp, const char* op) {
  FORGE_CHECK(N >= 0 && V > 0 && Vp >= V, "[", op, "] bad shape N=", N, " V=", V, " Vp=", Vp);
}

void check_target(int32_t target, int64_t row, int V, const char* op) {
  FORGE_CHECK(target == kIgnoreIndex || (target >= 0 && target < V), "[", op, "] target ", target,
              " of row ", row, " outside [0, ", V, ") and not ignore_index -1");
}

// exp of a max-subtracted logit (<= 0). The float path uses expf (relative error ~1e-7, below
// f32 rounding of the inputs) because the double exp was ~10% of a CPU training step with a
// 2,048-token vocabulary; sums stay in double. The double path keeps libm's double exp.
template <typename T>
double exp_shifted(double v) {
  if constexpr (std::is_same_v<T, float>) return std::exp(static_cast<float>(v));
  else return std::exp(v);
}

// Max of the real columns and Σ exp(x − max) over them, in double.
struct RowStats {
  double max, sum;
};

template <typename T>
RowStats row_stats(const T* x, int V) {
  double mx = -INFINITY;
  for (int j = 0; j < V; ++j) mx = std::max(mx, static_cast<double>(x[j]));
  double sum = 0;
  for (int j = 0; j < V; ++j) sum += exp_shifted<T>(static_cast<double>(x[j]) - mx);
  return {mx, sum};
}

}  // namespace

template <typename T>
void cross_entropy_fwd(T* losses, const T* logits, const int32_t* targets, int N, int V, int Vp) {
  check_args(N, V, Vp, "cross_entropy_fwd");
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const int32_t target = targets[n];
    check_target(target, n, V, "cross_entropy_fwd");
    if (target == kIgnoreIndex) {
      losses[n] = T(0);
      continue;
    }
    const T* x = logits + n * Vp;  // (Vp)
    const RowStats st = row_stats(x, V);
    losses[n] = static_cast<T>(std::log(st.sum) - (static_cast<double>(x[target]) - st.max));
  }
}

template <typename T>
void cross_entropy_bwd(T* dlogits, const T* logits, const int32_t* targets, T dloss, int N, int V,
                       int Vp) {
  check_args(N, V, Vp, "cross_entropy_bwd");
  const double g = static_cast<double>(dloss);
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const int32_t target = targets[n];
    check_target(target, n, V, "cross_entropy_bwd");
    const T* x = logits + n * Vp;  // (Vp), may be the same memory as dx
    T* dx = dlogits + n * Vp;      // (Vp)
    if (target == kIgnoreIndex) {
      std::fill(dx, dx + Vp, T(0));
      continue;
    }
    const RowStats st = row_stats(x, V);  // before any write to this row
    for (int j = 0; j < V; ++j) {
      const double p = exp_shifted<T>(static_cast<double>(x[j]) - st.max) / st.sum;
      dx[j] = static_cast<T>(g * (p - (j == target ? 1.0 : 0.0)));
    }
    std::fill(dx + V, dx + Vp, T(0));
  }
}

namespace {

// Rows per chunk of logits: about 4M elements (16 MiB in f32), a function of the shape alone
// so that the order dw is summed in (chunk by chunk) never depends on the thread count. The
// tiny preset's (2048, 2048) logits are one chunk: the same three GEMMs as unchunked.
int head_chunk_rows(int N, int Vp) {
  const int64_t budget = int64_t{1} << 22;
  return static_cast<int>(std::clamp<int64_t>(budget / std::max(Vp, 1), 1, std::max(N, 1)));
}

}  // namespace

template <typename T>
void lm_head_cross_entropy(T* losses, T* dx, T* dw, const T* x, const T* w, const int32_t* targets,
                           T dloss, int N, int C, int V, int Vp) {
  check_args(N, V, Vp, "lm_head_cross_entropy");
  FORGE_CHECK(dw == nullptr || dx != nullptr, "[lm_head_cross_entropy] dw needs dx");
  const int rows = head_chunk_rows(N, Vp);
  std::vector<T> logits(static_cast<size_t>(std::min(rows, N)) * Vp);  // (rows, Vp)
  for (int r0 = 0; r0 < N; r0 += rows) {
    const int n = std::min(rows, N - r0);
    const T* xc = x + static_cast<int64_t>(r0) * C;  // (n, C)
    linear_fwd<T>(logits.data(), xc, w, nullptr, n, C, Vp, WeightLayout::kOutIn);
    cross_entropy_fwd<T>(losses + r0, logits.data(), targets + r0, n, V, Vp);
    if (dx == nullptr) continue;
    cross_entropy_bwd<T>(logits.data(), logits.data(), targets + r0, dloss, n, V, Vp);
    linear_bwd<T>(dx + static_cast<int64_t>(r0) * C, dw, nullptr, logits.data(), xc, w, n, C, Vp,
                  WeightLayout::kOutIn);
  }
}

#define FORGE_INSTANTIATE(T)                                                       \
  template void cross_entropy_fwd<T>(T*, const T*, const int32_t*, int, int, int); \
  template void cross_entropy_bwd<T>(T*, const T*, const int32_t*, T, int, int, int); \
  template void lm_head_cross_entropy<T>(T*, T*, T*, const T*, const T*, const int32_t*, T, int, int, \
                                         int, int);
FORGE_INSTANTIATE(float)
FORGE_INSTANTIATE(double)
#undef FORGE_INSTANTIATE

}  // namespace forge::cpu
