// The forge binary as a user meets it: exit codes, one-line errors, --help, JSON output.
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cli_runner.h"
#include "forge/data/shard.h"
#include "forge/generate/sampler.h"
#include "forge/model/config.h"
#include "forge/model/model_dir.h"
#include "forge/train/train_config.h"
#include "testing.h"

namespace forge {
namespace {

namespace fs = std::filesystem;
using testing::CmdResult;

class CliTest : public testing::CliTest {
 protected:
  void write_counting_shard(const std::string& path, int n, int mod) {
    std::vector<uint32_t> t(n);
    for (int i = 0; i < n; ++i) t[i] = static_cast<uint32_t>(i % mod);
    write_shard(path, t);
  }
};

TEST_F(CliTest, HelpForEveryCommand) {
  EXPECT_EQ(forge("--help").code, 0);
  for (const char* cmd : {"train", "eval", "generate", "quickstart"}) {
    const CmdResult r = forge(std::string(cmd) + " --help");
    EXPECT_EQ(r.code, 0) << cmd;
    EXPECT_NE(r.out.find("usage: forge " + std::string(cmd)), std::string::npos) << r.out;
  }
}

TEST_F(CliTest, BadArgumentsAreOneLineErrors) {
  expect_user_error(forge("frobnicate"), "unknown command");
  expect_user_error(forge("train --bogus 1"), "unknown option --bogus");
  write_counting_shard(p("ok.bin"), 5000, 100);
  expect_user_error(forge("train --preset gpt5 --data " + p("ok.bin")), "unknown preset 'gpt5'");
  expect_user_error(forge("train --data " + p("ok.bin") + " not_a_setting=3"), "unknown setting 'not_a_setting'");
  expect_user_error(forge("train --data " + p("ok.bin") + " n_layer=two"), "expected an integer");
  expect_user_error(forge("train --data " + p("missing.bin")), "no such file");
  expect_user_error(forge("eval --model " + p("nomodel") + " --data " + p("ok.bin")), "not a model directory");
}

TEST_F(CliTest, BadShardsAreOneLineErrors) {
  write_counting_shard(p("good.bin"), 5000, 100);
  // Truncated: drop the last 100 bytes.
  fs::copy_file(p("good.bin"), p("trunc.bin"));
  fs::resize_file(p("trunc.bin"), fs::file_size(p("good.bin")) - 100);
  expect_user_error(forge("train --data " + p("trunc.bin") + " --out " + p("r1")), "truncated");
  // Wrong magic.
  fs::copy_file(p("good.bin"), p("magic.bin"));
  {
    std::fstream f(p("magic.bin"), std::ios::in | std::ios::out | std::ios::binary);
    const int32_t bad = 42;
    f.write(reinterpret_cast<const char*>(&bad), 4);
  }
  expect_user_error(forge("train --data " + p("magic.bin") + " --out " + p("r2")), "wrong magic 42");
  // Ids beyond the vocabulary (the shard holds 0..99).
  expect_user_error(forge("train --data " + p("good.bin") + " --out " + p("r3") + " vocab_size=64"),
                    "out of range for vocabulary size 64");
  EXPECT_FALSE(fs::exists(p("r1/metrics.jsonl")));
}

TEST_F(CliTest, TrainEvalGenerateRoundTrip) {
  write_counting_shard(p("train_000000.bin"), 4000, 50);
  write_counting_shard(p("val_000000.bin"), 1000, 50);
  const std::string model_args = " vocab_size=50 max_seq_len=16 seq_len=16 batch_size=2 n_layer=1 n_embd=16 n_head=2 ffn_hidden=32";
  const CmdResult t = forge("train --data " + dir_.string() + " --out " + p("run") + " --steps 3" + model_args);
  ASSERT_EQ(t.code, 0) << t.err;
  EXPECT_NE(t.out.find("step 3/3"), std::string::npos) << t.out;
  ASSERT_TRUE(fs::exists(p("run/model/model.safetensors")));

  const CmdResult e = forge("eval --model " + p("run/model") + " --data " + p("val_000000.bin") + " --seq-len 16 --json");
  ASSERT_EQ(e.code, 0) << e.err;
  const auto j = nlohmann::json::parse(e.out);
  EXPECT_EQ(j["tokens"].get<int64_t>(), (1000 - 1) / 16 * 16);
  EXPECT_NEAR(j["perplexity"].get<double>(), std::exp(j["loss"].get<double>()), 1e-9);
  EXPECT_GT(j["loss"].get<double>(), 0.0);

  const CmdResult g1 = forge("generate --model " + p("run/model") + " --ids 1,2,3 --max-new-tokens 5 --temperature 0 --json");
  const CmdResult g2 = forge("generate --model " + p("run/model") + " --ids 1,2,3 --max-new-tokens 5 --temperature 0 --json");
  ASSERT_EQ(g1.code, 0) << g1.err;
  const auto ids = nlohmann::json::parse(g1.out)["ids"];
  EXPECT_EQ(ids.size(), 5u);
  EXPECT_EQ(g1.out, g2.out);  // greedy is deterministic
  expect_user_error(forge("generate --model " + p("run/model") + " --ids 1,99"), "out of range");
  expect_user_error(forge("generate --model " + p("run/model") + " --ids 1,x"), "bad token id 'x'");
}

// A model argument list small enough that a step takes milliseconds.
const char* kSmallModel =
    " vocab_size=50 max_seq_len=16 seq_len=16 batch_size=2 n_layer=1 n_embd=16 n_head=2"
    " ffn_hidden=32 eval_every=1 eval_windows=2";

// Before: --steps 4294967297 was read with stol and cast to int, so it trained 1 step (2^32 + 1
// wrapped); trailing garbage, spaces and '+' slipped through stol too.
TEST_F(CliTest, IntegerOptionsOutOfRangeAreErrorsNotWrapped) {
  write_counting_shard(p("ok.bin"), 4000, 50);
  const std::string train = "train --data " + p("ok.bin") + " --out " + p("run") + kSmallModel;
  const CmdResult wrapped = forge(train + " --steps 4294967297");
  expect_user_error(wrapped, "--steps: expected an integer in [1, 2147483647], got '4294967297'");
  EXPECT_FALSE(fs::exists(p("run/metrics.jsonl")));  // nothing trained
  expect_user_error(forge(train + " --steps 12abc"), "--steps: expected an integer");
  expect_user_error(forge(train + " --steps ''"), "got ''");
  expect_user_error(forge(train + " --steps=-3"), "got '-3'");
  expect_user_error(forge(train + " --steps ' 5'"), "got ' 5'");
  expect_user_error(forge(train + " --steps 1 --keep-checkpoints 4294967296"),
                    "--keep-checkpoints: expected an integer in [0, 2147483647]");
  expect_user_error(forge(train + " --steps 2 n_layer=+1"), "n_layer: expected an integer");
  expect_user_error(forge(train + " --steps 2 grad_accum=4294967297"), "grad_accum");
  EXPECT_FALSE(fs::exists(p("run/metrics.jsonl")));

  // The other commands read their integer options through the same checked getters.
  expect_user_error(
      forge("data prepare --tokenizer t.json --input a.txt --out d --threads 4294967296"),
      "--threads: expected an integer in [0, 2147483647]");
  expect_user_error(
      forge("data prepare --tokenizer t.json --input a.txt --out d --shard-tokens 1e6"),
      "--shard-tokens: expected an integer in [1, 9223372036854775807], got '1e6'");
  expect_user_error(forge("generate --model m --ids 1 --max-new-tokens 4294967297"),
                    "--max-new-tokens: expected an integer in [0, 2147483647]");
  expect_user_error(forge("generate --model m --ids 1 --top-k -1"), "--top-k: expected an integer");
  expect_user_error(forge("generate --model m --ids 1 --top-p 0"),
                    "--top-p: expected a number in (0, 1]");
  expect_user_error(forge("generate --model m --ids 1 --temperature nan"), "--temperature");
}

// Before: seed=N went through a double, so any seed above 2^53 was rounded (and 2^64 - 1 became
// 0, the double 2^64 being out of uint64's range). A --config file's seed took the same path.
TEST_F(CliTest, TrainSeedIsExactInConfigAndTrainerState) {
  write_counting_shard(p("train_000000.bin"), 4000, 50);
  write_counting_shard(p("val_000000.bin"), 1000, 50);
  auto read_json = [](const std::string& path) {
    std::ifstream f(path);
    return nlohmann::json::parse(f);
  };
  struct Case {
    std::string how;  // how the seed is given
    uint64_t seed;
  };
  std::ofstream(p("cfg.json")) << R"({"seed": 9007199254740993})";  // 2^53 + 1
  for (const Case& c : {Case{"seed=18446744073709551615", UINT64_MAX},
                        Case{"--config " + p("cfg.json"), 9007199254740993ull}}) {
    const std::string run = p("run" + std::to_string(c.seed));
    const CmdResult t = forge("train --data " + dir_.string() + " --out " + run +
                              " --steps 1 --save-every 1 " + c.how + kSmallModel);
    ASSERT_EQ(t.code, 0) << t.err;
    const auto config = read_json(run + "/config.json");
    ASSERT_TRUE(config["train"]["seed"].is_number_unsigned()) << config.dump();
    EXPECT_EQ(config["train"]["seed"].get<uint64_t>(), c.seed) << c.how;
    const auto state = read_json(run + "/checkpoints/step_000001/trainer_state.json");
    EXPECT_EQ(state["seed"].get<uint64_t>(), c.seed) << c.how;
    EXPECT_EQ(state["config"]["train"]["seed"].get<uint64_t>(), c.seed) << c.how;
    // Resuming reads the seed back from both files and checks that they agree.
    const CmdResult r = forge("train --resume " + run + " --steps 2");
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_EQ(read_json(run + "/config.json")["train"]["seed"].get<uint64_t>(), c.seed) << c.how;
  }
  // (A run directory and 1 step, so that a forge which accepted these would end quickly.)
  const std::string bad = "train --data " + dir_.string() + " --out " + p("bad") + " --steps 1";
  expect_user_error(forge(bad + " seed=18446744073709551616" + kSmallModel),
                    "seed: expected an integer in [0, 18446744073709551615]");
  expect_user_error(forge(bad + " seed=-1" + kSmallModel), "got '-1'");
  expect_user_error(forge(bad + " seed=1e9" + kSmallModel), "got '1e9'");
  EXPECT_FALSE(fs::exists(p("bad/metrics.jsonl")));
}

// Before: --seed was read as an int, so 2^53 + 1 became 1 (its low 32 bits).
TEST_F(CliTest, GenerateSeedUsesAll64Bits) {
  ModelConfig cfg = preset_config("tiny");
  cfg.vocab_size = 64;
  cfg.max_seq_len = 32;
  cfg.n_layer = 1;
  cfg.n_embd = 16;
  cfg.n_head = cfg.n_kv_head = 2;
  cfg.ffn_hidden = 32;
  Transformer<float> model(cfg);
  model.init_weights(7);
  save_model_dir(p("model"), model);
  auto library = [&](uint64_t seed) {
    SampleOptions opt;
    opt.max_new_tokens = 24;
    opt.seed = seed;
    return generate(model, {1, 2, 3}, opt);
  };
  auto cli = [&](const std::string& seed) {
    const CmdResult r = forge("generate --model " + p("model") +
                              " --ids 1,2,3 --max-new-tokens 24 --json --seed " + seed);
    EXPECT_EQ(r.code, 0) << r.err;
    return nlohmann::json::parse(r.out)["ids"].get<std::vector<int32_t>>();
  };
  const uint64_t seed = 9007199254740993ull;  // 2^53 + 1
  // The test can tell: the seed's int and double images sample other tokens.
  ASSERT_NE(library(seed), library(1));
  ASSERT_NE(library(seed), library(9007199254740992ull));
  EXPECT_EQ(cli("9007199254740993"), library(seed));
  EXPECT_EQ(cli("18446744073709551615"), library(UINT64_MAX));
  expect_user_error(
      forge("generate --model " + p("model") + " --ids 1 --seed 18446744073709551616"),
      "--seed: expected an integer in [0, 18446744073709551615]");
  expect_user_error(forge("generate --model " + p("model") + " --ids 1 --seed -1"), "--seed");
  expect_user_error(forge("generate --model " + p("model") + " --ids ' 1'"), "bad token id ' 1'");
}

// `forge sample` is `forge generate` under another name: listed as an alias, same help, same
// output, same errors.
TEST_F(CliTest, SampleIsAnAliasOfGenerate) {
  const CmdResult help = forge("--help");
  EXPECT_EQ(help.code, 0);
  EXPECT_NE(help.out.find("  sample       alias of generate\n"), std::string::npos) << help.out;
  const CmdResult gen_help = forge("generate --help"), sample_help = forge("sample --help");
  EXPECT_EQ(sample_help.code, 0);
  EXPECT_EQ(sample_help.out, gen_help.out);
  EXPECT_NE(sample_help.out.find("usage: forge generate"), std::string::npos);

  ModelConfig cfg = preset_config("tiny");
  cfg.vocab_size = 64;
  cfg.max_seq_len = 32;
  cfg.n_layer = 1;
  cfg.n_embd = 16;
  cfg.n_head = cfg.n_kv_head = 2;
  cfg.ffn_hidden = 32;
  Transformer<float> model(cfg);
  model.init_weights(3);
  save_model_dir(p("model"), model);
  SampleOptions opt;
  opt.max_new_tokens = 6;
  opt.seed = 5;
  const std::vector<int32_t> want = generate(model, {4, 5}, opt);
  const std::string args =
      " --model " + p("model") + " --ids 4,5 --max-new-tokens 6 --seed 5 --json";
  const CmdResult s = forge("sample" + args), g = forge("generate" + args);
  ASSERT_EQ(s.code, 0) << s.err;
  EXPECT_EQ(nlohmann::json::parse(s.out)["ids"].get<std::vector<int32_t>>(), want);
  EXPECT_EQ(s.out, g.out);
  expect_user_error(forge("sample --model " + p("model")), "give exactly one of --prompt");
  expect_user_error(forge("sample --bogus"), "unknown option --bogus");
}

// Before: --help listed the training keys by hand (save_every and keep_checkpoints were
// missing), and the overrides had no ranges: beta2=1 divided by zero in AdamW's bias correction,
// eval_windows=0 averaged over no windows.
TEST_F(CliTest, TrainSettingsHaveRangesAndAreAllListedInHelp) {
  const CmdResult h = forge("train --help");
  ASSERT_EQ(h.code, 0);
  for (const TrainField& f : train_fields())
    EXPECT_NE(h.out.find("    " + std::string(f.name) + "=" + f.metavar + " "), std::string::npos)
        << f.name << "\n"
        << h.out;
  EXPECT_NE(h.out.find("(default 1337; 0 to 2^64-1)"), std::string::npos) << h.out;
  EXPECT_NE(h.out.find("(default 0.95; [0, 1))"), std::string::npos) << h.out;

  write_counting_shard(p("ok.bin"), 4000, 50);
  const std::string train =
      "train --data " + p("ok.bin") + " --out " + p("run") + " --steps 1" + kSmallModel;
  expect_user_error(forge(train + " beta2=1"), "beta2: expected a number in [0, 1), got '1'");
  expect_user_error(forge(train + " eval_windows=0"),
                    "eval_windows: expected an integer in [1, 2147483647], got '0'");
  expect_user_error(forge(train + " warmup_steps=-2"), "warmup_steps: expected an integer in [-1,");
  expect_user_error(forge(train + " min_lr_frac=1.5"), "min_lr_frac: expected a number in [0, 1]");
  expect_user_error(forge(train + " recompute=some"), "recompute: expected none, attn, mlp or full, got 'some'");
  std::ofstream(p("cfg.json")) << R"({"eps": 0})";
  expect_user_error(forge(train + " --config " + p("cfg.json")),
                    "eps: expected a number > 0, got '0'");
  std::ofstream(p("cfg2.json")) << R"({"recompute": "all"})";
  expect_user_error(forge(train + " --config " + p("cfg2.json")),
                    "recompute: expected none, attn, mlp or full, got 'all'");
  EXPECT_FALSE(fs::exists(p("run/metrics.jsonl")));
}

// Before: the model keys of --help were a hand-written list, and the overrides took any int or
// double: n_layer=0 got as far as validate(), norm_eps=1e39 became an infinite epsilon.
TEST_F(CliTest, ModelSettingsAreCheckedAndListedInHelp) {
  const CmdResult h = forge("train --help");
  ASSERT_EQ(h.code, 0);
  for (const ModelSetting& m : model_settings())
    EXPECT_NE(h.out.find("    " + m.name + "=" + m.metavar + " "), std::string::npos)
        << m.name << "\n"
        << h.out;
  write_counting_shard(p("ok.bin"), 4000, 50);
  const std::string train =
      "train --data " + p("ok.bin") + " --out " + p("run") + " --steps 1" + kSmallModel;
  expect_user_error(forge(train + " n_layer=0"),
                    "n_layer: expected an integer in [1, 2147483647], got '0'");
  expect_user_error(forge(train + " norm_eps=1e39"),
                    "norm_eps: expected a value that fits a 32-bit float, got '1e39'");
  expect_user_error(forge(train + " rope_style=spiral"), "rope_style: expected rotate_half or");
  EXPECT_FALSE(fs::exists(p("run/metrics.jsonl")));
}

TEST_F(CliTest, QuickstartRunsOnASmallCorpus) {
  fs::create_directories(p("corpus"));
  {
    std::ofstream f(p("corpus/proverbs"));
    for (int i = 0; i < 200; ++i) f << "A stitch in time saves nine.\n%\nLook before you leap, number " << i << ".\n%\n";
  }
  std::ofstream(p("corpus/proverbs.dat")) << "binary index to be skipped";
  const CmdResult r = forge("quickstart --corpus " + p("corpus") + " --out " + p("qs") + " --steps 4");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("400 documents"), std::string::npos) << r.out;
  EXPECT_TRUE(fs::exists(p("qs/model/tokenizer.json")));  // the trained tokenizer travels with the model
  const CmdResult g = forge("generate --model " + p("qs/model") + " --prompt 'A stitch in' --max-new-tokens 6 --temperature 0 --json");
  ASSERT_EQ(g.code, 0) << g.err;
  const auto j = nlohmann::json::parse(g.out);
  EXPECT_EQ(j["ids"].size(), 6u);
  EXPECT_TRUE(j["text"].is_string());
  expect_user_error(forge("generate --model " + p("qs/model") + " --prompt x --ids 1"), "exactly one of");
  EXPECT_NE(r.out.find("samples"), std::string::npos) << r.out;
  EXPECT_TRUE(fs::exists(p("qs/metrics.jsonl")));
  EXPECT_TRUE(fs::exists(p("qs/data/train_000000.bin")));
  expect_user_error(forge("quickstart --corpus " + p("nocorpus") + " --out " + p("qs2")), "corpus not found");
}

}  // namespace
}  // namespace forge
