#include "forge/train/trainer.h"

#include <cmath>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "forge/core/error.h"
#include "forge/data/shard.h"
#include "forge/model/model_dir.h"
#include "forge/train/checkpoint.h"
#include "forge/train/schedule.h"
#include "testing.h"
#include "train/counting_corpus.h"

namespace forge {
namespace {

namespace fs = std::filesystem;

TEST(LrSchedule, WarmupThenCosineToTheFloor) {
  const LrSchedule s{1.0, 10, 110, 0.1};
  EXPECT_DOUBLE_EQ(s.at(0), 0.1);  // (0 + 1) / 10
  EXPECT_DOUBLE_EQ(s.at(9), 1.0);
  EXPECT_DOUBLE_EQ(s.at(10), 1.0);     // cosine starts at the peak
  EXPECT_NEAR(s.at(60), 0.55, 1e-12);  // halfway: min + (max − min)/2
  EXPECT_NEAR(s.at(110), 0.1, 1e-12);
}

class TrainerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("forge_train_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "data");
    testing::write_counting_corpus(dir_ / "data");
  }
  void TearDown() override { fs::remove_all(dir_); }

  ModelConfig model() const {
    ModelConfig c = preset_config("tiny");
    c.vocab_size = 16;
    c.max_seq_len = 32;
    c.n_layer = 1;
    c.n_embd = 32;
    c.n_head = c.n_kv_head = 2;
    c.ffn_hidden = 64;
    return c;
  }
  TrainConfig config() const {
    TrainConfig t;
    t.steps = 40;
    t.batch_size = 4;
    t.seq_len = 32;
    t.lr = 1e-2;
    t.warmup_steps = 4;
    t.eval_every = 10;
    t.eval_windows = 1000;  // all of them
    t.quiet = true;
    return t;
  }
  std::vector<nlohmann::json> read_metrics(const fs::path& run) {
    std::vector<nlohmann::json> out;
    std::ifstream f(run / "metrics.jsonl");
    std::string line;
    while (std::getline(f, line)) out.push_back(nlohmann::json::parse(line));
    return out;
  }

