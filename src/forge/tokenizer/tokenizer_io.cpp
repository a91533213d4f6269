// Tokenizer files: Hugging Face tokenizer.json (read and written) and GPT-2's original
// encoder.json + vocab.bpe (read).
//
// Design decisions:
//  - Both formats spell byte-level tokens in GPT-2's byte-to-unicode alphabet; we turn them into
//    raw bytes on load and back on save, so the in-memory tokenizer never sees the alphabet. A
//    character-level tokenizer.json keeps its tokens as spelled ("▁the", "<0x41>").
//  - tokenizer.json is accepted only when Forge would encode exactly as `tokenizers` does:
//    model BPE, and either
//      byte-level: no normalizer; pre-tokenizer ByteLevel (its own GPT-2 regex if use_regex),
//      or a Sequence of Split (regex or string, "Isolated", not inverted) / Digits steps ending
//      in ByteLevel — what Llama 3 and SmolLM2 ship; decoder ByteLevel; or
//      character-level (the pre-tokenizer has no ByteLevel): normalizer Prepend / Replace /
//      Sequence or none; pre-tokenizer Metaspace or none; decoder Replace / ByteFallback / Fuse
//      / Strip / Metaspace / Sequence or none; byte_fallback, unk_token, fuse_unk — what Llama
//      2, Mistral and TinyLlama ship.
//    Anything else is a one-line forge::Error naming the component rather than a silently
//    different encoding. encode() returns the text's tokens only, never an added BOS; the
//    post-processor (TemplateProcessing's single template, ByteLevel, Sequences of them) is
//    applied on request by with_special_tokens(). A post-processor Forge cannot apply never
//    stops a load (they were all ignored before): with_special_tokens() reports it instead.
//  - Added tokens all become special tokens (matched before splitting in encode()), whether or
//    not they are flagged special — `tokenizers` also matches non-special added tokens first.
//    An added token that merely repeats a vocabulary entry with the same id and is not special
//    stays a regular token.
//  - save_json writes the split regexes as Split steps followed by ByteLevel(use_regex=false),
//    the form that round-trips any regex exactly (a character-level tokenizer: its normalizer,
//    pre-tokenizer and decoder as read); the file is replaced atomically
//    (io/atomic_file.h), so a crash never leaves half a tokenizer.json.
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include "forge/core/error.h"
#include "forge/io/atomic_file.h"
#include "forge/tokenizer/tokenizer.h"

namespace forge::tok {

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr int64_t kMaxTokenId = 1 << 26;  // sanity bound: no real vocabulary is near this

// For error messages: at most `max` bytes, control characters shown as '?', so it stays one line.
std::string printable(std::string_view s, size_t max = 60) {
  std::string out;
  for (size_t i = 0; i < s.size() && i < max; ++i)
    out.push_back(static_cast<unsigned char>(s[i]) < 0x20 ? '?' : s[i]);
  if (s.size() > max) out += "...";
  return out;
}

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error(str(path, ": cannot open for reading"));
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

json parse_json(const std::string& path) {
  const std::string text = read_file(path);
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    throw Error(str(path, ": invalid JSON: ", e.what()));
  }
}

// A token spelled in the byte-to-unicode alphabet → its bytes; nullopt if some character is not
// in the alphabet (or the spelling is not UTF-8).
std::optional<std::string> from_byte_level(std::string_view s) {
  static const std::array<int16_t, 324> byte_of = [] {
    std::array<int16_t, 324> t;
    t.fill(-1);
    const auto& b2u = byte_to_unicode();
    for (int b = 0; b < 256; ++b) {
      const auto* p = reinterpret_cast<const unsigned char*>(b2u[b].data());
      const uint32_t cp = b2u[b].size() == 1 ? p[0] : ((p[0] & 0x1Fu) << 6) | (p[1] & 0x3Fu);
      t[cp] = static_cast<int16_t>(b);
    }
    return t;
  }();
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    uint32_t cp;
    if (c < 0x80) {
      cp = c;
      i += 1;
    } else if ((c & 0xE0) == 0xC0 && i + 1 < s.size()) {
      cp = ((c & 0x1Fu) << 6) | (static_cast<unsigned char>(s[i + 1]) & 0x3Fu);
      i += 2;
    } else {
      return std::nullopt;  // 3- and 4-byte characters are never in the alphabet
    }
    if (cp >= byte_of.size() || byte_of[cp] < 0) return std::nullopt;
    out.push_back(static_cast<char>(byte_of[cp]));
  }
  return out;
}

