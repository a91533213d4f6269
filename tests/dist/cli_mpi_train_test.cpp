// `mpirun -np 2 forge train --device cpu` end to end (issue 15's acceptance; ctest
// dist_mpi_train_cli, label mpi). Not itself started by mpirun: each test runs the forge binary
// once plainly (one process) and once under `mpirun -np 2`, and compares the runs'
// metrics.jsonl. The 2-rank run trains on the same global batch (batch_size rows x grad_accum),
// each rank on half of every micro-batch's rows, so its losses equal the one-process run's up to
// float rounding; a resumed run continues bit for bit on the same rank count.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "forge/data/shard.h"
#include "forge/io/atomic_file.h"
#include "forge/model/config.h"
#include "forge/model/lora_dir.h"
#include "forge/model/model_dir.h"
#include "forge/model/transformer.h"
#include "forge/tokenizer/tokenizer.h"
#include "stride_shards.h"
#include "tiny_chat_model.h"
#include "forge_bin.h"

namespace forge {
namespace {

namespace fs = std::filesystem;

// Relative tolerance between a 2-rank and a 1-rank run (fp32): the ranks' gradient halves and
// loss halves are summed in another order than one process sums them; measured differences are
// ~1e-8 relative after 6 steps.
constexpr double kRankTol = 1e-6;

class MpiTrainCli : public ::testing::Test {
 protected:
  struct Result {
    int code;
    std::string out;  // stdout and stderr together
  };

  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("forge_mpi_cli_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "data");
    testing::write_stride_shards(dir_ / "data");
  }
  void TearDown() override {
    if (!HasFailure()) fs::remove_all(dir_);
  }
  std::string p(const std::string& name) const { return (dir_ / name).string(); }

