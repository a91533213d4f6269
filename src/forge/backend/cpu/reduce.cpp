#include "forge/ops/reduce.h"

namespace forge::cpu {

double sum_in_order(const float* x, int64_t n) {
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += x[i];
  return sum;
}

}  // namespace forge::cpu
