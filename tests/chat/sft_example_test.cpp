// SFT examples: the JSONL forms and their errors, and the trained mask: exactly the assistant
// turns (content and the template's end-of-turn text) of multi-turn conversations, on the real
// templates with the test tokenizers.
#include "forge/chat/sft_example.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>

#include "forge/core/error.h"
#include "fuzz_regression.h"

namespace forge::chat {
namespace {

namespace fs = std::filesystem;
const std::string kData = std::string(FORGE_SOURCE_DIR) + "/tests/data";

ChatTemplate model(const std::string& name) {
  return ChatTemplate::load(kData + "/chat/models/" + name);
}

const tok::Tokenizer& bytelevel() {
  static const tok::Tokenizer t = tok::Tokenizer::load(kData + "/chat/tokenizers/bytelevel.json");
  return t;
}
const tok::Tokenizer& sp(const std::string& name) {
  static std::map<std::string, tok::Tokenizer> cache;
  auto it = cache.find(name);
  if (it == cache.end())
    it =
        cache.emplace(name, tok::Tokenizer::load(kData + "/tokenizer/sentencepiece/" + name)).first;
  return it->second;
}

// The text of each run of trained tokens (token bytes concatenated), in order.
std::vector<std::string> trained_runs(const EncodedChat& e, const tok::Tokenizer& tok) {
  std::vector<std::string> runs;
  for (size_t i = 0; i < e.ids.size(); ++i) {
    if (!e.trained[i]) continue;
    if (i == 0 || !e.trained[i - 1]) runs.emplace_back();
    runs.back() += tok.token_bytes(e.ids[i]);
  }
  return runs;
}

const std::vector<Message> kMultiTurn = {{"system", "Answer briefly."},
                                         {"user", "Name a primary colour."},
                                         {"assistant", "Red."},
                                         {"user", "Another one?"},
                                         {"assistant", "Blue <|im_end|> </s> <|eot_id|>"}};

EncodedChat encode(const ChatTemplate& t, const tok::Tokenizer& tok,
                   const std::vector<Message>& m) {
  return encode_sft_example(t, tok, {m, "test"});
}

TEST(SftExampleTest, ChatMLTrainsTheAssistantTurnsAndTheirEndOfTurn) {
  for (const char* name : {"smollm2-135m-instruct", "qwen2.5-7b-instruct"}) {
    SCOPED_TRACE(name);
    const EncodedChat e = encode(model(name), bytelevel(), kMultiTurn);
    ASSERT_EQ(e.trained.size(), e.ids.size());
    EXPECT_EQ(trained_runs(e, bytelevel()),
              (std::vector<std::string>{"Red.<|im_end|>\n",
                                        "Blue <|im_end|> </s> <|eot_id|><|im_end|>\n"}));
    // The assistant's literal "<|im_end|>" is trained as text; the template's is the special id.
    const int32_t im_end = *bytelevel().special_id("<|im_end|>");
    size_t trained_specials = 0;
    for (size_t i = 0; i < e.ids.size(); ++i)
      trained_specials += e.trained[i] && e.ids[i] == im_end;
    EXPECT_EQ(trained_specials, 2u);
  }
}

TEST(SftExampleTest, LlamaTemplatesTrainTheirOwnEndOfTurn) {
  for (const char* name : {"llama-3.1-8b-instruct", "llama-3.2-1b-instruct"}) {
    SCOPED_TRACE(name);
    RenderOptions opt;
    std::tm now{};
    now.tm_year = 124;
    now.tm_mday = 1;
    opt.now = now;
    const EncodedChat e = encode_sft_example(model(name), bytelevel(), {kMultiTurn, "test"}, opt);
    EXPECT_EQ(
        trained_runs(e, bytelevel()),
        (std::vector<std::string>{"Red.<|eot_id|>", "Blue <|im_end|> </s> <|eot_id|><|eot_id|>"}));
  }
  // Llama 2 (SentencePiece-style tokens: token_bytes spells "▁Red" as " Red").
  const EncodedChat e = encode(model("llama-2-7b-chat"), sp("llama2.json"), kMultiTurn);
  EXPECT_EQ(trained_runs(e, sp("llama2.json")),
            (std::vector<std::string>{" Red. </s>", " Blue <|im_end|> </s> <|eot_id|> </s>"}));
}

TEST(SftExampleTest, MistralV01TurnEndsInsideATokenAndTheStraddlingTokenIsTrained) {
  // v0.1 ends an assistant turn with "</s> " and the next user turn starts "[INST]": the space
  // belongs to the answer, but BPE merges it with the "[" after it.
  const std::vector<Message> m = {
      {"user", "A?"}, {"assistant", "B."}, {"user", "C?"}, {"assistant", "D."}};
  const tok::Tokenizer& tok = sp("mistral.json");
  const EncodedChat e = encode(model("mistral-7b-instruct-v0.1"), tok, m);
  EXPECT_EQ(e.text.text(), "<s>[INST] A? [/INST]B.</s> [INST] C? [/INST]D.</s> ");
  const std::vector<std::string> runs = trained_runs(e, tok);
  ASSERT_EQ(runs.size(), 2u);
  EXPECT_TRUE(runs[0].starts_with("B.</s> ")) << runs[0];  // " [" or " " + more, by the merges
  EXPECT_LE(runs[0].size(), std::string("B.</s> [").size()) << runs[0];
  EXPECT_EQ(runs[1], "D.</s> ");
}

TEST(SftExampleTest, TemplatesThatAreNotPrefixStableAreRefused) {
  // Mistral v0.3 puts the system message into the last user turn only: the prompt of turn 2
  // (which has it) is not a prefix of the rendering with the answer (which has not).
  const tok::Tokenizer tok = tok::Tokenizer::load(kData + "/chat/tokenizers/mistral_v3.json");
  try {
    encode_sft_example(model("mistral-7b-instruct-v0.3"), tok, {kMultiTurn, "data.jsonl:7"});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("data.jsonl:7: assistant message 2: "), std::string::npos)
        << e.what();
  }
  // Without a system message it is prefix-stable, and the turns are "[/INST]" + " D.</s>".
  const std::vector<Message> m = {
      {"user", "A?"}, {"assistant", "B."}, {"user", "C?"}, {"assistant", "D."}};
  const EncodedChat e = encode(model("mistral-7b-instruct-v0.3"), tok, m);
  EXPECT_EQ(trained_runs(e, tok), (std::vector<std::string>{" B.</s>", " D.</s>"}));
  // A template's own exception names the example.
  try {
    encode_sft_example(model("mistral-7b-instruct-v0.1"), tok, {kMultiTurn, "data.jsonl:9"});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("data.jsonl:9: "), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("raise_exception: Conversation roles must alternate"),
              std::string::npos);
  }
}