std::string to_byte_level(std::string_view bytes) {
  const auto& b2u = byte_to_unicode();
  std::string out;
  out.reserve(bytes.size() * 2);
  for (const char c : bytes) out += b2u[static_cast<unsigned char>(c)];
  return out;
}

// Escapes a literal string for a regex understood by both PCRE2 and Oniguruma.
std::string regex_escape(std::string_view s) {
  std::string out;
  for (const char c : s) {
    if (std::strchr("\\^$.|?*+()[]{}-/", c) != nullptr && c != '\0') out.push_back('\\');
    out.push_back(c);
  }
  return out;
}

// What both loaders produce, for Tokenizer::build.
struct BpeParts {
  std::vector<std::string> vocab;
  std::vector<std::pair<int32_t, int32_t>> merges;
  std::vector<SpecialToken> specials;
  std::vector<std::string> split_regexes;
  bool ignore_merges = false;
  PostProcessor post_processor;
  std::optional<CharLevel> char_level;
};

// spelled → id, and the vocab vector with "" for unused ids.
struct SpelledVocab {
  std::unordered_map<std::string, int32_t> id_of;
  std::vector<std::string> vocab;
};

// Reads a {"spelled token": id} object. `raw_text_of` gives an added token's content for ids
// whose spelling is not in the byte-level alphabet (special tokens listed in the vocab).
// byte_level false: tokens are kept as spelled.
SpelledVocab read_vocab(const json& obj, const std::string& path,
                        const std::unordered_map<int32_t, std::string>& raw_text_of,
                        bool byte_level = true) {
  if (!obj.is_object()) throw Error(str(path, ": the vocabulary is not a JSON object"));
  SpelledVocab v;
  int64_t max_id = -1;
  for (const auto& [key, value] : obj.items()) {
    if (!value.is_number_integer() || value.get<int64_t>() < 0 ||
        value.get<int64_t>() >= kMaxTokenId)
      throw Error(str(path, ": token '", printable(key), "' has id ", value.dump(),
                      " (expected an integer in [0, ", kMaxTokenId, "))"));
    max_id = std::max(max_id, value.get<int64_t>());
  }
  // The vocabulary is a table indexed by id; a real one's ids are dense, so a few tokens with
  // ids in the millions are refused before that table is allocated (tokenizer.cpp: build()).
  try {
    check_ids_dense(max_id + 1, obj.size() + raw_text_of.size());
  } catch (const Error& e) {
    throw Error(str(path, ": ", e.what()));
  }
  v.vocab.assign(static_cast<size_t>(max_id + 1), std::string());
  for (const auto& [key, value] : obj.items()) {
    const auto id = value.get<int32_t>();
    std::optional<std::string> bytes = byte_level ? from_byte_level(key) : key;
    if (!bytes) {
      const auto it = raw_text_of.find(id);
      if (it == raw_text_of.end())
        throw Error(str(path, ": token '", printable(key), "' (id ", id,
                        ") is not spelled in the byte-level alphabet"));
      bytes = it->second;
    }
    if (!v.vocab[id].empty())
      throw Error(str(path, ": id ", id, " is given to two tokens ('", printable(key), "')"));
    v.vocab[id] = *bytes;
    v.id_of.emplace(key, id);
  }
  return v;
}

