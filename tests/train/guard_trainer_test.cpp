// The numerical guards through the trainer (train/trainer.h), faults injected with
// RunOptions::faults (what FORGE_FAULT_INJECT fills): a poisoned step is skipped and counted in
// metrics.jsonl, and every later loss equals, bit for bit, a reference loop written here that
// simply leaves that step's update out; max_bad_steps poisoned steps in a row stop the run with
// an error and leave the last checkpoint byte for byte as it was; a resumed run continues the
// skip count, Adam's t and the loss z-scores exactly.
#include <cmath>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "forge/core/error.h"
#include "forge/data/loader.h"
#include "forge/model/model_dir.h"
#include "forge/train/checkpoint.h"
#include "forge/train/schedule.h"
#include "forge/train/trainer.h"
#include "testing.h"
#include "train/counting_corpus.h"

namespace forge {
namespace {

namespace fs = std::filesystem;

std::vector<nlohmann::json> read_metrics(const fs::path& run) {
  std::vector<nlohmann::json> out;
  std::ifstream f(run / "metrics.jsonl");
  std::string line;
  while (std::getline(f, line)) out.push_back(nlohmann::json::parse(line));
  return out;
}

std::string file_bytes(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

// Every file under dir, relative path -> bytes.
std::map<std::string, std::string> tree_bytes(const fs::path& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file()) out[fs::relative(e.path(), dir).string()] = file_bytes(e.path());
  return out;
}

class GuardTrainerTest : public testing::CountingCorpusRun {
 protected:
  GuardTrainerTest() : CountingCorpusRun("forge_guard") {}

  std::string data() const { return (dir_ / "data").string(); }
  static RunOptions faults(const std::string& spec) {
    RunOptions o;
    o.quiet = true;
    o.faults = parse_fault_plan(spec);
    return o;
  }

