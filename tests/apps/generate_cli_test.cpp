// forge generate as a user meets it: one prompt against the library, a prompts.jsonl batch
// (each line as if generated alone, in the file's order), stop strings, the context limit, and
// one-line errors naming the prompts file's line.
#include <gtest/gtest.h>

#include <cctype>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli_runner.h"
#include "forge/generate/sampler.h"
#include "forge/io/model_files.h"
#include "forge/model/config.h"
#include "forge/model/model_dir.h"
#include "forge/tokenizer/tokenizer.h"

namespace forge {
namespace {

namespace fs = std::filesystem;
using testing::CmdResult;

class GenerateCliTest : public testing::CliTest {
 protected:
  void SetUp() override {
    CliTest::SetUp();
    // A tiny GPT-2 over the 300-token byte-level test tokenizer, max_seq_len 32.
    ModelConfig cfg = preset_config("tiny");
    cfg.vocab_size = 300;
    cfg.max_seq_len = 32;
    cfg.n_layer = 2;
    cfg.n_embd = 32;
    cfg.n_head = cfg.n_kv_head = 2;
    cfg.ffn_hidden = 64;
    model_ = std::make_unique<Transformer<float>>(cfg);
    model_->init_weights(11);
    const std::string tok = std::string(FORGE_SOURCE_DIR) + "/tests/data/tokenizer/post_processor/byte_level.json";
    save_model_dir(p("model"), *model_, {.files = {{"tokenizer.json", io::read_file(tok)}}});
  }
  nlohmann::json generate_json(const std::string& args) {
    const CmdResult r = forge("generate --model " + p("model") + " " + args + " --json");
    EXPECT_EQ(r.code, 0) << r.err;
    return nlohmann::json::parse(r.out);
  }

  std::unique_ptr<Transformer<float>> model_;
};

TEST_F(GenerateCliTest, OnePromptEqualsTheLibrary) {
  SampleOptions o;
  o.max_new_tokens = 12;
  o.temperature = 0.9f;
  o.top_k = 40;
  o.seed = 5;
  const std::vector<int32_t> want = generate(*model_, {5, 6, 7}, o);
  const auto j = generate_json("--ids 5,6,7 --max-new-tokens 12 --temperature 0.9 --top-k 40 --seed 5 --ignore-eos");
  EXPECT_EQ(j["ids"].get<std::vector<int32_t>>(), want);
  EXPECT_EQ(j["finish_reason"], "length");
}

TEST_F(GenerateCliTest, BatchLinesEqualSinglePromptRuns) {
  std::ofstream(p("prompts.jsonl")) << "{\"ids\": [5, 6, 7], \"max_new_tokens\": 4}\n\n"
                                    << "{\"ids\": [9], \"temperature\": 0.7, \"seed\": 3, \"max_new_tokens\": 9}\n"
                                    << "{\"prompt\": \"hello world\", \"max_new_tokens\": 6, \"top_p\": 0.5}\n";
  const CmdResult r = forge("generate --model " + p("model") + " --input " + p("prompts.jsonl") +
                            " --ignore-eos --max-batch 2 --temperature 0");
  ASSERT_EQ(r.code, 0) << r.err;
  std::vector<nlohmann::json> lines;
  std::istringstream in(r.out);
  for (std::string l; std::getline(in, l);) lines.push_back(nlohmann::json::parse(l));
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0]["line"], 1);
  EXPECT_EQ(lines[1]["line"], 3);  // the blank line 2 is skipped
  EXPECT_EQ(lines[2]["line"], 4);
  // Flags win over lines (--temperature 0: greedy everywhere), lines over the defaults.
  const char* single[] = {"--ids 5,6,7 --max-new-tokens 4", "--ids 9 --max-new-tokens 9 --seed 3",
                          "--prompt 'hello world' --max-new-tokens 6 --top-p 0.5"};
  for (int i = 0; i < 3; ++i) {
    const auto j = generate_json(std::string(single[i]) + " --ignore-eos --temperature 0");
    EXPECT_EQ(lines[i]["ids"], j["ids"]) << single[i];
    EXPECT_EQ(lines[i]["ids"].size(), j["ids"].size());
  }
  EXPECT_EQ(lines[1]["ids"].size(), 9u);
}

