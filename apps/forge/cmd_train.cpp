// forge train: pretrain from scratch, fine-tune from a Hugging Face model (--init-from), or
// continue a stopped run (--resume). Parses the settings, installs the SIGINT/SIGTERM handler
// that asks the trainer to checkpoint and stop, and calls the library.
#include <chrono>
#include <csignal>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "args.h"
#include "commands.h"
#include "forge/core/dtype.h"
#include "forge/core/error.h"
#include "forge/model/config.h"
#include "forge/train/trainer.h"

namespace forge::cli {

namespace {

namespace fs = std::filesystem;

const Command kTrain = {
    "train",
    "pretrain a model on token shards",
    {{"config", "FILE", "JSON file of settings: {\"preset\": ..., \"key\": value, ...}"},
     {"preset", "NAME", "model shape (default tiny); see below"},
     {"data", "DIR|FILE", "token shards: a directory of train_*.bin/val_*.bin, or one .bin"},
     {"out", "RUNDIR", "run directory (default runs/<preset>-<time>)"},
     {"steps", "N", "optimizer steps (default 1000)"},
     {"device", "cpu|cuda", "where to train (default cpu)"},
     {"precision", "fp32|bf16|fp16", "compute precision (cpu: fp32; cuda: bf16 default, fp32, fp16 with loss scaling)"},
     {"save-every", "K", "write RUNDIR/checkpoints/step_NNNNNN every K steps (default: never)"},
     {"keep-checkpoints", "N", "keep the newest N checkpoints (default 3; 0 keeps all)"},
     {"init-from", "MODELDIR", "start from a Hugging Face model directory (fresh optimizer)"},
     {"resume", "RUNDIR", "continue a run from its newest checkpoint up to --steps"}},
    true,
    "",
    "key=value overrides (after --config, which comes after --preset):\n"
    "  model: vocab_size max_seq_len n_layer n_embd n_head n_kv_head ffn_hidden norm_eps\n"
    "         rope_theta rope_style=rotate_half|interleaved tie_embeddings sliding_window\n"
    "  train: steps batch_size seq_len grad_accum lr min_lr_frac warmup_steps weight_decay\n"
    "         beta1 beta2 eps grad_clip eval_every eval_windows seed\n"
    "presets: tiny gpt2-124m gpt2-350m llama-10m llama-25m llama-100m smollm2-135m\n"
    "--resume takes the run's configuration from its checkpoint (only --steps and --data may\n"
    "change). --init-from takes the model's shape from MODELDIR/config.json (no model settings).\n"
    "SIGINT/SIGTERM: the current step finishes, a checkpoint is written, and forge exits 0."};

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

// Set by SIGINT/SIGTERM; the trainer polls it after every step. SA_RESETHAND: a second signal
// takes the default action (a user pressing Ctrl-C twice means it).
volatile std::sig_atomic_t g_stop = 0;

void on_stop_signal(int) {
  g_stop = 1;
}

void install_stop_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESETHAND | SA_RESTART;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
}

}  // namespace

int cmd_train(const Argv& argv) {
  const Args a = parse_args(kTrain, argv);
  if (a.help()) {
    print_help(kTrain);
    return 0;
  }
  const Device device = parse_device(a.get("device", "cpu"));
  // Default precision: bf16 on the GPU, fp32 (the only one) on the CPU.
  const std::string precision = a.get("precision", device == Device::kCuda ? "bf16" : "fp32");
  if (precision != "fp32" && precision != "bf16" && precision != "fp16")
    throw Error(str("unknown precision '", precision, "' (expected fp32, bf16 or fp16)"));
  if (device == Device::kCpu && precision != "fp32")
    throw Error(str("--precision ", precision, " needs --device cuda; the CPU trains in fp32"));

  RunOptions opt;
  opt.device = device == Device::kCuda ? "cuda" : "cpu";
  opt.precision = precision;
  opt.stop = &g_stop;
  if (a.has("resume")) {
    for (const char* fixed :
         {"preset", "config", "init-from", "out", "save-every", "keep-checkpoints"})
      if (a.has(fixed))
        throw Error(
            str("--resume takes the run's configuration from its checkpoint; drop --", fixed));
    if (!a.overrides().empty())
      throw Error(str("--resume takes the run's configuration from its checkpoint; drop '",
                      a.overrides()[0].first, "=", a.overrides()[0].second, "'"));
    const int steps = a.get_int("steps", 0, 1, std::numeric_limits<int>::max());  // 0: the run's
    install_stop_handlers();
    forge::resume(a.get("resume"), steps, a.get("data", ""), opt);
    return 0;
  }
  const std::string init_from = a.get("init-from", "");
  if (!init_from.empty() && a.has("preset"))
    throw Error("--init-from takes the model from MODELDIR; drop --preset");

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
    if (file_cfg.contains("preset") && !file_cfg["preset"].is_string())
      throw Error(
          str(a.get("config"), ": \"preset\" must be a string, got ", file_cfg["preset"].dump()));
    if (file_cfg.contains("preset") && !a.has("preset"))
      preset = file_cfg["preset"].get<std::string>();
  }
  ModelConfig model = preset_config(preset);
  TrainConfig train;
  auto setting = [&](const std::string& k, const std::string& v) {
    if (!init_from.empty()) {
      ModelConfig scratch = model;
      if (apply_model_override(scratch, k, v))
        throw Error(str("--init-from takes the model's shape from ", init_from,
                        "/config.json; drop the model setting '", k, "=", v, "'"));
    }
    apply(model, train, k, v);
  };
  for (auto& [k, v] : file_cfg.items()) {
    if (k == "preset") continue;
    setting(k, v.is_string() ? v.get<std::string>() : v.dump());
  }
  for (const auto& [k, v] : a.overrides()) setting(k, v);
  const int int_max = std::numeric_limits<int>::max();
  train.steps = a.get_int("steps", train.steps, 1, int_max);
  train.save_every = a.get_int("save-every", train.save_every, 0, int_max);
  train.keep_checkpoints = a.get_int("keep-checkpoints", train.keep_checkpoints, 0, int_max);
  const std::string data = a.require("data");
  fs::path from = fs::path(init_from).lexically_normal();
  if (from.filename().empty()) from = from.parent_path();  // "models/x/" -> "models/x"
  const std::string name = init_from.empty() ? preset : from.filename().string();
  const std::string out = a.get("out", default_out(name.empty() ? "run" : name));
  install_stop_handlers();
  if (init_from.empty())
    forge::train(model, train, data, out, opt);
  else
    forge::train_from(init_from, train, data, out, opt);
  return 0;
}

}  // namespace forge::cli
