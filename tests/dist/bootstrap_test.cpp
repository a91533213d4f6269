#include "forge/dist/bootstrap.h"

#include <map>

#include "forge/core/error.h"
#include "testing.h"

namespace forge {
namespace {

using Env = std::map<std::string, std::string>;

EnvLookup lookup(const Env& env) {
  return [env](const std::string& name) -> std::optional<std::string> {
    auto it = env.find(name);
    if (it == env.end()) return std::nullopt;
    return it->second;
  };
}

// The message detect_launch throws for `env`, or "" when it accepts it.
std::string error_of(const Env& env) {
  try {
    detect_launch(lookup(env));
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

const Env kMpirun = {{"OMPI_COMM_WORLD_RANK", "3"},
                     {"OMPI_COMM_WORLD_SIZE", "8"},
                     {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}};
const Env kTorchrun = {{"RANK", "5"},
                       {"WORLD_SIZE", "6"},
                       {"LOCAL_RANK", "2"},
                       {"MASTER_ADDR", "node7"},
                       {"MASTER_PORT", "29500"}};
const Env kSlurm = {{"SLURM_PROCID", "2"}, {"SLURM_NTASKS", "4"}, {"SLURM_LOCALID", "0"}};

Env merged(std::initializer_list<Env> envs) {
  Env out;
  for (const auto& e : envs) out.insert(e.begin(), e.end());
  return out;
}

TEST(DetectLaunch, NoLauncherIsAWorldOfOne) {
  const LaunchInfo i = detect_launch(lookup({{"PATH", "/usr/bin"}, {"MASTER_PORT", "1"}}));
  EXPECT_EQ(i.launcher, "none");
  EXPECT_EQ(i.rank, 0);
  EXPECT_EQ(i.size, 1);
  EXPECT_EQ(i.local_rank, 0);
}

TEST(DetectLaunch, ReadsEachLauncher) {
  LaunchInfo i = detect_launch(lookup(kMpirun));
  EXPECT_EQ(i.launcher, "mpirun");
  EXPECT_EQ(i.rank, 3);
  EXPECT_EQ(i.size, 8);
  EXPECT_EQ(i.local_rank, 1);
  EXPECT_EQ(i.master_port, 0);

  i = detect_launch(lookup(kTorchrun));
  EXPECT_EQ(i.launcher, "torchrun");
  EXPECT_EQ(i.rank, 5);
  EXPECT_EQ(i.size, 6);
  EXPECT_EQ(i.local_rank, 2);
  EXPECT_EQ(i.master_addr, "node7");
  EXPECT_EQ(i.master_port, 29500);

  i = detect_launch(lookup(kSlurm));
  EXPECT_EQ(i.launcher, "slurm");
  EXPECT_EQ(i.rank, 2);
  EXPECT_EQ(i.size, 4);
  EXPECT_EQ(i.local_rank, 0);
}

TEST(DetectLaunch, PrecedenceIsMpirunThenTorchrunThenSlurm) {
  EXPECT_EQ(detect_launch(lookup(merged({kSlurm, kTorchrun, kMpirun}))).launcher, "mpirun");
  EXPECT_EQ(detect_launch(lookup(merged({kSlurm, kMpirun}))).rank, 3);
  EXPECT_EQ(detect_launch(lookup(merged({kSlurm, kTorchrun}))).launcher, "torchrun");
  EXPECT_EQ(detect_launch(lookup(merged({kSlurm, kTorchrun}))).rank, 5);
  // The winner's values are checked, the others' are not read: a broken Slurm value under
  // mpirun is not this process's business.
  Env env = merged({kMpirun, kSlurm});
  env["SLURM_PROCID"] = "x";
  EXPECT_EQ(detect_launch(lookup(env)).launcher, "mpirun");
}

TEST(DetectLaunch, RankMustBeBelowSize) {
  Env env = kTorchrun;
  env["RANK"] = "6";
  EXPECT_EQ(error_of(env), "RANK=6 is not below WORLD_SIZE=6");
  env = kSlurm;
  env["SLURM_LOCALID"] = "4";
  EXPECT_EQ(error_of(env), "SLURM_LOCALID=4 is not below SLURM_NTASKS=4");
  env = kMpirun;
  env["OMPI_COMM_WORLD_RANK"] = "8";
  EXPECT_EQ(error_of(env), "OMPI_COMM_WORLD_RANK=8 is not below OMPI_COMM_WORLD_SIZE=8");
  env["OMPI_COMM_WORLD_RANK"] = "7";  // the last rank is fine
  EXPECT_EQ(detect_launch(lookup(env)).rank, 7);
}

TEST(DetectLaunch, SizeMustBeAtLeastOne) {
  Env env = kSlurm;
  env["SLURM_NTASKS"] = "0";
  EXPECT_EQ(error_of(env), "SLURM_NTASKS: expected an integer in [1, 2147483647], got '0'");
  env["SLURM_NTASKS"] = "-2";
  EXPECT_EQ(error_of(env), "SLURM_NTASKS: expected an integer in [1, 2147483647], got '-2'");
}

TEST(DetectLaunch, ValuesMustBeIntegers) {
  for (const char* bad : {"", "1.0", " 1", "1 ", "one", "0x1", "+1", "99999999999"}) {
    Env env = kMpirun;
    env["OMPI_COMM_WORLD_LOCAL_RANK"] = bad;
    EXPECT_NE(error_of(env).find("OMPI_COMM_WORLD_LOCAL_RANK: expected an integer"),
              std::string::npos)
        << "'" << bad << "': " << error_of(env);
  }
  Env env = kTorchrun;
  env["WORLD_SIZE"] = "two";
  EXPECT_EQ(error_of(env), "WORLD_SIZE: expected an integer in [1, 2147483647], got 'two'");
  env = kTorchrun;
  env["RANK"] = "-1";
  EXPECT_EQ(error_of(env), "RANK: expected an integer in [0, 2147483647], got '-1'");
}

TEST(DetectLaunch, CompanionVariablesMustBeSet) {
  EXPECT_EQ(error_of({{"WORLD_SIZE", "2"}}),
            "torchrun environment: RANK or WORLD_SIZE is set but RANK is not");
  EXPECT_EQ(error_of({{"SLURM_PROCID", "0"}}),
            "slurm environment: SLURM_PROCID or SLURM_NTASKS is set but SLURM_NTASKS is not");
  Env env = kMpirun;
  env.erase("OMPI_COMM_WORLD_LOCAL_RANK");
  EXPECT_EQ(error_of(env),
            "mpirun environment: OMPI_COMM_WORLD_RANK or OMPI_COMM_WORLD_SIZE is set but "
            "OMPI_COMM_WORLD_LOCAL_RANK is not");
  env = kTorchrun;
  env.erase("MASTER_PORT");
  EXPECT_EQ(error_of(env),
            "torchrun environment: RANK or WORLD_SIZE is set but MASTER_PORT is not");
  env = kTorchrun;
  env["MASTER_ADDR"] = "";
  EXPECT_EQ(error_of(env), "torchrun environment: MASTER_ADDR is empty");
}

TEST(DetectLaunch, PortMustBeATcpPort) {
  for (const char* bad : {"0", "65536", "http"}) {
    Env env = kTorchrun;
    env["MASTER_PORT"] = bad;
    EXPECT_EQ(error_of(env),
              std::string("MASTER_PORT: expected an integer in [1, 65535], got '") + bad + "'");
  }
}

TEST(DetectLaunch, ErrorsStayOnOneLine) {
  Env env = kTorchrun;
  env["RANK"] = "1\n2";
  const std::string e = error_of(env);
  EXPECT_FALSE(e.empty());
  EXPECT_EQ(e.find('\n'), std::string::npos) << e;
}

TEST(DetectLaunch, ProcessEnvReadsTheEnvironment) {
  ::setenv("FORGE_BOOTSTRAP_TEST_VAR", "42", 1);
  ::unsetenv("FORGE_BOOTSTRAP_TEST_UNSET");
  const EnvLookup env = process_env();
  EXPECT_EQ(env("FORGE_BOOTSTRAP_TEST_VAR"), std::optional<std::string>("42"));
  EXPECT_EQ(env("FORGE_BOOTSTRAP_TEST_UNSET"), std::nullopt);
}

}  // namespace
}  // namespace forge
