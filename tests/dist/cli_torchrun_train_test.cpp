// `forge train` on torchrun-style ranks without MPI (dist/tcp_comm.h), on the CPU: two forge
// processes started by the --gpus supervisor's launcher (dist/local_launch.h, which sets RANK,
// WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT) train the same global batch as one process,
// losses and norms within 1e-6 relative, and the 2-rank run's checkpoint resumes on one process.
// And `forge train --gpus`'s argument errors, one line each, on any machine.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "forge/data/shard.h"
#include "forge/dist/local_launch.h"
#include "stride_shards.h"
#include "forge_bin.h"

namespace forge {
namespace {

namespace fs = std::filesystem;

class TorchrunTrainCli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("forge_torchrun_cli_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "data");
    testing::write_stride_shards(dir_ / "data");
  }
  void TearDown() override {
    if (!HasFailure()) fs::remove_all(dir_);
  }
  std::string p(const std::string& name) const { return (dir_ / name).string(); }
  std::vector<std::string> train_args(const std::string& run, int steps) const {
    return {"train", "--device", "cpu", "--data", p("data"), "--out", p(run), "--steps",
            std::to_string(steps), "--save-every", "3", "vocab_size=50", "max_seq_len=16",
            "seq_len=16", "batch_size=4", "grad_accum=2", "n_layer=2", "n_embd=32", "n_head=4",
            "ffn_hidden=64", "eval_every=5", "eval_windows=4", "lr=3e-3"};
  }
  // `forge ARGS` on `ranks` torchrun-style ranks (1: one plain process); the exit status.
  int forge(std::vector<std::string> args, int ranks) const {
    args.insert(args.begin(), FORGE_BIN);
    if (ranks == 1) {
      std::string cmd;
      for (const auto& a : args) cmd += "'" + a + "' ";
      const int st = std::system((cmd + ">" + p("log") + " 2>&1").c_str());
      return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    }
    LocalLaunch l;
    l.argv = args;
    l.ranks = ranks;
    // One OpenMP thread a rank (2 ranks on the 2-core CI machine), as the MPI tests do.
    const char* old = std::getenv("OMP_NUM_THREADS");
    const std::string saved = old ? old : "";
    ::setenv("OMP_NUM_THREADS", "1", 1);
    const int status = run_local_ranks(l).status;
    if (old) ::setenv("OMP_NUM_THREADS", saved.c_str(), 1);
    else ::unsetenv("OMP_NUM_THREADS");
    return status;
  }
  std::vector<nlohmann::json> metrics(const std::string& run) const {
    std::vector<nlohmann::json> out;
    std::ifstream f(dir_ / run / "metrics.jsonl");
    std::string line;
    while (std::getline(f, line)) out.push_back(nlohmann::json::parse(line));
    return out;
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
  std::string log() const {
    std::ifstream f(p("log"));
    std::stringstream s;
    s << f.rdbuf();
    return s.str();
  }
  fs::path dir_;
};

TEST_F(TorchrunTrainCli, TwoTcpRanksMatchOneProcessAndResumeOnOne) {
  ASSERT_EQ(forge(train_args("one", 6), 1), 0) << log();
  ASSERT_EQ(forge(train_args("two", 6), 2), 0);
  expect_close("two", "one", 1e-6);
  EXPECT_NE(metrics("two")[1]["grad_norm"], metrics("one")[1]["grad_norm"]);  // 2 ranks ran
  // The 2-rank run's checkpoint of step 3, resumed on one process, continues as the 1-rank run.
  fs::copy(dir_ / "two", dir_ / "back", fs::copy_options::recursive);
  fs::remove_all(dir_ / "back/checkpoints/step_000006");
  fs::remove_all(dir_ / "back/model");
  ASSERT_EQ(forge({"train", "--resume", p("back"), "--steps", "6"}, 1), 0) << log();
  expect_close("back", "one", 1e-6);
}

TEST_F(TorchrunTrainCli, GpusArgumentErrorsAreOneLine) {
  auto expect_error_cmd = [&](const std::string& cmd, const std::string& text) {
    const int st = std::system((cmd + " >" + p("log") + " 2>&1").c_str());
    EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) != 0) << cmd;
    const std::string out = log();
    EXPECT_NE(out.find(text), std::string::npos) << cmd << "\n" << out;
    EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << out;
  };
  auto expect_error = [&](const std::string& args, const std::string& text) {
    expect_error_cmd(std::string(FORGE_BIN) + " " + args, text);
  };
  const std::string data = " --data " + p("data") + " --out " + p("run");
  expect_error("train --gpus 4096" + data, "--gpus 4096: this machine has ");
  expect_error("train --gpus 2 --device cpu" + data, "--gpus trains on GPUs: drop --device cpu");
  expect_error("train --gpus 0" + data, "--gpus");
  expect_error_cmd("env RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=1 " +
                   std::string(FORGE_BIN) + " train --gpus 1" + data,
               "--gpus starts its own ranks; this process is already rank 0 of 1 under torchrun");
  EXPECT_FALSE(fs::exists(dir_ / "run"));
}

}  // namespace
}  // namespace forge
