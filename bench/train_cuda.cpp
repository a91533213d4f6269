// forge bench train: training throughput of a preset on the GPU, with random tokens (the data
// loader is not what is measured). One optimizer step = grad_accum micro-batches of B × T
// tokens (forward with the fused LM-head/cross-entropy, backward) + global norm + AdamW.
// Reported: tokens/s, MFU, step time, peak memory.
//
// MFU counts FLOPs per token as 6·N + 6·L·C·T (N every parameter including embeddings, L
// layers, C width, T sequence length: the forward and backward matmuls plus attention's
// QKᵀ and PV) against 989 TFLOP/s dense bf16 — the formula ANCHORS.md uses for llm.c and
// PyTorch, so the numbers compare directly.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <fstream>

#include <nlohmann/json.hpp>

#include "bench.h"
#include "forge/backend/cuda/check.h"
#include "forge/backend/cuda/context.h"
#include "forge/backend/cuda/runtime.h"
#include "forge/core/error.h"
#include "forge/core/rng.h"
#include "forge/model/config.h"
#include "forge/model/transformer_cuda.h"

namespace forge::bench {

void train_cuda(const BenchOptions& o) {
  if (!cuda::available()) throw Error("forge bench train needs a CUDA GPU: " + cuda::device_summary());
  const DType dt = o.precision == "fp32" ? DType::kF32 : o.precision == "bf16" ? DType::kBF16 : DType::kF16;
  if (dt == DType::kF16) throw Error("--precision fp16 is not supported yet (fp32 or bf16)");
  cuda::Context ctx(0);
  ModelConfig cfg = preset_config(o.preset);
  const int B = o.batch, T = o.seq_len;
  if (T > cfg.max_seq_len) cfg.max_seq_len = T;
  CudaTransformer model(ctx, cfg, dt);
  {
    std::vector<float> w(model.num_params());
    model.table().init(w.data(), 1337);
    model.set_weights(w);
  }
  // Random tokens; targets are the inputs shifted by one.
  const size_t n = static_cast<size_t>(B) * T;
  std::vector<int32_t> x(n + 1);
  Rng rng(5);
  for (auto& t : x) t = static_cast<int32_t>(rng.below(cfg.vocab_size));
  cuda::DeviceBuffer<int32_t> dx(ctx.allocator(), n), dy(ctx.allocator(), n);
  cuda::DeviceBuffer<float> dloss(ctx.allocator(), 1);
  const float dl = 1.0f / static_cast<float>(n);
  FORGE_CUDA_CHECK(cudaMemcpy(dx.data(), x.data(), n * 4, cudaMemcpyHostToDevice));
  FORGE_CUDA_CHECK(cudaMemcpy(dy.data(), x.data() + 1, n * 4, cudaMemcpyHostToDevice));
  FORGE_CUDA_CHECK(cudaMemcpy(dloss.data(), &dl, 4, cudaMemcpyHostToDevice));
  FORGE_CUDA_CHECK(cudaDeviceSynchronize());  // pageable copies may still be in flight
  const int accum = 1;
  cpu::AdamWParams p;
  p.lr = 6e-4f;
  auto step = [&](int s) {
    model.zero_grad();
    for (int a = 0; a < accum; ++a) {
      model.forward(dx.data(), dy.data(), dloss.data(), B, T);
      model.backward();
    }
    p.step = s + 1;
    model.optimizer_step(p, 1.0f, dt == DType::kBF16 ? 1000003ull * (s + 1) : 0);
  };
  for (int s = 0; s < o.warmup; ++s) step(s);
  ctx.synchronize();
  cudaEvent_t e0, e1;
  FORGE_CUDA_CHECK(cudaEventCreate(&e0));
  FORGE_CUDA_CHECK(cudaEventCreate(&e1));
  std::vector<float> ms;
  for (int s = 0; s < o.steps; ++s) {
    FORGE_CUDA_CHECK(cudaEventRecord(e0, ctx.stream()));
    step(o.warmup + s);
    FORGE_CUDA_CHECK(cudaEventRecord(e1, ctx.stream()));
    FORGE_CUDA_CHECK(cudaEventSynchronize(e1));
    float t = 0;
    FORGE_CUDA_CHECK(cudaEventElapsedTime(&t, e0, e1));
    ms.push_back(t);
  }
  std::vector<float> losses(n);
  FORGE_CUDA_CHECK(cudaMemcpy(losses.data(), model.losses(), n * 4, cudaMemcpyDeviceToHost));
  double loss = 0;
  for (float l : losses) loss += l;
  loss /= static_cast<double>(n);
  std::sort(ms.begin(), ms.end());
  const double step_s = ms[ms.size() / 2] * 1e-3;
  const double tokens = static_cast<double>(n) * accum;
  const double tps = tokens / step_s;
  const double flops_per_token = 6.0 * static_cast<double>(model.num_params()) +
                                 6.0 * cfg.n_layer * cfg.n_embd * static_cast<double>(T);
  const double mfu = tps * flops_per_token / 989e12;
  const auto& st = ctx.allocator().stats();
  const double peak_gb = (st.peak_reserved + ctx.workspace_bytes()) / 1e9;
  std::printf("forge bench train: %s (%.1fM parameters), %s, micro-batch %d x %d, %d micro-batch(es)/step\n",
              o.preset.c_str(), model.num_params() / 1e6, o.precision.c_str(), B, T, accum);
  std::printf("device %s; median of %d steps after %d warm-up; attention: unfused (batched GEMMs + softmax)\n\n",
              cuda::device_summary().c_str(), o.steps, o.warmup);
  std::printf("%-14s %12s %8s %14s %12s %10s\n", "", "tokens/s", "MFU", "step (ms)", "peak (GB)", "loss");
  std::printf("%-14s %12.0f %7.1f%% %14.1f %12.1f %10.4f\n", "forge", tps, 100 * mfu, step_s * 1e3, peak_gb, loss);
  // Comparison rows: ANCHORS.md, measured on the same GPU model (not in this run).
  struct Anchor {
    const char* preset;
    const char* who;
    const char* tps;
    const char* mfu;
    const char* settings;
  };
  static const Anchor anchors[] = {
      {"gpt2-124m", "llm.c (cuDNN)", "496,700", "40.4%", "micro-batch 64 x 1024"},
      {"gpt2-124m", "torch.compile", "534,800", "43.4%", "micro-batch 64 x 1024"},
      {"gpt2-124m", "PyTorch eager", "416,800", "33.8%", "micro-batch 64 x 1024"},
      {"gpt2-350m", "llm.c (cuDNN)", "193,300", "44.6%", "micro-batch 32 x 1024"},
      {"smollm2-135m", "HF + compile", "240,400", "24.8%", "micro-batch 32 x 2048"},
      {"smollm2-135m", "HF eager", "162,900", "16.8%", "micro-batch 32 x 2048"},
  };
  const char* settings = nullptr;
  for (const auto& a : anchors) {
    if (o.preset != a.preset) continue;
    std::printf("%-14s %12s %8s\n", a.who, a.tps, a.mfu);
    settings = a.settings;
  }
  std::printf("\nMFU = tokens/s x (6N + 6LCT) / 989 TFLOP/s.%s%s%s\n",
              settings ? " Comparison rows: ANCHORS.md, same GPU model, bf16, " : "",
              settings ? settings : "", settings ? " (measured 2026-11-30, not in this run)." : "");
  if (!o.json_out.empty())
    std::ofstream(o.json_out) << nlohmann::json{{"bench", "train"}, {"preset", o.preset}, {"precision", o.precision},
                                                {"batch", B}, {"seq_len", T}, {"tokens_per_s", tps}, {"mfu", mfu},
                                                {"step_ms", step_s * 1e3}, {"peak_gb", peak_gb}, {"loss", loss}}
                                     .dump(2)
                              << "\n";
}

}  // namespace forge::bench
