// Faults that must lose nothing, through the forge binary: steps poisoned with
// FORGE_FAULT_INJECT until max_bad_steps stop the run (exit 1, one error line, the checkpoint
// before them byte for byte as a clean run wrote it, and a resume from it that finishes); a full
// disk while saving a checkpoint, simulated as root can't undo it — a file-size limit
// (RLIMIT_FSIZE) on the forge process, which makes the checkpoint's weights file fail with EFBIG
// (forge ignores SIGXFSZ so the write fails rather than the process dying) — leaves the previous
// checkpoint intact and no temporary directory, and one while saving the final model is a
// one-line error too; a run directory that cannot hold checkpoints
// (its checkpoints/ is a regular file: chmod would not stop root) is a one-line error naming it.
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "forge/data/shard.h"
#include "testing.h"
#include "stride_shards.h"
#include "forge_bin.h"

namespace forge {
namespace {

namespace fs = std::filesystem;

struct Outcome {
  int code;  // exit code, or -signal
  std::string out, err;
};

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// Every file under dir, relative path -> bytes.
std::map<std::string, std::string> tree_bytes(const fs::path& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file()) out[fs::relative(e.path(), dir).string()] = slurp(e.path());
  return out;
}

// The names in a directory, sorted (temporary ones included).
std::vector<std::string> names_in(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

// The lines of `text` that contain `needle`.
int count_lines_with(const std::string& text, const std::string& needle) {
  std::istringstream in(text);
  int n = 0;
  for (std::string line; std::getline(in, line);) n += line.find(needle) != std::string::npos;
  return n;
}

class FaultCli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("forge_faultcli_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "data");
    testing::write_stride_shards(dir_ / "data");
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::vector<std::string> train_args(const std::string& run, int steps) const {
    return {"train",
            "--data",
            (dir_ / "data").string(),
            "--out",
            (dir_ / run).string(),
            "--steps",
            std::to_string(steps),
            "--save-every",
            "2",
            "vocab_size=50",
            "max_seq_len=16",
            "seq_len=16",
            "batch_size=4",
            "n_layer=2",
            "n_embd=32",
            "n_head=4",
            "ffn_hidden=64",
            "eval_every=50",
            "eval_windows=4",
            "lr=3e-3",
            "max_bad_steps=2"};
  }
  // Runs forge with extra environment variables and, when fsize > 0, a file-size limit.
  Outcome forge(const std::vector<std::string>& args,
                const std::vector<std::pair<std::string, std::string>>& env = {},
                rlim_t fsize = 0) const {
    const fs::path out = dir_ / "stdout", err = dir_ / "stderr";
    const pid_t pid = fork();
    if (pid == 0) {
      if (!freopen(out.c_str(), "w", stdout) || !freopen(err.c_str(), "w", stderr)) _exit(126);
      setenv("OMP_WAIT_POLICY", "passive", 1);  // forge would re-exec itself to set it
      for (const auto& [k, v] : env) setenv(k.c_str(), v.c_str(), 1);
      if (fsize > 0) {
        const rlimit lim{fsize, fsize};
        if (setrlimit(RLIMIT_FSIZE, &lim) != 0) _exit(125);
      }
      signal(SIGXFSZ, SIG_DFL);  // as a shell would leave it: forge must handle it itself
      std::vector<char*> argv = {const_cast<char*>(FORGE_BIN)};
      for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      execv(FORGE_BIN, argv.data());
      _exit(127);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    return {WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status), slurp(out), slurp(err)};
  }

  fs::path dir_;
};

TEST_F(FaultCli, BadStepsStopTheRunAndLeaveTheLastCheckpointAsACleanRunWroteIt) {
  ASSERT_EQ(forge(train_args("clean", 6)).code, 0);
  // Steps 2 and 3 (0-based) poisoned: the second bad step in a row ends the run before the
  // checkpoint of step 4.
  const Outcome r = forge(train_args("bad", 6), {{"FORGE_FAULT_INJECT", "nan_loss@2-3"}});
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_EQ(count_lines_with(r.err, "error"), 1) << r.err;
  EXPECT_NE(r.err.find("forge train: error: 2 steps in a row (3 to 4) had a non-finite loss"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find((dir_ / "bad/checkpoints/step_000002").string() + ", is intact"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(count_lines_with(r.err, "warning: step"), 2) << r.err;
  EXPECT_EQ(names_in(dir_ / "bad/checkpoints"), std::vector<std::string>{"step_000002"});
  EXPECT_EQ(tree_bytes(dir_ / "bad/checkpoints/step_000002"),
            tree_bytes(dir_ / "clean/checkpoints/step_000002"));
  EXPECT_FALSE(fs::exists(dir_ / "bad/model"));
  // Without the faults, the run resumes from it and ends where the clean run ended.
  const Outcome again = forge({"train", "--resume", (dir_ / "bad").string()});
  EXPECT_EQ(again.code, 0) << again.err;
  EXPECT_EQ(slurp(dir_ / "bad/model/model.safetensors"),
            slurp(dir_ / "clean/model/model.safetensors"));
}

TEST_F(FaultCli, FullDiskWhileSavingKeepsThePreviousCheckpoint) {
  ASSERT_EQ(forge(train_args("run", 2)).code, 0);
  fs::remove_all(dir_ / "run/model");  // as if stopped after the checkpoint
  const auto saved = tree_bytes(dir_ / "run/checkpoints");
  ASSERT_TRUE(saved.count("step_000002/optimizer.safetensors"));
  const uintmax_t weights = fs::file_size(dir_ / "run/checkpoints/step_000002/model.safetensors");
  // Room for the small files a resumed run rewrites (config.json, metrics.jsonl, loss.svg), not
  // for the weights.
  const rlim_t limit = 32 << 10;
  ASSERT_GT(weights, limit);
  const Outcome r =
      forge({"train", "--resume", (dir_ / "run").string(), "--steps", "4"}, {}, limit);
  EXPECT_EQ(r.code, 1) << r.err;  // not killed by SIGXFSZ
  EXPECT_EQ(count_lines_with(r.err, "error"), 1) << r.err;
  for (const std::string& needle :
       {std::string("forge train: error: checkpoint of step 4 not saved (the last checkpoint, ") +
            (dir_ / "run/checkpoints/step_000002").string() + ", is intact)",
        std::string("model.safetensors"), std::string(std::strerror(EFBIG))})
    EXPECT_NE(r.err.find(needle), std::string::npos) << needle << "\n" << r.err;
  EXPECT_EQ(tree_bytes(dir_ / "run/checkpoints"), saved);  // nothing left of the failed save
  EXPECT_EQ(names_in(dir_ / "run/checkpoints"), std::vector<std::string>{"step_000002"});
  EXPECT_FALSE(fs::exists(dir_ / "run/model"));
  // With room again, the same command finishes from that checkpoint.
  const Outcome again = forge({"train", "--resume", (dir_ / "run").string(), "--steps", "4"});
  EXPECT_EQ(again.code, 0) << again.err;
  EXPECT_TRUE(fs::exists(dir_ / "run/checkpoints/step_000004/trainer_state.json"));
}

// The final model under the same limit (a run without checkpoints): one line naming the weights
// file and the OS error, no model/ directory and no temporary one beside it.
TEST_F(FaultCli, FullDiskWhileSavingTheFinalModelIsAOneLineError) {
  std::vector<std::string> args = train_args("run", 2);
  const auto every = std::find(args.begin(), args.end(), "--save-every");
  ASSERT_NE(every, args.end());
  *(every + 1) = "0";
  const Outcome r = forge(args, {}, 32 << 10);
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_EQ(count_lines_with(r.err, "error"), 1) << r.err;
  for (const std::string& needle :
       {std::string("forge train: error: the final model was not saved (no checkpoint was written "
                    "before): "),
        std::string("model.safetensors"), std::string(std::strerror(EFBIG))})
    EXPECT_NE(r.err.find(needle), std::string::npos) << needle << "\n" << r.err;
  EXPECT_EQ(names_in(dir_ / "run"),
            (std::vector<std::string>{"config.json", "loss.svg", "metrics.jsonl"}));
}

TEST_F(FaultCli, RunDirectoryThatCannotHoldCheckpointsIsAOneLineError) {
  fs::create_directories(dir_ / "run");
  std::ofstream(dir_ / "run/checkpoints") << "a file where the directory should be";
  const Outcome r = forge(train_args("run", 4));
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_NE(r.err.find("forge train: error: checkpoint of step 2 not saved (no checkpoint was "
                       "written before): " +
                       (dir_ / "run/checkpoints").string() + ": cannot create directory: "),
            std::string::npos)
      << r.err;
  EXPECT_EQ(slurp(dir_ / "run/checkpoints"), "a file where the directory should be");
  // A run directory whose parent is a file: refused before anything is written.
  const Outcome s = forge(train_args("run/checkpoints/run", 4));
  EXPECT_EQ(s.code, 1) << s.err;
  EXPECT_NE(s.err.find((dir_ / "run/checkpoints/run").string()), std::string::npos) << s.err;
  EXPECT_EQ(std::count(s.err.begin(), s.err.end(), '\n'), 1) << s.err;
}

}  // namespace
}  // namespace forge
