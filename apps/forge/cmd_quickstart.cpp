// forge quickstart: the two-minute tour. Reads a real English corpus (Debian's `fortunes`),
// writes byte-level token shards, trains the `tiny` GPT-2 on the CPU, and prints text sampled
// from the result. Byte-level (vocabulary 257: bytes + <|endoftext|>) until Forge has its BPE
// trainer; every fortune is one document.
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "args.h"
#include "commands.h"
#include "forge/core/dtype.h"
#include "forge/core/error.h"
#include "forge/core/rng.h"
#include "forge/data/corpus.h"
#include "forge/data/shard.h"
#include "forge/generate/sampler.h"
#include "forge/model/model_dir.h"
#include "forge/train/trainer.h"

namespace forge::cli {

namespace fs = std::filesystem;

namespace {

constexpr const char* kDefaultCorpus = "/usr/share/games/fortunes";

const Command kQuickstart = {
    "quickstart",
    "train a tiny model on a real corpus, then sample from it",
    {{"out", "RUNDIR", "run directory (default runs/quickstart, or -2, -3... if taken)"},
     {"device", "D", "cpu (default) or cuda"},
     {"steps", "N", "training steps (default 600)"},
     {"corpus", "DIR", std::string("fortune database directory (default ") + kDefaultCorpus + ")"}},
    false,
    "",
    "Trains the `tiny` preset (GPT-2 family, 4 layers, width 128) on byte-level tokens for about\n"
    "three minutes on two CPU cores, evaluating on a held-out 5% of the fortunes."};

std::string free_run_dir() {
  std::string dir = "runs/quickstart";
  for (int i = 2; fs::exists(dir + "/metrics.jsonl"); ++i) dir = "runs/quickstart-" + std::to_string(i);
  return dir;
}

}  // namespace

int cmd_quickstart(const Argv& argv) {
  const Args a = parse_args(kQuickstart, argv);
  if (a.help()) {
    print_help(kQuickstart);
    return 0;
  }
  if (parse_device(a.get("device", "cpu")) != Device::kCpu)
    throw Error("--device cuda: this build trains on the CPU only (the CUDA backend is not built yet)");
  const std::string out = a.get("out", free_run_dir());
  const std::string corpus = a.get("corpus", kDefaultCorpus);
  if (!fs::is_directory(corpus))
    throw Error(str(corpus, ": corpus not found (Debian's 'fortunes' package provides it: run scripts/setup.sh)"));

  // 1. Documents, shuffled with a fixed seed, 5% held out for validation.
  std::vector<std::string> docs = read_fortune_dir(corpus);
  Rng rng(2024, 5);
  for (size_t i = docs.size() - 1; i > 0; --i) std::swap(docs[i], docs[rng.below(i + 1)]);
  const size_t n_val = std::max<size_t>(1, docs.size() / 20);
  const std::vector<std::string> val(docs.begin(), docs.begin() + n_val);
  const std::vector<std::string> train(docs.begin() + n_val, docs.end());
  const std::string data = out + "/data";
  std::error_code ec;
  fs::create_directories(data, ec);
  if (ec) throw Error(str(data, ": cannot create: ", ec.message()));
  const auto train_tokens = byte_encode(train), val_tokens = byte_encode(val);
  write_shard(data + "/train_000000.bin", train_tokens);
  write_shard(data + "/val_000000.bin", val_tokens);
  std::printf("corpus %s: %zu documents -> %.2fM train / %.2fM val byte tokens in %s\n", corpus.c_str(),
              docs.size(), train_tokens.size() / 1e6, val_tokens.size() / 1e6, data.c_str());

  // 2. Train. Byte-level text wants a short context and a high learning rate at this size.
  ModelConfig model = preset_config("tiny");
  model.vocab_size = kByteVocab;
  model.max_seq_len = 128;
  TrainConfig cfg;
  cfg.steps = a.get_int("steps", 600);
  cfg.batch_size = 16;
  cfg.seq_len = 128;
  cfg.lr = 2e-3;
  cfg.warmup_steps = std::min(30, cfg.steps / 10);
  cfg.eval_every = 50;
  cfg.eval_windows = 128;
  const TrainResult r = forge::train(model, cfg, data, out);

  // 3. Sample: each sample starts at a document boundary, i.e. a fresh fortune.
  Transformer<float> trained = load_model_dir(out + "/model");
  std::printf("\nsamples (temperature 0.8):\n");
  for (int s = 0; s < 3; ++s) {
    SampleOptions opt;
    opt.max_new_tokens = 300;
    opt.temperature = 0.8f;
    opt.seed = static_cast<uint64_t>(s);
    opt.stop_token = static_cast<int>(kByteEndOfText);
    auto ids = generate(trained, {static_cast<int32_t>(kByteEndOfText)}, opt);
    if (!ids.empty() && ids.back() == static_cast<int32_t>(kByteEndOfText)) ids.pop_back();
    std::printf("--- %d ---\n%s\n", s + 1, byte_decode(ids).c_str());
  }
  std::printf("---\nvalidation loss %.3f -> %.3f nats/byte in %.0f s. Run directory: %s\n",
              r.first_val_loss, r.last_val_loss, r.seconds, out.c_str());
  return 0;
}

}  // namespace forge::cli
