// Pre-tokenizer: pieces of hand-worked examples (each checked by reading the regex, not by
// running ours), the concatenation identity on random and invalid bytes, thread safety.
#include "forge/tokenizer/pretokenizer.h"

#include <string>
#include <thread>
#include <vector>

#include "forge/core/error.h"
#include "testing.h"

namespace forge::tok {
namespace {

std::vector<std::string> pieces(const PreTokenizer& pt, std::string_view text) {
  std::vector<std::string_view> views;
  pt.split(text, views);
  return std::vector<std::string>(views.begin(), views.end());
}

using Pieces = std::vector<std::string>;

TEST(PreTokenizerTest, Gpt2PatternSplitsAsGpt2Does) {
  const PreTokenizer pt(SplitPattern::kGpt2);
  EXPECT_EQ(pieces(pt, "Hello world"), (Pieces{"Hello", " world"}));
  // The last of several spaces joins the word; the rest are a piece of their own.
  EXPECT_EQ(pieces(pt, "  hi"), (Pieces{" ", " hi"}));
  EXPECT_EQ(pieces(pt, "a  b"), (Pieces{"a", " ", " b"}));
  EXPECT_EQ(pieces(pt, "hi   "), (Pieces{"hi", "   "}));
  EXPECT_EQ(pieces(pt, "I'm"), (Pieces{"I", "'m"}));
  EXPECT_EQ(pieces(pt, "they'll've"), (Pieces{"they", "'ll", "'ve"}));
  // Contractions are case-sensitive in GPT-2: 'S is punctuation then a letter.
  EXPECT_EQ(pieces(pt, "HE'S"), (Pieces{"HE", "'", "S"}));
  EXPECT_EQ(pieces(pt, "3.14"), (Pieces{"3", ".", "14"}));
  // \s+(?!\S) stops one short of the whitespace before a word; the newline is left alone.
  EXPECT_EQ(pieces(pt, "x\n\n  \ny"), (Pieces{"x", "\n\n  ", "\n", "y"}));
  EXPECT_EQ(pieces(pt, "caf\xc3\xa9 123"), (Pieces{"caf\xc3\xa9", " 123"}));
  // CJK characters are letters (\p{L}) under UCP.
  EXPECT_EQ(pieces(pt, "\xe4\xbd\xa0\xe5\xa5\xbd\xe4\xb8\x96\xe7\x95\x8c"),
            (Pieces{"\xe4\xbd\xa0\xe5\xa5\xbd\xe4\xb8\x96\xe7\x95\x8c"}));
  EXPECT_TRUE(pieces(pt, "").empty());
}

TEST(PreTokenizerTest, WhitespaceIsUnicodeWhiteSpace) {
  const PreTokenizer pt(SplitPattern::kGpt2);
  // U+180E (Mongolian vowel separator) is format, not White_Space, since Unicode 6.3: it joins
  // " ?[^\s\p{L}\p{N}]+" with the space before it. (PCRE2's own \s would take it as space.)
  EXPECT_EQ(pieces(pt,
                   "a \xe1\xa0\x8e"
                   "b"),
            (Pieces{"a", " \xe1\xa0\x8e", "b"}));
  // U+3000 (ideographic space) and U+00A0 (no-break space) are White_Space.
  EXPECT_EQ(pieces(pt, "a\xe3\x80\x80\xc2\xa0 b"), (Pieces{"a", "\xe3\x80\x80\xc2\xa0", " b"}));
  // A custom regex keeps \s inside and outside classes, and \Q..\E literals.
  const PreTokenizer custom(R"(\Q\s\E|[\s]+|[^\s]+)");
  EXPECT_EQ(pieces(custom, "\\sab  y"), (Pieces{"\\s", "ab", "  ", "y"}));
}

TEST(PreTokenizerTest, Gpt4PatternSplitsAsCl100kDoes) {
  const PreTokenizer pt(SplitPattern::kGpt4);
  EXPECT_EQ(pieces(pt, "Hello world"), (Pieces{"Hello", " world"}));
  EXPECT_EQ(pieces(pt, "I'M"), (Pieces{"I", "'M"}));      // case-insensitive contractions
  EXPECT_EQ(pieces(pt, "12345"), (Pieces{"123", "45"}));  // digits in groups of three
  EXPECT_EQ(pieces(pt, "  hi"), (Pieces{" ", " hi"}));
  EXPECT_EQ(pieces(pt, "hello!!!\n\n"), (Pieces{"hello", "!!!\n\n"}));
  EXPECT_EQ(pieces(pt, "foo\n  bar"), (Pieces{"foo", "\n", " ", " bar"}));
  EXPECT_EQ(pieces(pt, "x\n\n  \ny"), (Pieces{"x", "\n\n  \n", "y"}));
}

TEST(PreTokenizerTest, NoneKeepsTheTextWhole) {
  const PreTokenizer pt(SplitPattern::kNone);
  EXPECT_EQ(pieces(pt, "a b  c\n"), (Pieces{"a b  c\n"}));
  EXPECT_STREQ(split_regex(SplitPattern::kNone), "");
}

TEST(PreTokenizerTest, InvalidUtf8BytesArePiecesOfTheirOwn) {
  const PreTokenizer pt(SplitPattern::kGpt2);
  EXPECT_EQ(pieces(pt,
                   "ab\xff"
                   "cd"),
            (Pieces{"ab", "\xff", "cd"}));
  // Truncated 3-byte sequence: neither byte starts a valid character.
  EXPECT_EQ(pieces(pt, "x\xe2\x82"), (Pieces{"x", "\xe2", "\x82"}));
  // Overlong '/' and a UTF-16 surrogate encoded in UTF-8 are invalid too.
  EXPECT_EQ(pieces(pt, "\xc0\xaf"), (Pieces{"\xc0", "\xaf"}));
  EXPECT_EQ(pieces(pt, "\xed\xa0\x80"), (Pieces{"\xed", "\xa0", "\x80"}));
  // Above U+10FFFF.
  EXPECT_EQ(pieces(pt, "\xf4\x90\x80\x80"), (Pieces{"\xf4", "\x90", "\x80", "\x80"}));
  // A valid 4-byte character stays whole, next to an invalid byte.
  EXPECT_EQ(pieces(pt, "\xf0\x9f\x99\x82\x80"), (Pieces{"\xf0\x9f\x99\x82", "\x80"}));
}

TEST(PreTokenizerTest, CustomRegexKeepsTheGapsBetweenMatches) {
  const PreTokenizer digits(R"(\p{N})");
  EXPECT_EQ(pieces(digits, "ab12c"), (Pieces{"ab", "1", "2", "c"}));
  const PreTokenizer maybe_empty("x*");  // empty matches must not loop or drop text
  EXPECT_EQ(pieces(maybe_empty, "axxb"), (Pieces{"a", "xx", "b"}));
  EXPECT_THROW(PreTokenizer("(unclosed"), Error);
}

TEST(PreTokenizerTest, ParsesPatternNames) {
  EXPECT_EQ(parse_split_pattern("gpt2"), SplitPattern::kGpt2);
  EXPECT_EQ(parse_split_pattern("gpt4"), SplitPattern::kGpt4);
  EXPECT_EQ(parse_split_pattern("none"), SplitPattern::kNone);
  try {
    parse_split_pattern("gpt5");
    FAIL() << "expected forge::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("gpt5"), std::string::npos) << e.what();
  }
}

// Random bytes biased towards characters the patterns care about, plus arbitrary bytes.
std::string random_bytes(Rng& rng, size_t n) {
  static const std::string alphabet = " \t\n\r'sStT0123456789.,!?abcXYZ\xc3\xa9\xe4\xbd\xa0";
  std::string s;
  for (size_t i = 0; i < n; ++i)
    s.push_back(rng.below(3) == 0 ? static_cast<char>(rng.below(256))
                                  : alphabet[rng.below(alphabet.size())]);
  return s;
}

TEST(PreTokenizerTest, PiecesConcatenateToTheInputForAnyBytes) {
  Rng rng(42, 1);
  for (SplitPattern p : {SplitPattern::kGpt2, SplitPattern::kGpt4, SplitPattern::kNone}) {
    const PreTokenizer pt(p);
    for (int trial = 0; trial < 300; ++trial) {
      const std::string text = random_bytes(rng, rng.below(200));
      std::vector<std::string_view> views;
      pt.split(text, views);
      std::string joined;
      for (std::string_view v : views) {
        ASSERT_FALSE(v.empty()) << "empty piece, pattern " << split_regex(p);
        // Views must point into the input, in order.
        ASSERT_EQ(v.data(), text.data() + joined.size());
        joined += v;
      }
      ASSERT_EQ(joined, text) << "pattern " << split_regex(p);
    }
  }
}

TEST(PreTokenizerTest, LongRunsDoNotExhaustTheMatcher) {
  const PreTokenizer pt(SplitPattern::kGpt2);
  const std::string spaces(1 << 20, ' ');
  EXPECT_EQ(pieces(pt, spaces + "x"), (Pieces{std::string((1 << 20) - 1, ' '), " x"}));
  const std::string letters(1 << 20, 'a');
  EXPECT_EQ(pieces(pt, letters), (Pieces{letters}));
}

TEST(PreTokenizerTest, SplitIsThreadSafe) {
  const PreTokenizer pt(SplitPattern::kGpt4);
  Rng rng(7, 2);
  std::vector<std::string> texts;
  for (int i = 0; i < 64; ++i) texts.push_back(random_bytes(rng, 500));
  std::vector<std::vector<std::string>> want;
  for (const std::string& t : texts) want.push_back(pieces(pt, t));
  std::vector<int> bad(4, 0);
  std::vector<std::thread> threads;
  for (int k = 0; k < 4; ++k)
    threads.emplace_back([&, k] {
      for (int rep = 0; rep < 20; ++rep)
        for (size_t i = 0; i < texts.size(); ++i) bad[k] += pieces(pt, texts[i]) != want[i];
    });
  for (auto& t : threads) t.join();
  for (int k = 0; k < 4; ++k) EXPECT_EQ(bad[k], 0) << "thread " << k;
}

}  // namespace
}  // namespace forge::tok
