// generation_config.json (see generation_config.h). Token ids are read as transformers writes
// them (an integer, a list of integers for eos_token_id, or null), the sampling fields through
// check_sampling so a value is refused here exactly as on the command line.
#include "forge/generate/generation_config.h"

#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "forge/core/error.h"
#include "forge/tokenizer/tokenizer.h"

namespace forge {

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

json read_json(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error(str(path, ": cannot open"));
  std::stringstream text;
  text << f.rdbuf();
  try {
    return json::parse(text.str());
  } catch (const json::exception& e) {
    throw Error(str(path, ": malformed JSON: ", e.what()));
  }
}

std::string got(const json& v) {
  std::string s = v.dump();
  return s.size() > 40 ? s.substr(0, 40) + "..." : s;
}

std::optional<int32_t> token_id(const json& v, const std::string& where) {
  if (v.is_null()) return std::nullopt;
  if (!v.is_number_unsigned() || v.get<uint64_t>() > uint64_t{INT32_MAX})
    throw Error(str(where, ": expected a token id (an integer >= 0), got ", got(v)));
  return v.get<int32_t>();
}

// eos_token_id: an integer, a list of integers, or null.
std::vector<int32_t> token_ids(const json& v, const std::string& where) {
  std::vector<int32_t> ids;
  if (v.is_array()) {
    for (size_t i = 0; i < v.size(); ++i) {
      const auto id = token_id(v[i], str(where, "[", i, "]"));
      if (!id) throw Error(str(where, "[", i, "]: expected a token id, got null"));
      ids.push_back(*id);
    }
  } else if (auto id = token_id(v, where)) {
    ids.push_back(*id);
  }
  return ids;
}

// The token ids config.json or generation_config.json give; `path` names the file in errors.
struct TokenIds {
  std::vector<int32_t> eos;
  std::optional<int32_t> bos, pad;
};
TokenIds read_token_ids(const json& j, const std::string& path) {
  TokenIds t;
  if (j.contains("eos_token_id")) t.eos = token_ids(j["eos_token_id"], path + ": eos_token_id");
  if (j.contains("bos_token_id")) t.bos = token_id(j["bos_token_id"], path + ": bos_token_id");
  if (j.contains("pad_token_id")) t.pad = token_id(j["pad_token_id"], path + ": pad_token_id");
  return t;
}

// A token id in a tokenizer.json, or nullopt for anything else.
std::optional<int32_t> id_in(const json& v) {
  if (v.is_number_unsigned() && v.get<uint64_t>() <= uint64_t{INT32_MAX}) return v.get<int32_t>();
  return std::nullopt;
}

// A tokenizer_config.json token entry: "</s>", {"content": "</s>", ...} (an AddedToken), or null.
std::optional<std::string> token_name(const json& cfg, const char* key, const std::string& path) {
  if (!cfg.contains(key) || cfg[key].is_null()) return std::nullopt;
  const json& v = cfg[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string())
    return v["content"].get<std::string>();
  throw Error(
      str(path, ": ", key, ": expected a token (a string or {\"content\": ...}), got ", got(v)));
}

}  // namespace

SamplingOverrides GenerationConfig::sampling_defaults() const {
  SamplingOverrides s = sampling;
  if (do_sample == false) s.temperature = 0.0;
  return s;
}

GenerationConfig parse_generation_config(const json& j, const std::string& path) {
  if (!j.is_object()) throw Error(str(path, ": expected a JSON object, got ", got(j)));
  GenerationConfig c;
  const TokenIds ids = read_token_ids(j, path);
  c.eos_token_ids = ids.eos;
  c.bos_token_id = ids.bos;
  c.pad_token_id = ids.pad;
  auto present = [&](const char* key) { return j.contains(key) && !j[key].is_null(); };
  if (present("do_sample")) {
    if (!j["do_sample"].is_boolean())
      throw Error(str(path, ": do_sample: expected true or false, got ", got(j["do_sample"])));
    c.do_sample = j["do_sample"].get<bool>();
  }
  auto number = [&](const char* key, std::optional<double>& out) {
    if (!present(key)) return;
    if (!j[key].is_number())
      throw Error(str(path, ": ", key, ": expected a number, got ", got(j[key])));
    out = j[key].get<double>();
  };
  auto integer = [&](const char* key, std::optional<int64_t>& out) {
    if (!present(key)) return;
    const json& v = j[key];
    if (!v.is_number_integer() ||
        (v.is_number_unsigned() &&
         v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())))
      throw Error(str(path, ": ", key, ": expected an integer, got ", got(v)));
    out = v.get<int64_t>();
  };
  number("temperature", c.sampling.temperature);
  integer("top_k", c.sampling.top_k);
  number("top_p", c.sampling.top_p);
  number("min_p", c.sampling.min_p);
  number("repetition_penalty", c.sampling.repetition_penalty);
  integer("max_new_tokens", c.sampling.max_new_tokens);
  try {
    check_sampling(c.sampling);
  } catch (const Error& e) {
    throw Error(str(path, ": ", e.what()));
  }
  return c;
}

GenerationConfig read_generation_config(const std::string& path) {
  return parse_generation_config(read_json(path), path);
}

