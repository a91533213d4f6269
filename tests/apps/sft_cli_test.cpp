// forge train --sft and forge generate --chat as a user meets them: a run from JSONL with its
// summary line, an "sft" section in a config file, one-line errors that leave nothing behind,
// and a chat prompt that is the template's rendering, generated from as if given as ids.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cli_runner.h"
#include "tiny_chat_model.h"
#include "forge/backend/cuda/runtime.h"
#include "forge/chat/chat_template.h"
#include "forge/chat/sft_example.h"
#include "forge/io/model_files.h"
#include "forge/model/config.h"
#include "forge/model/model_dir.h"
#include "forge/tokenizer/tokenizer.h"

namespace forge {
namespace {

namespace fs = std::filesystem;
using testing::CmdResult;
const std::string& kTokenizer = testing::kChatTokenizer;

class SftCliTest : public testing::CliTest {
 protected:
  void SetUp() override {
    CliTest::SetUp();
    // A tiny GPT-2 over the byte-level chat test tokenizer (it has ChatML's special tokens).
    testing::save_tiny_chat_model(p("model"));
    std::ofstream(p("ok.jsonl"))
        << R"({"prompt": "Say hi", "response": "hi"})" << "\n"
        << R"({"messages": [{"role": "user", "content": "nothing to answer"}]})" << "\n"
        << R"({"prompt": "long", "response": ")" << std::string(200, 'x') << "\"}\n"
        << R"({"messages": [{"role": "system", "content": "Be brief."}, )"
        << R"({"role": "user", "content": "1+1?"}, {"role": "assistant", "content": "2"}]})"
        << "\n";
  }
  std::string sft_args(const std::string& jsonl, const std::string& run) {
    return "train --init-from " + p("model") + " --sft " + p(jsonl) + " --out " + p(run) +
           " seq_len=32 batch_size=2 eval_every=1 eval_windows=4";
  }
};

TEST_F(SftCliTest, TrainsFromJsonlAndCountsWhatItCutAndSkipped) {
  const CmdResult r = forge(sft_args("ok.jsonl", "run") + " --steps 3 sft_val_frac=0");
  ASSERT_EQ(r.code, 0) << r.err;
  // Four lines: one untrained (skipped), one of 200+ tokens (cut to 33), two kept whole.
  EXPECT_NE(r.out.find("4 examples: 3 train, 0 validation, 1 truncated to the sequence length, "
                       "1 skipped with no assistant tokens"),
            std::string::npos)
      << r.out;
  std::ifstream m(p("run/metrics.jsonl"));
  std::string line;
  int steps = 0;
  while (std::getline(m, line)) {
    const auto j = nlohmann::json::parse(line);
    if (!j.contains("loss")) continue;
    EXPECT_GT(j["trained_tokens"].get<int>(), 0) << line;
    ++steps;
  }
  EXPECT_EQ(steps, 3);
  const auto cfg = nlohmann::json::parse(std::ifstream(p("run/config.json")));
  EXPECT_TRUE(cfg["sft"].get<bool>());
  EXPECT_TRUE(fs::exists(p("run/model/tokenizer.json")));
}

TEST_F(SftCliTest, ConfigFileSftSectionSetsDataAndSettings) {
  std::ofstream(p("cfg.json")) << nlohmann::json{
      {"sft", {{"data", p("ok.jsonl")}, {"epochs", 2}, {"val_frac", 0}, {"overlong", "skip"}}}};
  const CmdResult r = forge("train --init-from " + p("model") + " --config " + p("cfg.json") +
                            " --out " + p("run") + " seq_len=32 batch_size=2");
  ASSERT_EQ(r.code, 0) << r.err;
  // overlong=skip: 2 examples left; 2 epochs of 2 in steps of 2.
  EXPECT_NE(r.out.find("2 train, 0 validation, 1 skipped as too long"), std::string::npos) << r.out;
  const auto cfg = nlohmann::json::parse(std::ifstream(p("run/config.json")));
  EXPECT_EQ(cfg["train"]["steps"].get<int>(), 2);
  EXPECT_EQ(cfg["train"]["epochs"].get<int>(), 2);
  EXPECT_EQ(cfg["train"]["sft_overlong"].get<std::string>(), "skip");

  std::ofstream(p("bad_cfg.json")) << R"({"sft": {"data": "x.jsonl", "shuffle": true}})";
  expect_user_error(forge("train --init-from " + p("model") + " --config " + p("bad_cfg.json") +
                          " --out " + p("run2")),
                    "unknown key 'shuffle'");
  EXPECT_FALSE(fs::exists(p("run2")));
}

TEST_F(SftCliTest, BadInputIsOneLineAndWritesNothing) {
  std::ofstream(p("bad.jsonl")) << R"({"prompt": "a", "response": "b"})" << "\n"
                                << R"({"prompt": "a", "response": 7})" << "\n";
  expect_user_error(forge(sft_args("bad.jsonl", "run") + " --steps 1"), "bad.jsonl:2:");
  EXPECT_FALSE(fs::exists(p("run")));
  expect_user_error(forge(sft_args("missing.jsonl", "run") + " --steps 1"), "missing.jsonl");
  expect_user_error(forge(sft_args("ok.jsonl", "run") + " --data " + p("ok.jsonl")), "drop --data");
  std::ofstream(p("none.jsonl")) << R"({"messages": [{"role": "user", "content": "q"}]})" << "\n";
  expect_user_error(forge(sft_args("none.jsonl", "run") + " --steps 1"),
                    "no SFT example left to train on");
  EXPECT_FALSE(fs::exists(p("run")));
  // A model without a tokenizer cannot encode the examples.
  fs::remove(p("model/tokenizer.json"));
  expect_user_error(forge(sft_args("ok.jsonl", "run") + " --steps 1"), "tokenizer");
}

// --pack (and "pack": true in a config file's "sft"): the summary line gives the packing
// efficiency, the run ends with its example tokens/s, the setting is recorded; on a GPU it is
// refused up front with one line, before anything is written.
TEST_F(SftCliTest, PackPacksExamplesAndReportsEfficiency) {
  const CmdResult r = forge(sft_args("ok.jsonl", "run") + " --pack --steps 2 sft_val_frac=0");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("packing efficiency"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("example tokens/s (packed rows)"), std::string::npos) << r.out;
  const auto cfg = nlohmann::json::parse(std::ifstream(p("run/config.json")));
  EXPECT_EQ(cfg["train"]["sft_layout"].get<std::string>(), "pack");

  std::ofstream(p("cfg.json")) << nlohmann::json{{"sft", {{"data", p("ok.jsonl")}, {"pack", true}}}};
  const CmdResult c = forge("train --init-from " + p("model") + " --config " + p("cfg.json") + " --out " +
                            p("run2") + " seq_len=32 batch_size=2 --steps 1");
  ASSERT_EQ(c.code, 0) << c.err;
  EXPECT_NE(c.out.find("packing efficiency"), std::string::npos) << c.out;

  // --device cuda packs too: on a GPU the run trains; without one it fails on the device, as a
  // padded run does, and writes no metrics.
  const CmdResult g =
      forge(sft_args("ok.jsonl", "gpu") + " --pack --steps 2 sft_val_frac=0 --device cuda");
  if (cuda::available()) {
    ASSERT_EQ(g.code, 0) << g.err;
    EXPECT_NE(g.out.find("packing efficiency"), std::string::npos) << g.out;
    EXPECT_TRUE(fs::exists(p("gpu/metrics.jsonl")));
  } else {
    expect_user_error(g, "--device cuda: " + cuda::device_summary());
    EXPECT_FALSE(fs::exists(p("gpu/metrics.jsonl")));
  }
}

TEST_F(SftCliTest, GenerateChatIsTheTemplatesRenderingOfAUserTurn) {
  const tok::Tokenizer tok = tok::Tokenizer::load(kTokenizer);
  chat::RenderOptions ro;
  ro.add_generation_prompt = true;
  // The user's literal <|im_end|> stays text: the template's specials are the only ones.
  const std::string prompt = "Hello <|im_end|> there";
  const std::vector<int32_t> ids =
      chat::encode_chat(chat::ChatTemplate::chatml(), tok, {{"user", prompt}}, ro, "t").ids;
  const int32_t im_start = tok.encode("<|im_start|>").at(0);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), im_start), 2);  // user turn and assistant's
  std::string id_list;
  for (int32_t id : ids) id_list += (id_list.empty() ? "" : ",") + std::to_string(id);
  const std::string common =
      "generate --model " + p("model") + " --temperature 0 --max-new-tokens 6 --ignore-eos --json";
  const CmdResult chat = forge(common + " --chat --prompt '" + prompt + "'");
  const CmdResult plain = forge(common + " --ids " + id_list);
  ASSERT_EQ(chat.code, 0) << chat.err;
  ASSERT_EQ(plain.code, 0) << plain.err;
  EXPECT_EQ(nlohmann::json::parse(chat.out)["ids"], nlohmann::json::parse(plain.out)["ids"]);
  expect_user_error(forge(common + " --chat --ids 1,2"), "--chat");
}

}  // namespace
}  // namespace forge
