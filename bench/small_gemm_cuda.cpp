// forge bench gemm --rows 1 8 32: the small-N linear kernels (backend/cuda/small_gemm.h) against
// cuBLASLt on a decode step's shapes, bf16: SmolLM2-135M's (W (OC, C), no bias; the gate/up
// projection also as the fused SwiGLU against two GEMMs + swiglu_fwd) and GPT-2 124M's (W (C, OC)
// with bias; its tied LM head is (V, C)).
//
// Timing as a decode step meets these products: a CUDA graph of calls, each on its own copy of
// the weight, the copies rotating through >= 256 MB (5× the H200's 50 MB L2), so every weight
// comes from HBM as it does when a step streams 270 MB of weights per token; x and out stay
// cached, as they would. One replay to warm up, the median of 5 timed replays, divided by the
// calls per graph. Inputs are random (never zeros).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench.h"
#include "forge/backend/cuda/check.h"
#include "forge/backend/cuda/context.h"
#include "forge/backend/cuda/gemm.h"
#include "forge/backend/cuda/graph.h"
#include "forge/backend/cuda/ops.h"
#include "forge/backend/cuda/runtime.h"
#include "forge/backend/cuda/small_gemm.h"
#include "forge/core/error.h"
#include "forge/core/rng.h"
#include "forge/model/config.h"