  fs::path dir_;
};

TEST_F(TrainerTest, LearnsWritesMetricsPlotAndModel) {
  const fs::path run = dir_ / "run";
  const TrainResult r = train(model(), config(), (dir_ / "data").string(), run.string());
  // Uniform guessing over 16 tokens is log 16 = 2.77; the sequence is ~96% predictable.
  EXPECT_NEAR(r.first_val_loss, std::log(16.0), 0.3);
  EXPECT_LT(r.last_val_loss, 0.5 * r.first_val_loss);
  const auto m = read_metrics(run);
  ASSERT_EQ(m.size(), 41u);  // 40 steps + the final evaluation
  for (int s = 0; s < 40; ++s) {
    EXPECT_EQ(m[s]["step"], s);
    for (const char* k : {"loss", "lr", "grad_norm", "tokens_per_s"})
      EXPECT_TRUE(m[s].contains(k)) << k;
    EXPECT_EQ(m[s].contains("val_loss"), s % 10 == 0) << s;
  }
  EXPECT_DOUBLE_EQ(m[40]["val_loss"].get<double>(), r.last_val_loss);
  std::ifstream svg(run / "loss.svg");
  std::string text((std::istreambuf_iterator<char>(svg)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("<svg"), std::string::npos);
  EXPECT_NE(text.find("<polyline"), std::string::npos);

  // The saved model reproduces the final validation loss.
  Transformer<float> loaded = load_model_dir((run / "model").string());
  Shard val = Shard::open((dir_ / "data/val_000000.bin").string());
  std::vector<Shard> shards;
  shards.push_back(std::move(val));
  EvalWindows w(&shards, {{0, 0, shards[0].size()}}, 32);
  double sum = 0;
  std::vector<int32_t> x(32), y(32);
  for (int64_t i = 0; i < w.count(); ++i) {
    w.window(i, x.data(), y.data());
    sum += loaded.loss(x.data(), y.data(), 1, 32);
  }
  EXPECT_NEAR(sum / w.count(), r.last_val_loss, 1e-5);
}

TEST_F(TrainerTest, TwoRunsAreBitIdentical) {
  TrainConfig c = config();
  c.steps = 8;
  train(model(), c, (dir_ / "data").string(), (dir_ / "a").string());
  train(model(), c, (dir_ / "data").string(), (dir_ / "b").string());
  const auto a = read_metrics(dir_ / "a"), b = read_metrics(dir_ / "b");
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i + 1 < a.size(); ++i) {
    EXPECT_EQ(a[i]["loss"].get<double>(), b[i]["loss"].get<double>()) << i;
    EXPECT_EQ(a[i]["grad_norm"].get<double>(), b[i]["grad_norm"].get<double>()) << i;
  }
}

TEST_F(TrainerTest, GradientAccumulationMatchesOneBigBatch) {
  // 2 micro-batches of 2 sequences vs 1 batch of 4: same data order (the loader draws the same
  // windows), same mean loss — up to float summation order.
  TrainConfig big = config(), acc = config();
  big.steps = acc.steps = 3;
  acc.batch_size = 2;
  acc.grad_accum = 2;
  train(model(), big, (dir_ / "data").string(), (dir_ / "big").string());
  train(model(), acc, (dir_ / "data").string(), (dir_ / "acc").string());
  const auto a = read_metrics(dir_ / "big"), b = read_metrics(dir_ / "acc");
  for (int i = 0; i < 3; ++i) {
    EXPECT_NEAR(a[i]["loss"].get<double>(), b[i]["loss"].get<double>(), 1e-5) << i;
    EXPECT_NEAR(a[i]["grad_norm"].get<double>(), b[i]["grad_norm"].get<double>(), 1e-4) << i;
  }
}

TEST_F(TrainerTest, RefusesToOverwriteARun) {
  TrainConfig c = config();
  c.steps = 1;
  train(model(), c, (dir_ / "data").string(), (dir_ / "r").string());
  const auto before = fs::file_size(dir_ / "r/metrics.jsonl");
  EXPECT_THROW(train(model(), c, (dir_ / "data").string(), (dir_ / "r").string()), Error);
  EXPECT_EQ(fs::file_size(dir_ / "r/metrics.jsonl"), before);
}

TEST_F(TrainerTest, RejectsIdsBeyondTheVocabulary) {
  ModelConfig m = model();
  m.vocab_size = 10;  // the data uses ids up to 15
  EXPECT_THROW(train(m, config(), (dir_ / "data").string(), (dir_ / "v").string()), Error);
}

std::string file_bytes(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

// Stopped twice and resumed twice (with gradient accumulation and evaluations in between):
// every logged number and the final weights match a run that never stopped, bit for bit.
TEST_F(TrainerTest, ResumeIsBitIdentical) {
  TrainConfig c = config();
  c.steps = 9;
  c.grad_accum = 2;
  c.batch_size = 2;
  c.eval_every = 4;
  c.eval_windows = 8;
  c.save_every = 4;
  const std::string data = (dir_ / "data").string();
  train(model(), c, data, (dir_ / "a").string());

  // The stop flag is polled after each step: set from the start, each call runs one step.
  volatile std::sig_atomic_t stop = 1;
  RunOptions opt;
  opt.stop = &stop;
  opt.quiet = true;
  const TrainResult r1 = train(model(), c, data, (dir_ / "b").string(), opt);
  EXPECT_TRUE(r1.interrupted);
  EXPECT_EQ(r1.steps_done, 1);
  EXPECT_FALSE(fs::exists(dir_ / "b/model"));
  ASSERT_EQ(list_checkpoints((dir_ / "b").string()).back().first, 1);
  const TrainResult r2 = resume((dir_ / "b").string(), 0, "", opt);
  EXPECT_EQ(r2.steps_done, 2);
  opt.stop = nullptr;
  const TrainResult r3 = resume((dir_ / "b").string(), 0, "", opt);
  EXPECT_FALSE(r3.interrupted);
  EXPECT_EQ(r3.steps_done, 9);

  const auto a = read_metrics(dir_ / "a"), b = read_metrics(dir_ / "b");
  ASSERT_EQ(a.size(), 10u);
  ASSERT_EQ(b.size(), a.size());  // the lines of the stopped attempts were replaced, not repeated
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(b[i]["step"], a[i]["step"]);
    for (const char* k : {"loss", "grad_norm", "lr", "val_loss"}) {
      ASSERT_EQ(a[i].contains(k), b[i].contains(k)) << i << " " << k;
      if (a[i].contains(k)) {
        EXPECT_EQ(a[i][k].get<double>(), b[i][k].get<double>()) << i << " " << k;
      }
    }
  }
  EXPECT_EQ(file_bytes(dir_ / "a/model/model.safetensors"),
            file_bytes(dir_ / "b/model/model.safetensors"));
  // Checkpoints at 4 and 8 (save_every) and 9 (the end); the stops' 1 and 2 were pruned (keep 3).
  std::vector<int> steps;
  for (const auto& [s, path] : list_checkpoints((dir_ / "b").string())) steps.push_back(s);
  EXPECT_EQ(steps, (std::vector<int>{4, 8, 9}));
  EXPECT_EQ(file_bytes(dir_ / "a/checkpoints/step_000008/optimizer.safetensors"),
            file_bytes(dir_ / "b/checkpoints/step_000008/optimizer.safetensors"));
}

// An interleaved-RoPE run resumes interleaved: the checkpoint's config.json records the style,
// so the resumed steps log the losses the uninterrupted run logged.
TEST_F(TrainerTest, InterleavedRopeRunResumesInterleaved) {
  ModelConfig m = model();
  m.family = Family::kLlama;
  m.n_kv_head = 1;
  m.tie_embeddings = false;
  m.rope_style = RopeStyle::kInterleaved;
  TrainConfig c = config();
  c.steps = 6;
  c.save_every = 3;
  c.eval_every = 3;
  c.eval_windows = 8;
  const fs::path run = dir_ / "run";
  train(m, c, (dir_ / "data").string(), run.string());
  const auto ref = read_metrics(run);
  nlohmann::json rc = nlohmann::json::parse(std::ifstream(run / "config.json"));
  EXPECT_EQ(rc["model"].value("forge_rope_style", ""), "interleaved");
  // Back to the checkpoint of step 3, as if the run had been killed after it.
  fs::remove_all(run / "checkpoints/step_000006");
  fs::remove_all(run / "model");
  RunOptions opt;
  opt.quiet = true;
  resume(run.string(), 0, "", opt);
  EXPECT_EQ(load_model_dir((run / "model").string()).config().rope_style, RopeStyle::kInterleaved);
  const auto again = read_metrics(run);
  ASSERT_EQ(again.size(), ref.size());
  for (size_t i = 3; i < ref.size(); ++i)
    for (const char* k : {"loss", "val_loss"})
      if (ref[i].contains(k)) {
        EXPECT_EQ(again[i][k].get<double>(), ref[i][k].get<double>()) << "line " << i << " " << k;
      }
}

// recompute=full (two layers: the second's ln1 is recomputed through the fused residual norm)
// trains what recompute=none trains, bit for bit, and the run records the level, so a resumed run
// keeps it.
TEST_F(TrainerTest, RecomputeTrainsBitIdenticallyAndIsKeptOnResume) {
  ModelConfig m = model();
  m.n_layer = 2;
  TrainConfig c = config();
  c.steps = 6;
  c.save_every = 3;
  c.eval_every = 3;
  c.eval_windows = 8;
  const std::string data = (dir_ / "data").string();
  train(m, c, data, (dir_ / "none").string());
  ASSERT_TRUE(c.apply_override("recompute", "full"));
  const fs::path run = dir_ / "full";
  train(m, c, data, run.string());
  nlohmann::json rc = nlohmann::json::parse(std::ifstream(run / "config.json"));
  EXPECT_EQ(rc["train"]["recompute"], "full");
  fs::remove_all(run / "checkpoints/step_000006");
  fs::remove_all(run / "model");
  RunOptions opt;
  opt.quiet = true;
  resume(run.string(), 0, "", opt);
  rc = nlohmann::json::parse(std::ifstream(run / "config.json"));
  EXPECT_EQ(rc["train"]["recompute"], "full");
  const auto a = read_metrics(dir_ / "none"), b = read_metrics(run);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i)
    for (const char* k : {"loss", "grad_norm", "val_loss"})
      if (a[i].contains(k)) {
        EXPECT_EQ(b[i][k].get<double>(), a[i][k].get<double>()) << "line " << i << " " << k;
      }
  EXPECT_EQ(file_bytes(dir_ / "none/model/model.safetensors"), file_bytes(run / "model/model.safetensors"));
}

