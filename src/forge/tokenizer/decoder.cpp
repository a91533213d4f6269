// Decoder (see decoder.h). Each step follows its `tokenizers` source (decoders/byte_fallback.rs,
// fuse.rs, strip.rs, normalizers/replace.rs, pre_tokenizers/metaspace.rs), corners included:
//  - ByteFallback judges a whole run of byte tokens: if the run is not valid UTF-8, every byte of
//    it becomes U+FFFD, even bytes that would form a valid character on their own ("中" followed
//    by a stray 0xE4 gives four U+FFFD, not "中" and one).
//  - The Metaspace decoder drops every replacement character of the first token (not only the
//    first one) unless the prepend scheme is "never"; later tokens get spaces.
//  - Strip counts characters, not bytes; when start and stop overlap the token becomes empty
//    (where `tokenizers` would panic).
#include "forge/tokenizer/decoder.h"

#include <nlohmann/json.hpp>

#include "forge/core/error.h"
#include "forge/tokenizer/utf8.h"

namespace forge::tok {

namespace {

using json = nlohmann::json;
using Tokens = std::vector<std::string>;

constexpr std::string_view kReplacementChar = "\xEF\xBF\xBD";  // U+FFFD

std::string type_of(const json& j) {
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string())
    return j.dump().substr(0, 60);
  return j["type"].get<std::string>();
}

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Byte length of the character at s[i]; a byte that starts no valid character counts as one.
size_t char_len(std::string_view s, size_t i) {
  const size_t len = utf8_char_len(s, i);
  return len == 0 ? 1 : len;
}

Decoder::Step make_step(Decoder::Step::Kind kind) {
  Decoder::Step s;
  s.kind = kind;
  return s;
}

void add_steps(const json& j, const std::string& path, std::vector<Decoder::Step>& steps) {
  using Kind = Decoder::Step::Kind;
  const std::string type = type_of(j);
  const std::string where = str(path, ": decoder ", type);
  if (type == "Sequence") {
    if (!j.contains("decoders") || !j["decoders"].is_array())
      throw Error(where + ": \"decoders\" is missing or not a list");
    for (const json& step : j["decoders"]) add_steps(step, path, steps);
  } else if (type == "Replace") {
    const json pattern = j.value("pattern", json());
    if (!pattern.is_object() || !pattern.contains("String") || !pattern["String"].is_string())
      throw Error(str(where, ": pattern ", pattern.dump().substr(0, 60),
                      " is not supported (only {\"String\": ...}, not a regex)"));
    Decoder::Step s = make_step(Kind::kReplace);
    s.pattern = pattern["String"].get<std::string>();
    if (s.pattern.empty()) throw Error(where + ": the pattern is empty");
    if (!j.contains("content") || !j["content"].is_string())
      throw Error(where + ": \"content\" is missing or not a string");
    s.content = j["content"].get<std::string>();
    steps.push_back(std::move(s));
  } else if (type == "ByteFallback") {
    steps.push_back(make_step(Kind::kByteFallback));
  } else if (type == "Fuse") {
    steps.push_back(make_step(Kind::kFuse));
  } else if (type == "Strip") {
    Decoder::Step s = make_step(Kind::kStrip);
    const json content = j.value("content", json());
    if (!content.is_string() || content.get<std::string>().empty() ||
        utf8_char_len(content.get<std::string>(), 0) != content.get<std::string>().size())
      throw Error(str(where, ": content ", content.dump(), " is not one character"));
    s.content = content.get<std::string>();
    for (const auto& [key, field] : {std::pair{"start", &s.start}, std::pair{"stop", &s.stop}}) {
      const json v = j.value(key, json());
      if (!v.is_number_unsigned())
        throw Error(str(where, ": \"", key, "\" ", v.dump(), " is not a count"));
      *field = v.get<size_t>();
    }
    steps.push_back(std::move(s));
  } else if (type == "Metaspace") {
    Decoder::Step s = make_step(Kind::kMetaspace);
    s.metaspace = Metaspace::from_json(j, path, "decoder");
    steps.push_back(std::move(s));
  } else {
    throw Error(str(path, ": decoder ", quote(type),
                    " is not supported here (Forge applies Replace, ByteFallback, Fuse, Strip, "
                    "Metaspace and Sequences of them; ByteLevel with a ByteLevel pre-tokenizer)"));
  }
}

void replace_each(Tokens& tokens, const std::string& pattern, const std::string& content) {
  for (std::string& t : tokens)
    if (t.find(pattern) != std::string::npos) t = replace_all(t, pattern, content);
}

// ByteFallback: a run of byte tokens becomes its text, or one U+FFFD per byte if it is not UTF-8.
Tokens byte_fallback(Tokens tokens) {
  Tokens out;
  out.reserve(tokens.size());
  std::string run;
  size_t run_tokens = 0;
  auto flush = [&] {
    if (run_tokens == 0) return;
    if (is_valid_utf8(run)) {
      out.push_back(run);
    } else {
      for (size_t k = 0; k < run_tokens; ++k) out.emplace_back(kReplacementChar);
    }
    run.clear();
    run_tokens = 0;
  };
  for (std::string& t : tokens) {
    const int b = byte_token_value(t);
    if (b >= 0) {
      run.push_back(static_cast<char>(b));
      ++run_tokens;
    } else {
      flush();
      out.push_back(std::move(t));
    }
  }
  flush();
  return out;
}

std::string strip(std::string_view t, std::string_view c, size_t start, size_t stop) {
  size_t begin = 0, end = t.size();
  for (size_t k = 0; k < start && t.substr(begin).starts_with(c); ++k) begin += c.size();
  for (size_t k = 0; k < stop && end >= begin + c.size() && t.substr(0, end).ends_with(c); ++k)
    end -= c.size();
  return std::string(t.substr(begin, end - begin));
}

// The Metaspace decoder on one token; `first`: the token is the first of the list.
std::string metaspace_decode(std::string_view t, const Metaspace& m, bool first) {
  const bool drop = first && m.prepend != Metaspace::Prepend::kNever;
  std::string out;
  out.reserve(t.size());
  for (size_t i = 0; i < t.size();) {
    const size_t len = char_len(t, i);
    if (t.substr(i, len) == m.replacement) {
      if (!drop) out.push_back(' ');
    } else {
      out.append(t, i, len);
    }
    i += len;
  }
  return out;
}

}  // namespace

