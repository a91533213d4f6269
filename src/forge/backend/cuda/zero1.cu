// The ZeRO-1 step's small kernels (zero1.h).
#include <cuda_runtime.h>

#include <algorithm>

#include "forge/backend/cuda/check.h"
#include "forge/backend/cuda/zero1.h"
#include "forge/core/error.h"

namespace forge::cuda {
namespace {

__global__ void scale_kernel(float* __restrict__ x, float s, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    x[i] *= s;
}

__global__ void pack_record_kernel(double* __restrict__ record, const float* __restrict__ sum_sq,
                                   const double* __restrict__ loss_sums,
                                   const double* __restrict__ counts, int micros) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  record[0] = static_cast<double>(sum_sq[0]);
  record[1] = static_cast<double>(micros);
  for (int i = 0; i < micros; ++i) {
    record[2 + i] = loss_sums[i];
    record[2 + micros + i] = counts[i];
  }
}

__global__ void reduce_records_kernel(float* __restrict__ global_sq, double* __restrict__ loss_sums,
                                      const double* __restrict__ records, int world, int micros) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  const int rec = 2 + 2 * micros;  // zero1_record_size (a host function)
  double sq = 0;
  for (int r = 0; r < world; ++r) sq = __dadd_rn(sq, records[r * rec]);
  global_sq[0] = static_cast<float>(sq);
  for (int i = 0; i < micros; ++i) {
    double s = 0;
    for (int r = 0; r < world; ++r) s = __dadd_rn(s, records[r * rec + 2 + i]);
    loss_sums[i] = s;
  }
}

}  // namespace

void scale_inplace(Context& ctx, float* x, float s, int64_t n) {
  FORGE_CHECK(n >= 0, "[scale_inplace] negative size ", n);
  if (n == 0) return;
  const int threads = 256;
  const int64_t blocks = std::min<int64_t>((n + threads - 1) / threads, 4096);
  scale_kernel<<<static_cast<unsigned>(blocks), threads, 0, ctx.stream()>>>(x, s, n);
  FORGE_CUDA_CHECK_LAUNCH();
}

void zero1_pack_record(Context& ctx, double* record, const float* sum_sq, const double* loss_sums,
                       const double* counts, int micros) {
  FORGE_CHECK(micros >= 1, "[zero1_pack_record] ", micros, " micro-batches");
  pack_record_kernel<<<1, 32, 0, ctx.stream()>>>(record, sum_sq, loss_sums, counts, micros);
  FORGE_CUDA_CHECK_LAUNCH();
}

void zero1_reduce_records(Context& ctx, float* global_sq, double* loss_sums, const double* records,
                          int world, int micros) {
  FORGE_CHECK(world >= 1 && micros >= 1, "[zero1_reduce_records] ", world, " ranks, ", micros,
              " micro-batches");
  reduce_records_kernel<<<1, 32, 0, ctx.stream()>>>(global_sq, loss_sums, records, world, micros);
  FORGE_CUDA_CHECK_LAUNCH();
}

}  // namespace forge::cuda
