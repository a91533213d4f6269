// What forge bench train, forge bench train --sft and dev/train_timeline share (train_bench.h):
// the model and CUDA runner of a bench run, and its step loop.
#include <algorithm>
#include <functional>

#include "train_bench.h"
#include "forge/backend/cuda/runtime.h"
#include "forge/core/error.h"
#include "forge/core/timer.h"
#include "forge/model/config.h"
#include "forge/train/runner.h"
#include "forge/train/train_config.h"

namespace forge::bench {

namespace {

// --set dp_bucket=BYTES (forge train's syntax), the last one given; 0 without.
int64_t bucket_bytes(const BenchOptions& o) {
  TrainConfig tc;
  bool given = false;
  for (const auto& [key, value] : o.overrides)
    if (key == "dp_bucket") given = tc.apply_override(key, value);
  return given ? tc.dp_bucket : 0;
}

}  // namespace

ModelConfig train_bench_config(const BenchOptions& o, std::string* shape) {
  if (!cuda::available())
    throw Error("forge bench train needs a CUDA GPU: " + cuda::device_summary());
  ModelConfig cfg = preset_config(o.preset);
  *shape = o.preset;
  for (const auto& [key, value] : o.overrides) {
    if (key == "recompute") {  // a training setting: train_bench_levels' (each row states it)
      parse_recompute(value);
      continue;
    }
    if (key == "dp_bucket") {  // a training setting: the data-parallel runner's buckets
      bucket_bytes(o);
      *shape += " " + key + "=" + value;
      continue;
    }
    if (!apply_model_override(cfg, key, value)) throw Error("--set: unknown model setting '" + key + "'");
    *shape += " " + key + "=" + value;
  }
  if (o.seq_len > cfg.max_seq_len) cfg.max_seq_len = o.seq_len;
  cfg.validate();
  return cfg;
}

std::vector<Recompute> train_bench_levels(const BenchOptions& o) {
  std::vector<Recompute> levels;
  for (const auto& [key, value] : o.overrides)
    if (key == "recompute") levels.push_back(parse_recompute(value));
  if (levels.empty()) levels.push_back(Recompute::kNone);
  return levels;
}

std::unique_ptr<StepRunner> train_bench_runner(const ModelConfig& cfg, const BenchOptions& o, Recompute level) {
  CudaSettings settings = o.cuda;
  if (const int64_t bytes = bucket_bytes(o); bytes > 0) settings.bucket_elems = bucket_elems_of_bytes(bytes);
  std::unique_ptr<StepRunner> runner = make_cuda_runner(cfg, o.precision, settings, o.comm);
  runner->set_recompute(level);
  std::vector<float> w(runner->table().total());
  runner->table().init(w.data(), 1337);
  runner->set_weights(w);
  return runner;
}

std::vector<double> time_train_steps(StepRunner& runner, const std::function<void(int)>& micro_steps,
                                     int warmup, int steps, StepReport* last) {
  auto step = [&](int s) {
    runner.zero_grad();
    micro_steps(s);
    AdamWParams p;
    p.lr = 6e-4f;
    p.step = s + 1;
    runner.optimizer_step(p, 1.0);
  };
  for (int s = 0; s < warmup; ++s) {
    step(s);
    *last = runner.take_report();
  }
  std::vector<double> ms;
  Timer clock;
  double prev = clock.seconds();
  for (int s = 0; s < steps; ++s) {
    step(warmup + s);
    if (s == 0) continue;  // one step in flight, as in training
    *last = runner.take_report();
    const double now = clock.seconds();
    ms.push_back((now - prev) * 1e3);
    prev = now;
  }
  if (steps > 0) {
    *last = runner.take_report();
    ms.push_back((clock.seconds() - prev) * 1e3);
  }
  FORGE_CHECK(!ms.empty(), "forge bench train: --steps must be positive");
  std::sort(ms.begin(), ms.end());
  return ms;
}

}  // namespace forge::bench
