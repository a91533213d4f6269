#include "forge/serve/openai_api.h"

#include <cmath>
#include <limits>

#include "forge/core/error.h"

namespace forge::serve {

namespace {

using nlohmann::json;

constexpr size_t kMaxParseMessage = 300;  // bytes of a JSON parse error quoted in the answer

ApiError bad(const std::string& param, const std::string& message) {
  return ApiError(400, str(param, ": ", message), param, "invalid_value");
}

// A value of the body as an error message shows it: a number, boolean or null as JSON, a
// string quoted (control characters escaped, cut at 120 bytes: the message stays one short
// line), a list or an object by its size only. Never a dump of a nested value: a body of 10^6
// '[' nests that deep, and dump() recursing through it overflows the stack.
std::string shown(const json& v) {
  if (v.is_array()) return str("a list of ", v.size(), v.size() == 1 ? " item" : " items");
  if (v.is_object()) return str("an object of ", v.size(), v.size() == 1 ? " key" : " keys");
  if (v.is_string()) return quote(v.get_ref<const std::string&>());
  return v.dump();
}

double number(const json& v, const std::string& name) {
  if (!v.is_number()) throw bad(name, str("expected a number, got ", shown(v)));
  return v.get<double>();
}

std::string string(const json& v, const std::string& name) {
  if (!v.is_string()) throw bad(name, str("expected a string, got ", shown(v)));
  return v.get<std::string>();
}

// An integer in [lo, hi] (JSON integers, or a float with no fraction as JavaScript sends them).
int64_t integer(const json& v, const std::string& name, int64_t lo, int64_t hi) {
  const auto refuse = [&] { return bad(name, str("expected an integer in [", lo, ", ", hi, "], got ", shown(v))); };
  if (v.is_number_unsigned()) {
    if (v.get<uint64_t>() > static_cast<uint64_t>(hi)) throw refuse();
    return static_cast<int64_t>(v.get<uint64_t>());
  }
  if (v.is_number_integer()) {
    const int64_t x = v.get<int64_t>();
    if (x < lo || x > hi) throw refuse();
    return x;
  }
  if (v.is_number_float()) {
    // In range before the conversion: a double outside int64's range (1e19) converted is
    // undefined behaviour. 2^63 itself is the first double above int64's range.
    const double d = v.get<double>();
    if (d >= static_cast<double>(lo) && d <= static_cast<double>(hi) && d < 9223372036854775808.0 &&
        d == std::trunc(d))
      return static_cast<int64_t>(d);
  }
  throw refuse();
}

std::vector<chat::Message> parse_messages(const json& v) {
  if (!v.is_array() || v.empty()) throw bad("messages", "expected a non-empty list of {role, content} objects");
  std::vector<chat::Message> out;
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string where = str("messages[", i, "]");
    const json& m = v[i];
    if (!m.is_object()) throw bad(where, "expected an object with role and content");
    if (!m.contains("role")) throw bad(where + ".role", "missing");
    const std::string role = string(m["role"], where + ".role");
    if (role != "system" && role != "user" && role != "assistant" && role != "developer")
      throw bad(where + ".role", str("expected system, developer, user or assistant, got ", quote(role)));
    if (!m.contains("content")) throw bad(where + ".content", "missing");
    out.push_back({role == "developer" ? "system" : role, string(m["content"], where + ".content")});
  }
  return out;
}

std::vector<std::string> parse_stop(const json& v) {
  std::vector<std::string> out;
  if (v.is_null()) return out;
  if (v.is_string()) {
    out.push_back(v.get<std::string>());
  } else if (v.is_array() && v.size() <= 4) {
    for (const json& s : v) out.push_back(string(s, "stop"));
  } else {
    throw bad("stop", str("expected a string or a list of up to 4 strings, got ", shown(v)));
  }
  for (const std::string& s : out)
    if (s.empty()) throw bad("stop", "a stop string is empty");
  return out;
}

}  // namespace

json error_json(const std::string& message, const std::string& type, const std::string& param,
                const std::string& code) {
  return {{"error",
           {{"message", message},
            {"type", type},
            {"param", param.empty() ? json(nullptr) : json(param)},
            {"code", code.empty() ? json(nullptr) : json(code)}}}};
}

