// FORGE_ATTENTION, FORGE_CUDA_GRAPH and FORGE_FAULT_INJECT are read by the CLI alone
// (apps/forge/run_env.cpp): a bad value is a one-line error before any work; the library never
// looks at them (the CUDA side of that is tested in tests/model/transformer_cuda_test.cpp).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace forge {
namespace {

namespace fs = std::filesystem;

struct EnvRun {
  int code;
  std::string err;
};

EnvRun forge_with_env(const std::string& env, const std::string& args) {
  const fs::path err = fs::temp_directory_path() / ("forge_run_env_" + std::to_string(::getpid()));
  const std::string cmd = env + " " + FORGE_BIN + " " + args + " >/dev/null 2>" + err.string() + " </dev/null";
  const int status = std::system(cmd.c_str());
  std::ifstream f(err);
  std::stringstream s;
  s << f.rdbuf();
  fs::remove(err);
  return {WEXITSTATUS(status), s.str()};
}

TEST(RunEnv, BadAttentionPathIsAOneLineError) {
  const EnvRun r = forge_with_env("FORGE_ATTENTION=fastest", "train --data /nonexistent --steps 1");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("attention path 'fastest'"), std::string::npos) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
}

TEST(RunEnv, BadGraphSwitchIsAOneLineError) {
  const EnvRun r = forge_with_env("FORGE_CUDA_GRAPH=yes", "train --data /nonexistent --steps 1");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("FORGE_CUDA_GRAPH='yes'"), std::string::npos) << r.err;
}

TEST(RunEnv, BadFaultPlanIsAOneLineError) {
  const EnvRun r =
      forge_with_env("FORGE_FAULT_INJECT=nan_grad@soon", "train --data /nonexistent --steps 1");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("FORGE_FAULT_INJECT: fault 'nan_grad@soon'"), std::string::npos) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
}

// A known value passes the CLI's check: the run then fails on the missing data, not the setting.
TEST(RunEnv, KnownValuesAreAccepted) {
  const EnvRun r =
      forge_with_env("FORGE_ATTENTION=unfused FORGE_CUDA_GRAPH=0 FORGE_FAULT_INJECT=nan_loss@1-2",
                     "train --data /nonexistent --steps 1");
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(r.err.find("FORGE_"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("/nonexistent"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace forge
