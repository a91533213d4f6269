// The CUDA StepRunner (train/runner_cuda.cpp): the training step replayed as a CUDA graph gives
// the same reports, evaluations, weights and Adam moments as eager execution, bit for bit — with
// gradient accumulation, ignored targets, changing lr, evaluations between steps (one with
// another batch size, which re-plans the activations and forces a new capture), and reports
// taken one step late or all at the end. Then the trainer on the GPU: a run stopped twice and
// resumed logs the same lines as a run that never stopped, and graph and eager runs log the
// same lines. fp16: graph replays equal eager steps with the loss scale in the loop; an initial
// scale of 2^40 overflows, skips steps (weights and Adam state untouched) and halves until the
// gradients fit, then doubles after the growth interval; a short fp16 run learns and reruns
// bit for bit, and its loss-scale state carried into a fresh runner continues it exactly. The
// numerical guard: a poisoned step updates nothing and later steps equal a runner without it.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>

#include "backend/cuda/op_testing.h"
#include "forge/core/error.h"
#include "forge/model/transformer.h"
#include "forge/train/checkpoint.h"
#include "forge/train/runner.h"
#include "forge/train/trainer.h"
#include "model/small_configs.h"
#include "train/counting_corpus.h"

namespace forge {
namespace {

namespace fs = std::filesystem;
using cuda::testing::CudaTest;

ModelConfig small(Family f) { return testing::small_config(f); }

std::unique_ptr<StepRunner> make_runner(const ModelConfig& cfg, const std::string& precision,
                                        bool graphs, const LossScaleOptions& ls = {}) {
  CudaSettings s;
  s.loss_scale = ls;
  s.graphs = graphs;
  return make_cuda_runner(cfg, precision, s);
}

struct Trace {
  std::vector<StepReport> reports;
  std::vector<double> evals;
  std::vector<float> w, m, v;
};

Trace train_steps(const ModelConfig& cfg, const std::string& precision, bool graphs,
                  bool report_at_end) {
  auto r = make_runner(cfg, precision, graphs);
  Transformer<float> init(cfg);
  init.init_weights(21);
  r->set_weights(init.weights());
  const int B = 4, T = 32, steps = 8;
  Trace t;
  auto eval = [&](int b, uint64_t seed) {
    auto x = testing::random_ids(b * T, cfg.vocab_size, seed),
         y = testing::random_ids(b * T, cfg.vocab_size, seed + 1);
    t.evals.push_back(r->eval_loss(x.data(), y.data(), b, T));
  };
  for (int s = 0; s < steps; ++s) {
    if (s == 3) eval(B, 500);      // same shape: the graph stays valid
    if (s == 5) eval(B - 1, 600);  // another B: activations re-planned, the next step re-captures
    r->zero_grad();
    for (int micro = 0; micro < 2; ++micro) {
      const uint64_t seed = 1000 + 10 * s + 2 * micro;
      auto x = testing::random_ids(B * T, cfg.vocab_size, seed),
           y = testing::random_ids(B * T, cfg.vocab_size, seed + 1);
      if (micro == 1)
        for (int i = 0; i < 5; ++i) y[7 * i] = -1;  // ignored targets: dloss = scale / 123
      r->micro_step(x.data(), y.data(), B, T, 0.5);
    }
    AdamWParams p;
    p.lr = 1e-3f * static_cast<float>(s + 1);
    p.step = s + 1;
    r->optimizer_step(p, 1.0);
    if (!report_at_end)
      while (static_cast<int>(t.reports.size()) < s + 1 - r->report_lag())
        t.reports.push_back(r->take_report());
  }
  while (static_cast<int>(t.reports.size()) < steps) t.reports.push_back(r->take_report());
  t.w = r->weights();
  t.m = r->adam_m();
  t.v = r->adam_v();
  return t;
}

class CudaRunnerTest : public CudaTest {};

// GPT-2 with head size 64: a shape flash attention supports (in bf16, q, k, v strided views).
ModelConfig gpt2_hs64() {
  ModelConfig c = small(Family::kGpt2);
  c.n_embd = 128;
  c.n_head = c.n_kv_head = 2;
  c.ffn_hidden = 512;
  return c;
}

TEST_F(CudaRunnerTest, GraphReplaysAreBitIdenticalToEagerSteps) {
  for (const ModelConfig& cfg : {small(Family::kGpt2), small(Family::kLlama), gpt2_hs64()})
    for (const char* precision : {"bf16", "fp32", "fp16"}) {
      const Trace eager = train_steps(cfg, precision, false, /*report_at_end=*/true);
      const Trace graph = train_steps(cfg, precision, true, /*report_at_end=*/false);
      const std::string where =
          cfg.family_name() + " HS=" + std::to_string(cfg.head_dim()) + " " + precision;
      ASSERT_EQ(graph.reports.size(), eager.reports.size()) << where;
      for (size_t s = 0; s < eager.reports.size(); ++s) {
        ASSERT_EQ(eager.reports[s].micro_losses.size(), 2u) << where;
        EXPECT_EQ(graph.reports[s].micro_losses, eager.reports[s].micro_losses)
            << where << " step " << s;
        const StepReport &g = graph.reports[s], &e = eager.reports[s];
        if (e.skipped) {  // f16 overflow: the norm is inf or NaN in both
          EXPECT_TRUE(g.skipped) << where << " step " << s;
          EXPECT_FALSE(std::isfinite(g.grad_norm)) << where << " step " << s;
        } else {
          EXPECT_EQ(g.grad_norm, e.grad_norm) << where << " step " << s;
          EXPECT_GT(e.grad_norm, 0.0) << where;
        }
        EXPECT_EQ(g.loss_scale, e.loss_scale) << where << " step " << s;
        EXPECT_EQ(e.loss_scale > 0, std::string(precision) == "fp16") << where;
      }
      EXPECT_EQ(graph.evals, eager.evals) << where;
      EXPECT_TRUE(cuda::testing::bit_identical(graph.w, eager.w)) << where;
      EXPECT_TRUE(cuda::testing::bit_identical(graph.m, eager.m)) << where;
      EXPECT_TRUE(cuda::testing::bit_identical(graph.v, eager.v)) << where;
      // The steps learned something: the weights moved.
      Transformer<float> init(cfg);
      init.init_weights(21);
      EXPECT_FALSE(cuda::testing::bit_identical(eager.w, init.weights())) << where;
    }
}

// The numerical guard on the GPU (ops/step_guard.h): a poisoned step (a NaN gradient or a NaN
// loss, injected on the device) leaves weights and both Adam moments bit for bit, is reported
// skipped one step late, and every later step equals a runner that never ran that update —
// Adam's t included, which the kernel lowers by the skip count. Graph and eager; in fp16 a NaN
// loss is the guard's skip, not an overflow: the loss scale and its skip count stay as they were.
TEST_F(CudaRunnerTest, PoisonedStepUpdatesNothingAndLaterStepsMatchOmittingIt) {
  const ModelConfig cfg = gpt2_hs64();
  Transformer<float> init(cfg);
  init.init_weights(21);
  const int B = 4, T = 32, kBad = 3, kSteps = 7;
  struct Case {
    const char* precision;
    bool graphs;
    StepFault fault;
  };
  for (const Case& c :
       {Case{"bf16", true, StepFault::kNanGrad}, Case{"bf16", false, StepFault::kNanLoss},
        Case{"fp32", true, StepFault::kNanLoss}, Case{"fp16", true, StepFault::kNanLoss}}) {
    SCOPED_TRACE(str(c.precision, c.graphs ? " graph " : " eager ",
                     c.fault == StepFault::kNanGrad ? "nan_grad" : "nan_loss"));
    auto a = make_runner(cfg, c.precision, c.graphs), b = make_runner(cfg, c.precision, c.graphs);
    a->set_weights(init.weights());
    b->set_weights(init.weights());
    // b runs the same micro-batches but leaves out step kBad's update, and is told of one skipped
    // update so that its later steps take Adam's t through the same device arithmetic as a's
    // (the kernel recomputes the bias corrections in double; the host's may differ in the last
    // bit). That t then counts updates taken is the CPU runner's test (step_guard_test.cpp).
    auto step = [&](StepRunner& r, int s, int t, bool poison) {
      r.zero_grad();
      auto x = testing::random_ids(B * T, cfg.vocab_size, 4000 + s), y = x;
      std::rotate(y.begin(), y.begin() + 1, y.end());
      r.micro_step(x.data(), y.data(), B, T, 1.0);
      if (poison) r.inject_fault(c.fault);
      AdamWParams p;
      p.lr = 1e-3f * static_cast<float>(s + 1);
      p.step = t;
      r.optimizer_step(p, 1.0);
    };
    std::vector<StepReport> ra, rb;
    std::vector<float> w_before;
    std::optional<LossScaleState> ls_before;
    for (int s = 0; s < kSteps; ++s) {
      if (s == kBad) {
        w_before = a->weights();  // waits for step kBad − 1
        ls_before = a->loss_scale_state();
      }
      step(*a, s, s + 1, s == kBad);
      if (s == kBad) {
        EXPECT_TRUE(cuda::testing::bit_identical(a->weights(), w_before));
        if (ls_before) {
          const LossScaleState now = *a->loss_scale_state();
          EXPECT_EQ(now.scale, ls_before->scale);
          EXPECT_EQ(now.skipped_total, ls_before->skipped_total);
          EXPECT_EQ(now.good_steps, ls_before->good_steps);
        }
        b->set_skipped_updates(1);
      } else {
        step(*b, s, s + 1, false);
      }
      while (static_cast<int>(ra.size()) < s + 1 - a->report_lag()) ra.push_back(a->take_report());
    }
    while (static_cast<int>(ra.size()) < kSteps) ra.push_back(a->take_report());
    while (static_cast<int>(rb.size()) < kSteps - 1) rb.push_back(b->take_report());
    for (int s = 0; s < kSteps; ++s) {
      EXPECT_EQ(ra[s].skipped, s == kBad) << s;
      EXPECT_FALSE(ra[s].overflow) << s;
      if (s == kBad) continue;
      const StepReport& r = rb[s < kBad ? s : s - 1];
      EXPECT_EQ(ra[s].micro_losses, r.micro_losses) << s;
      EXPECT_EQ(ra[s].grad_norm, r.grad_norm) << s;
    }
    EXPECT_TRUE(
        std::isnan(c.fault == StepFault::kNanGrad ? ra[kBad].grad_norm : ra[kBad].micro_losses[0]));
    EXPECT_TRUE(cuda::testing::bit_identical(a->weights(), b->weights()));
    EXPECT_TRUE(cuda::testing::bit_identical(a->adam_m(), b->adam_m()));
    EXPECT_TRUE(cuda::testing::bit_identical(a->adam_v(), b->adam_v()));
  }
}

// Initial scale 2^40: dloss · scale overflows f16 at once, so the first steps are skipped — the
// weights and both Adam moments keep every bit, the scale halves each time — until the scaled
// gradients fit; then the scale doubles after `growth_interval` clean steps. Graph on.
TEST_F(CudaRunnerTest, F16LossScaleSkipsOverflowsAndGrows) {
  const ModelConfig cfg = gpt2_hs64();
  const LossScaleOptions ls{/*init_scale=*/1099511627776.0f, /*growth_interval=*/2};  // 2^40
  auto r = make_runner(cfg, "fp16", true, ls);
  Transformer<float> init(cfg);
  init.init_weights(21);
  r->set_weights(init.weights());
  const int B = 4, T = 32;
  std::vector<StepReport> reps;
  for (int s = 0; s < 40; ++s) {
    r->zero_grad();
    auto x = testing::random_ids(B * T, cfg.vocab_size, 2000 + s), y = x;
    std::rotate(y.begin(), y.begin() + 1, y.end());
    r->micro_step(x.data(), y.data(), B, T, 1.0);
    AdamWParams p;
    p.lr = 1e-3f, p.step = s + 1;
    r->optimizer_step(p, 1.0);
    reps.push_back(r->take_report());  // waits: the state below is this step's
    if (s == 0) {
      ASSERT_TRUE(reps[0].skipped) << "2^40 must overflow f16";
      EXPECT_EQ(reps[0].loss_scale, 1099511627776.0);
      EXPECT_TRUE(cuda::testing::bit_identical(r->weights(), init.weights()));
      EXPECT_TRUE(cuda::testing::bit_identical(r->adam_m(), std::vector<float>(init.num_params(), 0.0f)));
      EXPECT_TRUE(cuda::testing::bit_identical(r->adam_v(), std::vector<float>(init.num_params(), 0.0f)));
    }
  }
  // Replay the scale with the CPU twin from the reported skips: every report's loss_scale is the
  // state's scale before that step.
  LossScaleState st = loss_scale_init(ls);
  int first_clean = -1, grew_at = -1;
  for (size_t s = 0; s < reps.size(); ++s) {
    EXPECT_EQ(reps[s].loss_scale, st.scale) << "step " << s;
    const double prev = st.scale;
    loss_scale_update(st, reps[s].skipped ? INFINITY : 1.0f);
    if (!reps[s].skipped) {
      EXPECT_TRUE(std::isfinite(reps[s].grad_norm)) << "step " << s;
      if (first_clean < 0) first_clean = static_cast<int>(s);
    }
    if (first_clean >= 0 && grew_at < 0 && st.scale > prev) grew_at = static_cast<int>(s);
  }
  ASSERT_GT(first_clean, 0) << "never stopped overflowing";
  // Halved once per skipped step, from 2^40 down to a scale the gradients fit (2^21 measured on
  // the H200 for this model).
  EXPECT_EQ(reps[first_clean].loss_scale, std::ldexp(1.0, 40 - first_clean));
  ASSERT_GE(grew_at, 0) << "the scale never grew";
  if (!reps[first_clean + 1].skipped) {
    EXPECT_EQ(grew_at, first_clean + 1);  // interval 2
  }
  EXPECT_FALSE(cuda::testing::bit_identical(r->weights(), init.weights()));
}

// A checkpoint's loss-scale state (StepRunner::loss_scale_state) put into a fresh runner
// (set_loss_scale_state, made with other LossScaleOptions) continues exactly where the first
// runner is: same scales, skips and losses, same weights — Adam's t included, which subtracts
// the skip count. Runners without loss scaling report none.
TEST_F(CudaRunnerTest, F16LossScaleStateRestoresExactly) {
  const ModelConfig cfg = gpt2_hs64();
  const LossScaleOptions ls{/*init_scale=*/1099511627776.0f, /*growth_interval=*/2};  // 2^40
  auto a = make_runner(cfg, "fp16", true, ls);
  Transformer<float> init(cfg);
  init.init_weights(21);
  a->set_weights(init.weights());
  const int B = 4, T = 32, kSplit = 24, kSteps = 32;
  auto step = [&](StepRunner& r, int s) {
    r.zero_grad();
    auto x = testing::random_ids(B * T, cfg.vocab_size, 3000 + s), y = x;
    std::rotate(y.begin(), y.begin() + 1, y.end());
    r.micro_step(x.data(), y.data(), B, T, 1.0);
    AdamWParams p;
    p.lr = 1e-3f, p.step = s + 1;
    r.optimizer_step(p, 1.0);
    return r.take_report();
  };
  int skipped = 0;
  for (int s = 0; s < kSplit; ++s) skipped += step(*a, s).skipped ? 1 : 0;
  ASSERT_GT(skipped, 0) << "2^40 must overflow f16 at first";
  const std::optional<LossScaleState> st = a->loss_scale_state();
  ASSERT_TRUE(st.has_value());
  EXPECT_EQ(st->skipped_total, skipped);
  EXPECT_EQ(st->growth_interval, 2);
  EXPECT_LT(st->scale, 1099511627776.0f);

  auto b = make_runner(cfg, "fp16", true);  // default options: the state must bring its own
  b->set_weights(a->weights());
  b->set_adam_state(a->adam_m(), a->adam_v());
  b->set_loss_scale_state(*st);
  for (int s = kSplit; s < kSteps; ++s) {
    const StepReport ra = step(*a, s), rb = step(*b, s);
    EXPECT_EQ(rb.loss_scale, ra.loss_scale) << "step " << s;
    EXPECT_EQ(rb.skipped, ra.skipped) << "step " << s;
    EXPECT_EQ(rb.micro_losses, ra.micro_losses) << "step " << s;
  }
  EXPECT_TRUE(cuda::testing::bit_identical(b->weights(), a->weights()));
  EXPECT_TRUE(cuda::testing::bit_identical(b->adam_m(), a->adam_m()));
  EXPECT_TRUE(cuda::testing::bit_identical(b->adam_v(), a->adam_v()));
  for (const char* precision : {"bf16", "fp32"})
    EXPECT_FALSE(make_runner(cfg, precision, true)->loss_scale_state().has_value()) << precision;
}

TEST_F(CudaRunnerTest, BadTokenIdIsAnErrorBeforeAnythingRuns) {
  auto r = make_runner(small(Family::kLlama), "bf16", true);
  std::vector<int32_t> x(32, 1), y(32, 2);
  x[5] = 100;  // vocab_size 100
  r->zero_grad();
  EXPECT_THROW(r->micro_step(x.data(), y.data(), 1, 32, 1.0), Error);
  EXPECT_THROW(r->eval_loss(x.data(), y.data(), 1, 32), Error);
}

// The trainer on the GPU runner, whose reports come one step late: every line, checkpoint and
// resume must still see the right step's numbers.
class CudaTrainerTest : public CudaTest {
 protected:
  void SetUp() override {
    CudaTest::SetUp();
    if (IsSkipped()) return;
    dir_ = fs::temp_directory_path() /
           ("forge_cuda_train_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "data");
    testing::write_counting_corpus(dir_ / "data");
  }
  void TearDown() override {
    if (!dir_.empty()) fs::remove_all(dir_);
  }
  ModelConfig model() const {
    ModelConfig c = preset_config("tiny");
    c.vocab_size = 16;
    c.max_seq_len = 32;
    c.n_layer = 2;
    c.n_embd = 64;
    c.n_head = c.n_kv_head = 1;  // head size 64: a shape flash attention supports
    c.ffn_hidden = 128;
    return c;
  }
  TrainConfig config() const {
    TrainConfig t;
    t.steps = 9;
    t.batch_size = 2;
    t.grad_accum = 2;
    t.seq_len = 32;
    t.lr = 1e-2;
    t.warmup_steps = 2;
    t.eval_every = 4;
    t.eval_windows = 8;
    t.save_every = 4;
    t.quiet = true;
    return t;
  }
  static std::vector<nlohmann::json> read_metrics(const fs::path& run) {
    std::vector<nlohmann::json> out;
    std::ifstream f(run / "metrics.jsonl");
    std::string line;
    while (std::getline(f, line)) out.push_back(nlohmann::json::parse(line));
    return out;
  }
  static void expect_same_lines(const fs::path& a_run, const fs::path& b_run) {
    const auto a = read_metrics(a_run), b = read_metrics(b_run);
    ASSERT_EQ(a.size(), 10u);  // 9 steps + the final evaluation
    ASSERT_EQ(b.size(), a.size());
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_EQ(b[i]["step"], a[i]["step"]);
      for (const char* k : {"loss", "grad_norm", "lr", "val_loss"}) {
        ASSERT_EQ(a[i].contains(k), b[i].contains(k)) << i << " " << k;
        if (a[i].contains(k)) {
          EXPECT_EQ(a[i][k].get<double>(), b[i][k].get<double>()) << i << " " << k;
        }
      }
    }
  }
  static std::string file_bytes(const fs::path& p) {
    std::ifstream f(p, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  }

  fs::path dir_;
};

TEST_F(CudaTrainerTest, StoppedAndResumedRunIsBitIdentical) {
  RunOptions opt;
  opt.device = "cuda";
  opt.precision = "bf16";
  opt.quiet = true;
  const std::string data = (dir_ / "data").string();
  const TrainResult full = train(model(), config(), data, (dir_ / "a").string(), opt);
  EXPECT_EQ(full.steps_done, 9);

  volatile std::sig_atomic_t stop = 1;  // polled after each step: each call runs one step
  opt.stop = &stop;
  const TrainResult r1 = train(model(), config(), data, (dir_ / "b").string(), opt);
  EXPECT_TRUE(r1.interrupted);
  EXPECT_EQ(r1.steps_done, 1);
  EXPECT_EQ(resume((dir_ / "b").string(), 0, "", opt).steps_done, 2);
  opt.stop = nullptr;
  const TrainResult r3 = resume((dir_ / "b").string(), 0, "", opt);
  EXPECT_EQ(r3.steps_done, 9);
  EXPECT_EQ(r3.last_train_loss, full.last_train_loss);
  expect_same_lines(dir_ / "a", dir_ / "b");
  EXPECT_EQ(file_bytes(dir_ / "a/model/model.safetensors"),
            file_bytes(dir_ / "b/model/model.safetensors"));
  EXPECT_EQ(file_bytes(dir_ / "a/checkpoints/step_000008/optimizer.safetensors"),
            file_bytes(dir_ / "b/checkpoints/step_000008/optimizer.safetensors"));
}

// fp16 through the trainer: the loss falls, every line carries loss_scale, and a rerun logs the
// same lines and saves the same model, bit for bit.
TEST_F(CudaTrainerTest, F16RunLearnsAndRerunsBitIdentically) {
  RunOptions opt;
  opt.device = "cuda";
  opt.precision = "fp16";
  opt.quiet = true;
  const std::string data = (dir_ / "data").string();
  const TrainResult a = train(model(), config(), data, (dir_ / "a").string(), opt);
  const TrainResult b = train(model(), config(), data, (dir_ / "b").string(), opt);
  EXPECT_EQ(a.last_train_loss, b.last_train_loss);
  const auto la = read_metrics(dir_ / "a"), lb = read_metrics(dir_ / "b");
  ASSERT_EQ(la.size(), 10u);
  ASSERT_EQ(lb.size(), la.size());
  for (size_t i = 0; i < la.size(); ++i)
    for (const char* k : {"step", "loss", "grad_norm", "lr", "val_loss", "loss_scale", "skipped"})
      EXPECT_EQ(la[i].contains(k) ? la[i][k] : nlohmann::json(),
                lb[i].contains(k) ? lb[i][k] : nlohmann::json())
          << i << " " << k;
  for (size_t i = 0; i + 1 < la.size(); ++i) EXPECT_TRUE(la[i].contains("loss_scale")) << i;
  EXPECT_LT(la[8]["loss"].get<double>(), la[0]["loss"].get<double>());
  EXPECT_EQ(file_bytes(dir_ / "a/model/model.safetensors"),
            file_bytes(dir_ / "b/model/model.safetensors"));
}

TEST_F(CudaTrainerTest, GraphAndEagerRunsLogTheSameLines) {
  RunOptions opt;
  opt.device = "cuda";
  opt.precision = "bf16";
  opt.quiet = true;
  const std::string data = (dir_ / "data").string();
  train(model(), config(), data, (dir_ / "graph").string(), opt);
  opt.cuda.graphs = false;
  train(model(), config(), data, (dir_ / "eager").string(), opt);
  expect_same_lines(dir_ / "graph", dir_ / "eager");
  EXPECT_EQ(file_bytes(dir_ / "graph/model/model.safetensors"),
            file_bytes(dir_ / "eager/model/model.safetensors"));
}

// The guards through the trainer on the GPU, whose reports come one step late: a skipped step
// is counted where the CPU counts it, and max_bad_steps bad steps in a row stop the run before
// the checkpoint that falls after them, leaving the last one byte for byte.
TEST_F(CudaTrainerTest, BadStepsAreSkippedAndStopTheRunWithoutACheckpoint) {
  RunOptions opt;
  opt.device = "cuda";
  opt.precision = "bf16";
  opt.quiet = true;
  TrainConfig c = config();
  c.max_bad_steps = 2;
  const std::string data = (dir_ / "data").string();
  // One bad step (5): counted, the run goes on.
  opt.faults = parse_fault_plan("nan_grad@5");
  ::testing::internal::CaptureStderr();
  train(model(), c, data, (dir_ / "one").string(), opt);
  const auto one = read_metrics(dir_ / "one");
  ASSERT_EQ(one.size(), 10u);
  for (int s = 0; s < 9; ++s) {
    EXPECT_EQ(one[s].contains("skipped"), s == 5) << s;
    EXPECT_EQ(one[s].value("skipped_steps", 0), s >= 5 ? 1 : 0) << s;
  }
  // Steps 5 and 6 bad: stopped before the checkpoint of step 8, step 4's intact.
  TrainConfig first = c;
  first.steps = 4;
  opt.faults = {};
  train(model(), first, data, (dir_ / "two").string(), opt);
  fs::remove_all(dir_ / "two/model");
  const std::string ck = (dir_ / "two/checkpoints/step_000004/optimizer.safetensors").string();
  const std::string before = file_bytes(ck);
  opt.faults = parse_fault_plan("nan_loss@5-8");
  EXPECT_THROW(resume((dir_ / "two").string(), 9, "", opt), Error);
  ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(file_bytes(ck), before);
  EXPECT_EQ(list_checkpoints((dir_ / "two").string()).size(), 1u);
  EXPECT_FALSE(fs::exists(dir_ / "two/model"));
}

}  // namespace
}  // namespace forge