// The ids of merge (a, b), checking that a, b and a + b are tokens. `where` names the merge in
// an error message (called only on error: building it for every merge would cost more).
template <typename Where>
std::pair<int32_t, int32_t> merge_ids(const SpelledVocab& v, const std::string& a,
                                      const std::string& b, const Where& where) {
  const auto ia = v.id_of.find(a), ib = v.id_of.find(b);
  for (const auto& [it, name] : {std::pair{ia, &a}, std::pair{ib, &b}})
    if (it == v.id_of.end())
      throw Error(str(where(), " names unknown token '", printable(*name), "'"));
  if (v.id_of.find(a + b) == v.id_of.end())
    throw Error(str(where(), " makes a token that is not in the vocabulary"));
  return {ia->second, ib->second};
}

BpeParts read_gpt2(const std::string& encoder_path, const std::string& merges_path) {
  BpeParts parts;
  const json encoder = parse_json(encoder_path);
  SpelledVocab v = read_vocab(encoder, encoder_path, {});
  const auto eot = v.id_of.find("<|endoftext|>");
  if (eot != v.id_of.end()) parts.specials.push_back({"<|endoftext|>", eot->second});

  const std::string text = read_file(merges_path);
  size_t line_no = 0;
  for (size_t pos = 0; pos < text.size();) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string::npos) eol = text.size();
    std::string line = text.substr(pos, eol - pos);
    pos = eol + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line_no == 1) {
      if (line.rfind("#version", 0) != 0)
        throw Error(str(merges_path, ": line 1: expected the header '#version: 0.2', found '",
                        printable(line), "'"));
      continue;
    }
    if (line.empty()) continue;
    const size_t sp = line.find(' ');
    if (sp == 0 || sp == std::string::npos || sp + 1 == line.size() ||
        line.find(' ', sp + 1) != std::string::npos)
      throw Error(str(merges_path, ": line ", line_no,
                      ": expected two tokens separated by one space, found '", printable(line),
                      "'"));
    parts.merges.push_back(merge_ids(v, line.substr(0, sp), line.substr(sp + 1), [&] {
      return str(merges_path, ": line ", line_no, ": merge '", printable(line), "'");
    }));
  }
  if (line_no == 0) throw Error(str(merges_path, ": empty file (expected '#version: 0.2')"));
  parts.vocab = std::move(v.vocab);
  parts.split_regexes = {split_regex(SplitPattern::kGpt2)};
  return parts;
}

std::string type_of(const json& component) {
  if (!component.is_object() || !component.contains("type") || !component["type"].is_string())
    return component.dump().substr(0, 60);
  return component["type"].get<std::string>();
}

// Appends the split regexes of one pre-tokenizer step; returns true for ByteLevel (which must
// come last: after it, text is in the byte-level alphabet and a regex would see other chars).
bool read_pre_tokenizer_step(const json& step, const std::string& path,
                             std::vector<std::string>& regexes) {
  const std::string type = type_of(step);
  if (type == "ByteLevel") {
    if (step.value("add_prefix_space", false))
      throw Error(
          str(path, ": pre_tokenizer ByteLevel with add_prefix_space=true is not supported"));
    if (step.value("use_regex", true)) regexes.emplace_back(split_regex(SplitPattern::kGpt2));
    return true;
  }
  if (type == "Split") {
    const json& pattern = step.at("pattern");
    const std::string behavior = step.value("behavior", "Isolated");
    if (behavior != "Isolated")
      throw Error(str(path, ": pre_tokenizer Split with behavior ", quote(behavior),
                      " is not supported (only Isolated)"));
    if (step.value("invert", false))
      throw Error(str(path, ": pre_tokenizer Split with invert=true is not supported"));
    if (pattern.contains("Regex")) {
      regexes.push_back(pattern.at("Regex").get<std::string>());
    } else if (pattern.contains("String")) {
      regexes.push_back(regex_escape(pattern.at("String").get<std::string>()));
    } else {
      throw Error(str(path, ": pre_tokenizer Split pattern ", printable(pattern.dump()),
                      " is neither Regex nor String"));
    }
    return false;
  }
  if (type == "Digits") {
    regexes.emplace_back(step.value("individual_digits", false) ? R"(\p{N})" : R"(\p{N}+)");
    return false;
  }
  throw Error(str(path, ": pre_tokenizer ", quote(type),
                  " is not supported (Forge reads ByteLevel, ",
                  "or a Sequence of Split/Digits steps ending in ByteLevel)"));
}

