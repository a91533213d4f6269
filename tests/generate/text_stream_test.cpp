// TextStream: characters split across tokens (hand-made byte tokens, and emoji / CJK / Hangul
// through GPT-2's real vocabulary with the ids that tiktoken and HF tokenizers give in
// tests/data/tokenizer/gpt2_reference.json), stop strings spanning tokens, a stop string's
// prefix that never completes, invalid bytes; and, on random byte streams cut at random, the
// joined output against sanitize_utf8 of all the bytes, cut before the first stop string.
#include "forge/generate/text_stream.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "forge/core/error.h"
#include "forge/core/rng.h"
#include "forge/data/corpus.h"
#include "testing.h"
#include "tokenizer/random_text.h"

namespace forge {
namespace {

namespace fs = std::filesystem;
using Chunks = std::vector<std::string>;

// A stream whose token i is pieces[i].
TextStream stream_of(const std::vector<std::string>* pieces, std::vector<std::string> stop = {}) {
  return TextStream([pieces](int32_t id) { return pieces->at(id); }, std::move(stop));
}

// What push returns for each piece in turn, then what finish returns.
Chunks run(const std::vector<std::string>& pieces, std::vector<std::string> stop = {}) {
  TextStream s = stream_of(&pieces, std::move(stop));
  Chunks out;
  for (size_t i = 0; i < pieces.size(); ++i) out.push_back(s.push(static_cast<int32_t>(i)));
  out.push_back(s.finish());
  return out;
}

const std::string kE = "\xC3\xA9";              // é
const std::string kNi = "\xE4\xBD\xA0";         // 你
const std::string kSmile = "\xF0\x9F\x99\x82";  // 🙂
const std::string kFffd = "\xEF\xBF\xBD";       // U+FFFD

TEST(TextStreamTest, HoldsACharacterUntilItsLastByte) {
  // é cut after its first byte; 你 over three tokens; 🙂 as 2 + 2 bytes.
  EXPECT_EQ(run({"caf\xC3", "\xA9 ", "\xE4", "\xBD", "\xA0!", "\xF0\x9F", "\x99\x82"}),
            (Chunks{"caf", kE + " ", "", "", kNi + "!", "", kSmile, ""}));
  // A token that ends one character and starts another.
  EXPECT_EQ(run({"\xC3", "\xA9\xE4\xBD", "\xA0"}), (Chunks{"", kE, kNi, ""}));
}

TEST(TextStreamTest, InvalidBytesBecomeReplacementCharactersAsSanitizeDoes) {
  // A byte that never starts a character prints at once.
  EXPECT_EQ(run({"a\xFF", "b"}), (Chunks{"a" + kFffd, "b", ""}));
  // A lone continuation byte.
  EXPECT_EQ(run({"\x80x"}), (Chunks{kFffd + "x", ""}));
  // A character cut short by an ASCII byte: both its bytes are replaced once that byte arrives.
  EXPECT_EQ(run({"\xE4\xBD", "a"}), (Chunks{"", kFffd + kFffd + "a", ""}));
  EXPECT_EQ(sanitize_utf8("\xE4\xBD"
                          "a"),
            kFffd + kFffd + "a");  // the rule it follows
  // Overlong and surrogate forms, complete but invalid.
  EXPECT_EQ(run({"\xC0\xAF"}), (Chunks{kFffd + kFffd, ""}));
  EXPECT_EQ(run({"\xED\xA0", "\x80"}), (Chunks{"", kFffd + kFffd + kFffd, ""}));
  // The stream ends inside a character: finish() flushes it byte by byte.
  EXPECT_EQ(run({"ok\xF0\x9F\x99"}), (Chunks{"ok", kFffd + kFffd + kFffd}));
}

TEST(TextStreamTest, StopStringSpanningTokensEndsTheText) {
  const std::vector<std::string> pieces = {"Hel", "lo", " wor", "ld!", "more"};
  TextStream s = stream_of(&pieces, {"o wo"});
  EXPECT_EQ(s.push(0), "Hel");
  EXPECT_EQ(s.push(1), "l");  // the "o" may begin "o wo"
  EXPECT_FALSE(s.stopped());
  EXPECT_EQ(s.push(2), "");  // "o wo" completed: neither it nor "r" is printed
  EXPECT_TRUE(s.stopped());
  EXPECT_EQ(s.stop_string(), "o wo");
  EXPECT_EQ(s.push(3), "");  // ignored after the stop
  EXPECT_EQ(s.finish(), "");
  EXPECT_EQ(s.text(), "Hell");
}

TEST(TextStreamTest, APrefixThatDoesNotCompleteIsPrintedLater) {
  EXPECT_EQ(run({"Hello", " there", "."}, {"Hello world"}), (Chunks{"", "Hello there", ".", ""}));
  // Held to the end: finish() prints it.
  EXPECT_EQ(run({"The E", "N"}, {"END"}), (Chunks{"The ", "", "EN"}));
  // The held part shrinks as it stops matching: "aa" could begin "aab", then "aaa" cannot, but
  // its tail "aa" still can.
  EXPECT_EQ(run({"aa", "a", "c"}, {"aab"}), (Chunks{"", "a", "aac", ""}));
}

TEST(TextStreamTest, StopStringThroughASplitCharacter) {
  const std::vector<std::string> pieces = {"caf\xC3", "\xA9!", "x"};
  TextStream s = stream_of(&pieces, {kE + "!"});
  EXPECT_EQ(s.push(0), "caf");
  EXPECT_EQ(s.push(1), "");
  EXPECT_TRUE(s.stopped());
  EXPECT_EQ(s.text(), "caf");
}

TEST(TextStreamTest, TheStopThatEndsFirstWinsWhateverTheTokens) {
  // "de" ends before "abcdef" does: it is the one found first when the text comes a byte at a
  // time, so it wins when one token brings everything too.
  for (const std::vector<std::string>& pieces :
       {std::vector<std::string>{"abcdefg"}, std::vector<std::string>{"a", "b", "c", "d", "e"}}) {
    TextStream s = stream_of(&pieces, {"abcdef", "de"});
    for (size_t i = 0; i < pieces.size(); ++i) s.push(static_cast<int32_t>(i));
    EXPECT_TRUE(s.stopped());
    EXPECT_EQ(s.stop_string(), "de");
    EXPECT_EQ(s.text(), "abc");
  }
  // Two ending together: the longer (earlier) one.
  const std::vector<std::string> pieces = {"abcd"};
  TextStream s = stream_of(&pieces, {"cd", "bcd"});
  s.push(0);
  EXPECT_EQ(s.stop_string(), "bcd");
  EXPECT_EQ(s.text(), "a");
}

TEST(TextStreamTest, AStopCanCompleteInFinish) {
  // The stop string holds a U+FFFD, which the cut-short tail becomes only at the end.
  const std::vector<std::string> pieces = {"x\xE4"};
  TextStream s = stream_of(&pieces, {"x" + kFffd});
  EXPECT_EQ(s.push(0), "");
  EXPECT_EQ(s.finish(), "");
  EXPECT_TRUE(s.stopped());
}

TEST(TextStreamTest, RejectsEmptyAndInvalidStopStrings) {
  const std::vector<std::string> pieces;
  EXPECT_THROW(stream_of(&pieces, {"ok", ""}), Error);
  EXPECT_THROW(stream_of(&pieces, {"\xC3"}), Error);
}

TEST(TextStreamTest, TokenizerBytesAndSpecialTokens) {
  std::vector<std::string> bytes;
  for (int b = 0; b < 256; ++b) bytes.emplace_back(1, static_cast<char>(b));
  const tok::Tokenizer t =
      tok::Tokenizer::from_bpe(bytes, {}, {{"<|endoftext|>", 256}}, tok::SplitPattern::kGpt2);
  const auto ids = [&](const std::string& s) {
    std::vector<int32_t> v = t.encode(s);
    return v;
  };
  TextStream with(t), without(t, {}, /*skip_special=*/true);
  std::string a, b;
  for (int32_t id : ids("hi " + kSmile + "<|endoftext|>")) {
    a += with.push(id);
    b += without.push(id);
  }
  EXPECT_EQ(a, "hi " + kSmile + "<|endoftext|>");
  EXPECT_EQ(b, "hi " + kSmile);
  EXPECT_THROW(with.push(999), Error);  // not a token
}

// The longest prefix of `bytes` made of whole valid characters (bytes is valid UTF-8 cut
// anywhere): what must have been printed once those bytes have arrived.
std::string whole_characters(const std::string& bytes) {
  size_t end = bytes.size();
  for (size_t back = 1; back <= std::min<size_t>(3, bytes.size()); ++back) {
    const auto c = static_cast<unsigned char>(bytes[bytes.size() - back]);
    if ((c >> 6) == 0x2) continue;  // a continuation byte: look further back
    const int len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : 4;
    if (static_cast<size_t>(len) > back) end = bytes.size() - back;
    break;
  }
  return bytes.substr(0, end);
}

TEST(TextStreamTest, Gpt2VocabularyEmojiAndCjk) {
  const std::string gpt2 = FORGE_SOURCE_DIR "/../shared/data/gpt2";
  if (!fs::exists(gpt2 + "/encoder.json")) GTEST_SKIP() << "GPT-2's files not found in " << gpt2;
  const tok::Tokenizer t = tok::Tokenizer::load(gpt2);
  std::ifstream f(FORGE_SOURCE_DIR "/tests/data/tokenizer/gpt2_reference.json");
  const nlohmann::json ref = nlohmann::json::parse(f);
  int multibyte_texts = 0, held_tokens = 0;
  for (const auto& e : ref) {
    const std::string text = e["text"];
    if (std::all_of(text.begin(), text.end(), [](char c) { return (c & 0x80) == 0; })) continue;
    ++multibyte_texts;
    const std::vector<int32_t> ids = e["ids"];
    TextStream s(t);
    std::string bytes;
    for (int32_t id : ids) {
      const std::string chunk = s.push(id);
      bytes += t.decode({id});
      EXPECT_EQ(sanitize_utf8(chunk), chunk) << "half a character printed in '" << text << "'";
      EXPECT_EQ(s.text(), whole_characters(bytes)) << text;
      held_tokens += chunk.empty();
    }
    EXPECT_EQ(s.finish(), "") << text;
    EXPECT_EQ(s.text(), text);
  }
  EXPECT_GE(multibyte_texts, 10);
  EXPECT_GT(held_tokens, 10);  // the reference texts do split characters across tokens
  // 🙂🙂🙂 is six GPT-2 tokens, two per emoji (per the reference): each shows whole.
  TextStream s(t);
  Chunks chunks;
  for (int32_t id : t.encode(kSmile + kSmile + kSmile)) chunks.push_back(s.push(id));
  EXPECT_EQ(chunks, (Chunks{"", kSmile, "", kSmile, "", kSmile}));
}

TEST(TextStreamTest, RandomStreamsMatchSanitizeCutAtTheFirstStop) {
  Rng rng(17, 3);
  int stopped = 0;
  for (int rep = 0; rep < 400; ++rep) {
    // Valid text with a few raw bytes mixed in, cut into tokens of 1-5 bytes.
    std::string all = tok::testing::random_utf8(rng, 1 + rng.below(40));
    for (int k = static_cast<int>(rng.below(3)); k > 0; --k)
      all.insert(rng.below(all.size() + 1), 1, static_cast<char>(0x80 + rng.below(0x80)));
    std::vector<std::string> pieces;
    for (size_t i = 0; i < all.size();) {
      const size_t n = std::min<size_t>(1 + rng.below(5), all.size() - i);
      pieces.push_back(all.substr(i, n));
      i += n;
    }
    // Stop strings: pieces of the sanitized text itself (so they occur) and one that may not.
    const std::string clean = sanitize_utf8(all);
    std::vector<std::string> stop;
    if (rep % 2 == 1) {
      const std::string mid = tok::testing::random_utf8(rng, 2);
      stop.push_back(mid);
      // A run of whole characters of the text, 1-6 bytes long or to the next boundary.
      auto continuation = [&](size_t i) {
        return (static_cast<unsigned char>(clean[i]) >> 6) == 2;
      };
      size_t begin = rng.below(clean.size()), end;
      while (begin < clean.size() && continuation(begin)) ++begin;
      end = std::min(clean.size(), begin + 1 + rng.below(6));
      while (end < clean.size() && continuation(end)) ++end;
      const std::string s = clean.substr(begin, end - begin);
      if (!s.empty()) stop.push_back(s);
    }
    // The reference: the whole text at once, cut before the occurrence that ends first.
    std::string want = clean;
    size_t best_end = std::string::npos, best_begin = 0;
    for (const auto& s : stop) {
      const size_t p = clean.find(s);
      if (p != std::string::npos &&
          (p + s.size() < best_end || (p + s.size() == best_end && p < best_begin))) {
        best_end = p + s.size();
        best_begin = p;
      }
    }
    if (best_end != std::string::npos) want = clean.substr(0, best_begin), ++stopped;
    const Chunks out = run(pieces, stop);
    std::string got;
    for (const auto& c : out) {
      EXPECT_EQ(sanitize_utf8(c), c);
      got += c;
    }
    ASSERT_EQ(got, want) << "rep " << rep;
  }
  EXPECT_GT(stopped, 100);
}

}  // namespace
}  // namespace forge