  // Runs a shell command line, its output captured.
  Result sh(const std::string& cmd) const {
    const std::string log = p("log");
    const int status = std::system((cmd + " >" + log + " 2>&1").c_str());
    std::ifstream f(log);
    std::stringstream s;
    s << f.rdbuf();
    return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, s.str()};
  }
  // `forge ARGS` (ranks = 1) or `mpirun -np RANKS forge ARGS`.
  Result forge(const std::string& args, int ranks) const {
    const std::string cmd = std::string(FORGE_BIN) + " " + args;
    return sh(ranks == 1 ? cmd : mpirun() + " -np " + std::to_string(ranks) + " " + cmd);
  }
  static std::string mpirun() { return std::string(FORGE_MPIEXEC) + " --oversubscribe"; }
  // A tiny model on the shards; every run of a test uses the same settings.
  // extra: more settings, e.g. " dp_bucket=1" (a gradient bucket a layer, dist/buckets.h).
  std::string shard_args(const std::string& run, int steps, int save_every = 3,
                         const std::string& extra = "") const {
    return "train --device cpu --data " + p("data") + " --out " + p(run) + " --steps " +
           std::to_string(steps) + " --save-every " + std::to_string(save_every) +
           " vocab_size=50 max_seq_len=16 seq_len=16 batch_size=4 grad_accum=2"
           " n_layer=2 n_embd=32 n_head=4 ffn_hidden=64 eval_every=5 eval_windows=4 lr=3e-3" + extra;
  }
  std::vector<nlohmann::json> metrics(const std::string& run) const {
    std::vector<nlohmann::json> out;
    std::ifstream f(dir_ / run / "metrics.jsonl");
    std::string line;
    while (std::getline(f, line)) out.push_back(nlohmann::json::parse(line));
    return out;
  }
  // Complete lines of RUN/metrics.jsonl (a line being written is not counted).
  size_t lines(const std::string& run) const {
    std::ifstream f(dir_ / run / "metrics.jsonl");
    std::stringstream s;
    s << f.rdbuf();
    return count(s.str(), "\n");
  }
  // Same steps; loss, grad_norm and val_loss within `rtol` relative (0: bit-identical).
  void expect_same_metrics(const std::string& run, const std::string& ref, double rtol) const {
    const auto a = metrics(ref), b = metrics(run);
    ASSERT_FALSE(a.empty()) << ref;
    ASSERT_EQ(a.size(), b.size()) << run << " vs " << ref;
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_EQ(a[i]["step"], b[i]["step"]) << i;
      for (const char* k : {"loss", "grad_norm", "val_loss", "trained_tokens"}) {
        ASSERT_EQ(a[i].contains(k), b[i].contains(k)) << run << " line " << i << " " << k;
        if (!a[i].contains(k)) continue;
        const double x = a[i][k].get<double>(), y = b[i][k].get<double>();
        if (rtol == 0)
          EXPECT_EQ(x, y) << run << " line " << i << " " << k;
        else
          EXPECT_LE(std::abs(x - y), rtol * std::abs(x)) << run << " line " << i << " " << k;
      }
    }
  }
  // A finished 6-step run copied and taken back to its checkpoint of step 3.
  void copy_back_to_step_3(const std::string& from, const std::string& to) const {
    fs::copy(dir_ / from, dir_ / to, fs::copy_options::recursive);
    fs::remove_all(dir_ / to / "checkpoints/step_000006");
    fs::remove_all(dir_ / to / "model");
  }
  // ONE (1 rank) and TWO (2 ranks), finished 6-step runs, copied, taken back to their checkpoints
  // of step 3 and resumed: on the same rank count bit for bit, on the other (saved on 2 ranks and
  // resumed on 1, and the reverse) within kRankTol of both uninterrupted runs. same(run, ref,
  // rtol) compares two runs (their metrics, and what else the test's runs save).
  using SameRuns = std::function<void(const std::string& run, const std::string& ref, double rtol)>;
  void expect_resumes_across_rank_counts(const SameRuns& same) const {
    struct Case {
      const char* from;  // the run taken back
      int ranks;         // resumed on
    };
    for (const Case& c : {Case{"two", 2}, Case{"one", 1}, Case{"two", 1}, Case{"one", 2}}) {
      const std::string on = c.ranks == 1 ? "one" : "two", run = std::string(c.from) + "_on_" + on;
      copy_back_to_step_3(c.from, run);
      const Result r = forge("train --resume " + p(run), c.ranks);
      ASSERT_EQ(r.code, 0) << run << ": " << r.out;
      if (on == c.from) {
        same(run, c.from, 0);
      } else {
        same(run, "one", kRankTol);
        same(run, "two", kRankTol);
      }
    }
  }
  // A tiny model over the byte-level chat test tokenizer saved as MODEL (GPT-2 unless `family`
  // says otherwise), and 24 SFT examples in chat.jsonl whose responses have different lengths,
  // so the ranks' halves of a micro-batch hold different numbers of trained tokens and the
  // weighting by the global step's count matters.
  ModelConfig chat_model_and_examples(Family family = Family::kGpt2) const {
    const ModelConfig cfg = testing::save_tiny_chat_model(p("model"), family);
    std::ofstream f(p("chat.jsonl"));
    for (int i = 0; i < 24; ++i)
      f << R"({"prompt": "q)" << i << R"(", "response": ")" << std::string(1 + (i * 5) % 17, 'a')
        << "\"}\n";
    return cfg;
  }
  static size_t count(const std::string& s, const std::string& needle) {
    size_t n = 0;
    for (size_t at = s.find(needle); at != std::string::npos; at = s.find(needle, at + 1)) ++n;
    return n;
  }

  fs::path dir_;
};

