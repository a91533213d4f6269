// Packed SFT rows (data/sft_data.h's packed layout): greedy placement that never splits an
// example, positions restarting and segment ids per example, targets that never cross into the
// next example, padding only at the row's end, the data state still "examples consumed", and the
// packing efficiency in the summary.
#include <gtest/gtest.h>

#include <vector>

#include "forge/core/error.h"
#include "forge/data/sft_data.h"

namespace forge {
namespace {

// Example k: ids 100k + 0..n-1, every token but the first trained.
SftRow row(int k, int n) {
  SftRow r;
  for (int i = 0; i < n; ++i) {
    r.ids.push_back(100 * k + i);
    r.trained.push_back(i > 0);
  }
  return r;
}

SftSettings packed(int T) {
  SftSettings s;
  s.seq_len = T;
  s.val_frac = 0;
  s.pack = true;
  return s;
}

// One example at a time: the packer's order is the epoch's order, which the padded layout
// shows row by row (the first token of each row names the example).
std::vector<int> epoch_order(const std::vector<SftRow>& r, int T) {
  SftSettings s = packed(T);
  s.pack = false;
  SftData d(r, s);
  std::vector<int32_t> x(static_cast<size_t>(T)), y(x.size());
  std::vector<int> out;
  uint64_t p = 0;
  for (size_t i = 0; i < r.size(); ++i) {
    d.next_batch(p, 1, x.data(), y.data());
    out.push_back(x[0] / 100);
  }
  return out;
}

TEST(SftPackTest, GreedyRowsWithRestartingPositionsSegmentsAndNoCrossingTargets) {
  const int T = 10;
  // Lengths 4, 5, 3, 6 (sums of two range from 7 to 11): the rows are checked against a
  // greedy placement computed here from the epoch's order.
  const std::vector<SftRow> r = {row(1, 4), row(2, 5), row(3, 3), row(4, 6)};
  const std::vector<int> order = epoch_order(r, T);
  SftData d(r, packed(T));
  ASSERT_TRUE(d.packed());
  const int B = 2;  // two rows never need the next epoch's examples (18 tokens an epoch)
  std::vector<int32_t> x(B * T), y(B * T), pos(B * T), seg(B * T);
  uint64_t p = 0;
  const int64_t trained = d.next_batch(p, B, x.data(), y.data(), pos.data(), seg.data());
  // Expected rows: greedy over the order, examples of m = n slots (n <= T).
  std::vector<int32_t> ex, ey, ep, es;
  std::vector<int32_t> cur_x, cur_y, cur_p, cur_s;
  int s = 0;
  uint64_t consumed = 0;
  auto end_row = [&] {
    const int used = static_cast<int>(cur_x.size());
    for (int i = used; i < T; ++i) {
      cur_x.push_back(0), cur_y.push_back(-1), cur_p.push_back(i - used), cur_s.push_back(s);
    }
    ex.insert(ex.end(), cur_x.begin(), cur_x.end());
    ey.insert(ey.end(), cur_y.begin(), cur_y.end());
    ep.insert(ep.end(), cur_p.begin(), cur_p.end());
    es.insert(es.end(), cur_s.begin(), cur_s.end());
    cur_x.clear(), cur_y.clear(), cur_p.clear(), cur_s.clear();
    s = 0;
  };
  int rows_done = 0;
  int64_t want_trained = 0;
  for (size_t i = 0; rows_done < B; i = (i + 1) % order.size()) {
    const SftRow& e = r[static_cast<size_t>(order[i] - 1)];
    const int n = static_cast<int>(e.ids.size());
    if (static_cast<int>(cur_x.size()) + n > T) {
      end_row();
      if (++rows_done == B) break;
    }
    for (int j = 0; j < n; ++j) {
      cur_x.push_back(e.ids[j]);
      cur_y.push_back(j + 1 < n ? e.ids[j + 1] : -1);  // the last token's target is -1
      cur_p.push_back(j);
      cur_s.push_back(s);
    }
    want_trained += n - 1;
    ++s;
    ++consumed;
  }
  EXPECT_EQ(x, ex);
  EXPECT_EQ(y, ey);
  EXPECT_EQ(pos, ep);
  EXPECT_EQ(seg, es);
  EXPECT_EQ(trained, want_trained);
  EXPECT_EQ(p, consumed);  // the data state: examples consumed
  EXPECT_GT(consumed, static_cast<uint64_t>(B)) << "two rows of 10 hold three or four of these examples";
}

TEST(SftPackTest, ExamplesThatFillARowAndCutExamplesKeepTheirTargets) {
  // T = 6: example 1 is cut to T + 1 = 7 tokens and fills a row alone (its last slot's target
  // is its 7th token, inside the example); examples 2 and 3 (3 tokens each) share the next.
  SftSettings s = packed(6);
  SftData d({row(1, 9), row(2, 3), row(3, 3)}, s);
  EXPECT_EQ(d.summary().truncated, 1);
  std::vector<int32_t> x(18), y(18), pos(18), seg(18);
  uint64_t p = 0;
  d.next_batch(p, 3, x.data(), y.data(), pos.data(), seg.data());
  for (int b = 0; b < 3; ++b) {
    const int32_t* xr = x.data() + b * 6;
    const int32_t* yr = y.data() + b * 6;
    if (xr[0] == 100) {  // example 1's row
      EXPECT_EQ(std::vector<int32_t>(yr, yr + 6), (std::vector<int32_t>{101, 102, 103, 104, 105, 106}));
    } else {  // two 3-token examples: targets -1 at 2 and 5, positions 0,1,2,0,1,2
      EXPECT_EQ(yr[2], -1);
      EXPECT_EQ(yr[5], -1);
      EXPECT_EQ(std::vector<int32_t>(pos.data() + b * 6, pos.data() + b * 6 + 6),
                (std::vector<int32_t>{0, 1, 2, 0, 1, 2}));
      EXPECT_EQ(std::vector<int32_t>(seg.data() + b * 6, seg.data() + b * 6 + 6),
                (std::vector<int32_t>{0, 0, 0, 1, 1, 1}));
    }
  }
}

TEST(SftPackTest, PositionIsExamplesConsumedSoBatchesResumeExactly) {
  const int T = 12;
  std::vector<SftRow> r;
  for (int k = 1; k <= 9; ++k) r.push_back(row(k, 2 + k % 5));
  SftData a(r, packed(T)), b(r, packed(T));
  std::vector<int32_t> x(2 * T), y(x.size()), pos(x.size()), seg(x.size());
  std::vector<int32_t> x2(x.size()), y2(x.size()), pos2(x.size()), seg2(x.size());
  uint64_t pa = 0;
  for (int i = 0; i < 3; ++i) a.next_batch(pa, 2, x.data(), y.data(), pos.data(), seg.data());
  uint64_t pb = pa;  // a fresh reader at the recorded position
  for (int i = 0; i < 5; ++i) {  // across the epoch boundary
    a.next_batch(pa, 2, x.data(), y.data(), pos.data(), seg.data());
    b.next_batch(pb, 2, x2.data(), y2.data(), pos2.data(), seg2.data());
    EXPECT_EQ(x, x2);
    EXPECT_EQ(y, y2);
    EXPECT_EQ(pos, pos2);
    EXPECT_EQ(seg, seg2);
    EXPECT_EQ(pa, pb);
  }
}

TEST(SftPackTest, SummaryReportsPackingEfficiencyAndEpochSteps) {
  // Eight 5-token examples in rows of 10: two per row, 4 rows, 100% (padded: 50%).
  std::vector<SftRow> r;
  for (int k = 1; k <= 8; ++k) r.push_back(row(k, 5));
  SftData d(r, packed(10));
  EXPECT_EQ(d.summary().pack_rows, 4);
  EXPECT_EQ(d.summary().pack_tokens, 40);
  const std::string line = d.summary().describe();
  EXPECT_NE(line.find("packing efficiency 100.0% (padded 50.0%)"), std::string::npos) << line;
  // Two epochs = 16 examples = 8 rows: 4 steps of 2 rows (padded: 8 steps).
  EXPECT_EQ(d.steps_for_epochs(2, 2), 4);
  SftSettings s = packed(10);
  s.pack = false;
  SftData padded(r, s);
  EXPECT_EQ(padded.steps_for_epochs(2, 2), 8);
  EXPECT_EQ(padded.summary().describe().find("packing"), std::string::npos);
}

}  // namespace
}  // namespace forge
