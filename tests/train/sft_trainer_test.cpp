// Supervised fine-tuning through the trainer (forge train --init-from --sft): the loss counts
// the assistant tokens only, as their mean over the whole step under gradient accumulation; and
// the acceptance run of issue 14: a briefly pretrained tiny model, which cannot reverse a word,
// fine-tuned until its greedy answers to held-out words are >= 95% right.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "forge/chat/chat_template.h"
#include "forge/chat/sft_example.h"
#include "forge/core/error.h"
#include "forge/core/rng.h"
#include "forge/data/prepare.h"
#include "forge/generate/engine.h"
#include "forge/model/model_dir.h"
#include "train/sft_task.h"
#include "forge/tokenizer/trainer.h"
#include "forge/train/trainer.h"

namespace forge {
namespace {

namespace fs = std::filesystem;

using namespace sft_task;

class SftTrainerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("forge_sft_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // The tiny GPT-2 (width 64, 2 layers) pretrained on random words for `steps` steps
  // (sft_task.h). Returns the model directory.
  std::string pretrained_model(int steps) {
    return sft_task::pretrained_model(dir_, steps, tiny_gpt2());
  }

  TrainConfig sft_config(int steps) const { return sft_task::sft_config(steps, 3e-3); }

  fs::path dir_;
};

RunOptions sft() {
  RunOptions o;
  o.sft = true;
  o.quiet = true;
  return o;
}

// The share of `words` the model in `model_dir` reverses (sft_task.h).
double reversal_accuracy(const std::string& model_dir, const std::vector<std::string>& words) {
  return sft_task::reversal_accuracy(load_model_dir(model_dir), model_dir, words);
}

TEST_F(SftTrainerTest, LossIsTheMeanOverAssistantTokensOnly) {
  const std::string base = pretrained_model(5);
  // One example: its loss is the mean of the per-token losses of the response's targets.
  std::ofstream(dir_ / "one.jsonl") << pair_line("abcde", "edcba");
  TrainConfig t = sft_config(1);
  t.batch_size = 1;
  t.sft_val_frac = 0;
  t.lr = 1e-12;  // the step changes (almost) nothing: the metric is the base model's loss
  train_from(base, t, (dir_ / "one.jsonl").string(), (dir_ / "run").string(), sft());
  const double step_loss = metrics(dir_ / "run")[0]["loss"].get<double>();

  Transformer<float> model = load_model_dir(base);
  const tok::Tokenizer tok = tok::Tokenizer::load(base + "/tokenizer.json");
  const chat::EncodedChat enc = chat::encode_sft_example(
      chat::ChatTemplate::load(base), tok, {{{"user", "abcde"}, {"assistant", "edcba"}}, "x"});
  const int T_ = static_cast<int>(enc.ids.size()) - 1;
  std::vector<int32_t> x(enc.ids.begin(), enc.ids.end() - 1);
  double trained_sum = 0, all_sum = 0;
  int trained = 0;
  for (int i = 0; i < T_; ++i) {  // the loss of target i alone
    std::vector<int32_t> y(static_cast<size_t>(T_), -1);
    y[static_cast<size_t>(i)] = enc.ids[static_cast<size_t>(i) + 1];
    const double l = model.loss(x.data(), y.data(), 1, T_);
    all_sum += l;
    if (enc.trained[static_cast<size_t>(i) + 1]) trained_sum += l, ++trained;
  }
  // "edcba", <|im_end|> (and ChatML's "\n" after it): the prompt's 20-odd tokens are not.
  EXPECT_GE(trained, 6);
  EXPECT_LE(trained, 7);
  EXPECT_NEAR(step_loss, trained_sum / trained, 1e-5);
  EXPECT_GT(std::abs(step_loss - all_sum / T_), 0.05);  // the prompt's targets would move it
  EXPECT_EQ(metrics(dir_ / "run")[0]["trained_tokens"].get<int>(), trained);
}

TEST_F(SftTrainerTest, AccumulatedMicroBatchesGiveTheWholeBatchsMeanOverTrainedTokens) {
  const std::string base = pretrained_model(5);
  // Responses from 1 to 12 letters: micro-batches hold different numbers of trained tokens, so
  // weighting each micro-batch's mean by 1 / grad_accum would give another loss and gradient.
  Rng rng(5, 0);
  {
    std::ofstream f(dir_ / "mixed.jsonl");
    for (int i = 0; i < 64; ++i) {
      std::string r;
      const int n = 1 + static_cast<int>(rng.below(12));
      for (int k = 0; k < n; ++k) r += static_cast<char>('a' + rng.below(26));
      f << pair_line(word(rng), r);
    }
  }
  TrainConfig whole = sft_config(4);
  whole.batch_size = 8;
  whole.sft_val_frac = 0;
  TrainConfig split = whole;
  split.batch_size = 2;
  split.grad_accum = 4;
  train_from(base, whole, (dir_ / "mixed.jsonl").string(), (dir_ / "whole").string(), sft());
  train_from(base, split, (dir_ / "mixed.jsonl").string(), (dir_ / "split").string(), sft());
  const auto a = metrics(dir_ / "whole"), b = metrics(dir_ / "split");
  for (int s = 0; s < 4; ++s) {
    EXPECT_NEAR(a[s]["loss"].get<double>(), b[s]["loss"].get<double>(), 1e-5) << s;
    EXPECT_NEAR(a[s]["grad_norm"].get<double>(), b[s]["grad_norm"].get<double>(), 1e-4) << s;
    EXPECT_EQ(a[s]["trained_tokens"], b[s]["trained_tokens"]) << s;
  }
  const std::vector<float> wa = load_model_dir((dir_ / "whole/model").string()).weights();
  const std::vector<float> wb = load_model_dir((dir_ / "split/model").string()).weights();
  ASSERT_EQ(wa.size(), wb.size());
  double worst = 0;
  for (size_t i = 0; i < wa.size(); ++i) worst = std::max(worst, double(std::abs(wa[i] - wb[i])));
  EXPECT_LT(worst, 1e-4);
}

// Stopped after a step and resumed: the example order goes on from the checkpoint's position
// (into a second epoch), so every logged loss matches the run that never stopped, bit for bit.
TEST_F(SftTrainerTest, ResumedSftRunContinuesTheExampleOrder) {
  const std::string base = pretrained_model(2);
  Rng rng(9, 0);
  {
    std::ofstream f(dir_ / "ex.jsonl");
    for (int i = 0; i < 20; ++i) f << pair_line(word(rng), word(rng));
  }
  TrainConfig t = sft_config(1);
  t.epochs = 3;  // 19 train examples (1 held out) x 3 / 4 per step: 15 steps
  t.batch_size = 4;
  t.save_every = 5;
  t.eval_every = 4;
  const std::string data = (dir_ / "ex.jsonl").string();
  train_from(base, t, data, (dir_ / "a").string(), sft());
  volatile std::sig_atomic_t stop = 1;
  RunOptions o = sft();
  o.stop = &stop;
  EXPECT_TRUE(train_from(base, t, data, (dir_ / "b").string(), o).interrupted);
  o.stop = nullptr;
  o.sft = false;  // resume() takes it from the run's config.json
  const TrainResult r = resume((dir_ / "b").string(), 0, "", o);
  EXPECT_EQ(r.steps_done, 15);
  const auto a = metrics(dir_ / "a"), b = metrics(dir_ / "b");
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].value("loss", -1.0), b[i].value("loss", -1.0)) << i;
    EXPECT_EQ(a[i].value("val_loss", -1.0), b[i].value("val_loss", -1.0)) << i;
  }
}

