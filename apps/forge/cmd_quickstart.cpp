// forge quickstart: the two-minute tour. Reads a real English corpus (Debian's `fortunes`),
// trains a byte-level BPE tokenizer on it, writes token shards, trains the `tiny` GPT-2, and
// prints text sampled from the result. Every fortune is one document; <|endoftext|> comes
// before each (as llm.c's data scripts do), so sampling from it starts a fresh fortune.
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <limits>

#include "args.h"
#include "commands.h"
#include "run_env.h"
#include "forge/core/dtype.h"
#include "forge/core/error.h"
#include "forge/core/rng.h"
#include "forge/core/timer.h"
#include "forge/data/corpus.h"
#include "forge/data/shard.h"
#include "forge/generate/sampler.h"
#include "forge/model/model_dir.h"
#include "forge/tokenizer/trainer.h"
#include "forge/train/trainer.h"

namespace forge::cli {

namespace fs = std::filesystem;

namespace {

constexpr const char* kDefaultCorpus = "/usr/share/games/fortunes";
// 2,048 tokens: ~3.3 bytes per token on this corpus, and an embedding (0.26M) that keeps the
// model about a million parameters. Measured on the 2-core CI machine kind: training the
// tokenizer takes ~1 s.
constexpr int kVocab = 2048;

const Command kQuickstart = {
    "quickstart",
    "train a tokenizer and a tiny model on a real corpus, then sample from it",
    {{"out", "RUNDIR", "run directory (default runs/quickstart, or -2, -3... if taken)"},
     {"device", "D", "cpu (default) or cuda"},
     {"steps", "N", "training steps (default 400)"},
     {"corpus", "DIR", std::string("fortune database directory (default ") + kDefaultCorpus + ")"}},
    false,
    "",
    "Trains a 2,048-token BPE tokenizer, then the `tiny` preset (GPT-2 family, 4 layers, width\n"
    "128) for 400 steps of 16 x 128 tokens (under three minutes on two CPU cores), evaluating on\n"
    "a held-out 5% of the fortunes."};

std::string free_run_dir() {
  std::string dir = "runs/quickstart";
  for (int i = 2; fs::exists(dir + "/metrics.jsonl"); ++i) dir = "runs/quickstart-" + std::to_string(i);
  return dir;
}

std::vector<uint32_t> encode_docs(const tok::Tokenizer& t, const std::vector<std::string>& docs, int32_t eot) {
  std::vector<uint32_t> out;
  for (const auto& d : docs) {
    out.push_back(static_cast<uint32_t>(eot));
    for (int32_t id : t.encode_ordinary(d)) out.push_back(static_cast<uint32_t>(id));
  }
  return out;
}

}  // namespace

int cmd_quickstart(const Argv& argv) {
  const Args a = parse_args(kQuickstart, argv);
  if (a.help()) {
    print_help(kQuickstart);
    return 0;
  }
  const Device device = parse_device(a.get("device", "cpu"));
  const std::string out = a.get("out", free_run_dir());
  const std::string corpus = a.get("corpus", kDefaultCorpus);
  if (!fs::is_directory(corpus))
    throw Error(str(corpus, ": corpus not found (Debian's 'fortunes' package provides it: run scripts/setup.sh)"));
  if (fs::exists(out + "/metrics.jsonl")) throw Error(str(out, ": already holds a run; choose another --out"));

  // 1. Documents, shuffled with a fixed seed, 5% held out for validation.
  std::vector<std::string> docs = read_fortune_dir(corpus);
  Rng rng(2024, 5);
  for (size_t i = docs.size() - 1; i > 0; --i) std::swap(docs[i], docs[rng.below(i + 1)]);
  const size_t n_val = std::max<size_t>(1, docs.size() / 20);
  const std::vector<std::string> val(docs.begin(), docs.begin() + n_val);
  const std::vector<std::string> train(docs.begin() + n_val, docs.end());
  size_t bytes = 0;
  for (const auto& d : docs) bytes += d.size();
  std::printf("corpus %s: %zu documents, %.2f MB\n", corpus.c_str(), docs.size(), bytes / 1e6);

  // 2. A BPE tokenizer trained on the training documents only.
  Timer t_tok;
  tok::BpeTrainOptions topt;
  topt.vocab_size = kVocab;
  const tok::Tokenizer tokenizer = tok::train_bpe(train, topt);
  const int32_t eot = *tokenizer.eot_id();
  std::error_code ec;
  fs::create_directories(out + "/data", ec);
  if (ec) throw Error(str(out, "/data: cannot create: ", ec.message()));
  tokenizer.save_json(out + "/tokenizer.json");  // the trainer copies it into the model
  const auto train_tokens = encode_docs(tokenizer, train, eot), val_tokens = encode_docs(tokenizer, val, eot);
  write_shard(out + "/data/train_000000.bin", train_tokens);
  write_shard(out + "/data/val_000000.bin", val_tokens);
  std::printf("tokenizer: %d tokens (BPE, GPT-2 split pattern) in %.1f s -> %s/tokenizer.json\n",
              tokenizer.vocab_size(), t_tok.seconds(), out.c_str());
  std::printf("data: %.2fM train / %.2fM val tokens (%.2f bytes per token) in %s/data\n", train_tokens.size() / 1e6,
              val_tokens.size() / 1e6, static_cast<double>(bytes) / (train_tokens.size() + val_tokens.size()),
              out.c_str());

  // 3. Train.
  ModelConfig model = preset_config("tiny");
  model.vocab_size = tokenizer.vocab_size();
  model.max_seq_len = 128;
  TrainConfig cfg;
  cfg.steps = a.get_int("steps", 400, 1, std::numeric_limits<int>::max());
  cfg.batch_size = 16;
  cfg.seq_len = 128;
  cfg.lr = 2e-3;
  cfg.warmup_steps = std::min(30, cfg.steps / 10);
  cfg.eval_every = 50;
  cfg.eval_windows = 128;
  RunOptions opt;
  opt.device = device == Device::kCuda ? "cuda" : "cpu";
  opt.precision = device == Device::kCuda ? "bf16" : "fp32";
  opt.cuda = cuda_settings_from_env();
  const TrainResult r = forge::train(model, cfg, out + "/data", out, opt);

  // 4. Sample: each sample starts at a document boundary, i.e. a fresh fortune.
  Transformer<float> trained = load_model_dir(out + "/model", GradBuffers::kNone);
  std::printf("\nsamples (temperature 0.8):\n");
  for (int s = 0; s < 3; ++s) {
    SampleOptions so;
    so.max_new_tokens = 120;
    so.temperature = 0.8f;
    so.seed = static_cast<uint64_t>(s);
    so.stop_token = eot;
    auto ids = generate(trained, {eot}, so);
    if (!ids.empty() && ids.back() == eot) ids.pop_back();
    std::printf("--- %d ---\n%s\n", s + 1, sanitize_utf8(tokenizer.decode(ids)).c_str());
  }
  std::printf("---\nvalidation loss %.3f -> %.3f nats/token in %.0f s. Run directory: %s\n", r.first_val_loss,
              r.last_val_loss, r.seconds, out.c_str());
  return 0;
}

}  // namespace forge::cli
