// generation_config.json: the files transformers ships (GPT-2's, Llama 3.1's, written here as
// the Hub has them), one-line errors naming the file and the field, the writer's exact text,
// the end-of-text token found from a tokenizer (+ tokenizer_config.json), and the loader's
// fallbacks (generation_config.json, then config.json, then the tokenizer).
#include "forge/generate/generation_config.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "forge/core/error.h"
#include "forge/tokenizer/tokenizer.h"
#include "testing.h"

namespace forge {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using Ids = std::vector<int32_t>;

const std::string kFixtures = FORGE_SOURCE_DIR "/tests/data/tokenizer/post_processor";

class GenerationConfigTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("forge_gencfg_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string write(const std::string& name, const std::string& text) {
    const std::string path = (dir_ / name).string();
    fs::create_directories(fs::path(path).parent_path());
    std::ofstream(path, std::ios::binary) << text;
    return path;
  }
  // A Forge-trained-style tokenizer.json: the 256 bytes, <|endoftext|> at 256 and <|pad|> at 257.
  std::string forge_tokenizer(const std::string& name) {
    std::vector<std::string> bytes;
    for (int b = 0; b < 256; ++b) bytes.emplace_back(1, static_cast<char>(b));
    const std::string path = (dir_ / name).string();
    fs::create_directories(fs::path(path).parent_path());
    tok::Tokenizer::from_bpe(bytes, {}, {{"<|endoftext|>", 256}, {"<|pad|>", 257}},
                             tok::SplitPattern::kGpt2)
        .save_json(path);
    return path;
  }
  // The message of the forge::Error reading `text` as generation_config.json throws.
  std::string error_of(const std::string& text) {
    const std::string path = write("generation_config.json", text);
    try {
      read_generation_config(path);
    } catch (const Error& e) {
      const std::string m = e.what();
      EXPECT_EQ(m.find('\n'), std::string::npos) << m;
      EXPECT_EQ(m.rfind(path + ": ", 0), 0u) << "does not start with the file: " << m;
      return m;
    }
    ADD_FAILURE() << "no error for " << text;
    return "";
  }
  fs::path dir_;
};

TEST_F(GenerationConfigTest, ReadsTheFilesTransformersShips) {
  const GenerationConfig gpt2 = read_generation_config(
      write("gpt2.json",
            "{\n  \"_from_model_config\": true,\n  \"bos_token_id\": 50256,\n  \"eos_token_id\": "
            "50256,\n  \"transformers_version\": \"4.26.0.dev0\"\n}\n"));
  EXPECT_EQ(gpt2.eos_token_ids, (Ids{50256}));
  EXPECT_EQ(gpt2.bos_token_id, 50256);
  EXPECT_FALSE(gpt2.pad_token_id.has_value());
  EXPECT_FALSE(gpt2.do_sample.has_value());
  EXPECT_FALSE(gpt2.sampling.temperature.has_value());

  const GenerationConfig llama = read_generation_config(
      write("llama.json",
            R"({"bos_token_id": 128000, "do_sample": true, "eos_token_id": [128001, 128008, 128009],
          "temperature": 0.6, "top_p": 0.9, "top_k": 50, "min_p": null, "max_length": 4096,
          "repetition_penalty": 1.05, "max_new_tokens": 256, "pad_token_id": null,
          "transformers_version": "4.42.3"})"));
  EXPECT_EQ(llama.eos_token_ids, (Ids{128001, 128008, 128009}));
  EXPECT_EQ(llama.bos_token_id, 128000);
  EXPECT_FALSE(llama.pad_token_id.has_value());
  EXPECT_EQ(llama.do_sample, true);
  EXPECT_EQ(llama.sampling.temperature, 0.6);
  EXPECT_EQ(llama.sampling.top_p, 0.9);
  EXPECT_EQ(llama.sampling.top_k, 50);
  EXPECT_FALSE(llama.sampling.min_p.has_value());
  EXPECT_EQ(llama.sampling.repetition_penalty, 1.05);
  EXPECT_EQ(llama.sampling.max_new_tokens, 256);
  EXPECT_EQ(llama.sampling_defaults().temperature, 0.6);
}

