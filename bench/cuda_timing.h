// Timing and input helpers of the CUDA micro-benchmarks (forge bench gemm and its --fp8 rows).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <vector>

#include "forge/backend/cuda/check.h"
#include "forge/backend/cuda/context.h"
#include "forge/backend/cuda/ops.h"
#include "forge/core/rng.h"

namespace forge::bench {

// Seconds per call of `op` (which enqueues on ctx's stream): CUDA events around 20 calls after 3
// warm-ups, the median of 5 such trials.
inline double time_op(cuda::Context& ctx, const std::function<void()>& op) {
  cudaEvent_t e0, e1;
  FORGE_CUDA_CHECK(cudaEventCreate(&e0));
  FORGE_CUDA_CHECK(cudaEventCreate(&e1));
  for (int i = 0; i < 3; ++i) op();
  std::vector<float> trials;
  for (int t = 0; t < 5; ++t) {
    FORGE_CUDA_CHECK(cudaEventRecord(e0, ctx.stream()));
    for (int i = 0; i < 20; ++i) op();
    FORGE_CUDA_CHECK(cudaEventRecord(e1, ctx.stream()));
    FORGE_CUDA_CHECK(cudaEventSynchronize(e1));
    float ms = 0;
    FORGE_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    trials.push_back(ms / 20);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  std::sort(trials.begin(), trials.end());
  return trials[2] * 1e-3;
}

// Fills a bf16 buffer with normal(0, scale) values: 2^20 generated on the host (in f32, converted
// on the device), then repeated by device copies — host generation of the largest operands
// (65,536 × 3,072) would take longer than the benchmark.
inline void fill_random_bf16(cuda::Context& ctx, void* dst, size_t n, uint64_t seed, float scale = 1.0f) {
  const size_t block = std::min<size_t>(n, size_t{1} << 20);
  std::vector<float> h(block);
  for (size_t i = 0; i < block; ++i) h[i] = scale * philox_normal(seed, 3, i);
  cuda::DeviceBuffer<float> tmp(ctx.allocator(), block);
  FORGE_CUDA_CHECK(cudaMemcpy(tmp.data(), h.data(), block * 4, cudaMemcpyHostToDevice));
  FORGE_CUDA_CHECK(cudaDeviceSynchronize());  // the DMA must land before convert() reads it
  cuda::convert(ctx, DType::kBF16, dst, DType::kF32, tmp.data(), block);
  auto* bytes = static_cast<char*>(dst);
  for (size_t done = block; done < n;) {
    const size_t k = std::min(done, n - done);
    FORGE_CUDA_CHECK(cudaMemcpyAsync(bytes + done * 2, bytes, k * 2, cudaMemcpyDeviceToDevice, ctx.stream()));
    done += k;
  }
  ctx.synchronize();
}

}  // namespace forge::bench
