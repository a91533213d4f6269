// A model's chat template: how a conversation (system / user / assistant messages) becomes the
// text the model was trained on, rendered as transformers' apply_chat_template renders it
// (chat/jinja.h), with every byte knowing whether the template or a message wrote it.
//
// Where the template comes from (ChatTemplate::load, as transformers reads a model directory):
//   1. chat_template.jinja (transformers 5 saves the template there; it wins over 2);
//   2. tokenizer_config.json "chat_template": a string, or a list of {"name", "template"} of
//      which the one named "default" is used;
//   3. a built-in one, for models without a template:
//        - ChatML (<|im_start|>role\n...<|im_end|>\n) when the tokenizer has <|im_start|> among
//          its added tokens (SmolLM, Qwen and the models fine-tuned from them),
//        - else the Llama-2 [INST] format (Llama 2 chat's own template) when the beginning-of-
//          sequence token is <s> (Llama 1/2, Mistral and other SentencePiece models),
//        - else ChatML, transformers' historical default (GPT-2-style tokenizers; a Forge-trained
//          tokenizer). Its <|im_start|> is then plain text unless the tokenizer defines it.
// The template sees messages, add_generation_prompt, tools and documents (none), and the
// tokenizer's bos_token, eos_token, unk_token and pad_token (tokenizer_config.json, as a
// string or an AddedToken object, else special_tokens_map.json). Those tokens are the model's
// configuration, not data: like the template's literal text, they may encode to special ids.
#pragma once

#include <ctime>
#include <optional>
#include <string>
#include <vector>

#include "forge/chat/jinja.h"
#include "forge/chat/tainted_string.h"

namespace forge::chat {

struct Message {
  std::string role;  // "system", "user" or "assistant"
  std::string content;
};

// The named tokens a template may use; unset ones are undefined in the template.
struct TemplateTokens {
  std::optional<std::string> bos, eos, unk, pad;
};

struct RenderOptions {
  bool add_generation_prompt = false;  // end with the opening of an assistant turn
  std::optional<std::tm> now;          // strftime_now's time (tests pin it); default: now
};

class ChatTemplate {
 public:
  // Throws forge::Error naming the file for an unreadable or malformed tokenizer_config.json
  // or chat_template.jinja, a list of templates without "default", or a template that does not
  // parse ("DIR/tokenizer_config.json chat_template line 3: ...").
  static ChatTemplate load(const std::string& model_dir);
  // `name` prefixes error messages ("chat template line 3: ..."); `origin` says where it came
  // from, for people (description()).
  static ChatTemplate from_source(const std::string& source, TemplateTokens tokens,
                                  std::string name = "chat template", std::string origin = "");
  static ChatTemplate chatml(TemplateTokens tokens = {});
  static ChatTemplate llama2(TemplateTokens tokens);

  // The conversation rendered; message i's role and content are data of origin i.
  // Throws forge::Error for what the template raises or cannot do with the messages.
  TaintedString render(const std::vector<Message>& messages, const RenderOptions& opt = {}) const;

  const std::string& source() const { return source_; }
  // Where it came from: "DIR/tokenizer_config.json", "built-in ChatML (DIR has no chat template)".
  const std::string& description() const { return description_; }
  const TemplateTokens& tokens() const { return tokens_; }

 private:
  std::string source_, description_;
  TemplateTokens tokens_;
  jinja::Template template_;
};

// What the template writes after an assistant message's content to end the turn, without the
// whitespace around it: "<|im_end|>" (ChatML), "<|eot_id|>" (Llama 3), "</s>" (Llama 2,
// Mistral). Found by rendering a user turn and an assistant turn and taking the text after the
// assistant's content. "" when the template writes nothing there or cannot render that
// conversation. Generation for a chat (forge generate --chat) stops at it.
std::string assistant_turn_end(const ChatTemplate& tmpl);

// transformers' ChatML default and Llama 2 chat's template, as the built-ins use them.
extern const char* const kChatMLTemplate;
extern const char* const kLlama2Template;

}  // namespace forge::chat
