// Global gradient norm and clipping (torch.nn.utils.clip_grad_norm_ semantics).
#pragma once

#include <cstdint>

namespace forge::cpu {

// Σ g² over a flat buffer, accumulated in double in a fixed order (deterministic). Data-parallel
// runners add the shards' sums over ranks before the square root.
template <typename T>
double sum_squares(const T* g, int64_t n);

// sqrt(sum_squares(g, n)).
template <typename T>
double global_norm(const T* g, int64_t n);

}  // namespace forge::cpu

namespace forge {

// The factor that clips to max_norm: min(1, max_norm / (norm + 1e-6)); 1 when max_norm <= 0.
inline double clip_scale(double norm, double max_norm) {
  if (max_norm <= 0) return 1.0;
  const double s = max_norm / (norm + 1e-6);
  return s < 1.0 ? s : 1.0;
}

}  // namespace forge
