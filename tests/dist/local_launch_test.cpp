// The `forge train --gpus N` supervisor (dist/local_launch.h), with /bin/sh scripts for ranks:
// every rank gets its own torchrun environment (ranks, world size, one free port); a rank that
// exits 3 or is killed stops the others (who would sleep for a minute) and the status and
// message name it; a rank that ignores SIGTERM is killed after the grace period; SIGTERM to the
// supervisor reaches every rank once, and ranks that then end with 0 make status 0.
#include "forge/dist/local_launch.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "forge/core/error.h"
#include "scratch_dir.h"

namespace forge {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;


std::string slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

LocalLaunch sh(const std::string& script, int ranks) {
  LocalLaunch l;
  l.argv = {"/bin/sh", "-c", script};
  l.ranks = ranks;
  return l;
}

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

TEST(LocalLaunch, EveryRankGetsItsTorchrunEnvironment) {
  const testing::ScratchDir scratch("forge_local_launch");
  const std::string& dir = scratch.path();
  ::setenv("RANK", "99", 1);  // a stale value of the caller's is replaced
  const LaunchOutcome o = run_local_ranks(
      sh("echo $RANK $LOCAL_RANK $WORLD_SIZE $LOCAL_WORLD_SIZE $MASTER_ADDR $MASTER_PORT > " + dir +
             "/env.$RANK",
         3));
  ::unsetenv("RANK");
  EXPECT_EQ(o.status, 0);
  EXPECT_EQ(o.failed_rank, -1);
  EXPECT_EQ(o.message, "");
  std::string port;
  for (int r = 0; r < 3; ++r) {
    std::istringstream in(slurp(dir + "/env." + std::to_string(r)));
    std::string rank, local, world, local_world, addr, p;
    in >> rank >> local >> world >> local_world >> addr >> p;
    EXPECT_EQ(rank, std::to_string(r));
    EXPECT_EQ(local, std::to_string(r));
    EXPECT_EQ(world, "3");
    EXPECT_EQ(local_world, "3");
    EXPECT_EQ(addr, "127.0.0.1");
    EXPECT_GT(std::stoi(p), 0);
    if (r > 0) EXPECT_EQ(p, port);  // one port for all
    port = p;
  }
}

TEST(LocalLaunch, ARankThatExitsNonZeroStopsTheOthers) {
  const auto t0 = Clock::now();
  const LaunchOutcome o = run_local_ranks(sh("if [ $RANK = 1 ]; then exit 3; fi; exec sleep 60", 3));
  EXPECT_EQ(o.status, 3);
  EXPECT_EQ(o.failed_rank, 1);
  EXPECT_EQ(o.message, "rank 1 of 3 exited with status 3; the other ranks were stopped");
  EXPECT_LT(seconds_since(t0), 20.0);  // the sleepers got SIGTERM, not a minute
}

TEST(LocalLaunch, AKilledRankIsNamedWithItsSignal) {
  const LaunchOutcome o =
      run_local_ranks(sh("if [ $RANK = 2 ]; then kill -9 $$; fi; exec sleep 60", 3));
  EXPECT_EQ(o.status, 128 + 9);
  EXPECT_EQ(o.failed_rank, 2);
  EXPECT_EQ(o.message.rfind("rank 2 of 3 was killed by signal 9", 0), 0u) << o.message;
}

TEST(LocalLaunch, RanksThatIgnoreSigtermAreKilledAfterTheGrace) {
  LocalLaunch l = sh("if [ $RANK = 0 ]; then sleep 0.2; exit 5; fi; trap '' TERM; while :; do sleep 0.1; done", 2);
  l.grace = std::chrono::milliseconds(500);
  const auto t0 = Clock::now();
  const LaunchOutcome o = run_local_ranks(l);
  EXPECT_EQ(o.status, 5);
  EXPECT_EQ(o.failed_rank, 0);
  EXPECT_LT(seconds_since(t0), 20.0);
}

TEST(LocalLaunch, SigtermIsForwardedOnceToEveryRank) {
  const testing::ScratchDir scratch("forge_local_launch");
  const std::string& dir = scratch.path();
  // Each rank counts the TERMs it gets for a moment after the first, then ends with 0.
  const std::string script =
      "n=0; trap 'n=$((n+1))' TERM; touch " + dir + "/up.$RANK; "
      "while [ $n = 0 ]; do sleep 0.05; done; sleep 0.5; echo $n > " + dir + "/terms.$RANK; exit 0";
  std::thread poke([&] {
    const auto deadline = Clock::now() + std::chrono::seconds(20);
    while (Clock::now() < deadline &&
           !(fs::exists(dir + "/up.0") && fs::exists(dir + "/up.1")))
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    ::kill(::getpid(), SIGTERM);
  });
  const LaunchOutcome o = run_local_ranks(sh(script, 2));
  poke.join();
  EXPECT_EQ(o.status, 0) << o.message;
  EXPECT_EQ(slurp(dir + "/terms.0"), "1\n");
  EXPECT_EQ(slurp(dir + "/terms.1"), "1\n");
}

TEST(LocalLaunch, BadArgumentsAreErrors) {
  LocalLaunch l = sh("true", 0);
  EXPECT_THROW(run_local_ranks(l), Error);
  // A program that does not exist: the rank ends with 127, named.
  LocalLaunch missing;
  missing.argv = {"/nonexistent/forge"};
  missing.ranks = 2;
  const LaunchOutcome o = run_local_ranks(missing);
  EXPECT_EQ(o.status, 127);
  EXPECT_GE(o.failed_rank, 0);
}

}  // namespace
}  // namespace forge
