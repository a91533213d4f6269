// prompts.jsonl: what each line becomes, and every kind of bad line as one "PATH:LINE: ..."
// error; the sampling ranges shared with the CLI's flags (check_sampling).
#include "forge/generate/prompts.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "forge/core/error.h"
#include "fuzz_regression.h"
#include "testing.h"

namespace forge {
namespace {

using Ids = std::vector<int32_t>;

// The message of the forge::Error that parsing `text` throws (and that it is one line).
std::string error_of(const std::string& text, int vocab_size = 0) {
  try {
    parse_prompts(text, "p.jsonl", vocab_size);
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
    return m;
  }
  ADD_FAILURE() << "no error for: " << text;
  return "";
}

#define EXPECT_ERROR(text, needle)                                  \
  do {                                                              \
    const std::string m_ = error_of(text);                          \
    EXPECT_NE(m_.find(needle), std::string::npos) << "got: " << m_; \
  } while (0)

TEST(PromptsTest, ReadsEveryField) {
  const auto r = parse_prompts(
      "{\"prompt\": \"Once upon a time\", \"max_new_tokens\": 50, \"stop\": [\"\\n\\n\", \"END\"],"
      " \"seed\": 18446744073709551615, \"temperature\": 0.7, \"top_k\": 40, \"top_p\": 0.9,"
      " \"min_p\": 0.05, \"repetition_penalty\": 1.1}\n"
      "\n"
      "   \t\n"
      "{\"ids\": [464, 0, 2147483647], \"stop\": \"x\", \"temperature\": 0}\r\n"
      "{\"prompt\": \"\", \"temperature\": null, \"stop\": null}",
      "p.jsonl");
  ASSERT_EQ(r.size(), 3u);
  EXPECT_EQ(r[0].line, 1);
  EXPECT_EQ(r[0].prompt, "Once upon a time");
  EXPECT_TRUE(r[0].ids.empty());
  EXPECT_EQ(r[0].stop, (std::vector<std::string>{"\n\n", "END"}));
  EXPECT_EQ(r[0].sampling.max_new_tokens, 50);
  EXPECT_EQ(r[0].sampling.seed, 18446744073709551615ull);
  EXPECT_EQ(r[0].sampling.temperature, 0.7);
  EXPECT_EQ(r[0].sampling.top_k, 40);
  EXPECT_EQ(r[0].sampling.top_p, 0.9);
  EXPECT_EQ(r[0].sampling.min_p, 0.05);
  EXPECT_EQ(r[0].sampling.repetition_penalty, 1.1);

  EXPECT_EQ(r[1].line, 4);  // blank lines count
  EXPECT_FALSE(r[1].prompt.has_value());
  EXPECT_EQ(r[1].ids, (Ids{464, 0, 2147483647}));
  EXPECT_EQ(r[1].stop, (std::vector<std::string>{"x"}));
  EXPECT_EQ(r[1].sampling.temperature, 0.0);
  EXPECT_FALSE(r[1].sampling.seed.has_value());
  EXPECT_FALSE(r[1].sampling.max_new_tokens.has_value());

  EXPECT_EQ(r[2].line, 5);  // no newline at the end of the file
  EXPECT_EQ(r[2].prompt, "");
  EXPECT_FALSE(r[2].sampling.temperature.has_value());
  EXPECT_TRUE(r[2].stop.empty());
}

TEST(PromptsTest, KeepsUnicodeAndEscapes) {
  const auto r = parse_prompts(
      "{\"prompt\": \"caf\\u00e9 \xe4\xbd\xa0\xe5\xa5\xbd \\ud83d\\ude42\"}\n", "p.jsonl");
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(*r[0].prompt, "caf\xc3\xa9 \xe4\xbd\xa0\xe5\xa5\xbd \xf0\x9f\x99\x82");
}

TEST(PromptsTest, ErrorsNameTheFileAndLine) {
  const std::string ok = "{\"prompt\": \"a\"}\n";
  EXPECT_ERROR(ok + "\n" + "{\"prompt\": \"a\"\n", "p.jsonl:3: malformed JSON");
  EXPECT_ERROR("{prompt: 1}", "p.jsonl:1: malformed JSON");
  EXPECT_ERROR(ok + "[1, 2]", "p.jsonl:2: expected a JSON object, got a list");
  EXPECT_ERROR(ok + "\"text\"", "p.jsonl:2: expected a JSON object, got a string");
  EXPECT_ERROR("{\"prompt\": \"a\", \"temprature\": 1}", "p.jsonl:1: unknown key 'temprature'");
  EXPECT_ERROR("{\"prompt\": \"a\", \"prompt\": \"b\"}", "p.jsonl:1: key 'prompt' appears twice");
  EXPECT_ERROR("{\"prompt\": \"a\", \"ids\": [1]}", "p.jsonl:1: give one of");
  EXPECT_ERROR("{\"max_new_tokens\": 5}", "p.jsonl:1: no \"prompt\"");
  EXPECT_ERROR("{}", "p.jsonl:1: no \"prompt\"");
  EXPECT_ERROR("", "p.jsonl: no requests");
  EXPECT_ERROR("\n  \n", "p.jsonl: no requests");
}

TEST(PromptsTest, RejectsInvalidUtf8WithItsPosition) {
  EXPECT_ERROR("{\"prompt\": \"ab\xff\"}", "p.jsonl:1: invalid UTF-8 at byte 15");
  EXPECT_ERROR("{\"prompt\": \"\xe4\xbd\"}", "p.jsonl:1: invalid UTF-8 at byte 13");  // cut short
  EXPECT_ERROR("{\"prompt\": \"\xc0\xaf\"}", "invalid UTF-8 at byte 13");      // overlong '/'
  EXPECT_ERROR("{\"prompt\": \"\xed\xa0\x80\"}", "invalid UTF-8 at byte 13");  // surrogate
  EXPECT_ERROR("{\"prompt\": \"\xf4\x90\x80\x80\"}", "invalid UTF-8");         // > U+10FFFF
  EXPECT_ERROR("{\"prompt\": \"\\ud800\"}", "p.jsonl:1: malformed JSON");  // lone surrogate escape
}

TEST(PromptsTest, RejectsWrongTypes) {
  EXPECT_ERROR("{\"prompt\": 5}", "p.jsonl:1: prompt: expected a string, got the integer 5");
  EXPECT_ERROR("{\"prompt\": null}", "prompt: expected a string, got null");
  EXPECT_ERROR("{\"ids\": \"1,2\"}", "ids: expected a list of token ids, got a string");
  EXPECT_ERROR("{\"ids\": []}", "ids: the list is empty");
  EXPECT_ERROR("{\"ids\": [1, 2.5]}",
               "ids[1]: expected a token id (an integer), got the number 2.5");
  EXPECT_ERROR("{\"ids\": [1, \"2\"]}", "ids[1]: expected a token id");
  EXPECT_ERROR("{\"ids\": [-1]}", "ids[0]: token id -1 is out of range");
  EXPECT_ERROR("{\"ids\": [2147483648]}", "ids[0]: token id 2147483648 is out of range");
  EXPECT_ERROR("{\"prompt\": \"a\", \"stop\": 3}", "stop: expected a string or a list of strings");
  EXPECT_ERROR("{\"prompt\": \"a\", \"stop\": [\"x\", false]}", "stop[1]: expected a string");
  EXPECT_ERROR("{\"prompt\": \"a\", \"stop\": \"\"}", "stop: a stop string must not be empty");
  EXPECT_ERROR("{\"prompt\": \"a\", \"stop\": [\"x\", \"\"]}", "stop[1]: a stop string must not");
  EXPECT_ERROR("{\"prompt\": \"a\", \"temperature\": \"hot\"}",
               "temperature: expected a number, got a string");
  EXPECT_ERROR("{\"prompt\": \"a\", \"top_p\": true}", "top_p: expected a number, got true");
  EXPECT_ERROR("{\"prompt\": \"a\", \"top_k\": 4.0}",
               "top_k: expected an integer, got the number 4.0");
  EXPECT_ERROR("{\"prompt\": \"a\", \"max_new_tokens\": \"5\"}",
               "max_new_tokens: expected an integer");
  EXPECT_ERROR("{\"prompt\": \"a\", \"seed\": -1}",
               "seed: expected an integer in [0, 18446744073709551615]");
  EXPECT_ERROR("{\"prompt\": \"a\", \"seed\": 1.5}", "seed: expected an integer");
}

TEST(PromptsTest, RejectsValuesOutOfRange) {
  const std::string a = "{\"prompt\": \"a\", ";
  EXPECT_ERROR(a + "\"temperature\": -0.1}",
               "p.jsonl:1: temperature: expected a number >= 0, got -0.1");
  EXPECT_ERROR(a + "\"temperature\": 1e39}",
               "temperature: expected a value that fits a 32-bit float");
  EXPECT_ERROR(a + "\"top_p\": 0}", "top_p: expected a number in (0, 1], got 0");
  EXPECT_ERROR(a + "\"top_p\": 1.5}", "top_p: expected a number in (0, 1], got 1.5");
  EXPECT_ERROR(a + "\"top_k\": -1}", "top_k: expected an integer in [0, 2147483647], got -1");
  EXPECT_ERROR(a + "\"top_k\": 2147483648}", "top_k: expected an integer in [0, 2147483647]");
  EXPECT_ERROR(a + "\"min_p\": 1}", "min_p: expected a number in [0, 1), got 1");
  EXPECT_ERROR(a + "\"min_p\": -0.5}", "min_p: expected a number in [0, 1), got -0.5");
  EXPECT_ERROR(a + "\"repetition_penalty\": 0}",
               "repetition_penalty: expected a number > 0, got 0");
  EXPECT_ERROR(a + "\"max_new_tokens\": -1}",
               "max_new_tokens: expected an integer in [0, 2147483647], got -1");
  EXPECT_ERROR(a + "\"max_new_tokens\": 99999999999999999999}", "max_new_tokens");
  // The edges that are allowed.
  const auto r = parse_prompts(a + "\"top_p\": 1, \"min_p\": 0, \"top_k\": 0, \"temperature\": 0,"
                                   " \"max_new_tokens\": 0, \"seed\": 0}",
                               "p.jsonl");
  EXPECT_EQ(r[0].sampling.top_p, 1.0);
  EXPECT_EQ(r[0].sampling.max_new_tokens, 0);
}

TEST(PromptsTest, ChecksIdsAgainstTheVocabularyWhenGiven) {
  EXPECT_EQ(parse_prompts("{\"ids\": [99]}", "p.jsonl", 100)[0].ids, (Ids{99}));
  const std::string m = error_of("{\"ids\": [1]}\n{\"ids\": [5, 100]}", 100);
  EXPECT_NE(m.find("p.jsonl:2: ids[1]: token id 100 is out of range for vocabulary size 100"),
            std::string::npos)
      << m;
}

TEST(PromptsTest, ReadsAFileAndNamesIt) {
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("forge_prompts_" + std::to_string(::getpid()) + ".jsonl"))
                               .string();
  std::ofstream(path) << "{\"prompt\": \"hi\"}\n{\"prompt\": \"x\", \"top_p\": 2}\n";
  try {
    read_prompts(path);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).rfind(path + ":2: top_p:", 0), 0u) << e.what();
  }
  std::filesystem::remove(path);
  EXPECT_THROW(read_prompts(path), Error);
}