CompletionRequest parse_completion_request(const std::string& body, bool chat) {
  json j;
  try {
    j = json::parse(body);
  } catch (const json::exception& e) {
    // nlohmann's message ends with the token it last read, which is the rest of the body for an
    // unterminated string: cut (at a character's start) so that the answer does not echo it.
    std::string m = e.what();
    if (m.size() > kMaxParseMessage) {
      size_t cut = kMaxParseMessage;
      while (cut > 0 && (static_cast<unsigned char>(m[cut]) & 0xC0) == 0x80) --cut;
      m = m.substr(0, cut) + "...";
    }
    throw ApiError(400, str("the request body is not valid JSON: ", m), "", "invalid_json");
  }
  if (!j.is_object()) throw ApiError(400, "the request body must be a JSON object", "", "invalid_json");
  CompletionRequest r;
  r.chat = chat;
  if (chat) {
    if (!j.contains("messages")) throw bad("messages", "missing");
    r.messages = parse_messages(j["messages"]);
  } else {
    if (!j.contains("prompt")) throw bad("prompt", "missing");
    if (!j["prompt"].is_string()) throw bad("prompt", str("expected a string (one prompt), got ", shown(j["prompt"])));
    r.prompt = j["prompt"].get<std::string>();
  }
  const int64_t int_max = std::numeric_limits<int>::max();
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& k = it.key();
    const json& v = it.value();
    if (k == "model") {
      r.model = string(v, k);
    } else if (k == "max_tokens" || k == "max_completion_tokens") {
      if (!v.is_null()) r.sampling.max_new_tokens = integer(v, k, 0, int_max);
    } else if (k == "temperature") {
      if (!v.is_null()) r.sampling.temperature = number(v, k);
    } else if (k == "top_p") {
      if (!v.is_null()) r.sampling.top_p = number(v, k);
    } else if (k == "seed") {
      if (!v.is_null()) r.sampling.seed = static_cast<uint64_t>(integer(v, k, 0, std::numeric_limits<int64_t>::max()));
    } else if (k == "stop") {
      r.stop = parse_stop(v);
    } else if (k == "n") {
      if (!v.is_null() && integer(v, k, std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max()) != 1)
        throw ApiError(400, str("n: only n = 1 is served, got ", shown(v)), "n", "unsupported_value");
    } else if (k == "stream") {
      if (!v.is_null() && !v.is_boolean()) throw bad(k, str("expected true or false, got ", shown(v)));
      r.stream = v.is_boolean() && v.get<bool>();
    } else if (k == "stream_options") {
      if (v.is_null()) continue;
      if (!v.is_object()) throw bad(k, str("expected an object, got ", shown(v)));
      if (v.contains("include_usage")) {
        const json& u = v["include_usage"];
        if (!u.is_boolean()) throw bad("stream_options.include_usage", str("expected true or false, got ", shown(u)));
        r.include_usage = u.get<bool>();
      }
    }
  }
  try {
    check_sampling(r.sampling);
  } catch (const Error& e) {  // "top_p: expected a number in (0, 1], got 1.5"
    const std::string m = e.what();
    const std::string field = m.substr(0, m.find(':'));
    throw ApiError(400, m, field == "max_new_tokens" ? "max_tokens" : field, "invalid_value");
  }
  return r;
}

json completion_json(bool chat, const std::string& id, int64_t created, const std::string& model,
                     const CompletionResult& r) {
  json choice = {{"index", 0}, {"logprobs", nullptr}, {"finish_reason", r.finish_reason}};
  if (chat)
    choice["message"] = {{"role", "assistant"}, {"content", r.text}};
  else
    choice["text"] = r.text;
  return {{"id", id},
          {"object", chat ? "chat.completion" : "text_completion"},
          {"created", created},
          {"model", model},
          {"choices", json::array({choice})},
          {"usage", usage_json(r)}};
}

json usage_json(const CompletionResult& r) {
  return {{"prompt_tokens", r.prompt_tokens},
          {"completion_tokens", r.completion_tokens},
          {"total_tokens", r.prompt_tokens + r.completion_tokens}};
}

json usage_chunk_json(bool chat, const std::string& id, int64_t created, const std::string& model,
                      const CompletionResult& r) {
  return {{"id", id},
          {"object", chat ? "chat.completion.chunk" : "text_completion"},
          {"created", created},
          {"model", model},
          {"choices", json::array()},
          {"usage", usage_json(r)}};
}

json chunk_json(bool chat, const std::string& id, int64_t created, const std::string& model, const std::string& text,
                const std::string& finish_reason, bool role) {
  json choice = {{"index", 0},
                 {"logprobs", nullptr},
                 {"finish_reason", finish_reason.empty() ? json(nullptr) : json(finish_reason)}};
  if (chat) {
    json delta = json::object();
    if (role) delta["role"] = "assistant";
    if (!text.empty() || role) delta["content"] = text;
    choice["delta"] = delta;
  } else {
    choice["text"] = text;
  }
  return {{"id", id},
          {"object", chat ? "chat.completion.chunk" : "text_completion"},
          {"created", created},
          {"model", model},
          {"choices", json::array({choice})}};
}

}  // namespace forge::serve
