// forge chat-template: what a model's chat template makes of a conversation, and with --tokens
// the ids the model sees and which of them supervised fine-tuning trains on.
//
// Decisions: stdout carries exactly the rendered text (no newline added), so it can be piped
// and compared; the template's origin goes to stderr once everything rendered. Several conversations (--messages with
// more than one line) are each preceded by a "==> FILE:LINE <==" line. Token texts are printed
// JSON-quoted (a token can end inside a UTF-8 character; such bytes show as U+FFFD).
#include <cstdio>
#include <optional>
#include <nlohmann/json.hpp>

#include "args.h"
#include "commands.h"
#include "forge/chat/chat_template.h"
#include "forge/chat/sft_example.h"
#include "forge/core/error.h"
#include "forge/tokenizer/tokenizer.h"

namespace forge::cli {

namespace {

const Command kChatTemplate = {
    "chat-template",
    "render a model's chat template for a conversation (and its tokens)",
    {{"model", "DIR",
      "model directory (tokenizer_config.json / chat_template.jinja, tokenizer.json)"},
     {"messages", "FILE",
      "JSONL: {\"prompt\", \"response\"} or {\"messages\": [{\"role\", \"content\"}]}"},
     {"prompt", "TEXT", "one user message"},
     {"add-generation-prompt", "", "end with the opening of an assistant turn"},
     {"tokens", "", "print the ids (index, id, trained, token text) instead of the text"}},
    false,
    "",
    "Give --messages or --prompt. Special tokens come only from the template: a message that\n"
    "contains \"<|im_end|>\" is encoded as that text, not as the special token. Trained tokens "
    "are\n"
    "those of the assistant turns (their content and the end-of-turn tokens after it), what\n"
    "supervised fine-tuning takes the loss on. Templates without one get a built-in: ChatML, or\n"
    "Llama 2's [INST] format when the beginning-of-sequence token is <s>."};

void write_stdout(const std::string& s) {
  std::fwrite(s.data(), 1, s.size(), stdout);
}

std::string quoted(std::string_view bytes) {
  return nlohmann::json(std::string(bytes))
      .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

void print_tokens(const chat::EncodedChat& enc, const tok::Tokenizer& tok) {
  std::printf("%6s %8s %8s  %s\n", "index", "id", "trained", "token");
  size_t trained = 0;
  for (size_t i = 0; i < enc.ids.size(); ++i) {
    const int32_t id = enc.ids[i];
    trained += enc.trained[i];
    std::printf("%6zu %8d %8s  %s%s\n", i, id, enc.trained[i] ? "yes" : "-",
                quoted(tok.token_bytes(id)).c_str(), tok.is_special(id) ? " (special)" : "");
  }
  std::printf("%zu tokens, %zu trained\n", enc.ids.size(), trained);
}

}  // namespace

int cmd_chat_template(const Argv& argv) {
  const Args a = parse_args(kChatTemplate, argv);
  if (a.help()) {
    print_help(kChatTemplate);
    return 0;
  }
  const std::string dir = a.require("model");
  if (a.has("messages") == a.has("prompt"))
    throw Error("give one of --messages FILE or --prompt TEXT");
  std::vector<chat::SftExample> convs;
  if (a.has("prompt")) {
    convs.push_back({{{"user", a.get("prompt")}}, "--prompt"});
  } else {
    const std::string path = a.get("messages");
    convs = chat::read_sft_jsonl(path, false);
    if (convs.empty()) throw Error(str(path, ": no conversation in the file"));
  }

  const chat::ChatTemplate tmpl = chat::ChatTemplate::load(dir);
  std::optional<tok::Tokenizer> tok;
  if (a.has("tokens")) tok = tok::Tokenizer::load(dir);
  chat::RenderOptions opt;
  opt.add_generation_prompt = a.has("add-generation-prompt");
  for (const chat::SftExample& conv : convs) {
    if (convs.size() > 1) std::printf("==> %s <==\n", conv.where.c_str());
    if (tok) {
      print_tokens(chat::encode_chat(tmpl, *tok, conv.messages, opt, conv.where), *tok);
    } else {
      try {
        write_stdout(tmpl.render(conv.messages, opt).text());
      } catch (const Error& e) {
        throw Error(str(conv.where, ": ", e.what()));
      }
      if (convs.size() > 1) write_stdout("\n");
    }
  }
  std::fflush(stdout);
  // After the output: a failure is then the only line on stderr.
  std::fprintf(stderr, "template: %s\n", tmpl.description().c_str());
  return 0;
}

}  // namespace forge::cli