TEST_F(GenerateCliTest, StopStringEndsTheTextBeforeIt) {
  const auto full = generate_json("--ids 5,6,7 --max-new-tokens 25 --temperature 0.8 --seed 2 --ignore-eos");
  const std::string text = full["text"];
  // A one-letter stop string taken from the sampled text, after its first character.
  size_t i = 1;
  while (i < text.size() && !std::isalnum(static_cast<unsigned char>(text[i]))) ++i;
  if (i >= text.size()) GTEST_SKIP() << "no letter or digit in the sampled text: " << text;
  const std::string stop(1, text[i]);
  const auto j =
      generate_json("--ids 5,6,7 --max-new-tokens 25 --temperature 0.8 --seed 2 --ignore-eos --stop " + stop);
  EXPECT_EQ(j["text"], text.substr(0, text.find(stop))) << "stop " << stop;
  EXPECT_EQ(j["finish_reason"], "stop_string");
}

// A literal special-token string in --prompt is text, as `forge data prepare` reads documents;
// --parse-special reads it as the special id.
TEST_F(GenerateCliTest, SpecialTokenStringsArePlainTextUnlessAsked) {
  const tok::Tokenizer t = tok::Tokenizer::load(p("model") + "/tokenizer.json");
  const std::vector<int32_t> plain = t.encode_ordinary("<|endoftext|>"), special = t.encode("<|endoftext|>");
  ASSERT_EQ(special, std::vector<int32_t>{0});
  ASSERT_NE(plain, special);
  std::string plain_ids;
  for (int32_t id : plain) plain_ids += (plain_ids.empty() ? "" : ",") + std::to_string(id);
  const std::string g = " --max-new-tokens 8 --temperature 0 --ignore-eos";
  // The two prompts continue differently, so the checks below can tell them apart.
  ASSERT_NE(generate_json("--ids " + plain_ids + g)["ids"], generate_json("--ids 0" + g)["ids"]);
  EXPECT_EQ(generate_json("--prompt '<|endoftext|>'" + g)["ids"], generate_json("--ids " + plain_ids + g)["ids"]);
  EXPECT_EQ(generate_json("--prompt '<|endoftext|>' --parse-special" + g)["ids"], generate_json("--ids 0" + g)["ids"]);
}

TEST_F(GenerateCliTest, ContextLimitAndBadInputs) {
  std::string ids30 = "1";
  for (int i = 1; i < 30; ++i) ids30 += ",1";
  const CmdResult r = forge("generate --model " + p("model") + " --ids " + ids30 +
                            " --max-new-tokens 10 --json --ignore-eos");
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["ids"].size(), 2u);  // 30 + 2 = max_seq_len
  EXPECT_EQ(j["finish_reason"], "context");
  EXPECT_NE(r.err.find("stopped at the model's context of 32 tokens"), std::string::npos) << r.err;
  const std::string m = "generate --model " + p("model");
  expect_user_error(forge(m + " --ids " + ids30 + ",1,1,1"), "a prompt of 33 tokens does not fit the model's context");
  expect_user_error(forge(m + " --ids 1,300"), "token id 300 is out of range for vocabulary size 300");
  expect_user_error(forge(m + " --ids 1 --temperature -1"), "--temperature: expected a number >= 0");
  expect_user_error(forge(m + " --ids 1 --top-p 0"), "--top-p: expected a number in (0, 1]");
  expect_user_error(forge(m + " --ids 1 --top-k -1"), "--top-k");
  expect_user_error(forge(m + " --ids 1 --repetition-penalty 0"), "--repetition-penalty");
  std::ofstream(p("bad.jsonl")) << "{\"ids\": [1]}\n{\"ids\": [1], \"top_p\": 2}\n";
  expect_user_error(forge(m + " --input " + p("bad.jsonl")), "bad.jsonl:2: top_p");
  std::ofstream(p("broken.jsonl")) << "{\"ids\": [1]}\n{\"ids\": [1\n";
  expect_user_error(forge(m + " --input " + p("broken.jsonl")), "broken.jsonl:2:");
  expect_user_error(forge(m + " --ids 1 --prompt x"), "give exactly one of");
}

}  // namespace
}  // namespace forge
