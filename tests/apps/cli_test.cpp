// The forge binary as a user meets it: exit codes, one-line errors, --help, JSON output.
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "forge/data/shard.h"
#include "testing.h"

namespace forge {
namespace {

namespace fs = std::filesystem;

struct CmdResult {
  int code;
  std::string out, err;
};

class CliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("forge_cli_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  CmdResult forge(const std::string& args) {
    const std::string out = (dir_ / "stdout").string(), err = (dir_ / "stderr").string();
    const std::string cmd = std::string(FORGE_BIN) + " " + args + " >" + out + " 2>" + err + " </dev/null";
    const int status = std::system(cmd.c_str());
    auto slurp = [](const std::string& p) {
      std::ifstream f(p);
      std::stringstream s;
      s << f.rdbuf();
      return s.str();
    };
    return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, slurp(out), slurp(err)};
  }
  std::string p(const std::string& name) const { return (dir_ / name).string(); }

  // A one-line error on stderr, a non-zero exit, no crash.
  void expect_user_error(const CmdResult& r, const std::string& needle) {
    EXPECT_EQ(r.code, 1) << r.err;
    EXPECT_NE(r.err.find(needle), std::string::npos) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  }

  void write_counting_shard(const std::string& path, int n, int mod) {
    std::vector<uint32_t> t(n);
    for (int i = 0; i < n; ++i) t[i] = static_cast<uint32_t>(i % mod);
    write_shard(path, t);
  }

  fs::path dir_;
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
