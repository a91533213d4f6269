#include <cmath>
#include <cstdio>
#include <limits>
#include <memory>

#include <nlohmann/json.hpp>

#include "args.h"
#include "commands.h"
#include "run_env.h"
#include "forge/core/dtype.h"
#include "forge/core/error.h"
#include "forge/core/timer.h"
#include "forge/data/loader.h"
#include "forge/model/model_dir.h"
#include "forge/train/runner.h"

namespace forge::cli {

namespace {

const Command kEval = {
    "eval",
    "mean cross-entropy of a model on token shards",
    {{"model", "DIR", "model directory (config.json + model.safetensors)"},
     {"data", "FILE|DIR", "a shard, or a directory (its val_*.bin; train_*.bin if it has none)"},
     {"seq-len", "T", "window length (default: the model's max_seq_len)"},
     {"batch", "B", "windows per forward pass (default 8)"},
     {"device", "D", "cpu (default) or cuda"},
     {"json", "", "print one JSON object: loss, tokens, perplexity, windows"}},
    false,
    "",
    "Window k is tokens[k*T .. k*T+T] (T+1 tokens; targets are inputs shifted by one)."};

}  // namespace

int cmd_eval(const Argv& argv) {
  const Args a = parse_args(kEval, argv);
  if (a.help()) {
    print_help(kEval);
    return 0;
  }
  const Device device = parse_device(a.get("device", "cpu"));
  Transformer<float> model = load_model_dir(a.require("model"), GradBuffers::kNone);
  const ModelConfig& cfg = model.config();
  const int T_ = a.get_int("seq-len", cfg.max_seq_len, 1, cfg.max_seq_len);  // this model's
  const int B = a.get_int("batch", 8, 1, std::numeric_limits<int>::max());

  const std::string data = a.require("data");
  std::vector<std::string> paths = list_shards(data, "val");
  if (paths.empty()) paths = list_shards(data, "train");
  if (paths.empty()) throw Error(str(data, ": no val_*.bin or train_*.bin shards"));
  std::vector<Shard> shards;
  std::vector<ShardRange> ranges;
  for (const auto& p : paths) {
    shards.push_back(Shard::open(p, cfg.vocab_size));
    ranges.push_back({static_cast<int>(shards.size()) - 1, 0, shards.back().size()});
  }
  EvalWindows windows(&shards, ranges, T_);
  if (windows.count() == 0) throw Error(str(data, ": fewer than ", T_ + 1, " tokens: no window to score"));

  // The GPU evaluates in fp32 (the precision the checkpoint is stored in) through the same
  // StepRunner the trainer uses; the CPU model is the reference.
  std::unique_ptr<StepRunner> gpu;
  if (device == Device::kCuda) {
    gpu = make_cuda_runner(cfg, "fp32", cuda_settings_from_env());
    gpu->set_weights(model.weights());
  }
  std::vector<int32_t> x(static_cast<size_t>(B) * T_), y(static_cast<size_t>(B) * T_);
  double sum = 0;
  Timer timer;
  for (int64_t done = 0; done < windows.count();) {
    const int b = static_cast<int>(std::min<int64_t>(B, windows.count() - done));
    for (int i = 0; i < b; ++i) windows.window(done + i, x.data() + static_cast<size_t>(i) * T_, y.data() + static_cast<size_t>(i) * T_);
    sum += (gpu ? gpu->eval_loss(x.data(), y.data(), b, T_) : model.loss(x.data(), y.data(), b, T_)) * b * T_;
    done += b;
    if (!a.has("json") && timer.seconds() > 2.0) {
      std::fprintf(stderr, "\r%lld/%lld windows", static_cast<long long>(done), static_cast<long long>(windows.count()));
    }
  }
  const int64_t tokens = windows.count() * T_;
  const double loss = sum / static_cast<double>(tokens);
  if (a.has("json")) {
    nlohmann::json j = {{"loss", loss}, {"tokens", tokens}, {"perplexity", std::exp(loss)}, {"windows", windows.count()}, {"seq_len", T_}};
    std::printf("%s\n", j.dump().c_str());
  } else {
    if (timer.seconds() > 2.0) std::fprintf(stderr, "\n");
    std::printf("loss %.6f | perplexity %.4f | %lld tokens in %lld windows of %d\n", loss, std::exp(loss),
                static_cast<long long>(tokens), static_cast<long long>(windows.count()), T_);
  }
  return 0;
}

}  // namespace forge::cli
