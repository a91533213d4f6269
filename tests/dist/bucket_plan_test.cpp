// BucketPlan (dist/buckets.h): the buckets partition the padded buffer, every real element has
// exactly one owner (rank, shard index), a bucket's gradients are final after the layer it waits
// for, and gather/scatter between shards and the flat buffer are inverse.

#include "forge/dist/buckets.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

#include "forge/model/config.h"
#include "forge/model/lora.h"
#include "forge/model/params.h"
#include "model/small_configs.h"

namespace forge {
namespace {

struct Case {
  size_t n;
  int world;
  std::vector<int64_t> starts;
  size_t min_elems;
};

void check_plan(const Case& c) {
  const size_t align = 64;
  const BucketPlan plan(c.n, c.world, c.starts, c.min_elems, align);
  const auto& bs = plan.buckets();
  SCOPED_TRACE(::testing::Message() << "n " << c.n << " world " << c.world << " min " << c.min_elems);
  ASSERT_FALSE(bs.empty());
  // Partition of [0, P) in ascending order; sizes multiples of W·align; offsets contiguous.
  size_t at = 0, off = 0;
  for (const GradBucket& b : bs) {
    EXPECT_EQ(b.begin, at);
    EXPECT_GT(b.end, b.begin);
    EXPECT_EQ((b.end - b.begin) % (c.world * align), 0u);
    EXPECT_EQ(b.piece * c.world, b.end - b.begin);
    EXPECT_EQ(b.offset, off);
    at = b.end, off += b.piece;
  }
  EXPECT_EQ(at, plan.padded());
  EXPECT_EQ(off, plan.shard());
  EXPECT_GE(plan.padded(), c.n);
  EXPECT_LT(plan.padded() - c.n, c.world * align);
  // The padding: only in the top bucket, which is then a single unit; when it was split off the
  // bucket below it, it has that bucket's readiness and is left out of the checks below.
  const size_t unit = c.world * align;
  for (size_t i = 0; i + 1 < bs.size(); ++i) EXPECT_LE(bs[i].end, c.n);
  if (bs.back().end > c.n) EXPECT_EQ(bs.back().end - bs.back().begin, unit);
  size_t m = bs.size();
  if (m > 1 && bs.back().end > c.n && bs.back().ready_after_layer == bs[m - 2].ready_after_layer) --m;
  // Ready layers: every element of a bucket that waits for layer l is at or above l's start;
  // only the bottom bucket may wait for the whole backward (not when layer 0 starts at 0, as
  // adapters do); each layer completes at most one and it holds at least min_elems.
  for (size_t i = 0; i < m; ++i) {
    const int l = bs[i].ready_after_layer;
    if (l < 0) {
      EXPECT_EQ(l, -1);
      EXPECT_EQ(i, 0u) << "only the bottom bucket waits for the whole backward";
      continue;
    }
    EXPECT_GE(static_cast<int64_t>(bs[i].begin), c.starts[l]);
    if (i + 1 < m) EXPECT_LT(l, bs[i + 1].ready_after_layer);
    const bool split_below = m < bs.size() && i == m - 1;  // the padding's unit came off it
    EXPECT_GE(bs[i].end - bs[i].begin + (split_below ? unit : 0), c.min_elems);
  }
  // Every real element owned exactly once; a rank's real elements are its shard's first valid().
  std::vector<int> owners(c.n, 0);
  for (int r = 0; r < c.world; ++r) {
    size_t real = 0;
    for (const GradBucket& b : bs) {
      const size_t lo = plan.part_begin(b, r), hi = plan.part_end(b, r);
      ASSERT_LE(lo, hi);
      for (size_t i = lo; i < hi; ++i) ++owners[i];
      if (lo < hi) EXPECT_EQ(b.offset, real) << "rank " << r << ": a gap among the real elements";
      real += hi - lo;
    }
    EXPECT_EQ(plan.valid(r), real) << "rank " << r;
  }
  EXPECT_TRUE(std::all_of(owners.begin(), owners.end(), [](int k) { return k == 1; }));
  // flat → shards → flat is the identity; padding comes out 0.
  std::vector<float> flat(c.n), all(plan.padded()), back(c.n, -1.0f);
  std::mt19937 rng(static_cast<unsigned>(c.n * 31 + c.world));
  std::uniform_real_distribution<float> u(-1, 1);
  for (float& x : flat) x = u(rng);
  for (int r = 0; r < c.world; ++r) {
    float* shard = all.data() + r * plan.shard();
    plan.flat_to_shard(flat.data(), r, shard);
    for (size_t i = plan.valid(r); i < plan.shard(); ++i) EXPECT_EQ(shard[i], 0.0f);
  }
  plan.shards_to_flat(all.data(), back.data());
  EXPECT_EQ(back, flat);
}

TEST(BucketPlanTest, PartitionsOwnsEveryElementOnceAndRoundTrips) {
  const std::vector<int64_t> starts{1000, 3000, 5000, 7000, 9000};
  for (int world : {1, 2, 3, 4, 8})
    for (size_t min_elems : {size_t{1}, size_t{2500}, size_t{4100}, size_t{1} << 30})
      for (size_t n : {size_t{9001}, size_t{9216}, size_t{11111}})
        check_plan({n, world, starts, min_elems});
  check_plan({1, 2, {}, 1});  // one element, no layers
  check_plan({100, 3, {0}, 1});  // a layer at 0: nothing below it
}

// min_elems >= n: one bucket, rank r owning [r·s, (r + 1)·s): the plain contiguous shards (when n
// needs no padding).
TEST(BucketPlanTest, OneBucketIsTheContiguousLayout) {
  const BucketPlan plan(10'240, 4, {100, 5000}, size_t{1} << 40, 64);  // 10240 = 40 units of 256
  ASSERT_EQ(plan.buckets().size(), 1u);
  EXPECT_EQ(plan.shard(), 2560u);
  for (int r = 0; r < 4; ++r) EXPECT_EQ(plan.part_begin(plan.buckets()[0], r), r * 2560u);
  // With padding: the one bucket and the padding's (the unit holding elements 9984 .. 9999).
  const BucketPlan padded(10'000, 4, {100, 5000}, size_t{1} << 40, 64);
  ASSERT_EQ(padded.buckets().size(), 2u);
  EXPECT_EQ(padded.buckets()[0].end, 9984u);
  EXPECT_EQ(padded.buckets()[1].end, 10'240u);
  EXPECT_EQ(padded.shard(), 2560u);
}

// Small buckets: a bucket per layer, each beginning at its layer's start rounded up to W·align.
TEST(BucketPlanTest, ABucketPerLayerWhenEveryLayerIsBigEnough) {
  const BucketPlan plan(20'000, 2, {1000, 5000, 9000, 13000}, 1, 64);
  const auto& bs = plan.buckets();
  ASSERT_EQ(bs.size(), 6u);
  // Multiples of 128 at or above the starts, then the padding's bucket from 19968 (20000 rounded
  // down to 128) to 20096 (rounded up), ready with the layer below it.
  const size_t want[] = {0, 1024, 5120, 9088, 13056, 19968};
  const int ready[] = {-1, 0, 1, 2, 3, 3};
  for (size_t i = 0; i < bs.size(); ++i) {
    EXPECT_EQ(bs[i].begin, want[i]);
    EXPECT_EQ(bs[i].ready_after_layer, ready[i]);
  }
  EXPECT_EQ(bs.back().end, 20'096u);
}

// Arguments come from the parameter tables, never from a user: a bad one is a bug, and stops.
TEST(BucketPlanTest, StopsOnStartsOutsideTheBufferOrOutOfOrder) {
  EXPECT_DEATH(BucketPlan(100, 2, {50, 40}, 1), "layer 1 starts at 40");
  EXPECT_DEATH(BucketPlan(100, 2, {100}, 1), "layer 0 starts at 100");
  EXPECT_DEATH(BucketPlan(100, 0, {}, 1), "BucketPlan");
}

// The tables' layer starts: ascending, each the smallest offset of its layer, and every tensor
// at or above its layer's start belongs to that layer or a later one (or the final norm/head):
// what "final after layer l's backward" needs.
TEST(BucketPlanTest, TableLayerStartsAreEachLayersFirstTensor) {
  for (const Family f : {Family::kGpt2, Family::kLlama}) {
    const ModelConfig cfg = testing::small_config(f);
    const ParamTable t(cfg);
    const auto starts = t.layer_starts();
    ASSERT_EQ(starts.size(), static_cast<size_t>(cfg.n_layer));
    for (int l = 0; l < cfg.n_layer; ++l) {
      const std::string prefix = (f == Family::kGpt2 ? "transformer.h." : "model.layers.") + std::to_string(l) + ".";
      int64_t lo = t.total();
      for (const ParamInfo& p : t.params())
        if (p.name.rfind(prefix, 0) == 0) lo = std::min(lo, p.offset);
      EXPECT_EQ(starts[l], lo) << "layer " << l;
      if (l > 0) EXPECT_GT(starts[l], starts[l - 1]);
    }
    EXPECT_GT(starts[0], t.wte());  // the embedding sits below layer 0
  }
  const ModelConfig cfg = testing::small_config(Family::kLlama);
  LoraConfig lora;
  lora.targets = {LoraTarget::kQ, LoraTarget::kV, LoraTarget::kDown};
  const AdapterTable at(cfg, lora);
  const auto starts = at.layer_starts();
  ASSERT_EQ(starts.size(), static_cast<size_t>(cfg.n_layer));
  EXPECT_EQ(starts[0], 0);
  for (int l = 0; l < cfg.n_layer; ++l) {
    const std::string prefix = "base_model.model.model.layers." + std::to_string(l) + ".";
    int64_t lo = at.total();
    for (const ParamInfo& p : at.params())
      if (p.name.rfind(prefix, 0) == 0) lo = std::min(lo, p.offset);
    EXPECT_EQ(starts[l], lo) << "adapter layer " << l;
  }
}

}  // namespace
}  // namespace forge