TEST(SamplingSettingsTest, FlagsAreNamedAsFlags) {
  SamplingOverrides s;
  s.repetition_penalty = -1;
  try {
    check_sampling(s, SettingNames::kFlags);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "--repetition-penalty: expected a number > 0, got -1.0");
  }
  s = {};
  s.max_new_tokens = -3;
  EXPECT_THROW(check_sampling(s, SettingNames::kFlags), Error);
}

TEST(SamplingSettingsTest, LayersAndApplies) {
  SamplingOverrides file, line;
  file.temperature = 0.5;
  file.top_k = 10;
  line.temperature = 0.0;
  line.seed = 9;
  const SamplingOverrides both = line.over(file);
  EXPECT_EQ(both.temperature, 0.0);  // the upper layer wins
  EXPECT_EQ(both.top_k, 10);         // the lower one fills in
  EXPECT_EQ(both.seed, 9u);
  EXPECT_FALSE(both.top_p.has_value());
  SamplerSettings base;
  base.top_p = 0.8f;
  base.temperature = 1.0f;
  const SamplerSettings s = apply_sampling(both, base);
  EXPECT_EQ(s.temperature, 0.0f);
  EXPECT_EQ(s.top_k, 10);
  EXPECT_EQ(s.top_p, 0.8f);
  EXPECT_EQ(s.seed, 9u);
  SamplingOverrides bad;
  bad.top_p = 0;
  EXPECT_THROW(apply_sampling(bad), Error);
}

// Found by fuzz/fuzz_prompts: an unknown key holding a newline was printed raw (two lines).
TEST(PromptsTest, FuzzFindingKeyWithANewlineStaysOneLine) {
  const std::string in = testing::fuzz_regression("prompts-key_newline");
  testing::expect_one_line_error([&] { parse_prompts(in, "p.jsonl", 1000); },
                                 {"p.jsonl:1: unknown key 'max_new_to\\x0ans'"});
}

// Found by fuzz/fuzz_prompts: a number that overflows a double (1e999) made nlohmann throw
// out_of_range, which escaped as a non-forge exception without the file and line.
TEST(PromptsTest, FuzzFindingNumberOverflowIsMalformedJson) {
  const std::string in = testing::fuzz_regression("prompts-number_overflow");
  testing::expect_one_line_error([&] { parse_prompts(in, "p.jsonl", 1000); },
                                 {"p.jsonl:1: malformed JSON: number overflow parsing '1e999'"});
}

}  // namespace
}  // namespace forge
