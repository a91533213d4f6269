// Plain reductions over flat buffers.
#pragma once

#include <cstdint>

namespace forge::cpu {

// Σ x[i] for i = 0 … n−1, accumulated in double in index order: the result of a plain loop, so
// the CUDA twin (cuda::sum_in_order, one thread in the same order) gives it bit for bit. The
// trainer's loss is this sum over per-position losses divided by the number of targets; summing
// it in the same order everywhere keeps the logged loss independent of where it was computed.
double sum_in_order(const float* x, int64_t n);

}  // namespace forge::cpu