TEST_F(GenerationConfigTest, DoSampleFalseMeansGreedy) {
  GenerationConfig c = read_generation_config(
      write("g.json", R"({"do_sample": false, "temperature": 0.7, "top_p": 0.8})"));
  EXPECT_EQ(c.sampling.temperature, 0.7);             // as the file says...
  EXPECT_EQ(c.sampling_defaults().temperature, 0.0);  // ...but transformers samples greedily
  EXPECT_EQ(c.sampling_defaults().top_p, 0.8);
  c.do_sample.reset();
  EXPECT_EQ(c.sampling_defaults().temperature, 0.7);
  EXPECT_EQ(read_generation_config(write("e.json", "{}")), GenerationConfig{});
}

TEST_F(GenerationConfigTest, ErrorsNameTheFileAndTheField) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"{\"eos_token_id\": \"2\"}", "eos_token_id: expected a token id"},
      {"{\"eos_token_id\": [1, \"x\"]}", "eos_token_id[1]: expected a token id"},
      {"{\"eos_token_id\": [1, null]}", "eos_token_id[1]: expected a token id, got null"},
      {"{\"eos_token_id\": -1}", "eos_token_id: expected a token id (an integer >= 0), got -1"},
      {"{\"eos_token_id\": 4294967296}", "eos_token_id: expected a token id"},
      {"{\"bos_token_id\": 1.5}", "bos_token_id: expected a token id"},
      {"{\"pad_token_id\": [0]}", "pad_token_id: expected a token id"},
      {"{\"do_sample\": \"yes\"}", "do_sample: expected true or false"},
      {"{\"temperature\": \"hot\"}", "temperature: expected a number"},
      {"{\"temperature\": -1}", "temperature: expected a number >= 0, got -1"},
      {"{\"top_p\": 1.5}", "top_p: expected a number in (0, 1], got 1.5"},
      {"{\"top_k\": -1}", "top_k: expected an integer in [0, 2147483647], got -1"},
      {"{\"top_k\": 5.0}", "top_k: expected an integer"},
      {"{\"min_p\": 1.0}", "min_p: expected a number in [0, 1)"},
      {"{\"repetition_penalty\": 0}", "repetition_penalty: expected a number > 0"},
      {"{\"max_new_tokens\": -5}", "max_new_tokens: expected an integer in [0, 2147483647]"},
      {"[1, 2]", "expected a JSON object"},
      {"{\"eos_token_id\": ", "malformed JSON"},
  };
  for (const auto& [text, needle] : cases) {
    const std::string m = error_of(text);
    EXPECT_NE(m.find(needle), std::string::npos) << text << " -> " << m;
  }
  EXPECT_THROW(read_generation_config((dir_ / "missing.json").string()), Error);
}

TEST_F(GenerationConfigTest, WritesTransformersLayout) {
  GenerationConfig c;
  c.bos_token_id = 0;
  c.eos_token_ids = {0};
  EXPECT_EQ(generation_config_json(c), "{\n  \"bos_token_id\": 0,\n  \"eos_token_id\": 0\n}\n");
  c.eos_token_ids = {2, 7};
  c.pad_token_id = 3;
  c.do_sample = true;
  c.sampling.temperature = 0.25;
  c.sampling.max_new_tokens = 20;
  EXPECT_EQ(generation_config_json(c),
            "{\n  \"bos_token_id\": 0,\n  \"do_sample\": true,\n  \"eos_token_id\": [\n    2,\n"
            "    7\n  ],\n  \"max_new_tokens\": 20,\n  \"pad_token_id\": 3,\n"
            "  \"temperature\": 0.25\n}\n");
  EXPECT_EQ(generation_config_json(GenerationConfig{}), "{}\n");
  // Everything it writes reads back.
  c.sampling.top_k = 40;
  c.sampling.top_p = 0.95;
  c.sampling.min_p = 0.05;
  c.sampling.repetition_penalty = 1.3;
  EXPECT_EQ(read_generation_config(write("g.json", generation_config_json(c))), c);
}