namespace forge::bench {

namespace {

using cuda::SmallLinearTiling;

constexpr size_t kRotateBytes = size_t{256} << 20;
constexpr int kMinCalls = 64;

struct SmallShape {
  std::string model, what;
  int C, OC;  // OC: the product's width (SwiGLU: 2·FF, the gate and up rows)
  WeightLayout layout;
  bool bias, swiglu;
};

std::vector<SmallShape> shapes_of(const std::string& preset) {
  const ModelConfig c = preset_config(preset);
  const int C = c.n_embd, FF = c.ffn_hidden, V = c.padded_vocab();
  if (c.family == Family::kGpt2)
    return {{preset, "c_attn", C, 3 * C, WeightLayout::kInOut, true, false},
            {preset, "attn c_proj", C, C, WeightLayout::kInOut, true, false},
            {preset, "c_fc", C, FF, WeightLayout::kInOut, true, false},
            {preset, "mlp c_proj", FF, C, WeightLayout::kInOut, true, false},
            {preset, "lm head (tied)", C, V, WeightLayout::kOutIn, false, false}};
  const int qkv = (c.n_head + 2 * c.n_kv_head) * c.head_dim();
  return {{preset, "q|k|v", C, qkv, WeightLayout::kOutIn, false, false},
          {preset, "3C (as if NKV = NH)", C, 3 * C, WeightLayout::kOutIn, false, false},
          {preset, "o_proj", C, C, WeightLayout::kOutIn, false, false},
          {preset, "gate|up", C, 2 * FF, WeightLayout::kOutIn, false, false},
          {preset, "gate|up + SwiGLU", C, 2 * FF, WeightLayout::kOutIn, false, true},
          {preset, "down_proj", FF, C, WeightLayout::kOutIn, false, false},
          {preset, "lm head", C, V, WeightLayout::kOutIn, false, false}};
}

// bf16 normal(0, scale) values (generated in f32 on the host, converted on the device).
void fill_random(cuda::Context& ctx, void* dst, size_t n, uint64_t seed, float scale) {
  std::vector<float> h(n);
  for (size_t i = 0; i < n; ++i) h[i] = scale * philox_normal(seed, 5, i);
  cuda::DeviceBuffer<float> tmp(ctx.allocator(), n);
  FORGE_CUDA_CHECK(
      cudaMemcpyAsync(tmp.data(), h.data(), n * 4, cudaMemcpyHostToDevice, ctx.stream()));
  cuda::convert(ctx, DType::kBF16, dst, DType::kF32, tmp.data(), n);
  ctx.synchronize();
}

// Seconds per call of enqueue(i) (i = the call's index), replayed as one graph of `calls`.
double time_graph(cuda::Context& ctx, int calls, const std::function<void(int)>& enqueue) {
  for (int i = 0; i < std::min(calls, 2); ++i) enqueue(i);  // plans, caches: before the capture
  ctx.synchronize();
  cuda::Graph graph;
  graph.capture(ctx, [&] {
    for (int i = 0; i < calls; ++i) enqueue(i);
  });
  cudaEvent_t e0, e1;
  FORGE_CUDA_CHECK(cudaEventCreate(&e0));
  FORGE_CUDA_CHECK(cudaEventCreate(&e1));
  graph.launch();
  std::vector<float> trials;
  for (int t = 0; t < 5; ++t) {
    FORGE_CUDA_CHECK(cudaEventRecord(e0, ctx.stream()));
    graph.launch();
    FORGE_CUDA_CHECK(cudaEventRecord(e1, ctx.stream()));
    FORGE_CUDA_CHECK(cudaEventSynchronize(e1));
    float ms = 0;
    FORGE_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    trials.push_back(ms);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  std::sort(trials.begin(), trials.end());
  return trials[2] * 1e-3 / calls;
}

}  // namespace

void small_gemm_cuda(const BenchOptions& o) {
  if (!cuda::available())
    throw Error("forge bench gemm needs a CUDA GPU: " + cuda::device_summary());
  cuda::Context ctx(0);
  std::vector<SmallShape> shapes;
  for (const std::string& p : o.presets)
    for (const SmallShape& s : shapes_of(p)) shapes.push_back(s);
  const int max_rows = *std::max_element(o.rows.begin(), o.rows.end());
  std::printf(
      "forge bench gemm --rows: small-N linear (small_gemm.cu) vs cuBLASLt, bf16 in and out,\n"
      "f32 accumulate; W from HBM (graph of calls over >= 256 MB of weight copies)\n");
  std::printf("device %s\n\n", cuda::device_summary().c_str());
  std::printf("%-14s %-22s %6s %6s %-7s %4s %10s %12s %8s %9s  %s\n", "model", "shape", "C", "OC",
              "W", "N", "small (us)", "cuBLASLt (us)", "speedup", "small GB/s", "backend takes");
  nlohmann::json rows = nlohmann::json::array();
  const DType dt = DType::kBF16;
  for (const SmallShape& s : shapes) {
    const size_t w_elems = static_cast<size_t>(s.C) * s.OC, w_bytes = w_elems * 2;
    const int copies =
        static_cast<int>(std::clamp<size_t>((kRotateBytes + w_bytes - 1) / w_bytes, 2, 1024));
    const int calls = std::max(copies, kMinCalls);
    cuda::DeviceBuffer<uint16_t> w(ctx.allocator(), w_elems * copies);
    fill_random(ctx, w.data(), w_elems, 1, 1.0f / std::sqrt(static_cast<float>(s.C)));
    for (int i = 1; i < copies; ++i)
      FORGE_CUDA_CHECK(cudaMemcpyAsync(w.data() + i * w_elems, w.data(), w_bytes,
                                       cudaMemcpyDeviceToDevice, ctx.stream()));
    cuda::DeviceBuffer<uint16_t> x(ctx.allocator(), static_cast<size_t>(max_rows) * s.C),
        bias(ctx.allocator(), s.OC), out(ctx.allocator(), static_cast<size_t>(max_rows) * s.OC),
        scratch(ctx.allocator(), static_cast<size_t>(max_rows) * s.OC);
    fill_random(ctx, x.data(), x.size(), 2, 1.0f);
    fill_random(ctx, bias.data(), bias.size(), 3, 1.0f);
    const void* b = s.bias ? bias.data() : nullptr;
    auto wi = [&](int i) { return w.data() + (i % copies) * w_elems; };
    const int FF = s.OC / 2;
    for (int N : o.rows) {
      if (!(s.swiglu ? cuda::small_linear_swiglu_supported(dt, N, s.C, FF)
                     : cuda::small_linear_supported(dt, N, s.C, s.OC, s.layout)))
        continue;
      const bool eligible = s.swiglu ? cuda::small_linear_swiglu_eligible(dt, N, s.C, FF)
                                     : cuda::small_linear_eligible(dt, N, s.C, s.OC, s.layout);
      auto small = [&](SmallLinearTiling t) {
        return time_graph(ctx, calls, [&](int i) {
          if (s.swiglu)
            cuda::small_linear_swiglu_fwd(ctx, dt, out.data(), x.data(), wi(i), N, s.C, FF, t);
          else
            cuda::small_linear_fwd(ctx, dt, out.data(), x.data(), wi(i), b, N, s.C, s.OC, s.layout,
                                   t);
        });
      };
      const double t_small = small({});
      // What CudaBackend enqueues without the small-N kernels (linear_fwd, linear_swiglu_fwd).
      const double t_lt = time_graph(ctx, calls, [&](int i) {
        cuda::GemmArgs g;
        g.M = N, g.K = s.C, g.trans_b = s.layout == WeightLayout::kOutIn;
        g.ab_type = g.c_type = dt;
        if (b) g.epilogue = cuda::GemmEpilogue::kBias, g.bias = b;
        if (!s.swiglu) {
          g.N = s.OC;
          cuda::gemm(ctx, g, x.data(), wi(i), out.data());
          return;
        }
        g.N = FF;
        const size_t nff = static_cast<size_t>(N) * FF;
        cuda::gemm(ctx, g, x.data(), wi(i), scratch.data());
        cuda::gemm(ctx, g, x.data(), wi(i) + static_cast<size_t>(FF) * s.C, scratch.data() + nff);
        cuda::swiglu_fwd(ctx, dt, out.data(), scratch.data(), scratch.data() + nff,
                         static_cast<int64_t>(nff));
      });
      std::printf("%-14s %-22s %6d %6d %-7s %4d %10.2f %12.2f %7.2fx %9.0f  %s\n", s.model.c_str(),
                  s.what.c_str(), s.C, s.OC, s.layout == WeightLayout::kOutIn ? "(OC,C)" : "(C,OC)",
                  N, t_small * 1e6, t_lt * 1e6, t_lt / t_small, w_bytes / t_small / 1e9,
                  eligible ? "small" : "cuBLASLt");
      std::fflush(stdout);  // a row at a time: a run cut short keeps what it measured
      rows.push_back({{"model", s.model},
                      {"shape", s.what},
                      {"C", s.C},
                      {"OC", s.OC},
                      {"N", N},
                      {"layout", s.layout == WeightLayout::kOutIn ? "out_in" : "in_out"},
                      {"eligible", eligible},
                      {"small_seconds", t_small},
                      {"cublaslt_seconds", t_lt}});
      if (!o.sweep) continue;
      // Every tiling the kernels take, to check the default choice (small_gemm.cu's heuristic).
      const bool cols = s.layout == WeightLayout::kOutIn;
      for (int ct : {1, 2, 4}) {
        if ((!cols && ct != 1) || (s.swiglu && ct == 1)) continue;
        for (int warps : {2, 4, 8, 16}) {
          const double t = small({cols ? ct : 0, warps});
          std::printf("%-14s   tiling col_tiles=%d warps=%-2d %30.2f\n", "", cols ? ct : 0, warps,
                      t * 1e6);
        }
      }
    }
  }
  if (!o.json_out.empty())
    std::ofstream(o.json_out) << nlohmann::json{{"bench", "gemm_small_rows"}, {"rows", rows}}.dump(
                                     2)
                              << "\n";
}

}  // namespace forge::bench