// Adds one post-processor's special tokens to `out` (see PostProcessor). Throws forge::Error or
// a json exception for what Forge cannot apply; read_post_processor records it.
template <typename IsToken>
void add_post_processor(const json& p, const std::string& path, const IsToken& is_token,
                        PostProcessor& out) {
  const std::string type = type_of(p);
  if (type == "ByteLevel") return;  // offsets only: the ids are untouched
  if (type == "Sequence") {
    for (const json& step : p.at("processors")) add_post_processor(step, path, is_token, out);
    return;
  }
  if (type != "TemplateProcessing")
    throw Error(str(path, ": post_processor ", quote(type),
                    " is not supported (Forge applies TemplateProcessing, ByteLevel and "
                    "Sequences of them)"));
  const std::string where = str(path, ": post_processor TemplateProcessing: ");
  const json& single = p.at("single");
  if (!single.is_array()) throw Error(where + "\"single\" is not a list of pieces");
  const json specials = p.value("special_tokens", json::object());
  std::vector<int32_t> before, after;
  bool seen_a = false;
  for (const json& piece : single) {
    if (piece.is_object() && piece.contains("Sequence")) {
      const std::string id = piece["Sequence"].at("id").get<std::string>();
      if (id != "A" || seen_a)
        throw Error(where + "the single template may hold the sequence $A once, found $" + id +
                    (seen_a && id == "A" ? " twice" : ""));
      seen_a = true;
    } else if (piece.is_object() && piece.contains("SpecialToken")) {
      const std::string name = piece["SpecialToken"].at("id").get<std::string>();
      if (!specials.is_object() || !specials.contains(name))
        throw Error(str(where, "the single template names special token '", printable(name),
                        "', which special_tokens does not define"));
      for (const json& id : specials[name].at("ids")) {
        if (!id.is_number_integer() || !is_token(id.get<int64_t>()))
          throw Error(str(where, "special token '", printable(name), "' has id ", id.dump(),
                          ", which is not a token of this tokenizer"));
        (seen_a ? after : before).push_back(id.get<int32_t>());
      }
    } else {
      throw Error(str(where, "piece ", printable(piece.dump()),
                      " is neither a SpecialToken nor a Sequence"));
    }
  }
  if (!seen_a) throw Error(where + "the single template has no $A");
  // A later processor wraps what the earlier ones made.
  out.prefix.insert(out.prefix.begin(), before.begin(), before.end());
  out.suffix.insert(out.suffix.end(), after.begin(), after.end());
}

// tokenizer.json's post_processor. Never throws: what Forge cannot apply goes to `problem`.
template <typename IsToken>
PostProcessor read_post_processor(const json& root, const std::string& path,
                                  const IsToken& is_token) {
  PostProcessor pp;
  const json p = root.value("post_processor", json());
  if (p.is_null()) return pp;
  pp.json = p.dump();
  try {
    add_post_processor(p, path, is_token, pp);
  } catch (const Error& e) {
    pp.problem = e.what();
  } catch (const json::exception& e) {
    pp.problem = str(path, ": post_processor: ", e.what());
  }
  if (!pp.problem.empty()) pp.prefix.clear(), pp.suffix.clear();
  return pp;
}

BpeParts read_tokens(const json& root, const std::string& path, BpeParts parts);

// Whether the pre-tokenizer is ByteLevel or a Sequence holding one: then the file is byte-level.
bool uses_byte_level(const json& pre) {
  if (type_of(pre) == "ByteLevel") return true;
  if (type_of(pre) != "Sequence" || !pre.contains("pretokenizers")) return false;
  for (const json& step : pre["pretokenizers"])
    if (type_of(step) == "ByteLevel") return true;
  return false;
}

