// prompts.jsonl (see prompts.h). Lines are parsed one at a time with nlohmann::json; its
// callback sees each key of the top-level object as it is read, which is how a repeated key
// (that json would otherwise keep silently, last one winning) is caught. UTF-8 is checked
// before parsing so that the message can say where the bad byte is.
#include "forge/generate/prompts.h"

#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "forge/core/error.h"

namespace forge {

namespace {

using json = nlohmann::json;

constexpr const char* kKnownKeys =
    "prompt, ids, max_new_tokens, stop, seed, temperature, top_k, top_p, min_p, "
    "repetition_penalty";

// Offset of the first byte that does not start a valid UTF-8 sequence (overlong forms,
// surrogates and code points above U+10FFFF are invalid), or npos.
size_t first_invalid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    const int len = c < 0x80           ? 1
                    : (c >> 5) == 0x6  ? 2
                    : (c >> 4) == 0xE  ? 3
                    : (c >> 3) == 0x1E ? 4
                                       : 0;
    if (len == 0 || i + len > s.size()) return i;
    uint32_t cp = len == 1 ? c : c & (0x7F >> len);
    for (int k = 1; k < len; ++k) {
      const auto b = static_cast<unsigned char>(s[i + k]);
      if ((b >> 6) != 0x2) return i;
      cp = (cp << 6) | (b & 0x3F);
    }
    constexpr uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kMin[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return i;
    i += len;
  }
  return std::string_view::npos;
}

// The JSON type of a value, for "expected X, got Y".
std::string type_name(const json& v) {
  switch (v.type()) {
    case json::value_t::null:
      return "null";
    case json::value_t::boolean:
      return v.get<bool>() ? "true" : "false";
    case json::value_t::string:
      return "a string";
    case json::value_t::array:
      return "a list";
    case json::value_t::object:
      return "an object";
    case json::value_t::number_float:
      return "the number " + v.dump();
    default:
      return "the integer " + v.dump();
  }
}

// One line's object → a request; throws forge::Error without the "PATH:LINE: " prefix.
PromptRequest parse_request(const json& j, int vocab_size) {
  PromptRequest r;
  auto number = [](const json& v, const std::string& key) {
    if (!v.is_number()) throw Error(str(key, ": expected a number, got ", type_name(v)));
    return v.get<double>();
  };
  // Non-negative integers; a negative one reads -N so the range check can say so.
  auto integer = [](const json& v, const std::string& key) -> int64_t {
    if (v.is_number_unsigned()) {
      if (v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        throw Error(str(key, ": ", v.dump(), " is too large"));
      return v.get<int64_t>();
    }
    if (v.is_number_integer()) return v.get<int64_t>();
    throw Error(str(key, ": expected an integer, got ", type_name(v)));
  };
  for (const auto& [key, v] : j.items()) {
    if (key == "prompt") {
      if (!v.is_string()) throw Error(str("prompt: expected a string, got ", type_name(v)));
      r.prompt = v.get<std::string>();
    } else if (key == "ids") {
      if (!v.is_array()) throw Error(str("ids: expected a list of token ids, got ", type_name(v)));
      if (v.empty()) throw Error("ids: the list is empty (give at least one token id)");
      for (size_t i = 0; i < v.size(); ++i) {
        const std::string what = str("ids[", i, "]");
        const json& e = v[i];
        if (!e.is_number_integer())
          throw Error(str(what, ": expected a token id (an integer), got ", type_name(e)));
        // Non-negative integers parse as unsigned; an id must also fit an int32.
        if (!e.is_number_unsigned() || e.get<uint64_t>() > uint64_t{INT32_MAX})
          throw Error(str(what, ": token id ", e.dump(), " is out of range"));
        const int32_t id = e.get<int32_t>();
        if (vocab_size > 0 && id >= vocab_size)
          throw Error(
              str(what, ": token id ", id, " is out of range for vocabulary size ", vocab_size));
        r.ids.push_back(id);
      }
    } else if (key == "stop") {
      const std::vector<json> list = v.is_array()  ? v.get<std::vector<json>>()
                                     : v.is_null() ? std::vector<json>{}
                                                   : std::vector<json>{v};
      for (size_t i = 0; i < list.size(); ++i) {
        const std::string what = v.is_array() ? str("stop[", i, "]") : "stop";
        if (!list[i].is_string())
          throw Error(
              str(what, ": expected a string or a list of strings, got ", type_name(list[i])));
        if (list[i].get_ref<const std::string&>().empty())
          throw Error(str(what, ": a stop string must not be empty"));
        r.stop.push_back(list[i].get<std::string>());
      }
    } else if (v.is_null() && (key == "max_new_tokens" || key == "seed" || key == "temperature" ||
                               key == "top_k" || key == "top_p" || key == "min_p" ||
                               key == "repetition_penalty")) {
      continue;  // null: not given
    } else if (key == "max_new_tokens") {
      r.sampling.max_new_tokens = integer(v, key);
    } else if (key == "seed") {
      if (!v.is_number_unsigned())
        throw Error(
            str("seed: expected an integer in [0, 18446744073709551615], got ", type_name(v)));
      r.sampling.seed = v.get<uint64_t>();
    } else if (key == "temperature") {
      r.sampling.temperature = number(v, key);
    } else if (key == "top_k") {
      r.sampling.top_k = integer(v, key);
    } else if (key == "top_p") {
      r.sampling.top_p = number(v, key);
    } else if (key == "min_p") {
      r.sampling.min_p = number(v, key);
    } else if (key == "repetition_penalty") {
      r.sampling.repetition_penalty = number(v, key);
    } else {
      throw Error(str("unknown key ", quote(key), " (known: ", kKnownKeys, ")"));
    }
  }
  if (r.prompt.has_value() == !r.ids.empty())
    throw Error(r.prompt ? "give one of \"prompt\" and \"ids\", not both"
                         : "no \"prompt\" (text) or \"ids\" (token ids)");
  check_sampling(r.sampling);
  return r;
}

// nlohmann's parse error without its prefix and its "line 1" (the line is ours to name).
// out_of_range.406 (a number that overflows a double, 1e999) is a parse failure too.
std::string parse_error_text(const json::exception& e) {
  std::string m = e.what();
  const size_t bracket = m.find("] ");
  if (bracket != std::string::npos) m = m.substr(bracket + 2);
  for (const std::string drop : {"parse error at line 1, ", "parse error: "})
    if (m.starts_with(drop)) m = m.substr(drop.size());
  return m;
}

}  // namespace

std::vector<PromptRequest> parse_prompts(std::string_view text, const std::string& name,
                                         int vocab_size) {
  std::vector<PromptRequest> out;
  int line_no = 0;
  for (size_t pos = 0; pos < text.size();) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string_view::npos) eol = text.size();
    std::string_view line = text.substr(pos, eol - pos);
    pos = eol + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    const std::string at = str(name, ":", line_no, ": ");
    const size_t bad = first_invalid_utf8(line);
    if (bad != std::string_view::npos)
      throw Error(str(at, "invalid UTF-8 at byte ", bad + 1, " of the line"));
    // Keys of the top-level object as they are read (depth 1), to catch a repeated one.
    std::set<std::string> keys;
    std::string repeated;
    json j;
    try {
      j = json::parse(line, [&](int depth, json::parse_event_t event, json& parsed) {
        if (event == json::parse_event_t::key && depth == 1 && repeated.empty() &&
            !keys.insert(parsed.get<std::string>()).second)
          repeated = parsed.get<std::string>();
        return true;
      });
    } catch (const json::exception& e) {
      throw Error(str(at, "malformed JSON: ", parse_error_text(e)));
    }
    if (!j.is_object()) throw Error(str(at, "expected a JSON object, got ", type_name(j)));
    if (!repeated.empty()) throw Error(str(at, "key ", quote(repeated), " appears twice"));
    try {
      PromptRequest r = parse_request(j, vocab_size);
      r.line = line_no;
      out.push_back(std::move(r));
    } catch (const Error& e) {
      throw Error(at + e.what());
    }
  }
  if (out.empty()) throw Error(str(name, ": no requests (expected one JSON object per line)"));
  return out;
}

std::vector<PromptRequest> read_prompts(const std::string& path, int vocab_size) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error(str(path, ": cannot open"));
  std::stringstream text;
  text << f.rdbuf();
  return parse_prompts(text.str(), path, vocab_size);
}

}  // namespace forge