std::string generation_config_json(const GenerationConfig& c) {
  json j = json::object();  // std::map underneath: keys sorted, as transformers writes them
  if (c.bos_token_id) j["bos_token_id"] = *c.bos_token_id;
  if (c.eos_token_ids.size() == 1) j["eos_token_id"] = c.eos_token_ids[0];
  if (c.eos_token_ids.size() > 1) j["eos_token_id"] = c.eos_token_ids;
  if (c.pad_token_id) j["pad_token_id"] = *c.pad_token_id;
  if (c.do_sample) j["do_sample"] = *c.do_sample;
  const SamplingOverrides& s = c.sampling;
  if (s.temperature) j["temperature"] = *s.temperature;
  if (s.top_k) j["top_k"] = *s.top_k;
  if (s.top_p) j["top_p"] = *s.top_p;
  if (s.min_p) j["min_p"] = *s.min_p;
  if (s.repetition_penalty) j["repetition_penalty"] = *s.repetition_penalty;
  if (s.max_new_tokens) j["max_new_tokens"] = *s.max_new_tokens;
  return j.dump(2) + "\n";
}

GenerationConfig generation_config_for_tokenizer(const std::string& tokenizer_json,
                                                 const std::string& tokenizer_config_json) {
  GenerationConfig c;
  // Token names → ids from the file itself (added_tokens, then the vocabulary, where special
  // tokens are spelled as themselves), so a tokenizer Forge cannot encode with still names its
  // end-of-text token.
  json tj;
  try {
    tj = read_json(tokenizer_json);
  } catch (const Error&) {
    return c;
  }
  std::map<std::string, int32_t> added;
  if (tj.is_object() && tj.contains("added_tokens") && tj["added_tokens"].is_array())
    for (const json& t : tj["added_tokens"])
      if (t.is_object() && t.contains("content") && t["content"].is_string() && t.contains("id"))
        if (const auto id = id_in(t["id"])) added.emplace(t["content"].get<std::string>(), *id);
  const json* vocab = tj.is_object() && tj.contains("model") && tj["model"].is_object() &&
                              tj["model"].contains("vocab") && tj["model"]["vocab"].is_object()
                          ? &tj["model"]["vocab"]
                          : nullptr;
  auto find = [&](const std::optional<std::string>& name) -> std::optional<int32_t> {
    if (!name) return std::nullopt;
    if (const auto it = added.find(*name); it != added.end()) return it->second;
    if (vocab && vocab->contains(*name)) return id_in((*vocab)[*name]);
    return std::nullopt;
  };

  std::optional<std::string> eos_name, bos_name, pad_name;
  if (!tokenizer_config_json.empty()) {
    const json cfg = read_json(tokenizer_config_json);
    if (!cfg.is_object())
      throw Error(str(tokenizer_config_json, ": expected a JSON object, got ", got(cfg)));
    eos_name = token_name(cfg, "eos_token", tokenizer_config_json);
    bos_name = token_name(cfg, "bos_token", tokenizer_config_json);
    pad_name = token_name(cfg, "pad_token", tokenizer_config_json);
  }
  const std::optional<int32_t> eot = find(std::string("<|endoftext|>"));
  std::optional<int32_t> eos = find(eos_name);
  if (!eos) eos = eot;
  if (eos) c.eos_token_ids = {*eos};
  c.bos_token_id = find(bos_name);
  if (!c.bos_token_id) {
    try {
      const tok::Tokenizer t = tok::Tokenizer::load(tokenizer_json);
      if (t.post_processor().problem.empty() && t.post_processor().prefix.size() == 1)
        c.bos_token_id = t.post_processor().prefix[0];
    } catch (const Error&) {
      // Not a tokenizer Forge reads: no post-processor to ask.
    }
  }
  if (!c.bos_token_id && eos && eos == eot) c.bos_token_id = eot;
  c.pad_token_id = find(pad_name);
  return c;
}

GenerationConfig load_generation_config(const std::string& model_dir) {
  const std::string gen = model_dir + "/generation_config.json";
  GenerationConfig c = fs::exists(gen) ? read_generation_config(gen) : GenerationConfig{};
  auto fill = [&](const std::vector<int32_t>& eos, std::optional<int32_t> bos,
                  std::optional<int32_t> pad) {
    if (c.eos_token_ids.empty()) c.eos_token_ids = eos;
    if (!c.bos_token_id) c.bos_token_id = bos;
    if (!c.pad_token_id) c.pad_token_id = pad;
  };
  // pad_token_id is taken where found but never searched for: most models have none.
  auto complete = [&] { return !c.eos_token_ids.empty() && c.bos_token_id; };
  const std::string config = model_dir + "/config.json";
  if (!complete() && fs::exists(config)) {
    const json j = read_json(config);
    if (j.is_object()) {
      const TokenIds ids = read_token_ids(j, config);
      fill(ids.eos, ids.bos, ids.pad);
    }
  }
  const std::string tokenizer = model_dir + "/tokenizer.json";
  if (!complete() && fs::exists(tokenizer)) {
    const std::string tc = model_dir + "/tokenizer_config.json";
    const GenerationConfig t = generation_config_for_tokenizer(tokenizer, fs::exists(tc) ? tc : "");
    fill(t.eos_token_ids, t.bos_token_id, t.pad_token_id);
  }
  return c;
}

}  // namespace forge
