#include "forge/chat/sft_example.h"

#include <fstream>
#include <nlohmann/json.hpp>

#include "forge/chat/chat_encode.h"
#include "forge/core/error.h"

namespace forge::chat {

using json = nlohmann::json;

namespace {

std::string need_string(const json& obj, const char* key, const std::string& where,
                        const std::string& what) {
  if (!obj.contains(key)) throw Error(str(where, ": ", what, " has no \"", key, "\""));
  const json& v = obj[key];
  if (!v.is_string())
    throw Error(str(where, ": ", what, ": \"", key, "\" must be a string, got ", v.type_name()));
  return v.get<std::string>();
}

}  // namespace

SftExample parse_sft_line(std::string_view line, const std::string& where, bool require_assistant) {
  json j;
  try {
    j = json::parse(line);
  } catch (const json::exception& e) {
    throw Error(str(where, ": not valid JSON: ", e.what()));
  }
  if (!j.is_object()) throw Error(str(where, ": expected a JSON object, got ", j.type_name()));
  SftExample ex;
  ex.where = where;
  const bool pair = j.contains("prompt") || j.contains("response");
  if (pair && j.contains("messages"))
    throw Error(str(where, ": has both \"messages\" and \"prompt\"/\"response\"; give one form"));
  if (pair) {
    ex.messages.push_back({"user", need_string(j, "prompt", where, "the example")});
    ex.messages.push_back({"assistant", need_string(j, "response", where, "the example")});
    return ex;
  }
  if (!j.contains("messages"))
    throw Error(
        str(where, ": expected {\"prompt\": ..., \"response\": ...} or {\"messages\": [...]}"));
  const json& msgs = j["messages"];
  if (!msgs.is_array() || msgs.empty())
    throw Error(str(where, ": \"messages\" must be a non-empty array, got ",
                    msgs.is_array() ? "an empty one" : msgs.type_name()));
  bool assistant = false;
  for (size_t i = 0; i < msgs.size(); ++i) {
    const std::string what = str("messages[", i, "]");
    if (!msgs[i].is_object())
      throw Error(str(where, ": ", what, " must be an object, got ", msgs[i].type_name()));
    Message m{need_string(msgs[i], "role", where, what),
              need_string(msgs[i], "content", where, what)};
    if (m.role != "system" && m.role != "user" && m.role != "assistant")
      throw Error(str(where, ": ", what, ": unknown role ", quote(m.role),
                      " (expected system, user or assistant)"));
    assistant |= m.role == "assistant";
    ex.messages.push_back(std::move(m));
  }
  if (!assistant && require_assistant)
    throw Error(str(where, ": no assistant message, so nothing to train on"));
  return ex;
}

std::vector<SftExample> read_sft_jsonl(const std::string& path, bool require_assistant) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error(str(path, ": no such file or not readable"));
  std::vector<SftExample> out;
  std::string line;
  for (int64_t n = 1; std::getline(f, line); ++n) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    out.push_back(parse_sft_line(line, str(path, ":", n), require_assistant));
  }
  if (f.bad()) throw Error(str(path, ": read failed"));
  return out;
}

EncodedChat encode_chat(const ChatTemplate& tmpl, const tok::Tokenizer& tok,
                        const std::vector<Message>& messages, const RenderOptions& opt,
                        const std::string& where) {
  auto render = [&](size_t n, bool gen) {
    RenderOptions o = opt;
    o.add_generation_prompt = gen;
    try {
      return tmpl.render(
          std::vector<Message>(messages.begin(), messages.begin() + static_cast<std::ptrdiff_t>(n)),
          o);
    } catch (const Error& e) {
      throw Error(str(where, ": ", e.what()));
    }
  };
  EncodedChat out;
  out.text = render(messages.size(), opt.add_generation_prompt);
  const std::string& full = out.text.text();
  const EncodedText enc = encode_rendered(tok, out.text);
  out.ids = enc.ids;
  out.trained.assign(out.ids.size(), 0);
  for (size_t i = 0; i < messages.size(); ++i) {
    if (messages[i].role != "assistant") continue;
    const std::string prompt = render(i, true).text();
    const std::string turn = render(i + 1, false).text();
    if (!turn.starts_with(prompt))
      throw Error(str(where, ": assistant message ", i,
                      ": the chat template's rendering of the "
                      "conversation before it (with the generation prompt) is not a prefix of its "
                      "rendering with it, so its tokens cannot be told apart"));
    if (!full.starts_with(turn))
      throw Error(str(where, ": assistant message ", i,
                      ": the chat template renders the "
                      "conversation up to it differently once later messages follow"));
    if (turn.size() == prompt.size()) continue;  // the template writes nothing for this turn
    const TokenBoundary b = token_boundary(tok, full, enc, prompt.size());
    const TokenBoundary e = token_boundary(tok, full, enc, turn.size());
    const size_t end = std::min(out.ids.size(), e.exact ? e.index : e.index + 1);
    for (size_t t = b.index; t < end; ++t) out.trained[t] = 1;
  }
  return out;
}

EncodedChat encode_sft_example(const ChatTemplate& tmpl, const tok::Tokenizer& tok,
                               const SftExample& ex, const RenderOptions& opt) {
  RenderOptions o = opt;
  o.add_generation_prompt = false;
  return encode_chat(tmpl, tok, ex.messages, o, ex.where);
}

}  // namespace forge::chat
