// The real chat templates (tests/data/chat/models) against Python jinja2's renders, byte for
// byte, and their ids under the special-tokens-only-from-the-template rule against ids computed
// with Hugging Face `tokenizers` (tools/make_chat_template_golden.py); how a model directory's
// template is found; the built-ins.
#include "forge/chat/chat_template.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "forge/chat/chat_encode.h"
#include "forge/core/error.h"
#include "forge/tokenizer/tokenizer.h"

namespace forge::chat {
namespace {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

const std::string kData = std::string(FORGE_SOURCE_DIR) + "/tests/data";

ojson load_json(const std::string& path) {
  std::ifstream f(path);
  EXPECT_TRUE(f.good()) << path;
  return ojson::parse(f);
}

std::tm golden_now() {  // the script pins strftime_now to 2024-09-05 12:00:00
  std::tm tm{};
  tm.tm_year = 2024 - 1900;
  tm.tm_mon = 8;
  tm.tm_mday = 5;
  tm.tm_hour = 12;
  tm.tm_wday = 4;
  tm.tm_yday = 248;
  return tm;
}

std::vector<Message> messages_of(const ojson& conv) {
  std::vector<Message> out;
  for (const ojson& m : conv) out.push_back({m["role"], m["content"]});
  return out;
}

const tok::Tokenizer& tokenizer(const std::string& name) {
  static std::map<std::string, tok::Tokenizer> cache;
  const std::map<std::string, std::string> paths = {
      {"bytelevel", kData + "/chat/tokenizers/bytelevel.json"},
      {"mistral_v3", kData + "/chat/tokenizers/mistral_v3.json"},
      {"llama2", kData + "/tokenizer/sentencepiece/llama2.json"},
      {"mistral", kData + "/tokenizer/sentencepiece/mistral.json"}};
  auto it = cache.find(name);
  if (it == cache.end()) it = cache.emplace(name, tok::Tokenizer::load(paths.at(name))).first;
  return it->second;
}

std::string first_mismatch(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  size_t i = 0;
  while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
  if (i == a.size() && i == b.size()) return "";
  return str("first difference at token ", i, " of ", a.size(), " / ", b.size(), ": ",
             i < a.size() ? a[i] : -1, " vs ", i < b.size() ? b[i] : -1);
}

TEST(ChatTemplateTest, RealTemplatesRenderAsJinja2AndEncodeAsReference) {
  const ojson golden = load_json(kData + "/chat/golden_renders.json");
  int texts = 0, errors = 0, with_specials_in_data = 0;
  for (const ojson& c : golden["cases"]) {
    const std::string model = c["model"], conv = c["conversation"];
    const bool agp = c["add_generation_prompt"];
    SCOPED_TRACE(str(model, " / ", conv, " / add_generation_prompt=", agp));
    const ChatTemplate tmpl = ChatTemplate::load(kData + "/chat/models/" + model);
    const std::vector<Message> msgs = messages_of(golden["conversations"][conv]);
    RenderOptions opt;
    opt.add_generation_prompt = agp;
    opt.now = golden_now();
    if (c.contains("error")) {
      ++errors;
      try {
        tmpl.render(msgs, opt);
        ADD_FAILURE() << "jinja2 raised '" << c["error"].get<std::string>() << "', Forge rendered";
      } catch (const Error& e) {
        const std::string what = e.what();
        EXPECT_NE(what.find(c["error"].get<std::string>()), std::string::npos) << what;
        EXPECT_NE(what.find("tokenizer_config.json chat_template line "), std::string::npos)
            << what;
        EXPECT_EQ(what.find('\n'), std::string::npos) << what;
      }
      continue;
    }
    ++texts;
    const TaintedString text = tmpl.render(msgs, opt);
    ASSERT_EQ(text.text(), c["text"].get<std::string>());

    const tok::Tokenizer& tok = tokenizer(c["tokenizer"]);
    const std::vector<int32_t> want = c["ids"].get<std::vector<int32_t>>();
    const std::vector<int32_t> got = encode_rendered(tok, text).ids;
    EXPECT_EQ(got, want) << first_mismatch(got, want);
    bool specials_in_data = false;
    for (const Message& m : msgs)
      for (const tok::SpecialToken& sp : tok.specials())
        specials_in_data |= m.content.find(sp.text) != std::string::npos;
    if (specials_in_data) {
      ++with_specials_in_data;
      EXPECT_NE(got, tok.encode(text.text())) << "a message's special-token text became the token";
    } else {
      EXPECT_EQ(got, tok.encode(text.text()))
          << "without special text in messages the rule is encode()";
    }
  }
  EXPECT_EQ(texts + errors, 140);
  EXPECT_GT(errors, 5);
  EXPECT_GE(with_specials_in_data, 14);
}

// Model directories made in a temporary directory.
class ChatTemplateDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           str("forge_chat_", ::getpid(), "_",
               ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  void write(const std::string& name, const std::string& text) {
    std::ofstream(dir_ / name) << text;
  }
  std::string dir() const { return dir_.string(); }
  std::string error_of(const std::function<void()>& fn) {
    try {
      fn();
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  }
  fs::path dir_;
};

const std::vector<Message> kHello = {{"user", "Hi"}};

TEST_F(ChatTemplateDirTest, ListOfTemplatesUsesDefault) {
  write("tokenizer_config.json", R"({"chat_template": [
      {"name": "tool_use", "template": "TOOLS"},
      {"name": "default", "template": "{{ bos_token }}{{ messages[0].content }}{{ eos_token }}"}],
    "bos_token": {"__type": "AddedToken", "content": "<B>"}, "eos_token": "<E>"})");
  EXPECT_EQ(ChatTemplate::load(dir()).render(kHello).text(), "<B>Hi<E>");

