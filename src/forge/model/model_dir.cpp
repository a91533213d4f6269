// Model directories (see model_dir.h). The tensors of a directory come from one
// model.safetensors or from the shards that model.safetensors.index.json maps them to; either
// way they are looked up by name through one TensorSet, so loading and inspecting don't care.
#include "forge/model/model_dir.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "forge/core/error.h"
#include "forge/io/atomic_file.h"

namespace forge {

namespace fs = std::filesystem;

namespace {

// The checkpoint shape of a parameter: the token embedding (and an untied head) have V rows in
// a checkpoint and padded_vocab() rows in memory.
Shape checkpoint_shape(const ParamTable& table, const ParamInfo& p, const ModelConfig& cfg) {
  if (p.offset == table.wte() || p.offset == table.lm_head()) return {cfg.vocab_size, cfg.n_embd};
  return p.shape;
}

// Tensors some checkpoints carry that are not parameters (attention-mask buffers of old GPT-2
// exports, rotary frequency tables).
bool is_known_buffer(const std::string& name) {
  return name.ends_with(".attn.bias") || name.ends_with(".attn.masked_bias") ||
         name.ends_with("rotary_emb.inv_freq");
}

nlohmann::json read_json_file(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw Error(str(path, ": cannot open"));
  try {
    return nlohmann::json::parse(f);
  } catch (const nlohmann::json::exception& e) {
    throw Error(str(path, ": malformed JSON: ", e.what()));
  }
}

// Every tensor of a directory by name: (file index, name) into the opened files.
struct TensorSet {
  std::vector<io::SafetensorsFile> files;
  std::vector<std::string> file_names;
  std::map<std::string, size_t> where;  // tensor name -> index into files

  const io::TensorInfo* find(const std::string& name) const {
    auto it = where.find(name);
    return it == where.end() ? nullptr : files[it->second].find(name);
  }
  const io::SafetensorsFile& file_of(const std::string& name) const {
    return files[where.at(name)];
  }
};

TensorSet open_tensors(const std::string& dir) {
  TensorSet s;
  auto add_file = [&](const std::string& name) {
    s.files.push_back(io::SafetensorsFile::open(dir + "/" + name));
    s.file_names.push_back(name);
    for (const auto& t : s.files.back().tensors()) {
      if (s.where.count(t.name))
        throw Error(str(dir, ": tensor '", t.name, "' appears in both ",
                        s.file_names[s.where[t.name]], " and ", name));
      s.where[t.name] = s.files.size() - 1;
    }
  };
  if (fs::exists(dir + "/model.safetensors") ||
      !fs::exists(dir + "/model.safetensors.index.json")) {
    add_file("model.safetensors");  // a missing file fails here with "cannot open"
    return s;
  }
  const std::string index_path = dir + "/model.safetensors.index.json";
  const nlohmann::json index = read_json_file(index_path);
  if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object())
    throw Error(str(index_path, ": expected an object with a \"weight_map\" object"));
  std::map<std::string, std::string> weight_map;
  std::set<std::string> shard_names;
  for (const auto& [name, file] : index["weight_map"].items()) {
    if (!file.is_string())
      throw Error(str(index_path, ": weight_map['", name, "'] is not a string"));
    const std::string f = file.get<std::string>();
    if (f.empty() || f.find('/') != std::string::npos || f.starts_with("."))
      throw Error(str(index_path, ": weight_map['", name, "'] names a file outside the directory"));
    weight_map[name] = f;
    shard_names.insert(f);
  }
  for (const auto& f : shard_names) add_file(f);
  for (const auto& [name, file] : weight_map) {
    auto it = s.where.find(name);
    if (it == s.where.end() || s.file_names[it->second] != file)
      throw Error(str(index_path, ": tensor '", name, "' is not in ", file));
  }
  return s;
}

// config.json as Forge reads it, plus the one fact config.json may get wrong: a llama
// checkpoint without lm_head.weight is tied.
ModelConfig resolve_config(const std::string& dir, const nlohmann::json& j, const TensorSet& ts) {
  ModelConfig cfg;
  try {
    cfg = read_hf_config(j);
  } catch (const Error& e) {
    std::string msg = e.what();
    if (msg.starts_with("config.json: ")) msg = msg.substr(13);
    throw Error(str(dir, "/config.json: ", msg));
  }
  if (cfg.family == Family::kLlama && !cfg.tie_embeddings && !ts.find("lm_head.weight"))
    cfg.tie_embeddings = true;
  return cfg;
}

std::string tensor_file_name(const TensorSet& ts, const std::string& dir, const std::string& name) {
  auto it = ts.where.find(name);
  return dir + "/" + (it == ts.where.end() ? "model.safetensors" : ts.file_names[it->second]);
}

}  // namespace