TEST_F(MpiTrainCli, TwoRanksMatchOneProcessOnTokenShards) {
  const Result one = forge(shard_args("one", 6), 1);
  ASSERT_EQ(one.code, 0) << one.out;
  const Result two = forge(shard_args("two", 6), 2);
  ASSERT_EQ(two.code, 0) << two.out;
  expect_same_metrics("two", "one", kRankTol);
  // The runs differ at all (the comparison would pass for identical files trivially otherwise).
  EXPECT_NE(metrics("two")[1]["grad_norm"], metrics("one")[1]["grad_norm"]);
  // Rank 0 alone prints: one progress line per step, one summary.
  EXPECT_EQ(count(two.out, "step 6/6"), 1u) << two.out;
  EXPECT_EQ(count(two.out, "model saved to"), 1u) << two.out;
  EXPECT_NE(two.out.find("data parallel over 2 ranks"), std::string::npos) << two.out;
  EXPECT_TRUE(fs::is_regular_file(dir_ / "two/model/model.safetensors"));
  EXPECT_TRUE(fs::is_directory(dir_ / "two/checkpoints/step_000006"));
}

// With a gradient bucket a layer (dp_bucket=1; config.json keeps it for the resumed runs): the
// 2-rank shards are pieces of three buckets, and checkpoints hold the full buffers in the
// parameter table's order, so a run resumes on either rank count.
TEST_F(MpiTrainCli, ResumesAcrossRankCounts) {
  ASSERT_EQ(forge(shard_args("one", 6, 3, " dp_bucket=1"), 1).code, 0);
  ASSERT_EQ(forge(shard_args("two", 6, 3, " dp_bucket=1"), 2).code, 0);
  expect_resumes_across_rank_counts(
      [this](const std::string& run, const std::string& ref, double rtol) { expect_same_metrics(run, ref, rtol); });
  EXPECT_TRUE(fs::is_regular_file(dir_ / "one_on_two/model/model.safetensors"));
}

TEST_F(MpiTrainCli, KilledRankStopsTheRunAndLeavesTheCheckpoint) {
  // Rank 1 kills itself (SIGKILL) as step 4 begins, after the checkpoint of step 3.
  const std::string args = shard_args("killed", 6);
  // MPMD: rank 0 plain, rank 1 with the fault.
  const std::string forge_args = std::string(FORGE_BIN) + " " + args;
  const Result r = sh(mpirun() + " -np 1 " + forge_args +
                      " : -np 1 env FORGE_FAULT_INJECT=kill@4 " + forge_args);
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("rank 1"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("step 6/6"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(dir_ / "killed/model"));
  ASSERT_TRUE(fs::is_directory(dir_ / "killed/checkpoints/step_000003")) << r.out;
  // The checkpoint is whole: resumed on 2 ranks, the run ends as an uninterrupted one.
  ASSERT_EQ(forge(shard_args("ref", 6), 2).code, 0);
  const Result resumed = forge("train --resume " + p("killed"), 2);
  ASSERT_EQ(resumed.code, 0) << resumed.out;
  expect_same_metrics("killed", "ref", 0);
}

// The process of `parent`'s children whose environment says OMPI_COMM_WORLD_RANK=`rank`, or -1.
pid_t child_rank(pid_t parent, int rank) {
  const std::string want = "OMPI_COMM_WORLD_RANK=" + std::to_string(rank);
  for (const auto& e : fs::directory_iterator("/proc")) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream stat(e.path() / "stat");
    std::string pid, comm, state;
    long ppid = 0;
    if (!(stat >> pid >> comm >> state >> ppid) || ppid != parent) continue;
    std::ifstream env(e.path() / "environ");
    for (std::string var; std::getline(env, var, '\0');)
      if (var == want) return static_cast<pid_t>(std::stol(name));
  }
  return -1;
}