// A character-level (SentencePiece-style) tokenizer.json: its normalizer, Metaspace
// pre-tokenizer, decoder and model options, then the tokens as read_tokens reads them.
BpeParts read_char_level_json(const json& root, const std::string& path, BpeParts parts) {
  const json& model = root["model"];
  CharLevel c;
  const json normalizer = root.value("normalizer", json());
  c.normalizer = Normalizer::from_json(normalizer, path);
  const json pre = root.value("pre_tokenizer", json());
  if (type_of(pre) == "Metaspace") {
    c.metaspace = Metaspace::from_json(pre, path, "pre_tokenizer");
  } else if (!pre.is_null()) {
    throw Error(str(path, ": pre_tokenizer ", quote(type_of(pre)),
                    " is not supported (Forge reads ByteLevel, a Sequence of Split/Digits steps "
                    "ending in ByteLevel, Metaspace, or none)"));
  }
  const json decoder = root.value("decoder", json());
  if (type_of(decoder) == "ByteLevel")
    throw Error(str(path,
                    ": decoder ByteLevel needs a ByteLevel pre-tokenizer, and pre_tokenizer is ",
                    pre.is_null() ? std::string("null") : type_of(pre)));
  c.decoder = Decoder::from_json(decoder, path);
  c.byte_fallback = model.value("byte_fallback", false);
  c.fuse_unk = model.value("fuse_unk", false);
  const json unk = model.value("unk_token", json());
  if (!unk.is_null() && !unk.is_string())
    throw Error(str(path, ": model.unk_token ", unk.dump(), " is not a string"));
  c.unk_token = unk.is_string() ? unk.get<std::string>() : "";
  c.normalizer_json = normalizer.dump();
  c.pre_tokenizer_json = pre.dump();
  c.decoder_json = decoder.dump();
  parts.char_level = std::move(c);
  return read_tokens(root, path, std::move(parts));
}

BpeParts read_hf_json(const std::string& path) {
  const json root = parse_json(path);
  BpeParts parts;
  if (!root.is_object()) throw Error(str(path, ": expected a JSON object at the top level"));
  if (!root.contains("model")) throw Error(str(path, ": missing \"model\""));
  const json& model = root["model"];
  const std::string model_type = model.is_object() ? model.value("type", "BPE") : type_of(model);
  if (model_type != "BPE")
    throw Error(str(path, ": model type ", quote(model_type),
                    " is not supported (Forge reads BPE tokenizers)"));
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (model.contains(key) && !model[key].is_null() && model[key] != "")
      throw Error(str(path, ": model.", key, " is not supported"));
  // 0.0 is what `tokenizers` itself treats as no dropout; anything else makes encoding random.
  if (model.contains("dropout") && !model["dropout"].is_null() && model["dropout"] != 0.0)
    throw Error(str(path, ": model.dropout ", model["dropout"].dump(),
                    " is not supported (BPE dropout encodes at random; Forge needs null)"));
  parts.ignore_merges = model.value("ignore_merges", false);

  const json pre = root.value("pre_tokenizer", json());
  if (!uses_byte_level(pre)) return read_char_level_json(root, path, std::move(parts));

  const json normalizer = root.value("normalizer", json());
  if (!normalizer.is_null() && !(type_of(normalizer) == "Sequence" &&
                                 normalizer.value("normalizers", json::array()).empty()))
    throw Error(str(path, ": normalizer ", quote(type_of(normalizer)), " is not supported"));

  const std::vector<json> steps = type_of(pre) == "Sequence"
                                      ? pre.at("pretokenizers").get<std::vector<json>>()
                                      : std::vector<json>{pre};
  for (size_t i = 0; i < steps.size(); ++i) {
    if (steps[i].is_null())
      throw Error(str(path, ": pre_tokenizer null is not supported (a ByteLevel one is needed)"));
    const bool byte_level = read_pre_tokenizer_step(steps[i], path, parts.split_regexes);
    if (byte_level != (i + 1 == steps.size()))
      throw Error(str(path, ": pre_tokenizer must end with ByteLevel (and have it only once)"));
  }
  const json decoder = root.value("decoder", json());
  if (type_of(decoder) != "ByteLevel")
    throw Error(str(path, ": decoder ", quote(type_of(decoder)),
                    " is not supported with a ByteLevel pre-tokenizer (only ByteLevel)"));
  return read_tokens(root, path, std::move(parts));
}

