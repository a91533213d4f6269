// BPE training: merges worked out by hand, the tie rule, count weighting, and the incremental
// merge loop against a naive full recount per merge (minbpe's algorithm with our tie rule).
#include "forge/tokenizer/trainer.h"

#include <algorithm>
#include <map>

#include "forge/core/error.h"
#include "testing.h"

namespace forge::tok {
namespace {

using Merges = std::vector<std::pair<int32_t, int32_t>>;
using Counts = std::vector<std::pair<std::string, int64_t>>;

// minbpe: count every adjacent pair of every chunk (times the chunk's count) from scratch, take
// the highest count (ties: smallest (left, right)), replace it left to right without overlap.
Merges naive_bpe(const Counts& chunks, int num_merges) {
  std::vector<std::vector<int32_t>> words;
  std::vector<int64_t> counts;
  for (const auto& [text, c] : chunks) {
    words.emplace_back(text.begin(), text.end());
    for (auto& id : words.back()) id &= 0xff;
    counts.push_back(c);
  }
  Merges merges;
  for (int m = 0; m < num_merges; ++m) {
    std::map<std::pair<int32_t, int32_t>, int64_t> stats;  // ordered: smallest pair first
    for (size_t w = 0; w < words.size(); ++w)
      for (size_t i = 0; i + 1 < words[w].size(); ++i)
        stats[{words[w][i], words[w][i + 1]}] += counts[w];
    std::pair<int32_t, int32_t> best{-1, -1};
    int64_t best_count = 0;
    for (const auto& [p, c] : stats)
      if (c > best_count) best = p, best_count = c;
    if (best_count == 0) break;
    const int32_t z = 256 + m;
    for (auto& w : words) {
      std::vector<int32_t> out;
      for (size_t i = 0; i < w.size();) {
        if (i + 1 < w.size() && w[i] == best.first && w[i + 1] == best.second) {
          out.push_back(z);
          i += 2;
        } else {
          out.push_back(w[i++]);
        }
      }
      w = out;
    }
    merges.push_back(best);
  }
  return merges;
}

TEST(BpeTrainer, MinbpeExampleByHand) {
  // "aaabdaaabac": (a,a)=4 → 256: "Z a b d Z a b a c". Then (256,97) and (97,98) tie at 2; the
  // smaller pair (97,98) wins → 257: "Z Y d Z Y a c". (256,257)=2 → 258: "X d X a c". Four pairs
  // of count 1: (97,99) is smallest → 259: "X d X W". Then (100,258) → 260: "X V W", then
  // (258,260) → 261: "U W", then (261,259) → 262, and nothing is left to merge.
  const BpeResult r = train_bpe_from_counts({{"aaabdaaabac", 1}}, 10);
  const Merges want = {{97, 97},   {97, 98},   {256, 257}, {97, 99},
                       {100, 258}, {258, 260}, {261, 259}};
  EXPECT_EQ(r.merges, want);
  ASSERT_EQ(r.vocab.size(), 256u + 7);
  EXPECT_EQ(r.vocab['q'], "q");
  EXPECT_EQ(r.vocab[256], "aa");
  EXPECT_EQ(r.vocab[257], "ab");
  EXPECT_EQ(r.vocab[258], "aaab");
  EXPECT_EQ(r.vocab[259], "ac");
  EXPECT_EQ(r.vocab[262], "aaabdaaabac");
}

TEST(BpeTrainer, CountsWeightChunks) {
  // "ababab" once: (a,b)=3, (b,a)=2. "cd" four times: (c,d)=4 wins, then (a,b)=3, then
  // "Z Z Z" has (257,257)=2 (overlapping pairs count twice) → 258, then (258,257) → 259.
  const BpeResult r = train_bpe_from_counts({{"ababab", 1}, {"cd", 4}}, 10);
  const Merges want = {{'c', 'd'}, {'a', 'b'}, {257, 257}, {258, 257}};
  EXPECT_EQ(r.merges, want);
  // Ten copies of "xy" outweigh "ababab" only when given as a count, not as one chunk.
  const BpeResult heavy = train_bpe_from_counts({{"ababab", 1}, {"xy", 10}}, 1);
  EXPECT_EQ(heavy.merges, (Merges{{'x', 'y'}}));
  const BpeResult light = train_bpe_from_counts({{"ababab", 1}, {"xy", 1}}, 1);
  EXPECT_EQ(light.merges, (Merges{{'a', 'b'}}));
  // The same chunk listed twice counts twice.
  const BpeResult twice = train_bpe_from_counts({{"ab", 2}, {"yx", 3}, {"ab", 2}}, 1);
  EXPECT_EQ(twice.merges, (Merges{{'a', 'b'}}));
}

TEST(BpeTrainer, TiesGoToTheSmallestPair) {
  // (b,a) and (a,b) both 1, whichever comes first: (97,98) wins.
  EXPECT_EQ(train_bpe_from_counts({{"ba", 1}, {"ab", 1}}, 1).merges, (Merges{{'a', 'b'}}));
  EXPECT_EQ(train_bpe_from_counts({{"ab", 1}, {"ba", 1}}, 1).merges, (Merges{{'a', 'b'}}));
  // Same left id: the smaller right id wins; bytes above 127 compare as 128..255.
  EXPECT_EQ(train_bpe_from_counts({{"z\xff", 3}, {"z\x01", 3}}, 1).merges, (Merges{{'z', 1}}));
  EXPECT_EQ(train_bpe_from_counts({{"\xff\x01", 3}, {"\x7f\x02", 3}}, 1).merges,
            (Merges{{0x7f, 2}}));
}

TEST(BpeTrainer, EdgeCases) {
  EXPECT_TRUE(train_bpe_from_counts({}, 5).merges.empty());
  EXPECT_TRUE(train_bpe_from_counts({{"a", 100}, {"", 3}, {"bc", 0}}, 5).merges.empty());
  EXPECT_EQ(train_bpe_from_counts({{"abc", 1}}, 0).vocab.size(), 256u);
  EXPECT_THROW(train_bpe_from_counts({{"ab", -1}}, 1), Error);
  EXPECT_THROW(train_bpe_from_counts({{"ab", 1}}, -1), Error);
  // Zero bytes are ordinary bytes.
  const std::string nul("\0\0\0", 3);
  EXPECT_EQ(train_bpe_from_counts({{nul, 1}}, 3).merges, (Merges{{0, 0}, {256, 0}}));
}

// The key test: the incremental loop equals a full recount per merge on random small corpora,
// with a small alphabet (many ties and long runs of one byte) and random counts.
TEST(BpeTrainer, IncrementalEqualsFullRecount) {
  for (uint64_t seed = 1; seed <= 40; ++seed) {
    Rng rng(seed, 3);
    const int alphabet = 2 + static_cast<int>(rng.below(5));
    Counts chunks;
    const int n = 1 + static_cast<int>(rng.below(60));
    for (int i = 0; i < n; ++i) {
      std::string s;
      const int len = 1 + static_cast<int>(rng.below(seed % 4 == 0 ? 60 : 14));
      for (int j = 0; j < len; ++j)
        s.push_back(static_cast<char>("ab \xc3\x01z"[rng.below(alphabet)]));
      chunks.push_back({s, 1 + static_cast<int64_t>(rng.below(seed % 3 == 0 ? 1000 : 4))});
    }
    const int merges = 1 + static_cast<int>(rng.below(80));
    const BpeResult r = train_bpe_from_counts(chunks, merges);
    const Merges want = naive_bpe(chunks, merges);
    ASSERT_EQ(r.merges.size(), want.size()) << "seed " << seed;
    for (size_t m = 0; m < want.size(); ++m)
      ASSERT_EQ(r.merges[m], want[m]) << "seed " << seed << ", merge " << m;
    for (size_t m = 0; m < r.merges.size(); ++m)
      EXPECT_EQ(r.vocab[256 + m], r.vocab[r.merges[m].first] + r.vocab[r.merges[m].second]);
  }
}

TEST(BpeTrainer, ChunkOrderDoesNotMatter) {
  Rng rng(7, 1);
  Counts chunks;
  for (int i = 0; i < 300; ++i) {
    std::string s;
    for (int j = 0, len = 1 + static_cast<int>(rng.below(10)); j < len; ++j)
      s.push_back(static_cast<char>('a' + rng.below(4)));
    chunks.push_back({s, 1 + static_cast<int64_t>(rng.below(5))});
  }
  const BpeResult a = train_bpe_from_counts(chunks, 100);
  std::reverse(chunks.begin(), chunks.end());
  const BpeResult b = train_bpe_from_counts(chunks, 100);
  EXPECT_EQ(a.merges, b.merges);
  EXPECT_EQ(a.merges.size(), 100u);
}

TEST(BpeTrainer, ReportsProgress) {
  std::vector<int64_t> seen;
  train_bpe_from_counts({{"abcdefghijklmnopqrstuvwxyz", 1}}, 20, [&](const BpeProgress& p) {
    EXPECT_STREQ(p.stage, "merge");
    EXPECT_EQ(p.total, 20);
    seen.push_back(p.done);
  });
  ASSERT_FALSE(seen.empty());
  EXPECT_EQ(seen.back(), 20);
}

// --- With the pre-tokenizer ---

// Random text with what makes pre-tokenization hard: runs of spaces and newlines, "\r\n",
// punctuation, digits, contractions, non-ASCII letters, a no-break space and invalid bytes.
std::string messy_text(size_t bytes, uint64_t seed) {
  const char* pieces[] = {
      "the",          "Cat",      " ",  "  ",   "\n",   "\n\n",  " \n",
      "\r\n",         ".",        "!?", "'s",   "42",   "12345", "\xc3\xa9t\xc3\xa9",
      "\xe4\xb8\xad", "\xc2\xa0", "\t", "\xff", "x\ny", "a.\nB", "--",
      "\n "};
  const size_t n = sizeof(pieces) / sizeof(pieces[0]);
  Rng rng(seed, 2);
  std::string s;
  while (s.size() < bytes) s += pieces[rng.below(n)];
  return s;
}

std::map<std::string, int64_t> split_whole(const std::string& text, SplitPattern p) {
  std::vector<std::string_view> pieces;
  PreTokenizer(p).split(text, pieces);
  std::map<std::string, int64_t> m;
  for (const auto piece : pieces) ++m[std::string(piece)];
  return m;
}

TEST(BpeTrainer, CountChunksByHand) {
  const Counts got = count_chunks({"hello world hello"}, SplitPattern::kGpt2, {}, 1);
  EXPECT_EQ(got, (Counts{{" hello", 1}, {" world", 1}, {"hello", 1}}));
  // Special tokens are cut out and never counted; kNone keeps what is between them whole.
  const Counts sp = count_chunks({"a<|endoftext|>b c<|endoftext|>", "b c"}, SplitPattern::kNone,
                                 {"<|endoftext|>"}, 2);
  EXPECT_EQ(sp, (Counts{{"a", 1}, {"b c", 2}}));
  // Several specials, interleaved; at one position the longest wins.
  EXPECT_EQ(count_chunks({"a<|x|>b<|endoftext|>c<|x|>d<|x|>"}, SplitPattern::kNone,
                         {"<|endoftext|>", "<|x|>"}, 1),
            (Counts{{"a", 1}, {"b", 1}, {"c", 1}, {"d", 1}}));
  EXPECT_EQ(count_chunks({"1<|x|>2<|x3"}, SplitPattern::kNone, {"<|x", "<|x|>"}, 1),
            (Counts{{"1", 1}, {"2", 1}, {"3", 1}}));
}

// Texts are cut into ~1 MB blocks for the threads; the counts must be those of the whole text.
TEST(BpeTrainer, BlockCutsDoNotChangeTheCounts) {
  const std::string text = messy_text(3'500'000, 9);
  for (const SplitPattern p : {SplitPattern::kGpt2, SplitPattern::kGpt4}) {
    const std::map<std::string, int64_t> whole = split_whole(text, p);
    for (const int threads : {1, 2, 3}) {
      const Counts got = count_chunks({text}, p, {}, threads);
      EXPECT_EQ(got, Counts(whole.begin(), whole.end()))
          << "pattern " << split_regex(p) << ", threads " << threads;
    }
  }
}

TEST(BpeTrainer, SameTokenizerForAnyThreadCount) {
  const std::vector<std::string> texts = {messy_text(1'500'000, 1), messy_text(800'000, 2),
                                          "short"};
  BpeTrainOptions o;
  o.vocab_size = 600;
  o.threads = 1;
  const Tokenizer a = train_bpe(texts, o);
  o.threads = 2;
  const Tokenizer b = train_bpe(texts, o);
  o.threads = 5;
  const Tokenizer c = train_bpe(texts, o);
  EXPECT_EQ(a.merges(), b.merges());
  EXPECT_EQ(a.merges(), c.merges());
  EXPECT_EQ(a.merges().size(), 600u - 256 - 1);
}

TEST(BpeTrainer, SpecialsGetTheLastIds) {
  BpeTrainOptions o;
  o.vocab_size = 300;
  o.specials = {"<|endoftext|>", "<|pad|>"};
  const std::string text = messy_text(20'000, 4);
  const Tokenizer t = train_bpe({text}, o);
  EXPECT_EQ(t.merges().size(), 42u);
  EXPECT_EQ(t.vocab_size(), 300);
  EXPECT_EQ(t.special_id("<|endoftext|>"), 298);
  EXPECT_EQ(t.special_id("<|pad|>"), 299);
  EXPECT_EQ(t.encode("x<|pad|>"), (std::vector<int32_t>{'x', 299}));
  // Merge k made id 256 + k, and the training text comes back through encode/decode.
  for (size_t k = 0; k < t.merges().size(); ++k)
    EXPECT_EQ(t.vocab()[256 + k], t.vocab()[t.merges()[k].first] + t.vocab()[t.merges()[k].second]);
  const std::vector<int32_t> ids = t.encode_ordinary(text);
  EXPECT_LT(ids.size(), text.size());
  EXPECT_EQ(t.decode(ids), text);
}

TEST(BpeTrainer, VocabTooSmallOrBadSpecials) {
  BpeTrainOptions o;
  o.vocab_size = 256;  // no room for <|endoftext|>
  EXPECT_THROW(train_bpe({"abc"}, o), Error);
  o.vocab_size = 300;
  o.specials = {"<|a|>", "<|a|>"};
  EXPECT_THROW(train_bpe({"abc"}, o), Error);
  o.specials = {""};
  EXPECT_THROW(train_bpe({"abc"}, o), Error);
  EXPECT_THROW(train_bpe_files({"/nonexistent/forge/corpus.txt"}, BpeTrainOptions{}), Error);
}

}  // namespace
}  // namespace forge::tok
