// A whole CPU training run logs the same numbers, bit for bit, whatever the OpenMP thread count:
// forge::train with 1, 2 and 3 threads (omp_set_num_threads, in process), on both model
// families, with gradient accumulation and evaluations, compared line by line in metrics.jsonl
// and byte by byte in the saved weights. The shapes are small but awkward (B·T = 145 rows,
// widths 64–256) so that the products are big enough to fork and their row splits fall on no
// block boundary; the per-op guarantees behind this are in tests/backend/cpu/thread_count_test.
// tests/apps/thread_count_cli_test.cpp does the same through the binary with OMP_NUM_THREADS.
#include <omp.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "forge/model/config.h"
#include "forge/train/trainer.h"
#include "testing.h"
#include "train/counting_corpus.h"

namespace forge {
namespace {

namespace fs = std::filesystem;

class TrainThreadCount : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("forge_train_threads_" + std::to_string(::getpid()) + "_" + GetParam());
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "data");
    testing::write_counting_corpus(dir_ / "data");
    saved_threads_ = omp_get_max_threads();
  }
  void TearDown() override {
    omp_set_num_threads(saved_threads_);
    fs::remove_all(dir_);
  }

  ModelConfig model() const {
    ModelConfig c = preset_config(GetParam());
    c.vocab_size = 16;
    c.max_seq_len = 32;
    c.n_layer = 2;
    c.n_embd = 64;
    c.n_head = 4;
    c.n_kv_head = c.family == Family::kLlama ? 2 : 4;  // grouped-query attention for llama
    c.ffn_hidden = c.family == Family::kLlama ? 176 : 256;
    return c;
  }
  static TrainConfig config() {
    TrainConfig t;
    t.steps = 4;
    t.batch_size = 5;
    t.seq_len = 29;
    t.grad_accum = 2;
    t.lr = 1e-2;
    t.warmup_steps = 1;
    t.eval_every = 2;
    t.eval_windows = 16;
    t.quiet = true;
    return t;
  }
  fs::path run_with(int threads) {
    omp_set_num_threads(threads);
    const fs::path out = dir_ / ("threads_" + std::to_string(threads));
    train(model(), config(), (dir_ / "data").string(), out.string());
    return out;
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
  int saved_threads_ = 1;
};

TEST_P(TrainThreadCount, LossesAndWeightsIndependentOfThreadCount) {
  const fs::path ref = run_with(1);
  const auto want = metrics(ref);
  ASSERT_EQ(want.size(), 5u);  // 4 steps and the final evaluation
  for (int threads : {2, 3}) {
    const fs::path run = run_with(threads);
    const auto got = metrics(run);
    ASSERT_EQ(got.size(), want.size()) << threads << " threads";
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_EQ(got[i]["step"], want[i]["step"]);
      for (const char* k : {"loss", "grad_norm", "lr", "val_loss"}) {
        ASSERT_EQ(got[i].contains(k), want[i].contains(k)) << "line " << i << " " << k;
        if (want[i].contains(k)) {
          EXPECT_EQ(got[i][k].get<double>(), want[i][k].get<double>())
              << "step " << want[i]["step"] << " " << k << " with " << threads
              << " threads (1 thread: " << want[i][k] << ")";
        }
      }
    }
    EXPECT_TRUE(bytes(run / "model/model.safetensors") == bytes(ref / "model/model.safetensors"))
        << "final weights differ with " << threads << " threads";
  }
}

INSTANTIATE_TEST_SUITE_P(BothFamilies, TrainThreadCount, ::testing::Values("tiny", "llama-10m"),
                         [](const auto& info) {
                           return std::string(info.param == std::string("tiny") ? "Gpt2" : "Llama");
                         });

}  // namespace
}  // namespace forge
