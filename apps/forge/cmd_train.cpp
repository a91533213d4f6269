#include <chrono>
#include <ctime>
#include <fstream>

#include <nlohmann/json.hpp>

#include "args.h"
#include "commands.h"
#include "forge/core/dtype.h"
#include "forge/core/error.h"
#include "forge/model/config.h"
#include "forge/train/trainer.h"

namespace forge::cli {

namespace {

const Command kTrain = {
    "train",
    "pretrain a model on token shards",
    {{"config", "FILE", "JSON file of settings: {\"preset\": ..., \"key\": value, ...}"},
     {"preset", "NAME", "model shape (default tiny); see below"},
     {"data", "DIR|FILE", "token shards: a directory of train_*.bin/val_*.bin, or one .bin"},
     {"out", "RUNDIR", "run directory (default runs/<preset>-<time>)"},
     {"steps", "N", "optimizer steps (default 1000)"},
     {"device", "cpu|cuda", "where to train (default cpu)"},
     {"precision", "fp32|bf16|fp16", "compute precision (cpu: fp32)"},
     {"save-every", "K", "checkpoint every K steps (not yet implemented)"},
     {"init-from", "MODELDIR", "start from a Hugging Face model (not yet implemented)"},
     {"resume", "RUNDIR", "continue a run from its newest checkpoint (not yet implemented)"}},
    true,
    "",
    "key=value overrides (after --config, which comes after --preset):\n"
    "  model: vocab_size max_seq_len n_layer n_embd n_head n_kv_head ffn_hidden norm_eps\n"
    "         rope_theta rope_style=rotate_half|interleaved tie_embeddings sliding_window\n"
    "  train: steps batch_size seq_len grad_accum lr min_lr_frac warmup_steps weight_decay\n"
    "         beta1 beta2 eps grad_clip eval_every eval_windows seed\n"
    "presets: tiny gpt2-124m gpt2-350m llama-10m llama-25m llama-100m smollm2-135m"};

void apply(ModelConfig& m, TrainConfig& t, const std::string& key, const std::string& value) {
  if (apply_model_override(m, key, value)) return;
  if (t.apply_override(key, value)) return;
  throw Error(str("unknown setting '", key, "' (see forge train --help)"));
}

std::string default_out(const std::string& preset) {
  const std::time_t now = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y%m%d-%H%M%S", std::localtime(&now));
  return "runs/" + preset + "-" + buf;
}

}  // namespace

int cmd_train(const Argv& argv) {
  const Args a = parse_args(kTrain, argv);
  if (a.help()) {
    print_help(kTrain);
    return 0;
  }
  for (const char* later : {"save-every", "init-from", "resume"})
    if (a.has(later)) throw Error(str("--", later, " is not implemented yet in this version of forge"));
  const Device device = parse_device(a.get("device", "cpu"));
  const std::string precision = a.get("precision", "fp32");
  if (precision != "fp32" && precision != "bf16" && precision != "fp16")
    throw Error(str("unknown precision '", precision, "' (expected fp32, bf16 or fp16)"));
  if (device == Device::kCuda)
    throw Error("--device cuda: this build trains on the CPU only (the CUDA backend is not built yet)");
  if (precision != "fp32") throw Error(str("--precision ", precision, " needs --device cuda; the CPU trains in fp32"));

  std::string preset = a.get("preset", "tiny");
  nlohmann::json file_cfg = nlohmann::json::object();
  if (a.has("config")) {
    std::ifstream f(a.get("config"));
    if (!f) throw Error(str(a.get("config"), ": cannot open config file"));
    try {
      file_cfg = nlohmann::json::parse(f);
    } catch (const nlohmann::json::exception& e) {
      throw Error(str(a.get("config"), ": malformed JSON: ", e.what()));
    }
    if (!file_cfg.is_object()) throw Error(str(a.get("config"), ": expected a JSON object"));
    if (file_cfg.contains("preset") && !a.has("preset")) preset = file_cfg["preset"].get<std::string>();
  }
  ModelConfig model = preset_config(preset);
  TrainConfig train;
  for (auto& [k, v] : file_cfg.items()) {
    if (k == "preset") continue;
    apply(model, train, k, v.is_string() ? v.get<std::string>() : v.dump());
  }
  for (const auto& [k, v] : a.overrides()) apply(model, train, k, v);
  if (a.has("steps")) train.steps = a.get_int("steps", train.steps);
  const std::string data = a.require("data");
  const std::string out = a.get("out", default_out(preset));
  forge::train(model, train, data, out);
  return 0;
}

}  // namespace forge::cli
