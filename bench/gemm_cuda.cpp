// forge bench gemm: cuBLASLt TFLOP/s on the GEMM shapes of one training step of a preset
// (micro-batch × sequence rows), forward and both backward layouts, next to the 8192³ ceiling
// measured on the same GPU in the same run. Timing: CUDA events around 20 repetitions after
// 3 warm-ups, median of 5 such trials; inputs are random (never zeros: they run faster).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <fstream>

#include <nlohmann/json.hpp>

#include "bench.h"
#include "forge/backend/cuda/check.h"
#include "forge/backend/cuda/context.h"
#include "forge/backend/cuda/gemm.h"
#include "forge/backend/cuda/ops.h"
#include "forge/backend/cuda/runtime.h"
#include "forge/core/error.h"
#include "forge/core/rng.h"
#include "forge/model/config.h"

namespace forge::bench {

namespace {

struct Shape {
  std::string what;
  int M, N, K;
  bool ta, tb;
};

// Fills a bf16 buffer with normal(0, 1) values (generated in f32 on the host, converted on the
// device).
void fill_random(cuda::Context& ctx, void* dst, size_t n, uint64_t seed) {
  std::vector<float> h(n);
  for (size_t i = 0; i < n; ++i) h[i] = philox_normal(seed, 3, i);
  cuda::DeviceBuffer<float> tmp(ctx.allocator(), n);
  FORGE_CUDA_CHECK(cudaMemcpy(tmp.data(), h.data(), n * 4, cudaMemcpyHostToDevice));
  FORGE_CUDA_CHECK(cudaDeviceSynchronize());  // the DMA must land before convert() reads it
  cuda::convert(ctx, DType::kBF16, dst, DType::kF32, tmp.data(), n);
  ctx.synchronize();
}

double time_gemm(cuda::Context& ctx, const cuda::GemmArgs& g, const void* a, const void* b, void* c) {
  cudaEvent_t e0, e1;
  FORGE_CUDA_CHECK(cudaEventCreate(&e0));
  FORGE_CUDA_CHECK(cudaEventCreate(&e1));
  for (int i = 0; i < 3; ++i) cuda::gemm(ctx, g, a, b, c);
  std::vector<float> trials;
  for (int t = 0; t < 5; ++t) {
    FORGE_CUDA_CHECK(cudaEventRecord(e0, ctx.stream()));
    for (int i = 0; i < 20; ++i) cuda::gemm(ctx, g, a, b, c);
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

}  // namespace

void gemm_cuda(const BenchOptions& o) {
  if (!cuda::available()) throw Error("forge bench gemm needs a CUDA GPU: " + cuda::device_summary());
  cuda::Context ctx(0);
  const ModelConfig cfg = preset_config(o.preset);
  const int N = o.batch * o.seq_len, C = cfg.n_embd, FF = cfg.ffn_hidden;
  const int QKV = (cfg.n_head + 2 * cfg.n_kv_head) * cfg.head_dim();
  std::vector<Shape> shapes = {
      {"ceiling 8192^3", 8192, 8192, 8192, false, true},
      {"qkv fwd X.Wt", N, QKV, C, false, true},
      {"attn-out fwd", N, C, C, false, true},
      {"mlp-up fwd", N, FF, C, false, true},
      {"mlp-down fwd", N, C, FF, false, true},
      {"lm-head fwd (8192-col chunk)", N, 8192, C, false, true},
      {"mlp-up dX = dY.W", N, C, FF, false, false},
      {"mlp-up dW = dYt.X", FF, C, N, true, false},
      {"mlp-down dW = dYt.X", C, FF, N, true, false},
  };
  std::printf("forge bench gemm: cuBLASLt, bf16 inputs, f32 accumulate, bf16 output (dW: f32 output)\n");
  std::printf("device %s; preset %s, %d x %d = %d rows\n\n", cuda::device_summary().c_str(), o.preset.c_str(), o.batch,
              o.seq_len, N);
  std::printf("%-30s %7s %7s %7s %10s %9s\n", "shape", "M", "N", "K", "time (us)", "TFLOP/s");
  nlohmann::json rows = nlohmann::json::array();
  double ceiling = 0;
  for (const auto& s : shapes) {
    const bool dw = s.ta;
    cuda::GemmArgs g;
    g.M = s.M, g.N = s.N, g.K = s.K, g.trans_a = s.ta, g.trans_b = s.tb;
    g.ab_type = DType::kBF16;
    g.c_type = dw ? DType::kF32 : DType::kBF16;
    cuda::DeviceBuffer<uint16_t> a(ctx.allocator(), static_cast<size_t>(s.M) * s.K),
        b(ctx.allocator(), static_cast<size_t>(s.K) * s.N);
    cuda::DeviceBuffer<float> c(ctx.allocator(), static_cast<size_t>(s.M) * s.N);
    fill_random(ctx, a.data(), a.size(), 1);
    fill_random(ctx, b.data(), b.size(), 2);
    const double sec = time_gemm(ctx, g, a.data(), b.data(), c.data());
    const double tflops = 2.0 * s.M * s.N * s.K / sec / 1e12;
    if (ceiling == 0) ceiling = tflops;
    std::printf("%-30s %7d %7d %7d %10.1f %9.1f\n", s.what.c_str(), s.M, s.N, s.K, sec * 1e6, tflops);
    rows.push_back({{"shape", s.what}, {"M", s.M}, {"N", s.N}, {"K", s.K}, {"seconds", sec}, {"tflops", tflops}});
  }
  std::printf("\nreference: cuBLASLt 8192^3 bf16 on this H200 model measured 788-806 TFLOP/s (ANCHORS.md);\n"
              "the first row is the same product measured in this run.\n");
  if (!o.json_out.empty()) std::ofstream(o.json_out) << nlohmann::json{{"bench", "gemm"}, {"rows", rows}}.dump(2) << "\n";
}

}  // namespace forge::bench