// The added tokens, the vocabulary, the merges and the post-processor of a tokenizer.json whose
// other components `parts` already holds.
BpeParts read_tokens(const json& root, const std::string& path, BpeParts parts) {
  const json& model = root["model"];
  std::unordered_map<int32_t, std::string> added_text;
  std::vector<SpecialToken> added;
  std::vector<bool> added_special;
  for (const json& t : root.value("added_tokens", json::array())) {
    const int64_t id = t.at("id").get<int64_t>();
    if (id < 0 || id >= kMaxTokenId) throw Error(str(path, ": added token id ", id, " is invalid"));
    added.push_back({t.at("content").get<std::string>(), static_cast<int32_t>(id)});
    added_special.push_back(t.value("special", false));
    added_text[static_cast<int32_t>(id)] = added.back().text;
  }

  SpelledVocab v = read_vocab(model.at("vocab"), path, added_text, !parts.char_level);
  for (size_t i = 0; i < added.size(); ++i) {
    const SpecialToken& t = added[i];
    const bool plain_vocab_entry =
        t.id < static_cast<int32_t>(v.vocab.size()) && v.vocab[t.id] == t.text && !added_special[i];
    if (!plain_vocab_entry) parts.specials.push_back(t);
  }

  const json& merges = model.at("merges");
  if (!merges.is_array()) throw Error(str(path, ": model.merges is not an array"));
  parts.merges.reserve(merges.size());
  for (size_t r = 0; r < merges.size(); ++r) {
    const json& m = merges[r];
    std::string a, b;
    if (m.is_string()) {  // "a b" (tokenizers < 0.20)
      const std::string s = m.get<std::string>();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
        throw Error(str(path, ": merge ", r, " '", printable(s), "' is not two tokens"));
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      a = m[0].get<std::string>();  // ["a", "b"] (tokenizers >= 0.20)
      b = m[1].get<std::string>();
    } else {
      throw Error(str(path, ": merge ", r, " ", printable(m.dump()), " is not a pair of tokens"));
    }
    parts.merges.push_back(merge_ids(v, a, b, [&] {
      return str(path, ": merge ", r, " '", printable(a), " ", printable(b), "'");
    }));
  }
  parts.vocab = std::move(v.vocab);
  parts.post_processor = read_post_processor(root, path, [&](int64_t id) {
    if (id >= 0 && id < static_cast<int64_t>(parts.vocab.size()) && !parts.vocab[id].empty())
      return true;
    for (const SpecialToken& t : parts.specials)
      if (t.id == id) return true;
    return false;
  });
  return parts;
}

}  // namespace

Tokenizer Tokenizer::load(const std::string& path) {
  std::string json_path, encoder_path, merges_path;
  std::error_code ec;
  if (fs::is_regular_file(path, ec)) {
    json_path = path;
  } else if (fs::is_directory(path, ec)) {
    const fs::path dir(path);
    if (fs::is_regular_file(dir / "tokenizer.json", ec)) {
      json_path = (dir / "tokenizer.json").string();
    } else if (fs::is_regular_file(dir / "encoder.json", ec) &&
               fs::is_regular_file(dir / "vocab.bpe", ec)) {
      encoder_path = (dir / "encoder.json").string();
      merges_path = (dir / "vocab.bpe").string();
    } else {
      throw Error(str(path, ": directory has neither tokenizer.json nor encoder.json + vocab.bpe"));
    }
  } else {
    throw Error(str(path, ": no such tokenizer file or directory"));
  }

  const std::string& named = json_path.empty() ? merges_path : json_path;
  BpeParts p;
  try {
    p = json_path.empty() ? read_gpt2(encoder_path, merges_path) : read_hf_json(json_path);
  } catch (const json::exception& e) {  // a field of the wrong type or a missing key
    throw Error(str(named, ": ", e.what()));
  }
  try {
    return build(std::move(p.vocab), p.merges, std::move(p.specials), std::move(p.split_regexes),
                 p.ignore_merges, std::move(p.post_processor), std::move(p.char_level));
  } catch (const Error& e) {  // build() does not know the file; a bad regex lands here too
    throw Error(str(named, ": ", e.what()));
  }
}

