#include "forge/model/model_dir.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include <nlohmann/json.hpp>

#include "forge/core/error.h"
#include "forge/io/safetensors.h"

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

void write_text_atomic(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) throw Error(str(path, ": cannot write: ", std::strerror(errno)));
    f << text;
    f.flush();
    if (!f) throw Error(str(path, ": write failed"));
  }
  fs::rename(tmp, path);
}

}  // namespace

void save_model_dir(const std::string& dir, const Transformer<float>& model) {
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
  write_text_atomic(dir + "/config.json", to_hf_config(cfg).dump(2) + "\n");
}

Transformer<float> load_model_dir(const std::string& dir) {
  const std::string config_path = dir + "/config.json";
  if (!fs::is_directory(dir)) throw Error(str(dir, ": not a model directory"));
  std::ifstream f(config_path);
  if (!f) throw Error(str(config_path, ": cannot open"));
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(f);
  } catch (const nlohmann::json::exception& e) {
    throw Error(str(config_path, ": malformed JSON: ", e.what()));
  }
  ModelConfig cfg = from_hf_config(j);
  Transformer<float> model(cfg);
  const auto st = io::SafetensorsFile::open(dir + "/model.safetensors");
  std::set<std::string> used;
  for (const auto& p : model.table().params()) {
    std::string name = p.name;
    if (!st.find(name) && name.starts_with("transformer.") && st.find(name.substr(12)))
      name = name.substr(12);  // original OpenAI GPT-2 exports omit the "transformer." prefix
    const io::TensorInfo* t = st.find(name);
    if (!t) throw Error(str(dir, "/model.safetensors: missing tensor '", p.name, "'"));
    const Shape want = checkpoint_shape(model.table(), p, cfg);
    if (t->shape != want)
      throw Error(str(dir, "/model.safetensors: tensor '", name, "' has shape ", shape_str(t->shape),
                      " but config.json implies ", shape_str(want)));
    const std::vector<float> data = st.read_f32(name);
    std::copy(data.begin(), data.end(), model.weights().begin() + p.offset);
    used.insert(name);
  }
  for (const auto& t : st.tensors()) {
    if (used.count(t.name) || is_known_buffer(t.name)) continue;
    if (t.name == "lm_head.weight" && cfg.tie_embeddings) continue;  // tied: the embedding wins
    throw Error(str(dir, "/model.safetensors: unexpected tensor '", t.name, "' for model_type ", cfg.family_name()));
  }
  return model;
}

}  // namespace forge
