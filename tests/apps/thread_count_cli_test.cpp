// The README's promise as a user meets it: `forge train` with OMP_NUM_THREADS=1, 2 and 3 in its
// environment logs the same metrics.jsonl numbers, bit for bit, and saves the same weights.
// The in-process twin, on both model families, is tests/train/thread_count_test.cpp.
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "testing.h"
#include "train/counting_corpus.h"
#include "forge_bin.h"

namespace forge {
namespace {

namespace fs = std::filesystem;

class CliThreadCount : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("forge_cli_threads_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "data");
    testing::write_counting_corpus(dir_ / "data");
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Trains with `threads` OpenMP threads; returns the run directory. B·T = 5·29 = 145 rows, so
  // no thread count splits the products on a block boundary.
  fs::path train_with(int threads) {
    const fs::path run = dir_ / ("threads_" + std::to_string(threads));
    const std::string cmd = "OMP_NUM_THREADS=" + std::to_string(threads) + " " + FORGE_BIN +
                            " train --data " + (dir_ / "data").string() + " --out " + run.string() +
                            " --steps 4 vocab_size=16 max_seq_len=32 n_layer=2 n_embd=64"
                            " n_head=4 ffn_hidden=256 batch_size=5 seq_len=29 grad_accum=2"
                            " eval_every=2 eval_windows=16 lr=1e-2 warmup_steps=1 >" +
                            (dir_ / "log").string() + " 2>&1 </dev/null";
    EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
    return run;
  }
  static std::vector<nlohmann::json> metrics(const fs::path& run) {
    std::vector<nlohmann::json> out;
    std::ifstream f(run / "metrics.jsonl");
    std::string line;
    while (std::getline(f, line)) out.push_back(nlohmann::json::parse(line));
    return out;
  }
  static std::string bytes(const fs::path& p) {
    std::ifstream f(p, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  }

  fs::path dir_;
};

TEST_F(CliThreadCount, TrainLogsIdenticalLossesForAnyOmpNumThreads) {
  const fs::path ref = train_with(1);
  const auto want = metrics(ref);
  ASSERT_EQ(want.size(), 5u);  // 4 steps and the final evaluation
  for (int threads : {2, 3}) {
    const fs::path run = train_with(threads);
    const auto got = metrics(run);
    ASSERT_EQ(got.size(), want.size()) << threads << " threads";
    for (size_t i = 0; i < want.size(); ++i) {
      for (const char* k : {"loss", "grad_norm", "val_loss"}) {
        ASSERT_EQ(got[i].contains(k), want[i].contains(k)) << "line " << i << " " << k;
        if (want[i].contains(k)) {
          EXPECT_EQ(got[i][k].get<double>(), want[i][k].get<double>())
              << "step " << want[i]["step"] << " " << k << " with OMP_NUM_THREADS=" << threads
              << " (1: " << want[i][k] << ")";
        }
      }
    }
    EXPECT_TRUE(bytes(run / "model/model.safetensors") == bytes(ref / "model/model.safetensors"))
        << "final weights differ with OMP_NUM_THREADS=" << threads;
  }
}

}  // namespace
}  // namespace forge