  write("tokenizer_config.json", R"({"chat_template": [{"name": "tool_use", "template": "x"},
      {"name": "rag", "template": "y"}]})");
  const std::string e = error_of([&] { ChatTemplate::load(dir()); });
  EXPECT_NE(e.find("no template named 'default' (has: tool_use, rag)"), std::string::npos) << e;
}

TEST_F(ChatTemplateDirTest, ChatTemplateJinjaWinsAndSpecialTokensMapFillsIn) {
  write("tokenizer_config.json", R"({"chat_template": "config"})");
  write("chat_template.jinja", "file {{ eos_token }}\n");
  write("special_tokens_map.json", R"({"eos_token": {"content": "</s>"}})");
  EXPECT_EQ(ChatTemplate::load(dir()).render(kHello).text(), "file </s>");
}

TEST_F(ChatTemplateDirTest, BuiltInsForModelsWithoutATemplate) {
  // ChatML when <|im_start|> is an added token (tokenizer_config.json's added_tokens_decoder).
  write("tokenizer_config.json",
        R"({"added_tokens_decoder": {"0": {"content": "<|im_start|>"}}, "bos_token": "<s>"})");
  ChatTemplate t = ChatTemplate::load(dir());
  EXPECT_NE(t.description().find("built-in ChatML"), std::string::npos);
  RenderOptions gen;
  gen.add_generation_prompt = true;
  EXPECT_EQ(
      t.render({{"system", "S"}, {"user", "Hi"}}, gen).text(),
      "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");

  // Llama 2 [INST] when the beginning-of-sequence token is <s>.
  write("tokenizer_config.json", R"({"bos_token": "<s>", "eos_token": "</s>"})");
  t = ChatTemplate::load(dir());
  EXPECT_NE(t.description().find("built-in Llama 2"), std::string::npos);
  EXPECT_EQ(t.render({{"system", "S"}, {"user", " Hi "}, {"assistant", "Yo"}}).text(),
            "<s>[INST] <<SYS>>\nS\n<</SYS>>\n\n Hi [/INST] Yo </s>");

  // ChatML otherwise (a GPT-2-style tokenizer, or no tokenizer files at all).
  fs::remove(dir_ / "tokenizer_config.json");
  write("tokenizer.json", R"({"added_tokens": [{"id": 0, "content": "<|endoftext|>"}]})");
  EXPECT_EQ(ChatTemplate::load(dir()).render(kHello).text(), "<|im_start|>user\nHi<|im_end|>\n");
}

