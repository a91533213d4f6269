#include <gtest/gtest.h>

#include "forge/dist/communicator.h"
#include "testing.h"

namespace forge {
namespace {

TEST(ShardLayout, PadsToAMultipleOfTheWorld) {
  EXPECT_EQ(shard_size(10, 1), 10u);
  EXPECT_EQ(shard_size(10, 2), 5u);
  EXPECT_EQ(shard_size(10, 3), 4u);
  EXPECT_EQ(padded_size(10, 3), 12u);
  EXPECT_EQ(shard_size(2, 4), 1u);  // more ranks than elements: the last two shards are padding
  EXPECT_EQ(padded_size(2, 4), 4u);
  EXPECT_EQ(padded_size(0, 4), 0u);
  for (size_t n : {1u, 7u, 64u, 1000003u})
    for (int w : {1, 2, 3, 8}) {
      EXPECT_GE(padded_size(n, w), n);
      EXPECT_LT(padded_size(n, w), n + w);
      EXPECT_EQ(padded_size(n, w) % w, 0u);
    }
}

TEST(LocalComm, IsAWorldOfOneWhoseCollectivesKeepTheData) {
  LocalComm c;
  EXPECT_EQ(c.rank(), 0);
  EXPECT_EQ(c.size(), 1);
  EXPECT_EQ(c.local_rank(), 0);
  std::vector<float> f = testing::random_normal<float>(33, 1);
  std::vector<double> d = testing::random_normal<double>(5, 2);
  const auto f0 = f;
  const auto d0 = d;
  c.allreduce_sum(f.data(), f.size());
  c.allreduce_sum(d.data(), d.size());
  EXPECT_EQ(f, f0);
  EXPECT_EQ(d, d0);
  std::vector<float> out(f.size(), -1.0f);
  c.reduce_scatter_sum(f.data(), out.data(), f.size());
  EXPECT_EQ(out, f0);
  std::fill(out.begin(), out.end(), -1.0f);
  c.allgather(f.data(), out.data(), f.size());
  EXPECT_EQ(out, f0);
  char bytes[4] = {'a', 'b', 'c', 'd'};
  c.broadcast(bytes, sizeof bytes, 0);
  EXPECT_EQ(std::string(bytes, 4), "abcd");
  c.barrier();
}

TEST(LocalComm, RankOrderSumOfOneRankIsTheValues) {
  LocalComm c;
  const std::vector<double> v = {1.5, -0.0, NAN, 1e300};
  const auto s = allgather_sum_in_rank_order(c, v);
  ASSERT_EQ(s.size(), v.size());
  EXPECT_EQ(s[0], 1.5);
  EXPECT_EQ(s[1], 0.0);
  EXPECT_TRUE(std::isnan(s[2]));
  EXPECT_EQ(s[3], 1e300);
}

TEST(LocalComm, AbortEndsTheProcessNamingTheRank) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // the process has OpenMP threads
  LocalComm c;
  EXPECT_EXIT(c.abort("data shard 3 is missing"), ::testing::ExitedWithCode(1),
              "forge: rank 0: data shard 3 is missing");
}

}  // namespace
}  // namespace forge