  // The trainer's loop written out (train/trainer.cpp: same loader, schedule, AdamW settings),
  // except that step `omit` runs no update: its batch is drawn and dropped, and the updates
  // after it pass Adam's t = (updates taken so far) + 1. Returns each step's loss (NaN for the
  // omitted one) and the final weights.
  std::pair<std::vector<double>, std::vector<float>> reference(const TrainConfig& c, int omit) {
    const ModelConfig mc = model();
    Dataset ds = Dataset::open(data(), mc.vocab_size);
    TrainLoader loader(&ds.shards, ds.train, c.seq_len, c.seed);
    Transformer<float> init(mc);
    init.init_weights(c.seed);
    auto r = make_cpu_runner(mc);
    r->set_weights(init.weights());
    const LrSchedule sched{c.lr, c.warmup_steps >= 0 ? c.warmup_steps : std::max(1, c.steps / 20),
                           c.steps, c.min_lr_frac};
    std::vector<int32_t> x(c.batch_size * c.seq_len), y(x.size());
    std::vector<double> losses;
    int updates = 0;
    for (int step = 0; step < c.steps; ++step) {
      r->zero_grad();
      for (int micro = 0; micro < c.grad_accum; ++micro) {
        loader.next_batch(c.batch_size, x.data(), y.data());
        if (step != omit)
          r->micro_step(x.data(), y.data(), c.batch_size, c.seq_len, 1.0 / c.grad_accum);
      }
      if (step == omit) {
        losses.push_back(NAN);
        continue;
      }
      AdamWParams p;
      p.lr = static_cast<float>(sched.at(step));
      p.beta1 = static_cast<float>(c.beta1);
      p.beta2 = static_cast<float>(c.beta2);
      p.eps = static_cast<float>(c.eps);
      p.weight_decay = static_cast<float>(c.weight_decay);
      p.step = ++updates;
      r->optimizer_step(p, c.grad_clip);
      const StepReport rep = r->take_report();
      double loss = 0;
      for (double l : rep.micro_losses) loss += l / c.grad_accum;
      losses.push_back(loss);
    }
    return {losses, r->weights()};
  }
};

TEST_F(GuardTrainerTest, SkippedStepIsCountedAndLaterLossesEqualARunWithoutItsUpdate) {
  TrainConfig c = config(10, 0);
  c.grad_accum = 2;
  c.lr = 3e-3;
  const int bad = 4;
  const auto [ref_losses, ref_weights] = reference(c, bad);
  train(model(), c, data(), (dir_ / "clean").string(), faults(""));
  const auto clean = read_metrics(dir_ / "clean");
  for (const char* kind : {"nan_grad", "nan_loss"}) {
    SCOPED_TRACE(kind);
    const fs::path run = dir_ / kind;
    ::testing::internal::CaptureStderr();
    const TrainResult r = train(model(), c, data(), run.string(), faults(str(kind, "@", bad)));
    const std::string err = ::testing::internal::GetCapturedStderr();
    EXPECT_EQ(r.steps_done, 10);
    EXPECT_NE(err.find(str("warning: step ", bad + 1, " skipped")), std::string::npos) << err;
    const auto m = read_metrics(run);
    ASSERT_EQ(m.size(), 11u);  // 10 steps and the final evaluation
    for (int s = 0; s < 10; ++s) {
      EXPECT_EQ(m[s]["step"], s);
      EXPECT_EQ(m[s].contains("skipped"), s == bad) << s;
      if (s < bad) {
        EXPECT_FALSE(m[s].contains("skipped_steps")) << s;
      } else {
        EXPECT_EQ(m[s].value("skipped_steps", 0), 1) << s;
      }
      if (s == bad) {
        // The poisoned number is logged as null; the other one is the step's real value.
        EXPECT_TRUE(m[s][std::string(kind) == "nan_grad" ? "grad_norm" : "loss"].is_null());
        continue;
      }
      // Every other loss is the reference's, exactly: before the fault the clean run's, after
      // it those of a run that never applied step `bad`'s update.
      EXPECT_EQ(m[s]["loss"].get<double>(), ref_losses[s]) << s;
      if (s < bad) {
        EXPECT_EQ(m[s]["loss"], clean[s]["loss"]) << s;
      }
    }
    EXPECT_NE(m[bad + 1]["loss"], clean[bad + 1]["loss"]);  // the skip changed the run
    EXPECT_EQ(load_model_dir((run / "model").string()).weights(), ref_weights);
  }
}

// A skipped step changes nothing: the checkpoints on either side of it hold the same weights
// and Adam moments; only the step count moves.
TEST_F(GuardTrainerTest, CheckpointsAroundASkippedStepHoldTheSameState) {
  TrainConfig c = config(4, 1);
  c.keep_checkpoints = 0;
  train(model(), c, data(), (dir_ / "run").string(), faults("nan_grad@2"));
  const Checkpoint before = load_checkpoint((dir_ / "run/checkpoints/step_000002").string());
  const Checkpoint after = load_checkpoint((dir_ / "run/checkpoints/step_000003").string());
  const Checkpoint next = load_checkpoint((dir_ / "run/checkpoints/step_000004").string());
  EXPECT_EQ(after.model.weights(), before.model.weights());
  EXPECT_EQ(after.m, before.m);
  EXPECT_EQ(after.v, before.v);
  EXPECT_EQ(before.state.skipped_steps, 0);
  EXPECT_EQ(after.state.skipped_steps, 1);
  EXPECT_EQ(next.state.skipped_steps, 1);
  EXPECT_NE(next.model.weights(), after.model.weights());
}

// max_bad_steps poisoned steps in a row: the run stops with a one-line error naming the steps
// and the last checkpoint, writes no checkpoint and no model, and that checkpoint is byte for
// byte what it was and still loads.
TEST_F(GuardTrainerTest, ConsecutiveBadStepsStopTheRunAndKeepTheLastCheckpoint) {
  TrainConfig c = config(4, 4);
  c.max_bad_steps = 2;
  const fs::path run = dir_ / "run";
  train(model(), c, data(), run.string(), faults(""));
  const auto saved = tree_bytes(run / "checkpoints");
  ASSERT_EQ(list_checkpoints(run.string()).size(), 1u);
  fs::remove_all(run / "model");
  // Resumed up to step 12 (the run's save_every 4): step 4 bad, step 5 good (the streak starts
  // over), then bad from step 6 on: the second in a row is step 7, before checkpoint 8 is due.
  ::testing::internal::CaptureStderr();
  try {
    resume(run.string(), 12, "", faults("nan_loss@4,nan_grad@6-11"));
    ADD_FAILURE() << "the run did not stop";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    EXPECT_NE(msg.find("2 steps in a row (7 to 8)"), std::string::npos) << msg;
    EXPECT_NE(msg.find("max_bad_steps=2"), std::string::npos) << msg;
    EXPECT_NE(msg.find((run / "checkpoints/step_000004").string() + ", is intact"),
              std::string::npos)
        << msg;
  }
  ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(tree_bytes(run / "checkpoints"), saved);
  EXPECT_FALSE(fs::exists(run / "model"));
  const Checkpoint ck = load_checkpoint((run / "checkpoints/step_000004").string());
  EXPECT_EQ(ck.state.step, 4);
  // metrics.jsonl: steps 0-7, the bad ones marked, the good step 5 not.
  const auto m = read_metrics(run);
  ASSERT_EQ(m.size(), 8u);
  for (int s = 0; s < 8; ++s) EXPECT_EQ(m[s].contains("skipped"), s == 4 || s >= 6) << s;
  EXPECT_EQ(m[7]["skipped_steps"], 3);
}

// Stopped after a skipped step and resumed: the skip count, Adam's t (the losses) and the loss
// z-scores (which need a full window of 128 earlier losses) continue exactly.
TEST_F(GuardTrainerTest, ResumeAfterASkippedStepIsBitIdenticalIncludingLossZ) {
  TrainConfig c = config(200, 100);
  c.keep_checkpoints = 0;
  c.lr = 1e-2;  // converges early: on the plateau, the losses' noise gives positive z-scores
  c.loss_spike_z = 0.5;  // low, so that some steps are flagged
  const RunOptions o = faults("nan_grad@20");
  ::testing::internal::CaptureStderr();
  train(model(), c, data(), (dir_ / "a").string(), o);
  train(model(), c, data(), (dir_ / "b").string(), o);
  fs::remove_all(dir_ / "b/checkpoints/step_000200");
  fs::remove_all(dir_ / "b/model");
  resume((dir_ / "b").string(), 0, "", o);
  const std::string err = ::testing::internal::GetCapturedStderr();
  const auto a = read_metrics(dir_ / "a"), b = read_metrics(dir_ / "b");
  ASSERT_EQ(a.size(), 201u);
  ASSERT_EQ(b.size(), a.size());
  int scored = 0, spikes = 0;
  std::vector<double> losses;
  for (size_t i = 0; i < 200; ++i) {
    for (const char* k : {"loss", "grad_norm", "skipped_steps", "loss_z", "loss_spike", "skipped"})
      EXPECT_EQ(a[i].contains(k) ? a[i][k].dump() : "-", b[i].contains(k) ? b[i][k].dump() : "-")
          << i << " " << k;
    // loss_z is the z-score against the previous 128 finite losses, computed here again.
    if (losses.size() >= 128) {
      const std::vector<double> w(losses.end() - 128, losses.end());
      double mean = 0, var = 0;
      for (double x : w) mean += x / 128;
      for (double x : w) var += (x - mean) * (x - mean) / 128;
      ASSERT_TRUE(a[i].contains("loss_z")) << i;
      const double z = a[i]["loss_z"].get<double>();
      EXPECT_NEAR(z, (a[i]["loss"].get<double>() - mean) / std::sqrt(var), 1e-9) << i;
      EXPECT_EQ(a[i].contains("loss_spike"), z > 0.5) << i;
      ++scored;
      spikes += z > 0.5;
    } else {
      EXPECT_FALSE(a[i].contains("loss_z")) << i;
    }
    if (a[i]["loss"].is_number()) losses.push_back(a[i]["loss"].get<double>());
  }
  EXPECT_EQ(scored, 200 - 128);  // the nan_grad step's loss is finite and joins the window
  EXPECT_GT(spikes, 0);
  EXPECT_NE(err.find("loss spike"), std::string::npos);
  EXPECT_EQ(file_bytes(dir_ / "a/model/model.safetensors"),
            file_bytes(dir_ / "b/model/model.safetensors"));
}

}  // namespace
}  // namespace forge