TEST_F(MpiTrainCli, StopSignalOnOneRankStopsEveryRankAtTheSameStep) {
  // SIGTERM to rank 1 alone (as a scheduler might deliver it): the ranks agree after every step
  // whether any was asked to stop, so both stop after the same step and rank 0 checkpoints it.
  // A checkpoint every step: the stop then always follows a saved step, which no rank saves
  // again (a rank that did would wait in a collective the others never make).
  const std::string cmd = "exec " + mpirun() + " -np 2 " + FORGE_BIN + " " +
                          shard_args("run", 3000, 1) + " >" + p("log") + " 2>&1";
  const pid_t mpi = fork();
  if (mpi == 0) {
    execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  ASSERT_GT(mpi, 0);
  pid_t rank1 = -1;
  for (int i = 0; i < 3000 && (rank1 < 0 || lines("run") < 5); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    if (rank1 < 0) rank1 = child_rank(mpi, 1);
  }
  ASSERT_GT(rank1, 0);
  kill(rank1, SIGTERM);
  int status = 0;
  for (int i = 0; i < 6000 && waitpid(mpi, &status, WNOHANG) == 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  if (waitpid(mpi, &status, WNOHANG) == 0) {  // hung: a rank left the others' collectives
    for (int r = 0; r < 2; ++r)
      if (const pid_t rank = child_rank(mpi, r); rank > 0) kill(rank, SIGKILL);
    kill(mpi, SIGKILL);
    waitpid(mpi, &status, 0);
    FAIL() << "the run did not stop within 60 s of SIGTERM to rank 1";
  }
  std::ifstream f(p("log"));
  std::stringstream out;
  out << f.rdbuf();
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status << "\n" << out.str();
  const int steps = static_cast<int>(metrics("run").size());
  EXPECT_LT(steps, 3000);
  char name[32];
  std::snprintf(name, sizeof(name), "run/checkpoints/step_%06d", steps);
  EXPECT_TRUE(fs::is_directory(dir_ / name)) << name << "\n" << out.str();
  EXPECT_NE(out.str().find("stopped after step " + std::to_string(steps) + " of 3000"),
            std::string::npos)
      << out.str();
}

TEST_F(MpiTrainCli, ErrorsNameTheRankAndLeaveNothing) {
  const Result r = forge(shard_args("odd", 6) + " batch_size=3", 2);
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("forge: rank 0: forge train: error: batch_size 3 does not split over 2 "
                       "ranks"),
            std::string::npos)
      << r.out;
  EXPECT_FALSE(fs::exists(dir_ / "odd/metrics.jsonl"));
}

TEST_F(MpiTrainCli, TwoRanksMatchOneProcessOnSftData) {
  chat_model_and_examples();
  const std::string args = "train --device cpu --init-from " + p("model") + " --sft " +
                           p("chat.jsonl") +
                           " --steps 4 seq_len=32 batch_size=2 grad_accum=2 eval_every=2"
                           " eval_windows=4 sft_val_frac=0.2 lr=1e-2 --out ";
  const Result one = forge(args + p("one"), 1);
  ASSERT_EQ(one.code, 0) << one.out;
  const Result two = forge(args + p("two"), 2);
  ASSERT_EQ(two.code, 0) << two.out;
  expect_same_metrics("two", "one", kRankTol);
}

// Data-parallel LoRA (--lora on 2 ranks): adapters on every projection of a tiny Llama, SFT
// rows whose halves hold different trained-token counts. The same guarantees as full training:
// the 1-rank run's losses, gradient norms and validation losses, and its adapters at the end.
class MpiLoraCli : public MpiTrainCli {
 protected:
  void SetUp() override {
    MpiTrainCli::SetUp();
    cfg_ = chat_model_and_examples(Family::kLlama);
  }
  std::string lora_args(const std::string& run) const {
    return "train --device cpu --init-from " + p("model") + " --sft " + p("chat.jsonl") +
           " --lora r=4,alpha=8,targets=q,k,v,o,gate,up,down --out " + p(run) +
           " --steps 6 --save-every 3 seq_len=32 batch_size=2 grad_accum=2 eval_every=3"
           " eval_windows=4 sft_val_frac=0.2 lr=1e-2 dp_bucket=1";  // a bucket a layer
  }
  // RUN/model's adapters against REF's: ‖b − a‖ ≤ rtol · ‖a‖ over the whole adapter buffer
  // (0: bit-identical). Not per value: Adam divides each gradient by its own running magnitude,
  // so a value whose gradients nearly cancel carries the rounding of the ranks' sums into its
  // update (measured: 7e-6 relative for the worst of 2,176 values, 1.6e-7 for the buffer).
  void expect_same_adapters(const std::string& run, const std::string& ref, double rtol) const {
    const std::vector<float> a = load_adapter_dir(p(ref + "/model"), cfg_).weights;
    const std::vector<float> b = load_adapter_dir(p(run + "/model"), cfg_).weights;
    ASSERT_EQ(a.size(), b.size());
    double norm = 0, diff = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      norm += static_cast<double>(a[i]) * a[i];
      diff += (static_cast<double>(b[i]) - a[i]) * (static_cast<double>(b[i]) - a[i]);
    }
    ASSERT_GT(norm, 0.0);
    if (rtol == 0)
      EXPECT_EQ(diff, 0.0) << run << " vs " << ref;
    else
      EXPECT_LE(std::sqrt(diff), rtol * std::sqrt(norm)) << run << " vs " << ref;
  }
  ModelConfig cfg_;
};

