// forge bench train: training throughput of a preset on the GPU, with random tokens (the data
// loader is not what is measured). One optimizer step = grad_accum micro-batches of B × T
// tokens (forward with the fused LM-head/cross-entropy, backward) + global norm + AdamW, run
// through the CUDA StepRunner exactly as `forge train --device cuda` runs it: tokens staged in
// pinned memory, the step queued without host syncs and replayed as a CUDA graph once its
// shapes repeat (FORGE_CUDA_GRAPH=0: eager), the loss read one step late.
// Reported: tokens/s, MFU, step time, peak memory; one row per activation recomputation level
// given (--set recompute=LEVEL, repeatable: each level on a fresh runner, one after another, so
// each row's peak is that level's alone).
//
// Step time: the median over the timed steps of the wall time between two consecutive step
// reports. With one step queued behind the running one the GPU never waits for the host, so
// this is the GPU's time per step (or the host's, when the host is the slower of the two).
//
// MFU counts FLOPs per token as 6·N + 6·L·C·T (N every parameter including embeddings, L
// layers, C width, T sequence length: the forward and backward matmuls plus attention's
// QKᵀ and PV) against 989 TFLOP/s dense bf16 — the formula ANCHORS.md uses for llm.c and
// PyTorch, so the numbers compare directly.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "bench.h"
#include "train_bench.h"
#include "forge/backend/cuda/runtime.h"
#include "forge/core/error.h"
#include "forge/core/rng.h"
#include "forge/model/config.h"
#include "forge/train/runner.h"

namespace forge::bench {

// One timed run at one recompute level: a fresh runner (its own allocator, so its own peak).
struct LevelResult {
  Recompute level = Recompute::kNone;
  double tps = 0, mfu = 0, step_ms = 0, peak_gb = 0, loss = 0;
  std::string device;
};

LevelResult time_level(const ModelConfig& cfg, const BenchOptions& o, Recompute level, int64_t* params) {
  const int B = o.batch, T = o.seq_len;
  std::unique_ptr<StepRunner> runner = train_bench_runner(cfg, o, level);
  const int64_t P = runner->table().total();
  *params = P;
  // Data parallel (--gpus): each rank trains B × T tokens of its own a step.
  const int ranks = o.comm ? o.comm->size() : 1, rank = o.comm ? o.comm->rank() : 0;
  // Random tokens; targets are the inputs shifted by one.
  const size_t n = static_cast<size_t>(B) * T;
  std::vector<int32_t> x(n + 1);
  Rng rng(5 + rank);
  for (auto& t : x) t = static_cast<int32_t>(rng.below(cfg.vocab_size));
  const int accum = 1;
  StepReport last;
  const std::vector<double> ms = time_train_steps(
      *runner,
      [&](int) {
        for (int a = 0; a < accum; ++a) runner->micro_step(x.data(), x.data() + 1, B, T, 1.0 / accum);
      },
      o.warmup, o.steps, &last);
  LevelResult r;
  r.level = level;
  for (double l : last.micro_losses) r.loss += l / accum;
  const double step_s = ms[ms.size() / 2] * 1e-3;
  r.step_ms = step_s * 1e3;
  r.tps = static_cast<double>(n) * accum * ranks / step_s;
  const double flops_per_token =
      6.0 * static_cast<double>(P) + 6.0 * cfg.n_layer * cfg.n_embd * static_cast<double>(T);
  r.mfu = r.tps * flops_per_token / 989e12;
  r.peak_gb = runner->peak_device_bytes() / 1e9;
  r.device = runner->describe();
  return r;
}

void train_cuda(const BenchOptions& o) {
  if (o.sft) return train_sft_cuda(o);
  std::string shape;
  const ModelConfig cfg = train_bench_config(o, &shape);
  const int B = o.batch, T = o.seq_len;
  const std::vector<Recompute> levels = train_bench_levels(o);
  int64_t P = 0;
  std::vector<LevelResult> results;
  for (Recompute level : levels) results.push_back(time_level(cfg, o, level, &P));
  std::printf(
      "forge bench train: %s (%.1fM parameters), %s, micro-batch %d x %d, 1 micro-batch/step%s\n",
      shape.c_str(), P / 1e6, o.precision.c_str(), B, T,
      o.comm ? str(", ", o.comm->size(), " rank(s), ZeRO-1 over ", o.comm->describe(), " (tokens/s of all ranks)").c_str()
             : "");
  std::printf("device %s; median of %d steps after %d warm-up%s\n\n", results[0].device.c_str(), o.steps,
              o.warmup, results.size() > 1 ? "; one runner per recompute level, one after another" : "");
  std::printf("%-14s %10s %12s %8s %14s %12s %10s\n", "", "recompute", "tokens/s", "MFU", "step (ms)", "peak (GB)",
              "loss");
  for (const LevelResult& r : results)
    std::printf("%-14s %10s %12.0f %7.1f%% %14.1f %12.1f %10.4f\n", "forge", recompute_name(r.level), r.tps,
                100 * r.mfu, r.step_ms, r.peak_gb, r.loss);
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
  const std::string json_path = !o.rank_result.empty() ? o.rank_result : o.json_out;
  if (!json_path.empty() && (o.comm == nullptr || o.comm->rank() == 0)) {
    // The first level's figures at the top level (the format of before), every level in "levels".
    const LevelResult& f = results[0];
    nlohmann::json j{{"bench", "train"},     {"preset", o.preset},       {"shape", shape},
                     {"precision", o.precision}, {"batch", B},            {"seq_len", T},
                     {"tokens_per_s", f.tps}, {"mfu", f.mfu},             {"step_ms", f.step_ms},
                     {"peak_gb", f.peak_gb},  {"loss", f.loss},           {"recompute", recompute_name(f.level)},
                     {"device", f.device},    {"ranks", o.comm ? o.comm->size() : 1},
                     {"data_parallel", o.comm != nullptr}};
    for (const LevelResult& r : results)
      j["levels"].push_back({{"recompute", recompute_name(r.level)}, {"tokens_per_s", r.tps}, {"mfu", r.mfu},
                             {"step_ms", r.step_ms}, {"peak_gb", r.peak_gb}, {"loss", r.loss}});
    std::ofstream(json_path) << j.dump(2) << "\n";
  }
}

}  // namespace forge::bench