int byte_token_value(std::string_view t) {
  if (t.size() != 6 || !t.starts_with("<0x") || t[5] != '>') return -1;
  if (t[3] == '+') return hex_digit(t[4]);  // from_str_radix accepts a sign
  const int hi = hex_digit(t[3]), lo = hex_digit(t[4]);
  return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

Decoder Decoder::from_json(const json& j, const std::string& path) {
  Decoder d;
  if (j.is_null()) {
    d.join_with_spaces_ = true;
  } else {
    add_steps(j, path, d.steps_);
  }
  return d;
}

std::string Decoder::decode(Tokens tokens) const {
  for (const Step& s : steps_) {
    switch (s.kind) {
      case Step::Kind::kReplace:
        replace_each(tokens, s.pattern, s.content);
        break;
      case Step::Kind::kByteFallback:
        tokens = byte_fallback(std::move(tokens));
        break;
      case Step::Kind::kFuse: {
        std::string all;
        for (const std::string& t : tokens) all += t;
        tokens.assign(1, std::move(all));
        break;
      }
      case Step::Kind::kStrip:
        for (std::string& t : tokens) t = strip(t, s.content, s.start, s.stop);
        break;
      case Step::Kind::kMetaspace:
        for (size_t i = 0; i < tokens.size(); ++i)
          tokens[i] = metaspace_decode(tokens[i], s.metaspace, i == 0);
        break;
    }
  }
  std::string out;
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (join_with_spaces_ && i > 0) out.push_back(' ');
    out += tokens[i];
  }
  return out;
}

std::string Decoder::token_bytes(std::string_view token) const {
  std::string t(token);
  bool fused = false;
  for (const Step& s : steps_) {
    switch (s.kind) {
      case Step::Kind::kReplace:
        if (t.find(s.pattern) != std::string::npos) t = replace_all(t, s.pattern, s.content);
        break;
      case Step::Kind::kByteFallback:
        if (const int b = byte_token_value(t); b >= 0) t.assign(1, static_cast<char>(b));
        break;
      case Step::Kind::kFuse:
        fused = true;
        break;
      case Step::Kind::kStrip:
        if (!fused) t = strip(t, s.content, s.start, s.stop);
        break;
      case Step::Kind::kMetaspace:
        t = metaspace_decode(t, s.metaspace, false);
        break;
    }
  }
  return t;
}

}  // namespace forge::tok