// A checkpoint whose run configuration records no device (an older forge wrote it) is not
// guessed at: resume() asks for one, and continues where it is told.
TEST_F(TrainerTest, ResumeOfARunWithoutARecordedDeviceNeedsOne) {
  TrainConfig c = config();
  c.steps = 4;
  c.save_every = 2;
  c.eval_windows = 4;
  const fs::path run = dir_ / "run";
  train(model(), c, (dir_ / "data").string(), run.string());
  fs::remove_all(run / "checkpoints/step_000004");
  const fs::path state = run / "checkpoints/step_000002/trainer_state.json";
  nlohmann::json j = nlohmann::json::parse(std::ifstream(state));
  j["config"].erase("device");
  j["config"].erase("precision");
  std::ofstream(state) << j.dump();
  RunOptions opt;
  opt.quiet = true;
  try {
    resume(run.string(), 0, "", opt);
    ADD_FAILURE() << "resumed without a device";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("records no device"), std::string::npos) << e.what();
  }
  opt.device = "cpu";
  EXPECT_EQ(resume(run.string(), 0, "", opt).steps_done, 4);
  opt.precision = "bf16";
  EXPECT_THROW(train(model(), c, (dir_ / "data").string(), (dir_ / "bad").string(), opt), Error);
  EXPECT_FALSE(fs::exists(dir_ / "bad"));
}

