// forge train --resume, end to end through the binary: a run killed with SIGKILL mid-way, one
// killed a dozen times at random moments (inside checkpoint writes too) and a run stopped with
// SIGTERM all continue from their newest checkpoint, and every loss they log equals, exactly,
// the loss an uninterrupted run logs at that step.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <thread>

#include "forge/backend/cuda/runtime.h"
#include "forge/data/shard.h"
#include "testing.h"
#include "stride_shards.h"
#include "forge_bin.h"

namespace forge {
namespace {

namespace fs = std::filesystem;

class ResumeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("forge_resume_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    testing::write_stride_shards(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // The training command line; every run of a test uses the same settings.
  std::vector<std::string> train_args(const std::string& run, int steps) const {
    return {"train",
            "--data",
            dir_.string(),
            "--out",
            (dir_ / run).string(),
            "--steps",
            std::to_string(steps),
            "--save-every",
            "3",
            "--keep-checkpoints",
            "2",
            "vocab_size=50",
            "max_seq_len=16",
            "seq_len=16",
            "batch_size=4",
            "grad_accum=2",
            "n_layer=2",
            "n_embd=32",
            "n_head=4",
            "ffn_hidden=64",
            "eval_every=5",
            "eval_windows=4",
            "lr=3e-3"};
  }
  // Starts forge in the background; stdout/stderr go to files in the test directory.
  pid_t spawn(const std::vector<std::string>& args, const std::string& log) const {
    const std::string out = (dir_ / (log + ".out")).string(),
                      err = (dir_ / (log + ".err")).string();
    const pid_t pid = fork();
    if (pid == 0) {
      if (!freopen(out.c_str(), "w", stdout) || !freopen(err.c_str(), "w", stderr)) _exit(126);
      setenv("OMP_WAIT_POLICY", "passive", 1);  // forge would re-exec itself to set it
      std::vector<char*> argv = {const_cast<char*>(FORGE_BIN)};
      for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      execv(FORGE_BIN, argv.data());
      _exit(127);
    }
    return pid;
  }
  // Exit code, or -signal.
  static int wait_for(pid_t pid) {
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
  }
  int run(const std::vector<std::string>& args, const std::string& log) const {
    return wait_for(spawn(args, log));
  }
  std::string read(const std::string& name) const {
    std::ifstream f(dir_ / name);
    std::stringstream s;
    s << f.rdbuf();
    return s.str();
  }
  nlohmann::json read_json(const std::string& name) const {
    return nlohmann::json::parse(read(name));
  }
  void write_json(const std::string& name, const nlohmann::json& j) const {
    std::ofstream(dir_ / name) << j.dump(2);
  }
  // A finished run of 6 steps taken back to its checkpoint of step 3, as if killed after it.
  void back_to_step_3(const std::string& run) const {
    fs::remove_all(dir_ / run / "checkpoints/step_000006");
    fs::remove_all(dir_ / run / "model");
  }
  // Polls until pred() holds or `seconds` pass; true if it held.
  static bool wait_until(const std::function<bool()>& pred, double seconds = 20) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    while (std::chrono::steady_clock::now() < end) {
      if (pred()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    return false;
  }
  std::vector<nlohmann::json> metrics(const std::string& run) const {
    std::vector<nlohmann::json> out;
    std::ifstream f(dir_ / run / "metrics.jsonl");
    std::string line;
    while (std::getline(f, line)) out.push_back(nlohmann::json::parse(line));
    return out;
  }
  int lines(const std::string& run) const {
    std::ifstream f(dir_ / run / "metrics.jsonl");
    std::string line;
    int n = 0;
    while (std::getline(f, line)) ++n;
    return n;
  }
  // Every line of `run` equals the reference's: same steps, bit-identical losses.
  void expect_same_metrics(const std::string& run, const std::string& ref) const {
    const auto a = metrics(ref), b = metrics(run);
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_EQ(a[i]["step"], b[i]["step"]) << i;
      for (const char* k : {"loss", "grad_norm", "lr", "val_loss"}) {
        ASSERT_EQ(a[i].contains(k), b[i].contains(k)) << i << " " << k;
        if (a[i].contains(k)) {
          EXPECT_EQ(a[i][k].get<double>(), b[i][k].get<double>()) << "step " << i << " " << k;
        }
      }
    }
  }

  fs::path dir_;
};

TEST_F(ResumeTest, SigkillMidRunThenResumeLogsIdenticalLosses) {
  constexpr int kSteps = 60;
  ASSERT_EQ(run(train_args("ref", kSteps), "ref"), 0) << read("ref.err");

  const pid_t pid = spawn(train_args("run", kSteps), "run");
  const bool reached = wait_until([&] { return fs::exists(dir_ / "run/checkpoints/step_000006"); });
  kill(pid, SIGKILL);
  ASSERT_EQ(wait_for(pid), -SIGKILL) << "the run finished before it could be killed";
  ASSERT_TRUE(reached);
  EXPECT_FALSE(fs::exists(dir_ / "run/model"));
  EXPECT_LT(lines("run"), kSteps);

  ASSERT_EQ(run({"train", "--resume", (dir_ / "run").string()}, "resume"), 0) << read("resume.err");
  EXPECT_NE(read("resume.out").find("resuming"), std::string::npos);
  expect_same_metrics("run", "ref");
  EXPECT_EQ(read("run/model/model.safetensors"), read("ref/model/model.safetensors"));
  // --keep-checkpoints 2: the last two remain (57 and 60).
  EXPECT_TRUE(fs::exists(dir_ / "run/checkpoints/step_000060"));
  EXPECT_TRUE(fs::exists(dir_ / "run/checkpoints/step_000057"));
  EXPECT_FALSE(fs::exists(dir_ / "run/checkpoints/step_000054"));
}

// Kill anywhere: forge train is killed with SIGKILL again and again (12 times), each time
// resumed, then let finish; every resume must succeed, and the finished run must log exactly the
// losses of an uninterrupted run and save the same weights. Half of the kills fire at a random
// moment within a quarter of an uninterrupted run's time (startup, a step, an evaluation, a metrics
// line, loading a checkpoint), so that the run needs many resumes to finish; the other half
// as soon as a checkpoint's temporary directory (checkpoints/.tmp-step_N) appears, plus a random
// 0-300 µs, so that they land inside a checkpoint write: the directory still there after the kill
// is the proof, and at least one kill must have landed so. A kill before the first checkpoint
// exists leaves nothing to resume from: that run starts over, as a user would start it.
TEST_F(ResumeTest, SigkillAnywhereManyTimesEveryResumeContinuesExactly) {
  constexpr int kSteps = 60, kKills = 12;
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_EQ(run(train_args("ref", kSteps), "ref"), 0) << read("ref.err");
  const double ref_us =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();

  const fs::path run_dir = dir_ / "run", ckpts = run_dir / "checkpoints";
  // Entries of checkpoints/ whose name starts with `prefix` (and written since `since`).
  auto entries_starting = [&](const char* prefix,
                              fs::file_time_type since = fs::file_time_type::min()) {
    int n = 0;
    std::error_code ec;
    for (fs::directory_iterator it(ckpts, ec), end; !ec && it != end; it.increment(ec)) {
      std::error_code t;
      n += it->path().filename().string().rfind(prefix, 0) == 0 &&
           fs::last_write_time(it->path(), t) >= since;
    }
    return n;
  };
  std::mt19937 rng(20261202);  // the moments are random; the sequence of choices is fixed
  int kills = 0, inside_a_write = 0, resumes = 0, status = -SIGKILL;
  for (int round = 0; round < kKills && status != 0; ++round) {
    const bool resume = entries_starting("step_") > 0;
    if (!resume) fs::remove_all(run_dir);
    resumes += resume;
    const std::string log = "round" + std::to_string(round);
    // A leftover of an earlier round's kill stays until the next save removes it: only a
    // temporary directory written during this round counts as this kill's.
    const fs::file_time_type started = fs::file_time_type::clock::now();
    const pid_t pid = spawn(resume ? std::vector<std::string>{"train", "--resume", run_dir.string()}
                                   : train_args("run", kSteps),
                            log);
    int wstatus = 0;
    auto exited = [&] { return waitpid(pid, &wstatus, WNOHANG) == pid; };
    bool done = false;
    if (round % 2 == 1) {
      // Busy-wait for a checkpoint write of this round to begin (polling every few ms would
      // miss most) once a complete checkpoint exists, so that the kill leaves one to resume
      // from. A temporary directory left by an earlier round does not count: waiting for any
      // made such rounds kill at once, and a CI run where no checkpoint was ever completed
      // failed below.
      const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(60);
      while (!(done = exited()) &&
             !(entries_starting("step_") > 0 && entries_starting(".tmp-", started) > 0) &&
             std::chrono::steady_clock::now() < end) {
      }
      std::this_thread::sleep_for(
          std::chrono::microseconds(std::uniform_int_distribution<int>(0, 300)(rng)));
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(
          std::uniform_int_distribution<int64_t>(0, static_cast<int64_t>(ref_us / 4))(rng)));
    }
    if (!done) {
      kill(pid, SIGKILL);
      waitpid(pid, &wstatus, 0);
    }
    status = WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : -WTERMSIG(wstatus);
    ASSERT_TRUE(status == 0 || status == -SIGKILL)
        << log << " exited with " << status << ": " << read(log + ".err");
    if (status == -SIGKILL) {
      ++kills;
      inside_a_write += entries_starting(".tmp-", started) > 0;
    }
  }
  if (status != 0) {  // the last round was killed too: finish the run
    const bool resume = entries_starting("step_") > 0;
    if (!resume) fs::remove_all(run_dir);
    ASSERT_EQ(run(resume ? std::vector<std::string>{"train", "--resume", run_dir.string()}
                         : train_args("run", kSteps),
                  "last"),
              0)
        << read("last.err");
    resumes += resume;
  }
  std::printf("%d kills, %d inside a checkpoint write, %d resumes\n", kills, inside_a_write,
              resumes);
  EXPECT_GE(kills, kKills / 2);
  EXPECT_GE(resumes, kKills / 4);
  EXPECT_GE(inside_a_write, 1);
  EXPECT_EQ(entries_starting(".tmp-"), 0) << "a resume leaves no temporary directory behind";
  expect_same_metrics("run", "ref");
  EXPECT_EQ(read("run/model/model.safetensors"), read("ref/model/model.safetensors"));
}

TEST_F(ResumeTest, SigtermCheckpointsAndExitsZeroThenResumes) {
  constexpr int kSteps = 40;
  ASSERT_EQ(run(train_args("ref", kSteps), "ref"), 0) << read("ref.err");

  const pid_t pid = spawn(train_args("run", kSteps), "run");
  ASSERT_TRUE(wait_until([&] { return lines("run") >= 4; }));
  kill(pid, SIGTERM);
  ASSERT_EQ(wait_for(pid), 0) << read("run.err");
  // The checkpoint is at the step reached: as many steps as metrics.jsonl logged.
  const auto logged = metrics("run");
  ASSERT_FALSE(logged.empty());
  const int reached = logged.back()["step"].get<int>() + 1;
  ASSERT_LT(reached, kSteps) << "the run finished before it could be stopped";
  char name[48];  // room for any int: -Wformat-truncation
  std::snprintf(name, sizeof name, "run/checkpoints/step_%06d", reached);
  EXPECT_TRUE(fs::exists(dir_ / name / "trainer_state.json")) << name;
  EXPECT_NE(read("run.out").find("stopped after step " + std::to_string(reached)),
            std::string::npos)
      << read("run.out");
  EXPECT_FALSE(fs::exists(dir_ / "run/model"));

  ASSERT_EQ(run({"train", "--resume", (dir_ / "run").string()}, "resume"), 0) << read("resume.err");
  expect_same_metrics("run", "ref");
}

TEST_F(ResumeTest, ResumeRejectsChangedSettings) {
  ASSERT_EQ(run(train_args("run", 3), "run"), 0) << read("run.err");
  EXPECT_EQ(run({"train", "--resume", (dir_ / "run").string(), "lr=1"}, "bad"), 1);
  EXPECT_NE(read("bad.err").find("drop 'lr=1'"), std::string::npos) << read("bad.err");
  EXPECT_EQ(run({"train", "--resume", (dir_ / "nothing").string()}, "none"), 1);
  EXPECT_NE(read("none.err").find("no such run directory"), std::string::npos) << read("none.err");
  EXPECT_EQ(run({"train", "--resume", (dir_ / "run").string(), "--steps", "2"}, "back"), 1);
  EXPECT_NE(read("back.err").find("before the newest checkpoint"), std::string::npos)
      << read("back.err");
}

// A run records where it trained; resumed without --device/--precision it continues there (and
// records it again); with them, it uses what was given and says so.
TEST_F(ResumeTest, ResumeKeepsTheRunsDeviceAndPrecision) {
  std::vector<std::string> args = train_args("run", 6);
  for (const char* a : {"--device", "cpu", "--precision", "fp32"}) args.push_back(a);
  ASSERT_EQ(run(args, "run"), 0) << read("run.err");
  EXPECT_EQ(read_json("run/config.json")["device"], "cpu");
  EXPECT_EQ(read_json("run/config.json")["precision"], "fp32");
  const std::string state = "run/checkpoints/step_000003/trainer_state.json";
  EXPECT_EQ(read_json(state)["config"]["device"], "cpu");
  EXPECT_EQ(read_json(state)["config"]["precision"], "fp32");

  back_to_step_3("run");
  ASSERT_EQ(run({"train", "--resume", (dir_ / "run").string()}, "resume"), 0) << read("resume.err");
  EXPECT_NE(read("resume.out").find("device cpu fp32"), std::string::npos) << read("resume.out");
  EXPECT_EQ(read("resume.out").find("as given"), std::string::npos) << read("resume.out");
  for (const std::string f :
       {"run/config.json", "run/checkpoints/step_000006/trainer_state.json"}) {
    const nlohmann::json j = read_json(f);
    const nlohmann::json& rc = j.contains("config") ? j["config"] : j;
    EXPECT_EQ(rc["device"], "cpu") << f;
    EXPECT_EQ(rc["precision"], "fp32") << f;
  }

  back_to_step_3("run");
  ASSERT_EQ(run({"train", "--resume", (dir_ / "run").string(), "--device", "cpu"}, "given"), 0)
      << read("given.err");
  EXPECT_NE(read("given.out").find("device cpu fp32 as given (the run trained on cpu fp32)\n"),
            std::string::npos)
      << read("given.out");
}

// A GPU run resumed where there is no GPU, without --device: a one-line error that leaves the
// run as it was, never a silent switch to the CPU. With --device cpu it continues, saying so.
TEST_F(ResumeTest, GpuRunResumedWithoutCudaIsAnError) {
  if (cuda::available()) GTEST_SKIP() << "CUDA is available here: the run would resume on it";
  ASSERT_EQ(run(train_args("run", 6), "run"), 0) << read("run.err");
  back_to_step_3("run");
  // What a run trained with --device cuda records.
  const std::string state = "run/checkpoints/step_000003/trainer_state.json";
  nlohmann::json j = read_json(state);
  j["config"]["device"] = "cuda";
  j["config"]["precision"] = "bf16";
  write_json(state, j);
  const std::string metrics_before = read("run/metrics.jsonl");

  EXPECT_EQ(run({"train", "--resume", (dir_ / "run").string()}, "resume"), 1) << read("resume.out");
  const std::string err = read("resume.err");
  EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;
  EXPECT_NE(err.find("the run trained on cuda bf16"), std::string::npos) << err;
  EXPECT_NE(err.find("pass --device cpu to continue on the CPU"), std::string::npos) << err;
  EXPECT_EQ(read("resume.out").find("step 4/6"), std::string::npos) << read("resume.out");
  EXPECT_EQ(read("run/metrics.jsonl"), metrics_before);
  EXPECT_FALSE(fs::exists(dir_ / "run/model"));

  ASSERT_EQ(run({"train", "--resume", (dir_ / "run").string(), "--device", "cpu"}, "cpu"), 0)
      << read("cpu.err");
  EXPECT_NE(read("cpu.out").find("device cpu fp32 as given (the run trained on cuda bf16)\n"),
            std::string::npos)
      << read("cpu.out");
  EXPECT_EQ(read_json("run/config.json")["device"], "cpu");
}

}  // namespace
}  // namespace forge
