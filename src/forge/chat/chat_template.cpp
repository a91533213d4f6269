#include "forge/chat/chat_template.h"

#include <filesystem>
#include <nlohmann/json.hpp>

#include "forge/core/error.h"
#include "forge/io/model_files.h"

namespace forge::chat {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

// transformers' default before templates were required (PreTrainedTokenizerBase's ChatML).
const char* const kChatMLTemplate =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\\n' }}{% endif %}";

// meta-llama/Llama-2-7b-chat-hf's tokenizer_config.json chat_template.
const char* const kLlama2Template =
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
    "{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}"
    "{% set system_message = false %}{% endif %}{% for message in loop_messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{% endif %}{% if loop.index0 == 0 and system_message != false %}"
    "{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}"
    "{% else %}{% set content = message['content'] %}{% endif %}{% if message['role'] == 'user' %}"
    "{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}"
    "{% endif %}{% endfor %}";

namespace {

ojson read_json(const std::string& path) {
  const std::string text = io::read_file(path);
  try {
    return ojson::parse(text);
  } catch (const ojson::exception& e) {
    throw Error(str(path, ": not valid JSON: ", e.what()));
  }
}

// A token entry: "</s>", {"content": "</s>", ...} (an AddedToken), or null / absent.
std::optional<std::string> token_entry(const ojson& cfg, const char* key, const std::string& path) {
  if (!cfg.is_object() || !cfg.contains(key) || cfg[key].is_null()) return std::nullopt;
  const ojson& v = cfg[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string())
    return v["content"].get<std::string>();
  throw Error(str(path, ": ", key, ": expected a token (a string or {\"content\": ...}), got ",
                  v.type_name()));
}

TemplateTokens read_tokens(const ojson& cfg, const std::string& path, const ojson& map,
                           const std::string& map_path) {
  TemplateTokens t;
  std::optional<std::string>* slots[] = {&t.bos, &t.eos, &t.unk, &t.pad};
  const char* keys[] = {"bos_token", "eos_token", "unk_token", "pad_token"};
  for (int i = 0; i < 4; ++i) {
    *slots[i] = token_entry(cfg, keys[i], path);
    if (!*slots[i]) *slots[i] = token_entry(map, keys[i], map_path);
  }
  return t;
}

// Whether the tokenizer has `text` among its added tokens (tokenizer_config.json's
// added_tokens_decoder, else tokenizer.json's added_tokens).
bool has_added_token(const std::string& dir, const ojson& cfg, const std::string& text) {
  if (cfg.is_object() && cfg.contains("added_tokens_decoder") &&
      cfg["added_tokens_decoder"].is_object()) {
    for (const auto& [id, tok] : cfg["added_tokens_decoder"].items())
      if (tok.is_object() && tok.value("content", "") == text) return true;
    return false;
  }
  const std::string path = dir + "/tokenizer.json";
  if (!fs::exists(path)) return false;
  const ojson tj = read_json(path);
  if (!tj.is_object() || !tj.contains("added_tokens") || !tj["added_tokens"].is_array())
    return false;
  for (const ojson& tok : tj["added_tokens"])
    if (tok.is_object() && tok.value("content", "") == text) return true;
  return false;
}

}  // namespace

ChatTemplate ChatTemplate::from_source(const std::string& source, TemplateTokens tokens,
                                       std::string name, std::string origin) {
  ChatTemplate t;
  t.template_ = jinja::Template::parse(source, std::move(name));
  t.source_ = source;
  t.tokens_ = std::move(tokens);
  t.description_ = origin.empty() ? t.template_.name() : std::move(origin);
  return t;
}

ChatTemplate ChatTemplate::chatml(TemplateTokens tokens) {
  return from_source(kChatMLTemplate, std::move(tokens), "built-in ChatML template",
                     "built-in ChatML");
}

ChatTemplate ChatTemplate::llama2(TemplateTokens tokens) {
  return from_source(kLlama2Template, std::move(tokens), "built-in Llama 2 template",
                     "built-in Llama 2 [INST]");
}

ChatTemplate ChatTemplate::load(const std::string& model_dir) {
  if (!fs::is_directory(model_dir)) throw Error(str(model_dir, ": not a directory"));
  const std::string cfg_path = model_dir + "/tokenizer_config.json";
  const std::string map_path = model_dir + "/special_tokens_map.json";
  const std::string jinja_path = model_dir + "/chat_template.jinja";
  const ojson cfg = fs::exists(cfg_path) ? read_json(cfg_path) : ojson::object();
  if (!cfg.is_object())
    throw Error(str(cfg_path, ": expected a JSON object, got ", cfg.type_name()));
  const ojson map = fs::exists(map_path) ? read_json(map_path) : ojson::object();
  const TemplateTokens tokens = read_tokens(cfg, cfg_path, map, map_path);

  if (fs::exists(jinja_path))
    return from_source(io::read_file(jinja_path), tokens, jinja_path, jinja_path);
  if (cfg.contains("chat_template") && !cfg["chat_template"].is_null()) {
    const ojson& ct = cfg["chat_template"];
    const std::string name = cfg_path + " chat_template";
    if (ct.is_string()) return from_source(ct.get<std::string>(), tokens, name, cfg_path);
    if (!ct.is_array())
      throw Error(str(cfg_path,
                      ": chat_template: expected a string or a list of {\"name\", "
                      "\"template\"}, got ",
                      ct.type_name()));
    std::string names;
    for (const ojson& entry : ct) {
      if (!entry.is_object() || !entry.contains("name") || !entry["name"].is_string() ||
          !entry.contains("template") || !entry["template"].is_string())
        throw Error(str(cfg_path,
                        ": chat_template: every entry of the list must be {\"name\": "
                        "string, \"template\": string}"));
      const std::string n = entry["name"].get<std::string>();
      if (n == "default")
        return from_source(entry["template"].get<std::string>(), tokens, name + " 'default'",
                           cfg_path);
      names += (names.empty() ? "" : ", ") + n;
    }
    throw Error(str(cfg_path, ": chat_template: no template named 'default' (has: ", names, ")"));
  }
  const std::string why = str(" (", model_dir, " has no chat template)");
  if (has_added_token(model_dir, cfg, "<|im_start|>")) {
    ChatTemplate t = chatml(tokens);
    t.description_ += why;
    return t;
  }
  if (tokens.bos == "<s>") {
    TemplateTokens t2 = tokens;
    if (!t2.eos) t2.eos = "</s>";
    ChatTemplate t = llama2(t2);
    t.description_ += why;
    return t;
  }
  ChatTemplate t = chatml(tokens);
  t.description_ += why;
  return t;
}

TaintedString ChatTemplate::render(const std::vector<Message>& messages,
                                   const RenderOptions& opt) const {
  using jinja::Value;
  jinja::List list;
  for (size_t i = 0; i < messages.size(); ++i) {
    const int32_t o = static_cast<int32_t>(i);
    jinja::Dict d;
    d.items.emplace_back(TaintedString("role", o), Value::string(messages[i].role, o));
    d.items.emplace_back(TaintedString("content", o), Value::string(messages[i].content, o));
    list.push_back(Value::dict(std::move(d), o));
  }
  jinja::RenderInput in;
  in.now = opt.now;
  in.variables.emplace_back("messages", Value::list(std::move(list), kOtherData));
  in.variables.emplace_back("tools", Value::none());
  in.variables.emplace_back("documents", Value::none());
  in.variables.emplace_back("add_generation_prompt", Value::boolean(opt.add_generation_prompt));
  const std::pair<const char*, const std::optional<std::string>*> named[] = {
      {"bos_token", &tokens_.bos},
      {"eos_token", &tokens_.eos},
      {"unk_token", &tokens_.unk},
      {"pad_token", &tokens_.pad}};
  for (const auto& [key, tok] : named)
    if (*tok) in.variables.emplace_back(key, Value::string(**tok, kTemplate));
  return template_.render(in);
}

std::string assistant_turn_end(const ChatTemplate& tmpl) {
  // A content no template writes by itself, so that its last occurrence is the message's;
  // letters only, since templates trim contents (and Python's strip() takes \x1c-\x1f too).
  const std::string marker = "forgeTurnEndMarker7f3a";
  std::string text;
  try {
    text = tmpl.render({{"user", "Hi"}, {"assistant", marker}}).text();
  } catch (const Error&) {
    return "";
  }
  const size_t at = text.rfind(marker);
  if (at == std::string::npos) return "";
  std::string end = text.substr(at + marker.size());
  const char* space = " \t\r\n";
  const size_t first = end.find_first_not_of(space);
  if (first == std::string::npos) return "";
  return end.substr(first, end.find_last_not_of(space) + 1 - first);
}

}  // namespace forge::chat