TEST_F(TrainerTest, ResumeNeedsACheckpoint) {
  TrainConfig c = config();
  c.steps = 2;
  c.eval_windows = 4;
  train(model(), c, (dir_ / "data").string(), (dir_ / "r").string());
  EXPECT_THROW(resume((dir_ / "r").string(), 0), Error);  // trained without --save-every
  EXPECT_THROW(resume((dir_ / "nothing").string(), 0), Error);
}

// --init-from: the run starts from the saved weights (its first validation loss is the source
// run's last), and the source's tokenizer.json travels into the new run's model.
TEST_F(TrainerTest, InitFromStartsFromTheModelsWeights) {
  TrainConfig c = config();
  c.steps = 10;
  c.eval_windows = 16;
  const std::string data = (dir_ / "data").string();
  const TrainResult src = train(model(), c, data, (dir_ / "src").string());
  std::ofstream(dir_ / "src/model/tokenizer.json") << "{\"model\": {\"type\": \"BPE\"}}";
  c.steps = 2;
  c.seed = 99;
  const TrainResult r = train_from((dir_ / "src/model").string(), c, data, (dir_ / "ft").string());
  EXPECT_EQ(r.first_val_loss, src.last_val_loss);
  EXPECT_LT(r.first_val_loss, 0.7 * std::log(16.0));  // not a fresh model
  EXPECT_EQ(file_bytes(dir_ / "ft/model/tokenizer.json"),
            file_bytes(dir_ / "src/model/tokenizer.json"));
  EXPECT_THROW(train_from((dir_ / "none").string(), c, data, (dir_ / "ft2").string()), Error);
}

}  // namespace
}  // namespace forge
