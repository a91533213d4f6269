// CPU global gradient norm. Σ g² is accumulated in double over fixed blocks of kBlock elements:
// the blocks are summed in parallel into their own slots and the slots are then added serially
// in block order. The block boundaries do not depend on the thread count, so neither does the
// result (bit for bit), unlike an OpenMP reduction, whose combining order follows the threads.
#include "forge/ops/grad_norm.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "forge/core/error.h"

namespace forge::cpu {

template <typename T>
double sum_squares(const T* g, int64_t n) {
  FORGE_CHECK(n >= 0, "[sum_squares] negative size ", n);
  constexpr int64_t kBlock = 1 << 16;
  const int64_t num_blocks = (n + kBlock - 1) / kBlock;
  std::vector<double> partial(num_blocks);  // (num_blocks)
#pragma omp parallel for
  for (int64_t b = 0; b < num_blocks; ++b) {
    const int64_t end = std::min(n, (b + 1) * kBlock);
    double s = 0;
    for (int64_t i = b * kBlock; i < end; ++i) s += static_cast<double>(g[i]) * g[i];
    partial[b] = s;
  }
  double total = 0;
  for (double s : partial) total += s;
  return total;
}

template <typename T>
double global_norm(const T* g, int64_t n) {
  return std::sqrt(sum_squares(g, n));
}

template double sum_squares<float>(const float*, int64_t);
template double sum_squares<double>(const double*, int64_t);
template double global_norm<float>(const float*, int64_t);
template double global_norm<double>(const double*, int64_t);

}  // namespace forge::cpu