TEST(SftExampleTest, PromptResponseIsUserThenAssistant) {
  const SftExample ex = parse_sft_line(R"({"prompt": "Hi", "response": "Hello!", "id": 3})", "f:1");
  ASSERT_EQ(ex.messages.size(), 2u);
  EXPECT_EQ(ex.messages[0].role, "user");
  EXPECT_EQ(ex.messages[1].content, "Hello!");
  const EncodedChat e = encode_sft_example(model("smollm2-135m-instruct"), bytelevel(), ex);
  EXPECT_EQ(trained_runs(e, bytelevel()), (std::vector<std::string>{"Hello!<|im_end|>\n"}));
  // The ids are those of the whole render (no special text in the messages).
  EXPECT_EQ(e.ids, bytelevel().encode(e.text.text()));
}

TEST(SftExampleTest, BadLinesNameTheLineAndTheProblem) {
  const std::pair<const char*, const char*> bad[] = {
      {"{not json", "f.jsonl:4: not valid JSON"},
      {"[1, 2]", "f.jsonl:4: expected a JSON object, got array"},
      {R"({"text": "x"})",
       R"(f.jsonl:4: expected {"prompt": ..., "response": ...} or {"messages": [...]})"},
      {R"({"prompt": "x"})", R"(f.jsonl:4: the example has no "response")"},
      {R"({"prompt": 1, "response": "y"})",
       R"(f.jsonl:4: the example: "prompt" must be a string, got number)"},
      {R"({"prompt": "x", "response": "y", "messages": []})", "has both \"messages\" and"},
      {R"({"messages": []})", R"("messages" must be a non-empty array)"},
      {R"({"messages": "hi"})", R"("messages" must be a non-empty array, got string)"},
      {R"({"messages": ["hi"]})", "f.jsonl:4: messages[0] must be an object, got string"},
      {R"({"messages": [{"content": "x"}]})", R"(f.jsonl:4: messages[0] has no "role")"},
      {R"({"messages": [{"role": "bot", "content": "x"}]})",
       "f.jsonl:4: messages[0]: unknown role 'bot' (expected system, user or assistant)"},
      {R"({"messages": [{"role": "user", "content": ["x"]}]})",
       R"(f.jsonl:4: messages[0]: "content" must be a string, got array)"},
      {R"({"messages": [{"role": "user", "content": "x"}]})", "f.jsonl:4: no assistant message"},
  };
  for (const auto& [line, want] : bad) {
    try {
      parse_sft_line(line, "f.jsonl:4");
      ADD_FAILURE() << "accepted: " << line;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
      EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
    }
  }
  // A conversation to generate from may end without an assistant turn when asked.
  EXPECT_EQ(parse_sft_line(R"({"messages": [{"role": "user", "content": "x"}]})", "f", false)
                .messages.size(),
            1u);
}

// Found by fuzz/fuzz_sft: a role holding a newline ("syst\nem") was printed raw, so the
// unknown-role error took two lines.
TEST(SftExampleTest, FuzzFindingRoleWithANewlineStaysOneLine) {
  const std::string path = std::string(FORGE_SOURCE_DIR) + "/fuzz/regressions/sft-role_newline";
  testing::expect_one_line_error([&] { read_sft_jsonl(path); },
                                 {path + ":1: messages[0]: unknown role 'syst\\x0aem'"});
}

TEST(SftExampleTest, ReadsAFileSkippingBlankLinesAndNamesTheBadLine) {
  const fs::path path = fs::temp_directory_path() / str("forge_sft_", ::getpid(), ".jsonl");
  std::ofstream(path)
      << R"({"prompt": "a", "response": "b"})"
      << "\n\n   \n"
      << R"({"messages": [{"role": "user", "content": "c"}, {"role": "assistant", "content": "d"}]})"
      << "\r\n"
      << R"({"prompt": "e"})"
      << "\n";
  try {
    read_sft_jsonl(path.string());
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), path.string() + R"(:5: the example has no "response")");
  }
  std::ofstream(path)
      << R"({"prompt": "a", "response": "b"})"
      << "\n\n"
      << R"({"messages": [{"role": "user", "content": "c"}, {"role": "assistant", "content": "d"}]})";
  const std::vector<SftExample> all = read_sft_jsonl(path.string());
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[1].where, path.string() + ":3");
  EXPECT_EQ(all[1].messages[1].content, "d");
  fs::remove(path);
  try {
    read_sft_jsonl(path.string());
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), path.string() + ": no such file or not readable");
  }
}

}  // namespace
}  // namespace forge::chat