TEST_F(SftTrainerTest, FineTuningTeachesAHeldOutTaskWithEpochsAndValidation) {
  const std::string base = pretrained_model(60);
  // Four-letter words (of 10,000): 3,000 to train on, 100 others to ask. (Words of 3 to 5
  // letters were learned by some seeds and not by others within 10 epochs; four letters at
  // lr 3e-3 reached 100% in 4 and 6 epochs, with a loss of 0.0000, in the trials.)
  Rng rng(1234, 0);
  std::set<std::string> seen;
  {
    std::ofstream f(dir_ / "reverse.jsonl");
    while (seen.size() < 3000) {
      const std::string w = word(rng, 4);
      if (seen.insert(w).second) f << pair_line(w, reversed(w));
    }
  }
  std::vector<std::string> held_out;
  while (held_out.size() < 100) {
    const std::string w = word(rng, 4);
    if (!seen.count(w)) held_out.push_back(w), seen.insert(w);
  }
  EXPECT_LT(reversal_accuracy(base, held_out), 0.1) << "the base model already knew the task";

  TrainConfig t = sft_config(1);
  t.epochs = 4;  // sets steps
  t.eval_every = 200;
  const TrainResult r =
      train_from(base, t, (dir_ / "reverse.jsonl").string(), (dir_ / "sft").string(), sft());
  // 4 epochs of the 2,850 train examples (5% of 3,000 held out) in steps of 16.
  EXPECT_EQ(r.steps_done, (4 * 2850 + 15) / 16);
  EXPECT_LT(r.last_val_loss, r.first_val_loss / 4);
  const double acc = reversal_accuracy((dir_ / "sft" / "model").string(), held_out);
  std::printf("held-out words reversed: %.0f%%\n", 100 * acc);
  EXPECT_GE(acc, 0.95);
}

}  // namespace
}  // namespace forge
