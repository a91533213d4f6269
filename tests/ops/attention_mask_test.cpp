// ops/attention_mask.h: the masking rule as intervals (which the wgmma flash kernels test a masked
// tile's elements against) equals the rule itself, written out here as ops/attention.h states it,
// for every query and key of small lengths, causal or not, with and without a window — also for
// the indices past T and the negative query rows a kernel's partial tile carries.
#include "forge/ops/attention_mask.h"

#include <gtest/gtest.h>

namespace forge {
namespace {

bool rule(int i, int j, int T, bool causal, int window) {
  return i < T && j < T && (!causal || j <= i) && (window <= 0 || j > i - window);
}

bool in(IndexRange r, int x) {
  return r.lo <= x && x < r.hi;
}

TEST(AttentionMaskTest, IntervalsAreTheRule) {
  int checked = 0, visible = 0;
  for (int T : {1, 2, 7, 64, 130})
    for (bool causal : {false, true})
      for (int window : {0, 1, 3, 64, 200})
        for (int i = -70; i < T + 5; ++i)
          for (int j = 0; j < T + 5; ++j) {
            const bool want = rule(i, j, T, causal, window);
            ASSERT_EQ(in(keys_seen_by(i, T, causal, window), j), want)
                << "keys_seen_by: T " << T << " causal " << causal << " window " << window << " i "
                << i << " j " << j;
            if (i >= 0) {
              ASSERT_EQ(in(queries_seeing(j, T, causal, window), i), want)
                  << "queries_seeing: T " << T << " causal " << causal << " window " << window
                  << " i " << i << " j " << j;
            }
            ++checked;
            visible += want;
          }
  // Both answers occur in quantity (a rule that always said no would not pass silently).
  EXPECT_GT(visible, 10000);
  EXPECT_GT(checked - visible, 10000);
}

}  // namespace
}  // namespace forge