void Tokenizer::save_json(const std::string& path) const {
  using ojson = nlohmann::ordered_json;
  ojson added = ojson::array();
  for (const SpecialToken& sp : specials_)
    added.push_back({{"id", sp.id},
                     {"content", sp.text},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", true}});

  const ojson byte_level = {{"type", "ByteLevel"},
                            {"add_prefix_space", false},
                            {"trim_offsets", true},
                            {"use_regex", false}};
  ojson steps = ojson::array();
  for (const std::string& re : split_regexes())
    if (!re.empty())
      steps.push_back({{"type", "Split"},
                       {"pattern", {{"Regex", re}}},
                       {"behavior", "Isolated"},
                       {"invert", false}});
  ojson pre_tokenizer = byte_level;
  if (!steps.empty()) {
    steps.push_back(byte_level);
    pre_tokenizer = {{"type", "Sequence"}, {"pretokenizers", steps}};
  }
  ojson normalizer = nullptr;
  ojson decoder = {{"type", "ByteLevel"},
                   {"add_prefix_space", true},
                   {"trim_offsets", true},
                   {"use_regex", true}};
  const CharLevel* const cl = char_level();
  if (cl != nullptr) {  // the components as read, and the tokens as spelled
    normalizer = ojson::parse(cl->normalizer_json);
    pre_tokenizer = ojson::parse(cl->pre_tokenizer_json);
    decoder = ojson::parse(cl->decoder_json);
  }
  const auto spelled = [cl](const std::string& t) { return cl ? t : to_byte_level(t); };

  // ordered_json keeps ids in order, as Hugging Face writes them, but its lookups are linear:
  // append to the underlying vector and dedupe with a hash set (seconds → milliseconds for 50k).
  ojson vocab = ojson::object();
  auto& entries = vocab.get_ref<ojson::object_t&>();
  std::unordered_set<std::string> seen;
  for (size_t id = 0; id < vocab_.size(); ++id) {
    if (vocab_[id].empty()) continue;
    std::string key = spelled(vocab_[id]);
    if (seen.insert(key).second) entries.emplace_back(std::move(key), id);
  }
  ojson merges = ojson::array();
  for (const auto& [a, b] : merges_)
    merges.push_back(ojson::array({spelled(vocab_[a]), spelled(vocab_[b])}));

  const std::string& pp = post_processor().json;  // as read from a tokenizer.json
  const ojson post = pp.empty() ? ojson(nullptr) : ojson::parse(pp);
  ojson root = {{"version", "1.0"},
                {"truncation", nullptr},
                {"padding", nullptr},
                {"added_tokens", added},
                {"normalizer", normalizer},
                {"pre_tokenizer", pre_tokenizer},
                {"post_processor", post},
                {"decoder", decoder},
                {"model",
                 {{"type", "BPE"},
                  {"dropout", nullptr},
                  {"unk_token", cl && !cl->unk_token.empty() ? ojson(cl->unk_token) : ojson()},
                  {"continuing_subword_prefix", nullptr},
                  {"end_of_word_suffix", nullptr},
                  {"fuse_unk", cl && cl->fuse_unk},
                  {"byte_fallback", cl && cl->byte_fallback},
                  {"ignore_merges", ignore_merges()},
                  {"vocab", vocab},
                  {"merges", merges}}}};
  std::string text;
  try {
    text = root.dump(2);
  } catch (const ojson::exception& e) {  // a special token that is not valid UTF-8
    throw Error(str(path, ": cannot write tokenizer.json: ", e.what()));
  }
  text.push_back('\n');

  io::write_file_atomic(path, text);
}

}  // namespace forge::tok