TEST_F(MpiLoraCli, TwoRanksMatchOneProcess) {
  const Result one = forge(lora_args("one"), 1);
  ASSERT_EQ(one.code, 0) << one.out;
  const Result two = forge(lora_args("two"), 2);
  ASSERT_EQ(two.code, 0) << two.out;
  EXPECT_NE(two.out.find("data parallel over 2 ranks"), std::string::npos) << two.out;
  EXPECT_NE(two.out.find("lora r=4"), std::string::npos) << two.out;
  expect_same_metrics("two", "one", kRankTol);
  expect_same_adapters("two", "one", kRankTol);
  // The runs differ at all, and the adapters moved (B starts at 0): the comparisons bite.
  EXPECT_NE(metrics("two")[2]["grad_norm"], metrics("one")[2]["grad_norm"]);
  EXPECT_NE(metrics("two")[5]["loss"], metrics("two")[0]["loss"]);
  EXPECT_EQ(count(two.out, "step 6/6"), 1u) << two.out;
  EXPECT_TRUE(fs::is_regular_file(dir_ / "two/model/adapter_model.safetensors"));
  EXPECT_TRUE(fs::is_regular_file(dir_ / "two/checkpoints/step_000006/optimizer.safetensors"));
}

TEST_F(MpiLoraCli, ResumesAcrossRankCounts) {
  ASSERT_EQ(forge(lora_args("one"), 1).code, 0);
  ASSERT_EQ(forge(lora_args("two"), 2).code, 0);
  // The losses and the adapters at the end (the checkpoint holds every rank's shard of the
  // adapters' Adam state, gathered).
  expect_resumes_across_rank_counts([this](const std::string& run, const std::string& ref, double rtol) {
    expect_same_metrics(run, ref, rtol);
    expect_same_adapters(run, ref, rtol);
  });
  EXPECT_TRUE(fs::is_regular_file(dir_ / "one_on_two/model/adapter_model.safetensors"));
}

}  // namespace
}  // namespace forge

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  // What ctest sets too, for a direct run: mpirun as root (CI containers), one OpenMP thread a
  // rank, waiting ranks that yield their core.
  for (const auto& [k, v] : {std::pair{"OMPI_ALLOW_RUN_AS_ROOT", "1"},
                             {"OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1"},
                             {"OMP_NUM_THREADS", "1"},
                             {"OMPI_MCA_mpi_yield_when_idle", "1"},
                             {"OMP_WAIT_POLICY", "passive"}})
    setenv(k, v, 0);
  return RUN_ALL_TESTS();
}
