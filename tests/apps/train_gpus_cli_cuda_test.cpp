// `forge train` data parallel on GPUs from the command line (skipped without a GPU): `forge
// train --gpus 1` and `mpirun -np 1 forge train --device cuda` train and save a model; with 2 or
// more GPUs, `--gpus 2` follows `--gpus 1` (fp32: losses and norms within 1e-5 relative), and
// its checkpoint resumes on one GPU.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "forge/backend/cuda/runtime.h"
#include "forge/data/shard.h"
#include "stride_shards.h"
#include "forge_bin.h"

namespace forge {
namespace {

namespace fs = std::filesystem;

class TrainGpusCli : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda::available()) GTEST_SKIP() << "no CUDA device: " << cuda::device_summary();
    dir_ = fs::temp_directory_path() /
           ("forge_gpus_cli_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "data");
    testing::write_stride_shards(dir_ / "data", 20000, 2000);
  }
  void TearDown() override {
    if (!HasFailure() && !dir_.empty()) fs::remove_all(dir_);
  }
  std::string p(const std::string& name) const { return (dir_ / name).string(); }
  std::string args(const std::string& run, int steps) const {
    return "train --data " + p("data") + " --out " + p(run) + " --steps " + std::to_string(steps) +
           " --save-every 3 --precision fp32 vocab_size=50 max_seq_len=32 seq_len=32 batch_size=8"
           " grad_accum=2 n_layer=2 n_embd=64 n_head=4 ffn_hidden=128 eval_every=5"
           " eval_windows=4 lr=3e-3";
  }
  int sh(const std::string& cmd) const {
    const int st = std::system((cmd + " >" + p("log") + " 2>&1").c_str());
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  }
  std::string log() const {
    std::ifstream f(p("log"));
    std::stringstream s;
    s << f.rdbuf();
    return s.str();
  }
  std::vector<nlohmann::json> metrics(const std::string& run) const {
    std::vector<nlohmann::json> out;
    std::ifstream f(dir_ / run / "metrics.jsonl");
    std::string line;
    while (std::getline(f, line)) out.push_back(nlohmann::json::parse(line));
    return out;
  }
  // metrics.jsonl's training-step lines (the file also holds the step-0 validation line).
  int step_lines(const std::string& run) const {
    int n = 0;
    for (const auto& m : metrics(run)) n += m.contains("loss") ? 1 : 0;
    return n;
  }
  void expect_close(const std::string& run, const std::string& ref, double rtol) const {
    const auto a = metrics(ref), b = metrics(run);
    ASSERT_FALSE(a.empty()) << ref;
    ASSERT_EQ(a.size(), b.size()) << run;
    for (size_t i = 0; i < a.size(); ++i)
      for (const char* k : {"loss", "grad_norm", "val_loss"}) {
        ASSERT_EQ(a[i].contains(k), b[i].contains(k)) << run << " line " << i << " " << k;
        if (!a[i].contains(k)) continue;
        const double x = a[i][k].get<double>(), y = b[i][k].get<double>();
        EXPECT_LE(std::abs(x - y), rtol * std::abs(x)) << run << " line " << i << " " << k;
      }
  }
  fs::path dir_;
};

TEST_F(TrainGpusCli, GpusOneTrainsAndSaves) {
  // One rank is the single-process CUDA run, bit for bit (a world of one keeps the plain runner).
  ASSERT_EQ(sh(std::string(FORGE_BIN) + " " + args("ref", 6) + " --device cuda"), 0) << log();
  ASSERT_EQ(sh(std::string(FORGE_BIN) + " " + args("g1", 6) + " --gpus 1"), 0) << log();
  EXPECT_EQ(step_lines("g1"), 6);
  expect_close("g1", "ref", 0.0);
  EXPECT_TRUE(fs::exists(dir_ / "g1/model/config.json"));
}

TEST_F(TrainGpusCli, MpirunOneRankTrainsAndSaves) {
#ifndef FORGE_MPIEXEC
  GTEST_SKIP() << "built without MPI";
#else
  const std::string mpirun = "env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 " +
                             std::string(FORGE_MPIEXEC) + " --oversubscribe -np 1 ";
  ASSERT_EQ(sh(std::string(FORGE_BIN) + " " + args("ref", 6) + " --device cuda"), 0) << log();
  ASSERT_EQ(sh(mpirun + FORGE_BIN + " " + args("m1", 6) + " --device cuda"), 0) << log();
  EXPECT_EQ(step_lines("m1"), 6);
  expect_close("m1", "ref", 0.0);
  EXPECT_TRUE(fs::exists(dir_ / "m1/model/config.json"));
#endif
}

// forge bench train --gpus 1: one plain-runner rank, then one ZeRO-1 rank over NCCL, and the
// scaling row; the JSON's two runs are the same shape and the ZeRO-1 one says it is.
TEST_F(TrainGpusCli, BenchTrainGpusOnePrintsBothRunsAndTheEfficiency) {
  ASSERT_EQ(sh(std::string(FORGE_BIN) + " bench train --preset tiny --batch 4 --seq-len 64 --steps 3 --gpus 1"
                   " --json-out " + p("b.json")),
            0)
      << log();
  const std::string out = log();
  EXPECT_NE(out.find("| 1 | plain |"), std::string::npos) << out;
  EXPECT_NE(out.find("| 1 | ZeRO-1, NCCL |"), std::string::npos) << out;
  std::ifstream f(p("b.json"));
  const nlohmann::json j = nlohmann::json::parse(f);
  EXPECT_FALSE(j.at("one_gpu").at("data_parallel").get<bool>());
  EXPECT_TRUE(j.at("data_parallel").at("data_parallel").get<bool>());
  EXPECT_EQ(j.at("data_parallel").at("ranks").get<int>(), 1);
  const double t1 = j.at("one_gpu").at("tokens_per_s").get<double>(),
               tn = j.at("data_parallel").at("tokens_per_s").get<double>();
  EXPECT_GT(t1, 0);
  EXPECT_NEAR(j.at("efficiency").get<double>(), tn / t1, 1e-9);
}

TEST_F(TrainGpusCli, TwoGpusFollowOneAndResumeOnOne) {
  int n = 0;
  {
    // nvidia-smi is not needed: the binary's own error for too many GPUs says how many it sees.
    sh(std::string(FORGE_BIN) + " " + args("probe", 1) + " --gpus 4096");
    const std::string msg = log();
    const size_t at = msg.find("this machine has ");
    if (at != std::string::npos) n = std::atoi(msg.c_str() + at + 17);
  }
  if (n < 2) GTEST_SKIP() << "needs 2 GPUs, found " << n;
  ASSERT_EQ(sh(std::string(FORGE_BIN) + " " + args("one", 6) + " --gpus 1"), 0) << log();
  ASSERT_EQ(sh(std::string(FORGE_BIN) + " " + args("two", 6) + " --gpus 2"), 0) << log();
  expect_close("two", "one", 1e-5);
  fs::copy(dir_ / "two", dir_ / "back", fs::copy_options::recursive);
  fs::remove_all(dir_ / "back/checkpoints/step_000006");
  fs::remove_all(dir_ / "back/model");
  ASSERT_EQ(sh(std::string(FORGE_BIN) + " train --resume " + p("back") + " --steps 6 --device cuda"), 0)
      << log();
  expect_close("back", "one", 1e-5);
}

}  // namespace
}  // namespace forge
