// forge chat-template as a user meets it: the rendered text on stdout (as jinja2 renders it),
// the token table with the trained column, one-line errors naming the file and line, --help.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli_runner.h"
#include "testing.h"

namespace forge {
namespace {

namespace fs = std::filesystem;
using testing::CmdResult;
const std::string kData = std::string(FORGE_SOURCE_DIR) + "/tests/data";

class ChatTemplateCli : public testing::CliTest {
 protected:
  void SetUp() override {
    CliTest::SetUp();
    fs::create_directories(dir_ / "model");
    // Qwen2.5's template with the test byte-level tokenizer.
    fs::copy_file(kData + "/chat/models/qwen2.5-7b-instruct/tokenizer_config.json",
                  dir_ / "model" / "tokenizer_config.json");
    fs::copy_file(kData + "/chat/tokenizers/bytelevel.json", dir_ / "model" / "tokenizer.json");
  }

  std::string golden_text(const std::string& model, const std::string& conv, bool agp) {
    std::ifstream f(kData + "/chat/golden_renders.json");
    const nlohmann::json g = nlohmann::json::parse(f);
    for (const auto& c : g["cases"])
      if (c["model"] == model && c["conversation"] == conv && c["add_generation_prompt"] == agp)
        return c["text"];
    ADD_FAILURE() << "no golden case " << model << " " << conv;
    return "";
  }
};

TEST_F(ChatTemplateCli, PrintsTheRenderAsJinja2Does) {
  CmdResult r = forge("chat-template --model " + p("model") +
                      " --prompt 'Hello, how are you?' --add-generation-prompt");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, golden_text("qwen2.5-7b-instruct", "user_only", true));
  EXPECT_NE(r.err.find("tokenizer_config.json"), std::string::npos) << r.err;

  write(
      "conv.jsonl",
      R"({"messages": [{"role": "user", "content": "What is 2 + 2?"}, {"role": "assistant", "content": "2 + 2 = 4."}]})"
      "\n");
  r = forge("chat-template --model " + p("model") + " --messages " + p("conv.jsonl"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, golden_text("qwen2.5-7b-instruct", "one_turn", false));
}

TEST_F(ChatTemplateCli, TokensShowWhatIsTrainedAndKeepMessageSpecialsAsText) {
  write("conv.jsonl", R"({"prompt": "Say <|im_end|>", "response": "No."})"
                      "\n\n"
                      R"({"messages": [{"role": "user", "content": "Hi"}]})"
                      "\n");
  const CmdResult r =
      forge("chat-template --model " + p("model") + " --messages " + p("conv.jsonl") + " --tokens");
  ASSERT_EQ(r.code, 0) << r.err;
  // Two conversations, each under its FILE:LINE header; the second has no assistant turn.
  EXPECT_NE(r.out.find("==> " + p("conv.jsonl") + ":1 <=="), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("==> " + p("conv.jsonl") + ":3 <=="), std::string::npos) << r.out;
  std::istringstream lines(r.out);
  std::string line, trained_text;
  int specials = 0, summaries = 0, yes = 0;
  bool second = false;
  while (std::getline(lines, line)) {
    if (line.find(":3 <==") != std::string::npos) second = true;
    if (line.find(" tokens, ") != std::string::npos) {
      ++summaries;
      EXPECT_NE(line.find(", " + std::to_string(second ? 0 : yes) + " trained"), std::string::npos)
          << line;
    }
    if (!second && line.find("\"<|im_end|>\" (special)") != std::string::npos) ++specials;
    if (line.find(" yes  ") != std::string::npos) {
      EXPECT_FALSE(second) << line;
      ++yes;
      const std::string quoted = line.substr(line.find(" yes  ") + 6);
      trained_text +=
          nlohmann::json::parse(quoted.substr(0, quoted.rfind('"') + 1)).get<std::string>();
    }
  }
  EXPECT_EQ(summaries, 2);
  EXPECT_EQ(specials, 3);  // system, user and assistant turns end with the template's <|im_end|>
  EXPECT_EQ(trained_text, "No.<|im_end|>\n");
}

TEST_F(ChatTemplateCli, BadInputIsOneLineNamingTheProblem) {
  expect_user_error(forge("chat-template --model " + p("model")),
                    "give one of --messages FILE or --prompt TEXT");
  write("bad.jsonl", R"({"prompt": "a", "response": "b"})"
                     "\n"
                     R"({"messages": [{"role": "robot", "content": "x"}]})"
                     "\n");
  expect_user_error(forge("chat-template --model " + p("model") + " --messages " + p("bad.jsonl")),
                    p("bad.jsonl") + ":2: messages[0]: unknown role 'robot'");
  expect_user_error(forge("chat-template --model " + p("nowhere") + " --prompt hi"),
                    "nowhere: not a directory");
  write("model/tokenizer_config.json",
        R"({"chat_template": "{% for m in messages %}{{ m.content }}"})");
  expect_user_error(forge("chat-template --model " + p("model") + " --prompt hi"),
                    "tokenizer_config.json chat_template line 1: unexpected end of template");
  write("model/tokenizer_config.json",
        R"({"chat_template": "{{ raise_exception('only ' + messages[0].role + 's here') }}"})");
  expect_user_error(
      forge("chat-template --model " + p("model") + " --prompt hi"),
      "--prompt: " + p("model") +
          "/tokenizer_config.json chat_template line 1: raise_exception: only users here");
}

TEST_F(ChatTemplateCli, Help) {
  const CmdResult r = forge("chat-template --help");
  EXPECT_EQ(r.code, 0);
  EXPECT_NE(r.out.find("--add-generation-prompt"), std::string::npos);
  EXPECT_NE(r.out.find("--tokens"), std::string::npos);
}

}  // namespace
}  // namespace forge
