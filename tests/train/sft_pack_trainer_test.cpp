// Packed SFT through the trainer (forge train --sft --pack): a run stopped mid-epoch and resumed
// logs the losses of the run that never stopped, bit for bit (the data state is still the
// examples consumed); packed steps carry more examples than padded ones; and packing is refused
// without --sft.
#include <gtest/gtest.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "forge/backend/cuda/runtime.h"
#include "forge/core/error.h"
#include "forge/core/rng.h"
#include "forge/train/trainer.h"
#include "train/sft_task.h"

namespace forge {
namespace {

namespace fs = std::filesystem;

using namespace sft_task;

class SftPackTrainerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("forge_sft_pack_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string pretrained_model(int steps) {
    return sft_task::pretrained_model(dir_, steps, tiny_gpt2(), /*max_seq_len=*/128);
  }

  // 20 word-pair examples (short: several fit in a row).
  std::string examples() {
    Rng rng(9, 0);
    std::ofstream f(dir_ / "ex.jsonl");
    for (int i = 0; i < 20; ++i) f << pair_line(word(rng), word(rng));
    return (dir_ / "ex.jsonl").string();
  }

  fs::path dir_;
};

RunOptions sft() {
  RunOptions o;
  o.sft = true;
  o.quiet = true;
  return o;
}

TEST_F(SftPackTrainerTest, ResumedPackedRunContinuesTheExampleOrder) {
  const std::string base = pretrained_model(2);
  const std::string data = examples();
  TrainConfig t = sft_config(1, 3e-3);
  t.seq_len = 128;  // about four of these ~29-token examples a row
  t.sft_layout = "pack";
  t.epochs = 3;
  t.batch_size = 2;
  t.save_every = 2;  // stops after step 2, mid-epoch
  t.eval_every = 3;
  train_from(base, t, data, (dir_ / "a").string(), sft());
  volatile std::sig_atomic_t stop = 1;
  RunOptions o = sft();
  o.stop = &stop;
  EXPECT_TRUE(train_from(base, t, data, (dir_ / "b").string(), o).interrupted);
  o.stop = nullptr;
  o.sft = false;  // resume() takes it (and sft_layout) from the run's config.json
  resume((dir_ / "b").string(), 0, "", o);
  const auto a = metrics(dir_ / "a"), b = metrics(dir_ / "b");
  ASSERT_EQ(a.size(), b.size());
  ASSERT_GE(a.size(), 4u);
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].value("loss", -1.0), b[i].value("loss", -1.0)) << i;
    EXPECT_EQ(a[i].value("val_loss", -1.0), b[i].value("val_loss", -1.0)) << i;
    EXPECT_EQ(a[i].value("trained_tokens", -1), b[i].value("trained_tokens", -1)) << i;
  }
}

// Same rows per step: packed steps hold several examples a row, so they train more tokens, and
// three epochs take fewer steps.
TEST_F(SftPackTrainerTest, PackedStepsHoldMoreExamplesThanPaddedOnes) {
  const std::string base = pretrained_model(2);
  const std::string data = examples();
  TrainConfig t = sft_config(1, 3e-3);
  t.seq_len = 128;  // about four of these ~29-token examples a row
  t.epochs = 3;
  t.batch_size = 2;
  t.eval_every = 1000;
  const TrainResult padded = train_from(base, t, data, (dir_ / "padded").string(), sft());
  t.sft_layout = "pack";
  const TrainResult packed = train_from(base, t, data, (dir_ / "packed").string(), sft());
  EXPECT_LT(packed.steps_done * 2, padded.steps_done) << "rows of 128 hold more than 2 word pairs";
  const auto a = metrics(dir_ / "padded"), b = metrics(dir_ / "packed");
  EXPECT_GT(b[0]["trained_tokens"].get<int>(), 2 * a[0]["trained_tokens"].get<int>());
}

// --pack needs --sft. On the GPU it trains (train/packing_runner_cuda_test.cpp); without a
// device, a packed run fails exactly as a padded one does, on the device, not on packing.
TEST_F(SftPackTrainerTest, PackingIsRefusedWithoutSftAndNotOnTheGpu) {
  const std::string base = pretrained_model(1);
  const std::string data = examples();
  TrainConfig t = sft_config(1, 3e-3);
  t.sft_layout = "pack";
  RunOptions o = sft();
  o.sft = false;
  EXPECT_THROW(train_from(base, t, data, (dir_ / "nosft").string(), o), Error);
  if (cuda::available()) return;
  auto gpu_error = [&](const std::string& layout) {
    t.sft_layout = layout;
    RunOptions g = sft();
    g.device = "cuda";
    try {
      train_from(base, t, data, (dir_ / ("gpu_" + layout)).string(), g);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(ran)");
  };
  const std::string padded = gpu_error("pad");
  EXPECT_EQ(padded.rfind("--device cuda", 0), 0u) << padded;
  EXPECT_EQ(gpu_error("pack"), padded);
  EXPECT_FALSE(fs::exists(dir_ / "gpu_pack" / "metrics.jsonl"));
}

}  // namespace
}  // namespace forge
