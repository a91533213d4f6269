// MpiComm's collectives against values computed locally: every rank's input is a function of
// (seed, rank), so each rank computes what every other rank sent and the expected result.
// With 2 ranks (the ctest run) sums are a + b in any order, so results are compared bit for
// bit; with more, within f32 rounding of the sum.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "forge/core/error.h"
#include "forge/dist/bootstrap.h"
#include "forge/dist/mpi_comm.h"
#include "mpi_world.h"
#include "testing.h"

namespace forge {
namespace {

template <typename T>
std::vector<T> data_of(int rank, size_t n, uint64_t seed) {
  return testing::random_normal<T>(n, seed * 1000 + rank);
}

// Σ over ranks in rank order, in T: the result MPI gives for 2 ranks.
template <typename T>
std::vector<T> expected_sum(int world, size_t n, uint64_t seed) {
  std::vector<T> sum(n, T(0));
  for (int r = 0; r < world; ++r) {
    const auto d = data_of<T>(r, n, seed);
    for (size_t i = 0; i < n; ++i) sum[i] += d[i];
  }
  return sum;
}

template <typename T>
::testing::AssertionResult sums_match(const std::vector<T>& got, const std::vector<T>& want,
                                      int world) {
  if (world <= 2) return testing::all_close(got, want, {0, 0});
  return testing::all_close(got, want, {1e-6, 1e-5});
}

TEST(MpiComm, RankAndSizeAgreeWithTheLaunchEnvironment) {
  Communicator& c = testing::mpi_world();
  const LaunchInfo launch = detect_launch(process_env());
  EXPECT_EQ(launch.launcher, "mpirun");
  EXPECT_EQ(c.rank(), launch.rank);
  EXPECT_EQ(c.size(), launch.size);
  EXPECT_EQ(c.local_rank(), launch.local_rank);  // one machine: the local rank is the rank
  EXPECT_GE(c.size(), 2) << "run under mpirun -np 2 or more";
  EXPECT_EQ(c.describe(), str("mpi rank ", c.rank(), " of ", c.size()));
  EXPECT_TRUE(mpi_compiled());
}

TEST(MpiComm, AllreduceSumsFloatsAndDoubles) {
  Communicator& c = testing::mpi_world();
  for (size_t n : {1u, 3u, 1000u, 100003u}) {  // small, odd, and large enough to be split
    auto f = data_of<float>(c.rank(), n, 1 + n);
    c.allreduce_sum(f.data(), n);
    EXPECT_TRUE(sums_match(f, expected_sum<float>(c.size(), n, 1 + n), c.size())) << n;
    auto d = data_of<double>(c.rank(), n, 2 + n);
    c.allreduce_sum(d.data(), n);
    EXPECT_TRUE(sums_match(d, expected_sum<double>(c.size(), n, 2 + n), c.size())) << n;
  }
}

TEST(MpiComm, ReduceScatterGivesEachRankTheSumOfItsShard) {
  Communicator& c = testing::mpi_world();
  for (size_t shard : {1u, 7u, 4099u}) {
    const size_t n = shard * c.size();
    const auto in = data_of<float>(c.rank(), n, 3 + shard);
    std::vector<float> out(shard, NAN);
    c.reduce_scatter_sum(in.data(), out.data(), shard);
    const auto all = expected_sum<float>(c.size(), n, 3 + shard);
    const std::vector<float> want(all.begin() + c.rank() * shard,
                                  all.begin() + (c.rank() + 1) * shard);
    EXPECT_TRUE(sums_match(out, want, c.size())) << shard;
  }
}

TEST(MpiComm, AllgatherPutsRankRsShardAtROffset) {
  Communicator& c = testing::mpi_world();
  for (size_t shard : {1u, 7u, 4099u}) {
    const auto in = data_of<float>(c.rank(), shard, 4 + shard);
    std::vector<float> out(shard * c.size(), NAN);
    c.allgather(in.data(), out.data(), shard);
    for (int r = 0; r < c.size(); ++r) {
      const std::vector<float> got(out.begin() + r * shard, out.begin() + (r + 1) * shard);
      EXPECT_EQ(got, data_of<float>(r, shard, 4 + shard)) << "rank " << r << "'s shard";
    }
  }
}

TEST(MpiComm, BroadcastCopiesTheRootsBytes) {
  Communicator& c = testing::mpi_world();
  for (int root = 0; root < c.size(); ++root) {
    const std::string want = "bytes of rank " + std::to_string(root);
    std::string buf = "bytes of rank " + std::to_string(c.rank());
    buf.resize(want.size() + 8, '\0');
    c.broadcast(buf.data(), buf.size(), root);
    EXPECT_EQ(std::string(buf.c_str()), want);
  }
  c.barrier();
}

TEST(MpiComm, RankOrderSumIsTheSameOnEveryRankAndPropagatesNaN) {
  Communicator& c = testing::mpi_world();
  // Values whose sum depends on the order: 1e16 + 1 − 1e16 is 0 in rank order for 3 ranks and
  // 1 in others. Every rank must see exactly the rank-order sum.
  const double vals[] = {1e16, 1.0, -1e16};
  const double mine = vals[c.rank() % 3];
  const double nan_from_last = c.rank() == c.size() - 1 ? NAN : 1.0;
  const auto s = allgather_sum_in_rank_order(c, {mine, nan_from_last, -0.0});
  double want = 0;
  for (int r = 0; r < c.size(); ++r) want += vals[r % 3];
  EXPECT_EQ(s[0], want);
  EXPECT_TRUE(std::isnan(s[1]));
  EXPECT_EQ(s[2], 0.0);
  // Every rank holds the same bits: rank 0's result broadcast and compared.
  double r0 = s[0];
  c.broadcast(&r0, sizeof r0, 0);
  EXPECT_EQ(std::memcmp(&r0, &s[0], sizeof r0), 0);
}

}  // namespace
}  // namespace forge
