// TcpComm (dist/tcp_comm.h), the host communicator of torchrun-style ranks: three ranks (threads)
// on the loopback interface get rank-order sums identical on every rank, all-gathers, a
// broadcast from a rank other than 0, a reduce-scatter and barriers; the rank-order sum helper
// works over it. Failure: ranks in separate processes, one of which ends after the setup — the
// others stop (status 1) and rank 0's message names the rank that ended; a rank that calls
// another collective than rank 0 stops the world with a message naming it.
#include "forge/dist/tcp_comm.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <sstream>
#include <thread>

#include "dist/free_port.h"
#include "forge/core/error.h"
#include "scratch_dir.h"

namespace forge {
namespace {

using std::chrono::milliseconds;

LaunchInfo torchrun(int rank, int size, int port) {
  LaunchInfo l;
  l.launcher = "torchrun";
  l.rank = rank;
  l.size = size;
  l.local_rank = rank;
  l.master_addr = "127.0.0.1";
  l.master_port = port;
  return l;
}

TEST(TcpComm, CollectivesOverThreeRanks) {
  const int W = 3, port = testing::free_port();
  std::vector<float> sums_f[W], gathered[W], shard[W];
  std::vector<double> sums_d[W], ordered[W];
  std::vector<uint8_t> bcast[W];
  std::string errors[W];
  auto rank_main = [&](int r) {
    try {
      auto c = make_tcp_comm(torchrun(r, W, port), milliseconds(20000));
      EXPECT_EQ(c->rank(), r);
      EXPECT_EQ(c->size(), W);
      EXPECT_EQ(c->describe(), str("tcp rank ", r, " of 3"));
      // Values whose sum depends on the order: 1e8 + 1 − 1e8 in f32.
      sums_f[r] = {r == 0 ? 1e8f : r == 1 ? 1.0f : -1e8f, static_cast<float>(r)};
      c->allreduce_sum(sums_f[r].data(), 2);
      sums_d[r] = {0.1 * (r + 1), 1e300 * (r == 2 ? -1 : 1)};
      c->allreduce_sum(sums_d[r].data(), 2);
      const std::vector<float> mine = {static_cast<float>(10 * r), static_cast<float>(10 * r + 1)};
      gathered[r].resize(2 * W);
      c->allgather(mine.data(), gathered[r].data(), 2);
      bcast[r] = {static_cast<uint8_t>(r), 7, 7};
      c->broadcast(bcast[r].data(), 3, 2);
      std::vector<float> full(2 * W);
      for (int i = 0; i < 2 * W; ++i) full[i] = static_cast<float>(i * (r + 1));
      shard[r].resize(2);
      c->reduce_scatter_sum(full.data(), shard[r].data(), 2);
      c->barrier();
      ordered[r] = allgather_sum_in_rank_order(*c, {static_cast<double>(r) + 0.5});
      c->barrier();
    } catch (const std::exception& e) {
      errors[r] = e.what();
    }
  };
  std::vector<std::thread> threads;
  for (int r = 0; r < W; ++r) threads.emplace_back(rank_main, r);
  for (auto& t : threads) t.join();
  for (int r = 0; r < W; ++r) {
    ASSERT_EQ(errors[r], "") << "rank " << r;
    // (1e8 + 1) + (−1e8) in f32 = 0: rank order, not a sorted or pairwise one.
    EXPECT_EQ(sums_f[r], (std::vector<float>{(1e8f + 1.0f) + -1e8f, 3.0f})) << r;
    EXPECT_EQ(sums_d[r], (std::vector<double>{(0.1 + 0.2) + 0.1 * 3, (1e300 + 1e300) + -1e300})) << r;
    EXPECT_EQ(gathered[r], (std::vector<float>{0, 1, 10, 11, 20, 21})) << r;
    EXPECT_EQ(bcast[r], (std::vector<uint8_t>{2, 7, 7})) << r;
    // Σ over ranks of i·(r + 1) = 6i, rank r's shard is elements 2r, 2r + 1.
    EXPECT_EQ(shard[r], (std::vector<float>{12.0f * r, 12.0f * r + 6.0f})) << r;
    EXPECT_EQ(ordered[r], (std::vector<double>{0.5 + 1.5 + 2.5})) << r;
  }
}

std::string slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// Forks one process per rank (stderr to DIR/rank<R>.err) running `body`; returns exit statuses.
std::vector<int> run_ranks(int W, const std::string& dir,
                           const std::function<void(Communicator&)>& body) {
  const int port = testing::free_port();
  std::vector<pid_t> pids;
  for (int r = 0; r < W; ++r) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      if (!std::freopen((dir + "/rank" + std::to_string(r) + ".err").c_str(), "w", stderr)) std::_Exit(90);
      try {
        auto c = make_tcp_comm(torchrun(r, W, port), milliseconds(20000));
        body(*c);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "exception: %s\n", e.what());
        std::_Exit(91);
      }
      std::_Exit(0);
    }
    pids.push_back(pid);
  }
  std::vector<int> status;
  for (pid_t p : pids) {
    int st = 0;
    ::waitpid(p, &st, 0);
    status.push_back(WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
  }
  return status;
}


TEST(TcpComm, ARankThatEndsStopsTheOthersAndIsNamed) {
  const testing::ScratchDir scratch("forge_tcp_comm");
  const std::string& dir = scratch.path();
  const auto status = run_ranks(3, dir, [](Communicator& c) {
    if (c.rank() == 2) std::_Exit(3);  // dies after the setup, before the barrier
    c.barrier();
  });
  EXPECT_EQ(status, (std::vector<int>{1, 1, 3}));
  const std::string e0 = slurp(dir + "/rank0.err"), e1 = slurp(dir + "/rank1.err");
  EXPECT_NE(e0.find("forge: rank 0: lost rank 2 in barrier"), std::string::npos) << e0;
  EXPECT_NE(e1.find("forge: rank 1: lost rank 0"), std::string::npos) << e1;
}

TEST(TcpComm, MismatchedCollectivesStopTheWorldNamingTheRank) {
  const testing::ScratchDir scratch("forge_tcp_comm");
  const std::string& dir = scratch.path();
  const auto status = run_ranks(2, dir, [](Communicator& c) {
    if (c.rank() == 1) {
      double x = 1;
      c.allreduce_sum(&x, 1);
    } else {
      c.barrier();
    }
  });
  EXPECT_EQ(status, (std::vector<int>{1, 1}));
  const std::string e0 = slurp(dir + "/rank0.err");
  EXPECT_NE(e0.find("forge: rank 0: rank 1 called allreduce_sum(f64) of 8 bytes where rank 0 "
                    "called barrier"),
            std::string::npos)
      << e0;
}

}  // namespace
}  // namespace forge
