// SFT data: rows and their targets, what is cut, skipped and counted, the seeded split and the
// epoch order a position fixes; and a JSONL file end to end with a real template and tokenizer.
#include "forge/data/sft_data.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>

#include "forge/core/error.h"

namespace forge {
namespace {

namespace fs = std::filesystem;
const std::string kData = std::string(FORGE_SOURCE_DIR) + "/tests/data";

// Example k: ids 100k + 0..n-1, the second half trained.
SftRow row(int k, int n) {
  SftRow r;
  for (int i = 0; i < n; ++i) {
    r.ids.push_back(100 * k + i);
    r.trained.push_back(i >= n / 2);
  }
  return r;
}

std::vector<SftRow> rows(int count, int n) {
  std::vector<SftRow> out;
  for (int k = 1; k <= count; ++k) out.push_back(row(k, n));
  return out;
}

TEST(SftDataTest, RowTargetsAreTheNextTrainedTokenElseIgnored) {
  SftSettings s;
  s.seq_len = 8;
  s.val_frac = 0;
  SftData d({row(1, 6)}, s);  // ids 100..105, trained 103, 104, 105
  std::vector<int32_t> x(8), y(8);
  uint64_t pos = 0;
  EXPECT_EQ(d.next_batch(pos, 1, x.data(), y.data()), 3);
  EXPECT_EQ(pos, 1u);
  const std::vector<int32_t> want_x = {100, 101, 102, 103, 104, 105, 0, 0};
  const std::vector<int32_t> want_y = {-1, -1, 103, 104, 105, -1, -1, -1};
  EXPECT_EQ(x, want_x);
  EXPECT_EQ(y, want_y);
}

TEST(SftDataTest, OverlongExamplesAreCutOrSkippedAndCounted) {
  SftSettings s;
  s.seq_len = 7;  // rows of up to 8 tokens
  s.val_frac = 0;
  std::vector<SftRow> r = {row(1, 8), row(2, 12), row(3, 30)};
  // Example 3: 30 tokens, trained from token 15 on: nothing trained is left in its first 8.
  {
    SftData d(r, s);
    EXPECT_EQ(d.summary().truncated, 1);     // example 2: its tokens 6, 7 stay trained
    EXPECT_EQ(d.summary().skipped_long, 1);  // example 3
    EXPECT_EQ(d.train_count(), 2);
    EXPECT_EQ(d.summary().tokens, 16);
    EXPECT_EQ(d.summary().trained, 4 + 2);
  }
  s.truncate = false;
  SftData d(r, s);
  EXPECT_EQ(d.summary().truncated, 0);
  EXPECT_EQ(d.summary().skipped_long, 2);
  EXPECT_EQ(d.train_count(), 1);
}

TEST(SftDataTest, ExamplesWithoutTrainedTargetsAreSkippedAndCounted) {
  SftSettings s;
  s.seq_len = 16;
  s.val_frac = 0;
  SftRow none = row(1, 5);
  std::fill(none.trained.begin(), none.trained.end(), 0);
  SftRow first_only = row(2, 5);  // a trained first token is no target: nothing predicts it
  std::fill(first_only.trained.begin(), first_only.trained.end(), 0);
  first_only.trained[0] = 1;
  SftData d({none, first_only, row(3, 5)}, s);
  EXPECT_EQ(d.summary().skipped_untrained, 2);
  EXPECT_EQ(d.train_count(), 1);
  EXPECT_NE(d.summary().describe().find("2 skipped with no assistant tokens"), std::string::npos)
      << d.summary().describe();
  EXPECT_THROW(SftData({none}, s), Error);  // nothing left to train on
}

// The ids of the first tokens of the rows a sequence of positions visits.
std::vector<int32_t> visits(SftData& d, uint64_t from, int n) {
  std::vector<int32_t> x(static_cast<size_t>(d.seq_len())), y(x.size()), out;
  for (int i = 0; i < n; ++i) {
    d.next_batch(from, 1, x.data(), y.data());
    out.push_back(x[0]);
  }
  return out;
}

TEST(SftDataTest, SplitIsSeededDisjointAndComplete) {
  SftSettings s;
  s.seq_len = 8;
  s.val_frac = 0.1;
  s.seed = 7;
  SftData a(rows(100, 4), s), b(rows(100, 4), s);
  EXPECT_EQ(a.val_count(), 10);
  EXPECT_EQ(a.train_count(), 90);
  std::vector<int32_t> x(8), y(8);
  std::set<int32_t> val, train;
  for (int64_t i = 0; i < a.val_count(); ++i) {
    a.val_row(i, x.data(), y.data());
    const int32_t from_a = x[0];
    val.insert(from_a);
    b.val_row(i, x.data(), y.data());
    EXPECT_EQ(x[0], from_a) << "the same seed holds out the same examples in the same order";
  }
  for (int32_t id : visits(a, 0, 90)) train.insert(id);
  EXPECT_EQ(val.size(), 10u);
  EXPECT_EQ(train.size(), 90u);  // one epoch visits every train example once
  for (int32_t id : val) EXPECT_EQ(train.count(id), 0u) << id;
  // Another seed holds out other examples (10 of 100: the same 10 by chance is ~6e-14).
  s.seed = 8;
  SftData c(rows(100, 4), s);
  std::set<int32_t> val_c;
  for (int64_t i = 0; i < c.val_count(); ++i) {
    c.val_row(i, x.data(), y.data());
    val_c.insert(x[0]);
  }
  EXPECT_NE(val, val_c);
  // At least one held out once val_frac > 0, never all.
  s.val_frac = 0.01;
  EXPECT_EQ(SftData(rows(3, 4), s).val_count(), 1);
  s.val_frac = 0.5;
  EXPECT_EQ(SftData(rows(1, 4), s).val_count(), 0);
}

TEST(SftDataTest, EpochsAreFreshPermutationsAndAPositionResumesTheOrder) {
  SftSettings s;
  s.seq_len = 8;
  s.val_frac = 0;
  SftData d(rows(20, 4), s);
  const std::vector<int32_t> all = visits(d, 0, 60);  // three epochs
  for (int e = 0; e < 3; ++e) {
    std::set<int32_t> seen(all.begin() + 20 * e, all.begin() + 20 * (e + 1));
    EXPECT_EQ(seen.size(), 20u) << "epoch " << e;
  }
  EXPECT_FALSE(std::equal(all.begin(), all.begin() + 20, all.begin() + 20));
  // A fresh object from a position (a resumed run) continues the same sequence.
  SftData e(rows(20, 4), s);
  EXPECT_EQ(visits(e, 33, 27), std::vector<int32_t>(all.begin() + 33, all.end()));
}

TEST(SftDataTest, LoadsJsonlCountsAndNamesBadLines) {
  const fs::path dir = fs::temp_directory_path() / ("forge_sft_data_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const tok::Tokenizer tok = tok::Tokenizer::load(kData + "/chat/tokenizers/bytelevel.json");
  const chat::ChatTemplate tmpl = chat::ChatTemplate::chatml();
  SftSettings s;
  s.seq_len = 64;
  s.val_frac = 0;
  {
    std::ofstream f(dir / "ok.jsonl");
    f << R"({"prompt": "Hi", "response": "Hello there."})" << "\n\n"
      << R"({"messages": [{"role": "user", "content": "Only a question"}]})" << "\n"
      << R"({"messages": [{"role": "system", "content": "Be brief."}, )"
      << R"({"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]})" << "\n";
  }
  const SftData d = SftData::load((dir / "ok.jsonl").string(), tmpl, tok, tok.vocab_size(), s);
  EXPECT_EQ(d.summary().examples, 3);
  EXPECT_EQ(d.summary().skipped_untrained, 1);
  EXPECT_EQ(d.train_count(), 2);
  // An id the model cannot hold (a smaller vocabulary than the tokenizer's): refused.
  EXPECT_THROW(SftData::load((dir / "ok.jsonl").string(), tmpl, tok, 200, s), Error);
  {
    std::ofstream f(dir / "bad.jsonl");
    f << R"({"prompt": "Hi", "response": "Hello"})" << "\n" << R"({"prompt": "Hi", )" << "\n";
  }
  try {
    SftData::load((dir / "bad.jsonl").string(), tmpl, tok, tok.vocab_size(), s);
    ADD_FAILURE() << "a malformed line was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("bad.jsonl:2:"), std::string::npos) << e.what();
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace forge