TEST_F(GenerationConfigTest, EndOfTextFromTheTokenizer) {
  const std::string forge_tok = forge_tokenizer("forge/tokenizer.json");
  const GenerationConfig f = generation_config_for_tokenizer(forge_tok);
  EXPECT_EQ(f.eos_token_ids, (Ids{256}));
  EXPECT_EQ(f.bos_token_id, 256);  // GPT-2's convention: <|endoftext|> starts documents too
  EXPECT_FALSE(f.pad_token_id.has_value());

  // tokenizer_config.json names the tokens, as a string or as an AddedToken object.
  const std::string tc = write("forge/tokenizer_config.json",
                               R"({"eos_token": {"__type": "AddedToken", "content": "<|pad|>"},
                                   "bos_token": null, "pad_token": "<|endoftext|>"})");
  const GenerationConfig g = generation_config_for_tokenizer(forge_tok, tc);
  EXPECT_EQ(g.eos_token_ids, (Ids{257}));
  EXPECT_FALSE(g.bos_token_id.has_value());  // the eos is not <|endoftext|>
  EXPECT_EQ(g.pad_token_id, 256);
  // A name the tokenizer lacks falls back to <|endoftext|>.
  const GenerationConfig h = generation_config_for_tokenizer(
      forge_tok, write("x/tokenizer_config.json", R"({"eos_token": "</s>"})"));
  EXPECT_EQ(h.eos_token_ids, (Ids{256}));

  // Llama 3's shape: no <|endoftext|>; BOS from the post-processor, EOS from tokenizer_config.
  const std::string llama = kFixtures + "/bos.json";
  const GenerationConfig l = generation_config_for_tokenizer(llama);
  EXPECT_TRUE(l.eos_token_ids.empty());
  EXPECT_EQ(l.bos_token_id, 0);
  const GenerationConfig l2 = generation_config_for_tokenizer(
      llama, write("l/tokenizer_config.json", R"({"eos_token": "<|end_of_text|>"})"));
  EXPECT_EQ(l2.eos_token_ids, (Ids{1}));
  EXPECT_EQ(l2.bos_token_id, 0);

  // A tokenizer.json Forge cannot read: nothing known, no error.
  EXPECT_EQ(generation_config_for_tokenizer(write("bad/tokenizer.json", "{not json")),
            GenerationConfig{});
  EXPECT_EQ(generation_config_for_tokenizer((dir_ / "none.json").string()), GenerationConfig{});
  // A broken tokenizer_config.json is the user's to fix.
  EXPECT_THROW(generation_config_for_tokenizer(forge_tok, write("b/tokenizer_config.json", "[")),
               Error);
  try {
    generation_config_for_tokenizer(forge_tok,
                                    write("c/tokenizer_config.json", "{\"eos_token\": 5}"));
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("c/tokenizer_config.json: eos_token: expected a token"),
              std::string::npos)
        << e.what();
  }
}

TEST_F(GenerationConfigTest, LoaderFallsBackFromFileToConfigToTokenizer) {
  const std::string d = dir_.string();
  EXPECT_EQ(load_generation_config(d), GenerationConfig{});  // nothing there: defaults

  forge_tokenizer("tokenizer.json");
  EXPECT_EQ(load_generation_config(d).eos_token_ids, (Ids{256}));

  write("config.json", R"({"model_type": "llama", "eos_token_id": [2, 3], "bos_token_id": 1})");
  GenerationConfig c = load_generation_config(d);
  EXPECT_EQ(c.eos_token_ids, (Ids{2, 3}));  // config.json before the tokenizer
  EXPECT_EQ(c.bos_token_id, 1);

  write("generation_config.json", R"({"eos_token_id": 9, "temperature": 0.5})");
  c = load_generation_config(d);
  EXPECT_EQ(c.eos_token_ids, (Ids{9}));  // the file first
  EXPECT_EQ(c.bos_token_id, 1);          // what it lacks from config.json
  EXPECT_EQ(c.sampling.temperature, 0.5);

  write("generation_config.json", R"({"top_p": 0})");
  EXPECT_THROW(load_generation_config(d), Error);
  write("generation_config.json", "{}");
  write("config.json", R"({"eos_token_id": "x"})");
  EXPECT_THROW(load_generation_config(d), Error);
}

}  // namespace
}  // namespace forge
