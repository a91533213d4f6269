// Normalizer and Metaspace (see normalizer.h). The rules follow `tokenizers` (normalizers/
// prepend.rs, normalizers/replace.rs, pre_tokenizers/metaspace.rs) including its corners:
// Prepend skips empty text, Metaspace does not prepend to text that already starts with the
// replacement, "first" means "at offset 0 of the input" (so not after a special token), and
// splitting keeps each replacement with what follows it. Offsets, which Forge does not report,
// are not tracked.
#include "forge/tokenizer/normalizer.h"

#include <nlohmann/json.hpp>

#include "forge/core/error.h"
#include "forge/tokenizer/utf8.h"

namespace forge::tok {

namespace {

using json = nlohmann::json;

std::string type_of(const json& j) {
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string())
    return j.dump().substr(0, 60);
  return j["type"].get<std::string>();
}

// A JSON string field of `j`; throws forge::Error naming `where` if it is missing or not a string.
std::string string_field(const json& j, const char* key, const std::string& where) {
  if (!j.contains(key) || !j[key].is_string())
    throw Error(str(where, ": \"", key, "\" is missing or not a string"));
  return j[key].get<std::string>();
}

bool is_one_character(std::string_view s) {
  return !s.empty() && utf8_char_len(s, 0) == s.size();
}

void add_steps(const json& j, const std::string& path, std::vector<Normalizer::Step>& steps) {
  const std::string type = type_of(j);
  const std::string where = str(path, ": normalizer ", type);
  if (type == "Sequence") {
    if (!j.contains("normalizers") || !j["normalizers"].is_array())
      throw Error(where + ": \"normalizers\" is missing or not a list");
    for (const json& step : j["normalizers"]) add_steps(step, path, steps);
  } else if (type == "Prepend") {
    steps.push_back({Normalizer::Step::Kind::kPrepend, "", string_field(j, "prepend", where)});
  } else if (type == "Replace") {
    const json pattern = j.value("pattern", json());
    if (!pattern.is_object() || !pattern.contains("String") || !pattern["String"].is_string())
      throw Error(str(where, ": pattern ", pattern.dump().substr(0, 60),
                      " is not supported (only {\"String\": ...}, not a regex)"));
    const std::string literal = pattern["String"].get<std::string>();
    if (literal.empty()) throw Error(where + ": the pattern is empty");
    steps.push_back({Normalizer::Step::Kind::kReplace, literal, string_field(j, "content", where)});
  } else {
    throw Error(str(path, ": normalizer ", quote(type),
                    " is not supported (Forge applies Prepend, Replace with a String pattern, "
                    "and Sequences of them)"));
  }
}

}  // namespace

std::string replace_all(std::string_view text, std::string_view pattern, std::string_view content) {
  std::string out;
  out.reserve(text.size() + text.size() / 4);
  size_t begin = 0;
  for (size_t p = text.find(pattern); p != std::string_view::npos; p = text.find(pattern, begin)) {
    out.append(text, begin, p - begin).append(content);
    begin = p + pattern.size();
  }
  out.append(text, begin);
  return out;
}

Normalizer Normalizer::from_json(const json& j, const std::string& path) {
  Normalizer n;
  if (!j.is_null()) add_steps(j, path, n.steps_);
  return n;
}

std::string Normalizer::apply(std::string_view text) const {
  std::string s(text);
  for (const Step& step : steps_) {
    if (step.kind == Step::Kind::kPrepend) {
      if (!s.empty()) s.insert(0, step.content);
    } else {
      s = replace_all(s, step.pattern, step.content);
    }
  }
  return s;
}

Metaspace Metaspace::from_json(const json& j, const std::string& path, const std::string& where) {
  const std::string w = str(path, ": ", where, " Metaspace");
  Metaspace m;
  m.replacement = string_field(j, "replacement", w);
  if (!is_one_character(m.replacement))
    throw Error(str(w, ": replacement ", quote(m.replacement), " is not one character"));
  const json scheme = j.value("prepend_scheme", json());
  if (scheme.is_null()) {
    m.prepend = Prepend::kAlways;  // tokenizers' default
  } else if (scheme == "always") {
    m.prepend = Prepend::kAlways;
  } else if (scheme == "first") {
    m.prepend = Prepend::kFirst;
  } else if (scheme == "never") {
    m.prepend = Prepend::kNever;
  } else {
    throw Error(str(w, ": prepend_scheme ", scheme.dump(), " (expected first, never or always)"));
  }
  // Files from before prepend_scheme existed say add_prefix_space; false must agree with the
  // scheme, which then defaults to "always" — `tokenizers` refuses the file, and so do we.
  const json add_prefix_space = j.value("add_prefix_space", json());
  if (add_prefix_space == false && m.prepend != Prepend::kNever)
    throw Error(w + ": add_prefix_space false does not match prepend_scheme");
  const json split = j.value("split", json(true));
  if (!split.is_boolean()) throw Error(w + ": \"split\" is not true or false");
  m.split = split.get<bool>();
  return m;
}

void Metaspace::pre_tokenize(std::string& text, bool starts_input,
                             std::vector<std::string_view>& pieces) const {
  text = replace_all(text, " ", replacement);
  const bool want = prepend == Prepend::kAlways || (prepend == Prepend::kFirst && starts_input);
  if (want && !std::string_view(text).starts_with(replacement)) text.insert(0, replacement);
  const std::string_view t(text);
  if (t.empty()) return;
  if (!split) {
    pieces.push_back(t);
    return;
  }
  size_t begin = 0;
  for (size_t p = t.find(replacement, 1); p != std::string_view::npos;
       p = t.find(replacement, p + replacement.size())) {
    pieces.push_back(t.substr(begin, p - begin));
    begin = p;
  }
  pieces.push_back(t.substr(begin));
}

}  // namespace forge::tok