ModelConfig read_hf_config(const nlohmann::json& j) {
  try {
    if (!j.is_object()) throw Error("config.json: expected a JSON object");
    return from_hf_config(j);  // refuses what Forge does not compute (model/hf_config.cpp)
  } catch (const nlohmann::json::exception& e) {
    throw Error(str("config.json: a field has the wrong type: ", e.what()));
  }
}

void save_model_dir(const std::string& dir, const Transformer<float>& model,
                    const std::string& tokenizer_json, const std::string& generation_config_json) {
  std::string tokenizer_text;  // read first: a missing tokenizer must not cost the old model
  if (!tokenizer_json.empty()) {
    std::ifstream f(tokenizer_json, std::ios::binary);
    if (!f) throw Error(str(tokenizer_json, ": cannot open tokenizer"));
    std::stringstream text;
    text << f.rdbuf();
    tokenizer_text = text.str();
  }
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw Error(str(dir, ": cannot create directory: ", ec.message()));
  const ModelConfig& cfg = model.config();
  std::vector<io::TensorToWrite> tensors;
  for (const auto& p : model.table().params()) {
    tensors.push_back({p.name, io::StDType::kF32, checkpoint_shape(model.table(), p, cfg),
                       model.weights().data() + p.offset});
  }
  io::write_safetensors(dir + "/model.safetensors", tensors, {{"format", "pt"}});
  io::write_file_atomic(dir + "/config.json", to_hf_config(cfg).dump(2) + "\n");
  if (!tokenizer_json.empty()) io::write_file_atomic(dir + "/tokenizer.json", tokenizer_text);
  if (!generation_config_json.empty())
    io::write_file_atomic(dir + "/generation_config.json", generation_config_json);
}

Transformer<float> load_model_dir(const std::string& dir) {
  if (!fs::is_directory(dir)) throw Error(str(dir, ": not a model directory"));
  const nlohmann::json j = read_json_file(dir + "/config.json");
  const TensorSet ts = open_tensors(dir);
  const ModelConfig cfg = resolve_config(dir, j, ts);
  Transformer<float> model(cfg);
  std::set<std::string> used;
  for (const auto& p : model.table().params()) {
    std::string name = p.name;
    if (!ts.find(name) && name.starts_with("transformer.") && ts.find(name.substr(12)))
      name = name.substr(12);  // original OpenAI GPT-2 exports omit the "transformer." prefix
    const io::TensorInfo* t = ts.find(name);
    if (!t) throw Error(str(tensor_file_name(ts, dir, name), ": missing tensor '", p.name, "'"));
    const Shape want = checkpoint_shape(model.table(), p, cfg);
    if (t->shape != want)
      throw Error(str(tensor_file_name(ts, dir, name), ": tensor '", name, "' has shape ",
                      shape_str(t->shape), " but config.json implies ", shape_str(want)));
    const std::vector<float> data = ts.file_of(name).read_f32(name);
    std::copy(data.begin(), data.end(), model.weights().begin() + p.offset);
    used.insert(name);
  }
  for (const auto& [name, file] : ts.where) {
    if (used.count(name) || is_known_buffer(name)) continue;
    if (name == "lm_head.weight" && cfg.tie_embeddings) continue;  // tied: the embedding wins
    throw Error(str(dir, "/", ts.file_names[file], ": unexpected tensor '", name,
                    "' for model_type ", cfg.family_name()));
  }
  return model;
}

ModelDirInfo inspect_model_dir(const std::string& dir) {
  if (!fs::is_directory(dir)) throw Error(str(dir, ": not a model directory"));
  ModelDirInfo info;
  info.hf_config = read_json_file(dir + "/config.json");
  const TensorSet ts = open_tensors(dir);
  info.config = resolve_config(dir, info.hf_config, ts);
  for (size_t f = 0; f < ts.files.size(); ++f)
    for (const auto& t : ts.files[f].tensors()) info.tensors.push_back({ts.file_names[f], t});
  const ParamTable table(info.config);
  for (const auto& p : table.params())
    info.num_params += shape_numel(checkpoint_shape(table, p, info.config));
  info.has_tokenizer = fs::exists(dir + "/tokenizer.json");
  return info;
}

}  // namespace forge