// What each model's template closes an assistant turn with, from the templates' own text (and
// the models' eos_token): forge generate --chat stops there.
TEST(ChatTemplateTest, AssistantTurnEndIsTheTemplatesEndOfTurnText) {
  const std::pair<const char*, const char*> cases[] = {
      {"smollm2-135m-instruct", "<|im_end|>"}, {"qwen2.5-7b-instruct", "<|im_end|>"},
      {"llama-3.1-8b-instruct", "<|eot_id|>"}, {"llama-3.2-1b-instruct", "<|eot_id|>"},
      {"llama-2-7b-chat", "</s>"},            {"mistral-7b-instruct-v0.1", "</s>"},
      {"mistral-7b-instruct-v0.3", "</s>"}};
  for (const auto& [model, end] : cases)
    EXPECT_EQ(assistant_turn_end(ChatTemplate::load(kData + "/chat/models/" + model)), end)
        << model;
  EXPECT_EQ(assistant_turn_end(ChatTemplate::chatml()), "<|im_end|>");
  EXPECT_EQ(assistant_turn_end(ChatTemplate::from_source("{{ messages[0].content }}", {})), "");
  EXPECT_EQ(assistant_turn_end(ChatTemplate::from_source("{{ raise_exception('no') }}", {})), "");
}

TEST(ChatTemplateTest, BuiltInLlama2IsLlama2ChatsTemplate) {
  const ojson golden = load_json(kData + "/chat/golden_renders.json");
  const ChatTemplate builtin = ChatTemplate::llama2({"<s>", "</s>", {}, {}});
  int n = 0;
  for (const ojson& c : golden["cases"]) {
    if (c["model"] != "llama-2-7b-chat" || !c.contains("text")) continue;
    RenderOptions opt;
    opt.add_generation_prompt = c["add_generation_prompt"];
    EXPECT_EQ(
        builtin
            .render(messages_of(golden["conversations"][c["conversation"].get<std::string>()]), opt)
            .text(),
        c["text"].get<std::string>());
    ++n;
  }
  EXPECT_GT(n, 10);
}

TEST_F(ChatTemplateDirTest, BadFilesAreOneLineErrorsNamingTheFile) {
  write("tokenizer_config.json", "{not json");
  std::string e = error_of([&] { ChatTemplate::load(dir()); });
  EXPECT_NE(e.find("tokenizer_config.json: not valid JSON"), std::string::npos) << e;

  write("tokenizer_config.json", R"({"chat_template": 5})");
  e = error_of([&] { ChatTemplate::load(dir()); });
  EXPECT_NE(e.find("chat_template: expected a string or a list"), std::string::npos) << e;

  write("tokenizer_config.json",
        R"({"chat_template": "ok\n{% for m in messages %}\n{{ m | bogus }}"})");
  e = error_of([&] { ChatTemplate::load(dir()); });
  EXPECT_NE(e.find("tokenizer_config.json chat_template line 3: no filter named 'bogus'"),
            std::string::npos)
      << e;

  write("tokenizer_config.json", R"({"eos_token": 7})");
  e = error_of([&] { ChatTemplate::load(dir()); });
  EXPECT_NE(e.find("eos_token: expected a token"), std::string::npos) << e;

  write("tokenizer_config.json",
        R"({"chat_template": "a\n\n{{ raise_exception('no ' ~ messages|length) }}"})");
  e = error_of([&] { ChatTemplate::load(dir()).render(kHello); });
  EXPECT_EQ(e, dir() + "/tokenizer_config.json chat_template line 3: raise_exception: no 1");
  EXPECT_EQ(error_of([&] { ChatTemplate::load(dir() + "/missing"); }),
            dir() + "/missing: not a directory");
}

}  // namespace
}  // namespace forge::chat
