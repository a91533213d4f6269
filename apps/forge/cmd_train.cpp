// forge train: pretrain from scratch, fine-tune from a Hugging Face model (--init-from), or
// continue a stopped run (--resume). Parses the settings, installs the SIGINT/SIGTERM handler
// that asks the trainer to checkpoint and stop, and calls the library.
#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string_view>
#include <utility>

#include "args.h"
#include "commands.h"
#include "forge/core/dtype.h"
#include "forge/core/error.h"
#include "forge/core/parse.h"
#include "forge/dist/bootstrap.h"
#include "forge/dist/local_launch.h"
#include "forge/dist/nccl_comm.h"
#include "forge/model/config.h"
#include "forge/model/lora.h"
#include "forge/tokenizer/tokenizer.h"
#include "forge/train/trainer.h"
#include "run_env.h"
#include "world.h"

namespace forge::cli {

namespace {

namespace fs = std::filesystem;

// --steps, --save-every, --keep-checkpoints and --save-dtype are the training settings of those
// names (steps, save_every, keep_checkpoints, save_dtype): the same help, default and range.
constexpr std::pair<const char*, const char*> kTrainOptions[] = {
    {"steps", "steps"},
    {"save-every", "save_every"},
    {"keep-checkpoints", "keep_checkpoints"},
    {"save-dtype", "save_dtype"}};

const TrainField& option_field(std::string_view option) {
  for (const auto& [opt, field] : kTrainOptions)
    if (option == opt) return *find_train_field(field);
  FORGE_CHECK(false, "--", option, " is not a training setting");
}

const char* const kTrainNotes =
    "--resume takes the run's configuration from its checkpoint, device and precision included\n"
    "(only --steps, --data, --device and --precision may change). --init-from takes the model's\n"
    "shape from MODELDIR/config.json (no model settings).\n"
    "Every saved model carries the run's tokenizer files (tokenizer.json, tokenizer_config.json,\n"
    "special_tokens_map.json, chat_template.jinja) unchanged: the --init-from model's when it has\n"
    "a tokenizer.json, else those of the --data directory (forge data prepare writes them).\n"
    "Trained from scratch, the model takes that tokenizer's vocabulary unless vocab_size is set.\n"
    "--sft FILE.jsonl: one example a line, {\"prompt\": ..., \"response\": ...} or\n"
    "{\"messages\": [{\"role\": \"system\"|\"user\"|\"assistant\", \"content\": ...}, ...]}, rendered\n"
    "with the model's chat template (built-in ChatML without one) and encoded with its tokenizer;\n"
    "only assistant tokens are trained, the loss is their mean over the whole step. Each example\n"
    "is one row of seq_len tokens (padded); longer ones are cut or skipped (sft_overlong), those\n"
    "without assistant tokens skipped, all counted in the summary line. --pack (sft_layout=pack)\n"
    "places several whole examples in each row instead, positions restarting per example and\n"
    "attention kept inside each (the same loss and gradients as padded rows, fewer rows); the\n"
    "summary line gives the packing efficiency, the run's last lines example tokens/s. CPU and\n"
    "--device cuda. A config file may hold \"sft\": FILE or {\"data\": FILE, \"epochs\": N,\n"
    "\"val_frac\": X, \"overlong\": M, \"pack\": true}.\n"
    "--lora r=R,alpha=A,targets=q,k,v,o,gate,up,down (with --init-from, Llama-layout models,\n"
    "CPU or GPU, where the frozen base stays in the run's precision; data parallel as below,\n"
    "the adapters' gradients averaged over ranks): low-rank adapters\n"
    "train on the frozen model, y = x·Wᵀ + (alpha/r)·(x·Aᵀ)·Bᵀ (PEFT's init: A kaiming-uniform\n"
    "from seed, B = 0). Defaults r=8, alpha=8, targets=q,v; dropout=0 only. RUNDIR/model and\n"
    "the checkpoints are PEFT adapter directories (adapter_config.json, adapter_model.safetensors\n"
    "+ the tokenizer files); forge merge makes a full model of one.\n"
    "A config file may hold \"lora\": the same text, or {\"r\": R, \"alpha\": A, \"targets\":\n"
    "[...]}. --resume re-reads the base from the run's init_from and refuses one whose weights\n"
    "changed (their SHA-256 is recorded in RUNDIR/config.json).\n"
    "SIGINT/SIGTERM: the current step finishes, a checkpoint is written, and forge exits 0.\n"
    "A step whose loss or gradient norm is inf/NaN updates nothing (\"skipped\": true in\n"
    "metrics.jsonl); max_bad_steps of them in a row stop the run (exit 1) and leave the last\n"
    "checkpoint as it was. A loss loss_spike_z standard deviations above the last 128 steps' mean\n"
    "is logged as a spike (\"loss_z\" in metrics.jsonl). Testing hook: FORGE_FAULT_INJECT=\n"
    "nan_grad@STEP or nan_loss@FIRST-LAST (comma-separated, 0-based steps) poisons those steps;\n"
    "kill@STEP makes the process SIGKILL itself as that step begins.\n"
    "Data parallel (CPU): `mpirun -np N forge train --device cpu ...` (or srun with an MPI it\n"
    "can start, e.g. srun --mpi=pmix) trains on N ranks: batch_size x grad_accum stays the global\n"
    "batch, the same on any N; each rank trains batch_size/N rows of every micro-batch\n"
    "(batch_size must divide by N). Rank 0 alone writes RUNDIR, validates and prints; the others\n"
    "print only errors, as \"forge: rank R: ...\". An error or death of any rank ends the run,\n"
    "non-zero. --resume works on any N (bit-exact on the N the run was saved with). Give each\n"
    "rank its share of the cores (mpirun -x OMP_NUM_THREADS=K).\n"
    "Data parallel (GPUs): `forge train --gpus N ...` starts N ranks on this machine, one GPU\n"
    "each (rank r on GPU r), torchrun-style; Ctrl-C/SIGTERM reach every rank (each checkpoints\n"
    "and stops); if one rank fails the others are stopped and forge exits with that rank's\n"
    "status, naming it. `mpirun -np N forge train --device cuda ...` and torchrun (RANK,\n"
    "WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT) work too; each rank uses GPU LOCAL_RANK.\n"
    "Gradients are averaged with NCCL (ZeRO-1: each rank keeps Adam's state of 1/N of the\n"
    "parameters); the losses, gradient norm and skip decisions are global. NCCL_NVLS_ENABLE=0 is\n"
    "set unless given. torchrun-style CPU ranks (--device cpu) talk over TCP through rank 0:\n"
    "correct but slow; use mpirun for CPU ranks.";

// What --help says about a training setting: "optimizer steps (default 1000; >= 1)".
std::string field_help(const TrainField& f) {
  return str(f.help, " (default ", train_field_text(TrainConfig{}, f), "; ", train_field_range(f),
             ")");
}

// "    n_layer=N             L: transformer blocks (>= 1)\n"
std::string setting_line(const std::string& name, const std::string& metavar,
                         const std::string& help) {
  std::string left = name + "=" + metavar;
  left.resize(std::max<size_t>(left.size() + 1, 22), ' ');
  return "    " + left + help + "\n";
}

std::string settings_help() {
  std::string s =
      "key=value overrides (after --config, which comes after --preset):\n"
      "  model (defaults: the preset's):\n";
  for (const ModelSetting& m : model_settings()) s += setting_line(m.name, m.metavar, m.help);
  s += "  train (recorded in RUNDIR/config.json):\n";
  for (const TrainField& f : train_fields()) s += setting_line(f.name, f.metavar, field_help(f));
  s += "presets:";
  for (const std::string& name : preset_names()) s += " " + name;
  return s + "\n" + kTrainNotes;
}

const Command& train_command() {
  static const Command cmd = {
      "train",
      "pretrain a model on token shards, or fine-tune one on chat examples (--sft)",
      {{"config", "FILE", "JSON file of settings: {\"preset\": ..., \"key\": value, ...}"},
       {"preset", "NAME", "model shape (default tiny); see below"},
       {"data", "DIR|FILE", "token shards: a directory of train_*.bin/val_*.bin, or one .bin"},
       {"sft", "FILE.jsonl",
        "supervised fine-tuning on chat examples instead of --data (see below)"},
       {"pack", "", "--sft: pack several examples per row of seq_len, attention kept inside each"},
       {"out", "RUNDIR", "run directory (default runs/<preset>-<time>)"},
       {"steps", "N", field_help(option_field("steps"))},
       {"device", "cpu|cuda", "where to train (default cpu; --resume: the run's)"},
       {"precision", "fp32|bf16|fp16",
        "compute precision (cpu: fp32; cuda: bf16 default, fp32, fp16 with loss scaling; "
        "--resume: the run's)"},
       {"save-every", "K", field_help(option_field("save-every"))},
       {"keep-checkpoints", "N", field_help(option_field("keep-checkpoints"))},
       {"save-dtype", "f32|bf16", field_help(option_field("save-dtype"))},
       {"init-from", "MODELDIR", "start from a Hugging Face model directory (fresh optimizer)"},
       {"lora", "SPEC", "train LoRA adapters on the frozen --init-from model: r=16,alpha=32,targets=q,v,..."},
       {"resume", "RUNDIR", "continue a run from its newest checkpoint up to --steps"},
       {"gpus", "N", "data parallel on N GPUs of this machine: starts N ranks itself (see below)"}},
      true,
      "",
      settings_help()};
  return cmd;
}

// Sets the training setting behind --`option` when it is given.
void apply_option(const Args& a, const std::string& option, TrainConfig& t) {
  if (a.has(option)) set_train_field(t, option_field(option), "--" + option, a.get(option));
}

void apply(ModelConfig& m, TrainConfig& t, const std::string& key, const std::string& value) {
  if (apply_model_override(m, key, value)) return;
  if (t.apply_override(key, value)) return;
  throw Error(str("unknown setting ", quote(key), " (see forge train --help)"));
}

std::string default_out(const std::string& preset) {
  const std::time_t now = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y%m%d-%H%M%S", std::localtime(&now));
  return "runs/" + preset + "-" + buf;
}

// A model trained from scratch takes the vocabulary of the tokenizer the run will carry (the
// run directory's, else the --data directory's, where forge data prepare puts it) unless
// vocab_size is set: with the preset's (tiny: 4,096) and a 300-token tokenizer, the model
// would sample ids that the tokenizer cannot decode, and forge generate --prompt would fail.
// A tokenizer Forge cannot read leaves the preset's size.
void take_tokenizer_vocab(ModelConfig& model, const std::string& out, const std::string& data) {
  for (const std::string& dir : {out, data}) {
    std::error_code ec;
    const std::string path = dir + "/tokenizer.json";
    if (!fs::is_directory(dir, ec) || !fs::is_regular_file(path, ec)) continue;
    try {
      const int32_t vocab = tok::Tokenizer::load(path).vocab_size();
      if (vocab != model.vocab_size)
        std::printf("vocab_size %d, from %s (the preset has %d; vocab_size=N chooses)\n", vocab,
                    path.c_str(), model.vocab_size);
      model.vocab_size = vocab;
    } catch (const Error&) {
    }
    return;
  }
}

// A config file's "sft": the JSONL's path, or an object {"data": FILE, "epochs": N,
// "val_frac": X, "overlong": M, "pack": true|false} whose other keys set epochs, sft_val_frac,
// sft_overlong and sft_layout (through `setting`, as key=value would). Returns the path.
std::string sft_section(const nlohmann::json& j, const std::string& file,
                        const std::function<void(const std::string&, const std::string&)>& setting) {
  if (j.is_string()) return j.get<std::string>();
  if (!j.is_object())
    throw Error(str(file, ": \"sft\" must be a file name or an object, got ", j.type_name()));
  if (!j.contains("data") || !j["data"].is_string())
    throw Error(str(file, ": \"sft\" needs \"data\": the JSONL file of examples"));
  static const std::pair<const char*, const char*> keys[] = {
      {"epochs", "epochs"}, {"val_frac", "sft_val_frac"}, {"overlong", "sft_overlong"},
      {"pack", "sft_layout"}};
  for (const auto& item : j.items()) {
    // Not a structured binding: clang 14 (the sanitizer build's) cannot capture one.
    const std::string k = item.key();
    const nlohmann::json& v = item.value();
    if (k == "data") continue;
    const auto* it = std::find_if(std::begin(keys), std::end(keys),
                                  [&](const auto& p) { return k == p.first; });
    if (it == std::end(keys))
      throw Error(str(file, ": unknown key ", quote(k),
                      " in \"sft\" (expected data, epochs, val_frac, overlong, pack)"));
    if (k == "pack" && v.is_boolean())  // "pack": true -> sft_layout=pack
      setting(it->second, v.get<bool>() ? "pack" : "pad");
    else
      setting(it->second, v.is_string() ? v.get<std::string>() : v.dump());
  }
  return j["data"].get<std::string>();
}

// A config file's "lora": the --lora text, or {"r": R, "alpha": A, "targets": [names],
// "dropout": 0} turned into it.
std::string lora_section(const nlohmann::json& j, const std::string& file) {
  if (j.is_string()) return j.get<std::string>();
  if (!j.is_object())
    throw Error(str(file, ": \"lora\" must be a string or an object, got ", j.type_name()));
  std::string spec;
  for (const auto& item : j.items()) {
    const std::string k = item.key();
    const nlohmann::json& v = item.value();
    if (!spec.empty()) spec += ",";
    if (k == "targets" && v.is_array()) {
      spec += "targets=";
      for (size_t i = 0; i < v.size(); ++i) spec += (i ? "," : "") + (v[i].is_string() ? v[i].get<std::string>() : v[i].dump());
    } else {
      spec += k + "=" + (v.is_string() ? v.get<std::string>() : v.dump());
    }
  }
  return spec;
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

// The command after --help, on every rank of a data-parallel run (world: nullptr for one
// process). A data-parallel run on GPUs makes its NCCL communicator in `nccl` (over world's
// ranks, on GPU local_rank: one GPU per rank of a machine), which the caller keeps beyond the
// run and aborts on an error.
void run_train(const Args& a, Communicator* world, std::unique_ptr<Communicator>& nccl) {
  // Unset, the library chooses: a new run trains on the CPU (bf16 is the GPU's default
  // precision), a resumed one where it trained. It also checks the combination.
  RunOptions opt;
  if (a.has("device")) opt.device = device_name(parse_device(a.get("device")));
  if (a.has("precision")) opt.precision = a.get("precision");
  opt.cuda = cuda_settings_from_env();
  opt.faults = fault_plan_from_env();
  opt.stop = &g_stop;
  opt.comm = world;
  if (world) {
    opt.cuda.device = world->local_rank();
    opt.device_comm = [world, &nccl] {
      nccl = make_nccl_comm(*world, world->local_rank(), nullptr);
      return nccl.get();
    };
  }
  if (a.has("resume")) {
    for (const char* fixed : {"preset", "config", "init-from", "out", "save-every",
                              "keep-checkpoints", "save-dtype", "sft", "pack", "lora"})
      if (a.has(fixed))
        throw Error(
            str("--resume takes the run's configuration from its checkpoint; drop --", fixed));
    if (!a.overrides().empty())
      throw Error(str("--resume takes the run's configuration from its checkpoint; drop '",
                      a.overrides()[0].first, "=", a.overrides()[0].second, "'"));
    TrainConfig given;
    given.steps = 0;  // resume(): 0 keeps the run's own total
    apply_option(a, "steps", given);
    install_stop_handlers();
    forge::resume(a.get("resume"), given.steps, a.get("data", ""), opt);
    return;
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
  std::string sft_file;
  if (file_cfg.contains("sft")) sft_file = sft_section(file_cfg["sft"], a.get("config"), setting);
  std::string lora_spec;
  if (file_cfg.contains("lora")) lora_spec = lora_section(file_cfg["lora"], a.get("config"));
  for (auto& [k, v] : file_cfg.items()) {
    if (k == "preset" || k == "sft" || k == "lora") continue;
    setting(k, v.is_string() ? v.get<std::string>() : v.dump());
  }
  for (const auto& [k, v] : a.overrides()) setting(k, v);
  for (const auto& [option, field] : kTrainOptions) apply_option(a, option, train);
  if (a.has("sft")) sft_file = a.get("sft");
  if (a.has("pack")) train.sft_layout = "pack";
  if (a.has("lora")) lora_spec = a.get("lora");
  if (!lora_spec.empty()) {
    opt.lora = parse_lora_spec(lora_spec);
    if (init_from.empty()) throw Error("--lora needs --init-from MODELDIR (the base model the adapters train on)");
  }
  opt.sft = !sft_file.empty();
  if (opt.sft && a.has("data"))
    throw Error("--sft FILE is the run's data; drop --data (or --sft for token shards)");
  const std::string data = opt.sft ? sft_file : a.require("data");
  fs::path from = fs::path(init_from).lexically_normal();
  if (from.filename().empty()) from = from.parent_path();  // "models/x/" -> "models/x"
  const std::string name = init_from.empty() ? preset : from.filename().string();
  const std::string out = a.get("out", default_out(name.empty() ? "run" : name));
  bool vocab_given = file_cfg.contains("vocab_size");
  for (const auto& [k, v] : a.overrides()) vocab_given |= k == "vocab_size";
  if (init_from.empty() && !vocab_given) take_tokenizer_vocab(model, out, data);
  install_stop_handlers();
  if (init_from.empty())
    forge::train(model, train, data, out, opt);
  else
    forge::train_from(init_from, train, data, out, opt);
}

// --gpus N: this command again on N ranks (dist/local_launch.h), without --gpus and with
// --device cuda; returns the exit status.
int train_on_gpus(const Args& a, const Argv& argv) {
  const int n = parse_int("--gpus", a.get("gpus"), 1, 4096);
  const LaunchInfo launch = detect_launch(process_env());
  if (launch.launcher != "none")  // before the --device check: gpus_rank_command says it again
    throw Error(str("--gpus starts its own ranks; this process is already rank ", launch.rank,
                    " of ", launch.size, " under ", launch.launcher, ": drop --gpus"));
  if (a.has("device") && a.get("device") != "cuda")
    throw Error(str("--gpus trains on GPUs: drop --device ", a.get("device")));
  LocalLaunch l;
  l.ranks = n;
  l.argv = gpus_rank_command(n, {"train"}, argv);
  if (!a.has("device")) l.argv.insert(l.argv.end(), {"--device", "cuda"});
  const LaunchOutcome o = run_local_ranks(l);
  if (o.status != 0) std::fprintf(stderr, "forge train --gpus %d: %s\n", n, o.message.c_str());
  return o.status;
}

}  // namespace

int cmd_train(const Argv& argv) {
  const Command& cmd = train_command();
  const Args a = parse_args(cmd, argv);
  if (a.help()) {
    print_help(cmd);
    return 0;
  }
  if (a.has("gpus")) return train_on_gpus(a, argv);
  // Under mpirun or srun with 2 or more ranks: data parallel (world.h). Rank 0 prints; the
  // others print only errors, each prefixed "forge: rank R:", and an error on any rank ends
  // every rank (MPI_Abort: the launcher stops the others and exits non-zero).
  const std::unique_ptr<Communicator> world = open_world();
  if (world && world->rank() != 0 && !std::freopen("/dev/null", "w", stdout))
    throw Error("cannot redirect the standard output of a rank other than 0 to /dev/null");
  std::unique_ptr<Communicator> nccl;  // GPU ranks: destroyed before world
  try {
    run_train(a, world.get(), nccl);
  } catch (const std::exception& e) {
    // NCCL's abort first: the others may wait in a collective on their GPUs.
    if (nccl) nccl->abort(str("forge train: error: ", e.what()));
    if (world) world->abort(str("forge train: error: ", e.what()));
    throw;
  }
  return 0;
}

}  // namespace forge::cli
