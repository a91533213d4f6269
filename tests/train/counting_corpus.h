// The training tests' corpus: a learnable language of runs of a random start token counting up
// mod 16 (the next token is determined by the previous one except at run boundaries), written
// as dir/train_000000.bin (20,000 tokens) and dir/val_000000.bin (2,000), as `forge data`
// writes them. CountingCorpusRun: the fixture the save/carry tests share around it.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "forge/core/rng.h"
#include "forge/data/shard.h"
#include "forge/model/config.h"
#include "forge/train/checkpoint.h"
#include "forge/train/train_config.h"

namespace forge::testing {

inline void write_counting_corpus(const std::filesystem::path& dir) {
  Rng rng(3);
  std::vector<uint32_t> train, val;
  for (auto* v : {&train, &val}) {
    while (v->size() < (v == &train ? 20000u : 2000u)) {
      uint32_t t = static_cast<uint32_t>(rng.below(16));
      for (int k = 0; k < 24; ++k) v->push_back(t = (t + 1) % 16);
    }
  }
  write_shard((dir / "train_000000.bin").string(), train);
  write_shard((dir / "val_000000.bin").string(), val);
}

// A fresh temporary directory per test (dir_, named PREFIX_PID_TEST) holding data/ with the
// counting corpus; a one-layer tiny model over its 16 ids and a short run's settings.
class CountingCorpusRun : public ::testing::Test {
 protected:
  explicit CountingCorpusRun(std::string prefix) : prefix_(std::move(prefix)) {}
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           (prefix_ + "_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_ / "data");
    write_counting_corpus(dir_ / "data");
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  static ModelConfig model() {
    ModelConfig c = preset_config("tiny");
    c.vocab_size = 16;
    c.max_seq_len = 16;
    c.n_layer = 1;
    c.n_embd = 16;
    c.n_head = c.n_kv_head = 2;
    c.ffn_hidden = 32;
    return c;
  }
  static TrainConfig config(int steps, int save_every) {
    TrainConfig t;
    t.steps = steps;
    t.save_every = save_every;
    t.batch_size = 2;
    t.seq_len = 16;
    t.eval_every = 100;
    t.eval_windows = 2;
    t.quiet = true;
    return t;
  }
  // The model directories a run saved: model/ and every checkpoint.
  static std::vector<std::filesystem::path> saved_models(const std::filesystem::path& run) {
    std::vector<std::filesystem::path> dirs = {run / "model"};
    for (const auto& [step, path] : list_checkpoints(run.string())) dirs.emplace_back(path);
    return dirs;
  }

  std::filesystem::path dir_;

 private:
  std::string prefix_;
};

}  // namespace forge::testing
