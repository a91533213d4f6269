// tokenizer.json post-processors: the ids with_special_tokens() gives against those Hugging Face
// `tokenizers` gives with add_special_tokens=True (tests/data/tokenizer/post_processor, made by
// tools/make_post_processor_reference.py), post-processors Forge cannot apply (they load, and
// with_special_tokens() says why it cannot), save_json keeping the post-processor, and the
// one-token accessors token_bytes / is_special.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "forge/core/error.h"
#include "forge/tokenizer/tokenizer.h"
#include "testing.h"

namespace forge::tok {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using Ids = std::vector<int32_t>;

const std::string kDir = FORGE_SOURCE_DIR "/tests/data/tokenizer/post_processor";

json read_json(const std::string& path) {
  std::ifstream f(path);
  EXPECT_TRUE(f.good()) << path;
  return json::parse(f);
}

class PostProcessorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("forge_pp_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  // bos.json with its post_processor replaced, written to the temporary directory.
  std::string with_post_processor(const json& pp) {
    json j = read_json(kDir + "/bos.json");
    j["post_processor"] = pp;
    const std::string path = (dir_ / "tokenizer.json").string();
    std::ofstream(path) << j.dump();
    return path;
  }
  fs::path dir_;
};

TEST_F(PostProcessorTest, MatchesHuggingFaceAddSpecialTokens) {
  const json expected = read_json(kDir + "/expected.json");
  ASSERT_EQ(expected.size(), 3u);
  for (const auto& [file, cases] : expected.items()) {
    const Tokenizer t = Tokenizer::load(kDir + "/" + file);
    EXPECT_TRUE(t.post_processor().problem.empty()) << file << ": " << t.post_processor().problem;
    for (const json& c : cases) {
      const std::string text = c["text"];
      const Ids plain = t.encode(text);
      EXPECT_EQ(plain, c["plain"].get<Ids>()) << file << " '" << text << "'";
      EXPECT_EQ(t.with_special_tokens(plain), c["with_special"].get<Ids>())
          << file << " '" << text << "'";
    }
  }
}

TEST_F(PostProcessorTest, ReadsTheTemplateAroundTheSequence) {
  const Tokenizer bos = Tokenizer::load(kDir + "/bos.json");
  EXPECT_EQ(bos.post_processor().prefix, (Ids{*bos.special_id("<|begin_of_text|>")}));
  EXPECT_TRUE(bos.post_processor().suffix.empty());
  const Tokenizer both = Tokenizer::load(kDir + "/bos_eos.json");
  EXPECT_EQ(both.post_processor().prefix, (Ids{*both.special_id("<s>")}));
  EXPECT_EQ(both.post_processor().suffix, (Ids{*both.special_id("</s>")}));
  const Tokenizer byte_level = Tokenizer::load(kDir + "/byte_level.json");
  EXPECT_TRUE(byte_level.post_processor().prefix.empty());
  EXPECT_EQ(byte_level.with_special_tokens({5, 6}), (Ids{5, 6}));
}

TEST_F(PostProcessorTest, SequencesComposeOuterAroundInner) {
  // Two templates in a row: the second wraps what the first made (tokenizers' Sequence).
  const json tp1 = {{"type", "TemplateProcessing"},
                    {"single",
                     {{{"SpecialToken", {{"id", "B"}, {"type_id", 0}}}},
                      {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
                      {{"SpecialToken", {{"id", "E"}, {"type_id", 0}}}}}},
                    {"special_tokens",
                     {{"B", {{"id", "B"}, {"ids", {0}}, {"tokens", {"B"}}}},
                      {"E", {{"id", "E"}, {"ids", {1, 1}}, {"tokens", {"E", "E"}}}}}}};
  json tp2 = tp1;
  tp2["special_tokens"]["B"]["ids"] = {1};
  tp2["special_tokens"]["E"]["ids"] = {0};
  const Tokenizer t = Tokenizer::load(with_post_processor(
      {{"type", "Sequence"}, {"processors", {{{"type", "ByteLevel"}}, tp1, tp2}}}));
  EXPECT_EQ(t.with_special_tokens({7}), (Ids{1, 0, 7, 1, 1, 0}));
}

TEST_F(PostProcessorTest, WhatCannotBeAppliedStillLoadsAndIsReportedOnUse) {
  const json seq_a = {{"Sequence", {{"id", "A"}, {"type_id", 0}}}};
  const json seq_b = {{"Sequence", {{"id", "B"}, {"type_id", 0}}}};
  const json missing = {{"SpecialToken", {{"id", "<nope>"}, {"type_id", 0}}}};
  const json bad_id_map = {{"<x>", {{"id", "<x>"}, {"ids", {99999}}, {"tokens", {"<x>"}}}}};
  const json bad_id = {{"SpecialToken", {{"id", "<x>"}, {"type_id", 0}}}};
  const std::vector<std::pair<json, std::string>> cases = {
      {{{"type", "RobertaProcessing"}, {"sep", {"</s>", 2}}, {"cls", {"<s>", 0}}},
       "post_processor 'RobertaProcessing' is not supported"},
      {{{"type", "TemplateProcessing"}, {"single", {missing, seq_a}}, {"special_tokens", {}}},
       "names special token '<nope>'"},
      {{{"type", "TemplateProcessing"}, {"single", {seq_b}}, {"special_tokens", {}}}, "found $B"},
      {{{"type", "TemplateProcessing"}, {"single", {seq_a, seq_a}}, {"special_tokens", {}}},
       "found $A twice"},
      {{{"type", "TemplateProcessing"}, {"single", json::array()}, {"special_tokens", {}}},
       "has no $A"},
      {{{"type", "TemplateProcessing"},
        {"single", {bad_id, seq_a}},
        {"special_tokens", bad_id_map}},
       "has id 99999"},
      {{{"type", "TemplateProcessing"}}, "post_processor"},  // no "single"
  };
  for (const auto& [pp, needle] : cases) {
    const std::string path = with_post_processor(pp);
    const Tokenizer t = Tokenizer::load(path);
    EXPECT_EQ(t.encode("Hello"), Tokenizer::load(kDir + "/bos.json").encode("Hello"));
    try {
      t.with_special_tokens({1, 2});
      ADD_FAILURE() << "no error for " << pp.dump();
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(needle), std::string::npos) << msg;
      EXPECT_NE(msg.find(path), std::string::npos) << msg;
      EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    }
  }
}

TEST_F(PostProcessorTest, SaveJsonKeepsThePostProcessor) {
  const Tokenizer t = Tokenizer::load(kDir + "/bos_eos.json");
  const std::string path = (dir_ / "saved.json").string();
  t.save_json(path);
  const Tokenizer back = Tokenizer::load(path);
  EXPECT_EQ(back.with_special_tokens({9}), (Ids{0, 9, 1}));
  EXPECT_EQ(read_json(path)["post_processor"]["type"], "TemplateProcessing");
  // A tokenizer built in memory has none, and saves none.
  std::vector<std::string> bytes;
  for (int b = 0; b < 256; ++b) bytes.emplace_back(1, static_cast<char>(b));
  const Tokenizer plain =
      Tokenizer::from_bpe(bytes, {}, {{"<|endoftext|>", 256}}, SplitPattern::kGpt2);
  EXPECT_EQ(plain.with_special_tokens({3}), (Ids{3}));
  plain.save_json(path);
  EXPECT_TRUE(read_json(path)["post_processor"].is_null());
}

TEST_F(PostProcessorTest, TokenBytesAndIsSpecial) {
  const Tokenizer t = Tokenizer::load(kDir + "/bos_eos.json");
  const int32_t s = *t.special_id("<s>");
  EXPECT_EQ(t.token_bytes(s), "<s>");
  EXPECT_TRUE(t.is_special(s));
  const Ids hello = t.encode("Hello world");
  std::string joined;
  for (int32_t id : hello) {
    EXPECT_FALSE(t.is_special(id)) << id;
    joined += t.token_bytes(id);
  }
  EXPECT_EQ(joined, "Hello world");
  EXPECT_FALSE(t.is_special(-1));
  EXPECT_FALSE(t.is_special(t.vocab_size()));
  EXPECT_THROW(t.token_bytes(t.vocab_size()), Error);
  EXPECT_THROW(t.token_bytes(-1), Error);
}

}  // namespace
}  // namespace forge::tok
