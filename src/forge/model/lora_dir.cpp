#include "forge/model/lora_dir.h"

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "forge/core/error.h"
#include "forge/core/sha256.h"
#include "forge/io/atomic_file.h"
#include "forge/io/safetensors.h"

namespace forge {

namespace fs = std::filesystem;

namespace {

nlohmann::json read_json(const std::string& path) {
  const std::string text = io::read_file(path);
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw Error(str(path, ": malformed JSON: ", e.what()));
  }
}

// PEFT's LoraConfig as Forge writes it: its defaults except the fields Forge sets, and
// inference_mode true (what save_pretrained writes).
nlohmann::json adapter_config(const LoraConfig& lora, const std::string& base_model) {
  nlohmann::json targets = nlohmann::json::array();
  for (LoraTarget t : lora.targets) targets.push_back(lora_target_module(t));
  return {{"peft_type", "LORA"},
          {"task_type", "CAUSAL_LM"},
          {"base_model_name_or_path", base_model},
          {"r", lora.r},
          // An integer when it is one, as PEFT's configs usually hold it.
          {"lora_alpha", lora.alpha == std::floor(lora.alpha) && std::fabs(lora.alpha) < 1e15
                             ? nlohmann::json(static_cast<int64_t>(lora.alpha))
                             : nlohmann::json(lora.alpha)},
          {"target_modules", targets},
          {"lora_dropout", 0.0},
          {"bias", "none"},
          {"fan_in_fan_out", false},
          {"use_rslora", false},
          {"use_dora", false},
          {"init_lora_weights", true},
          {"inference_mode", true},
          {"modules_to_save", nullptr},
          {"layers_to_transform", nullptr},
          {"layers_pattern", nullptr},
          {"rank_pattern", nlohmann::json::object()},
          {"alpha_pattern", nlohmann::json::object()},
          {"revision", nullptr}};
}

// `key` when present and not null must equal `want`.
void require_field(const nlohmann::json& j, const std::string& path, const char* key, const nlohmann::json& want) {
  if (!j.contains(key) || j[key].is_null()) return;
  if (j[key] != want) throw Error(str(path, ": \"", key, "\": ", j[key].dump(), " is not supported (Forge needs ", want.dump(), ")"));
}

// A field whose non-default value (not null, not empty) Forge does not implement.
void require_empty(const nlohmann::json& j, const std::string& path, const char* key) {
  if (!j.contains(key) || j[key].is_null() || (j[key].is_object() && j[key].empty())) return;
  throw Error(str(path, ": \"", key, "\": ", j[key].dump(), " is not supported"));
}

}  // namespace

void save_adapter_dir(const std::string& dir, const AdapterTable& table, const std::vector<float>& adapter,
                      const std::string& base_model, const io::FileSet& files) {
  FORGE_CHECK(static_cast<int64_t>(adapter.size()) == table.total(), "save_adapter_dir: ", adapter.size(),
              " values for ", table.total());
  fs::path path = fs::path(dir).lexically_normal();
  if (path.filename().empty()) path = path.parent_path();
  std::error_code ec;
  if (fs::exists(path, ec) && !fs::is_directory(path, ec)) throw Error(str(dir, ": exists and is not a directory"));
  if (!path.parent_path().empty()) {
    fs::create_directories(path.parent_path(), ec);
    if (ec) throw Error(str(path.parent_path().string(), ": cannot create directory: ", ec.message()));
  }
  io::AtomicDir out(path.string());
  write_adapter_files(out.tmp_path(), table, adapter, base_model, files);
  out.commit();
}

void write_adapter_files(const std::string& dir, const AdapterTable& table, const std::vector<float>& adapter,
                         const std::string& base_model, const io::FileSet& files) {
  FORGE_CHECK(static_cast<int64_t>(adapter.size()) == table.total(), "write_adapter_files: sizes");
  std::vector<io::TensorToWrite> tensors;
  for (const ParamInfo& p : table.params())
    tensors.push_back({p.name, io::StDType::kF32, p.shape, adapter.data() + p.offset});
  io::write_safetensors(dir + "/" + kAdapterWeightsFile, tensors, {{"format", "pt"}});
  io::write_file_atomic(dir + "/" + kAdapterConfigFile, adapter_config(table.lora(), base_model).dump(2) + "\n");
  io::write_files(dir, files);
}

std::string weights_sha256(const std::vector<float>& weights) {
  Sha256 h;
  h.update(weights.data(), weights.size() * sizeof(float));
  return h.hex_digest();
}

bool is_adapter_dir(const std::string& dir) {
  std::error_code ec;
  return fs::is_regular_file(dir + "/" + kAdapterConfigFile, ec);
}

LoadedAdapter load_adapter_dir(const std::string& dir, const ModelConfig& base) {
  if (!fs::is_directory(dir)) throw Error(str(dir, ": not an adapter directory"));
  const std::string cpath = dir + "/" + kAdapterConfigFile;
  const nlohmann::json j = read_json(cpath);
  LoadedAdapter out;
  try {
    if (!j.is_object() || j.value("peft_type", "") != "LORA")
      throw Error(str(cpath, ": not a LoRA adapter (\"peft_type\" is not \"LORA\")"));
    if (!j.contains("r") || !j["r"].is_number_integer()) throw Error(str(cpath, ": \"r\" missing or not an integer"));
    out.lora.r = j["r"].get<int>();
    out.lora.alpha = j.contains("lora_alpha") ? j["lora_alpha"].get<double>() : 8.0;  // PEFT's default
    const nlohmann::json& tm = j.contains("target_modules") ? j["target_modules"] : nlohmann::json();
    if (!tm.is_array())
      throw Error(str(cpath, ": \"target_modules\" must be a list of module names (a pattern is not supported)"));
    out.lora.targets.clear();
    for (const auto& m : tm) {
      const std::string name = m.get<std::string>();
      bool found = false;
      for (int t = 0; t < kNumLoraTargets; ++t)
        if (name == lora_target_module(static_cast<LoraTarget>(t))) {
          out.lora.targets.push_back(static_cast<LoraTarget>(t));
          found = true;
        }
      if (!found) throw Error(str(cpath, ": target module '", name, "' is not one Forge adapts (q_proj ... down_proj)"));
    }
    require_field(j, cpath, "bias", "none");
    require_field(j, cpath, "fan_in_fan_out", false);
    require_field(j, cpath, "use_rslora", false);
    require_field(j, cpath, "use_dora", false);
    require_empty(j, cpath, "rank_pattern");
    require_empty(j, cpath, "alpha_pattern");
    require_empty(j, cpath, "layers_to_transform");
    require_empty(j, cpath, "modules_to_save");
    if (j.contains("base_model_name_or_path") && j["base_model_name_or_path"].is_string())
      out.base_model = j["base_model_name_or_path"].get<std::string>();
  } catch (const nlohmann::json::exception& e) {
    throw Error(str(cpath, ": a field has the wrong type: ", e.what()));
  }
  const AdapterTable table(base, out.lora);  // validates r, targets, the family
  const io::SafetensorsFile f = io::SafetensorsFile::open(dir + "/" + kAdapterWeightsFile);
  out.weights.assign(table.total(), 0.0f);
  for (const ParamInfo& p : table.params()) {
    const io::TensorInfo* t = f.find(p.name);
    if (t == nullptr) throw Error(str(f.path(), ": tensor ", p.name, " missing (the adapter does not fit this base model)"));
    if (t->shape != p.shape)
      throw Error(str(f.path(), ": tensor ", p.name, " has shape ", shape_str(t->shape), ", the base model needs ",
                      shape_str(p.shape)));
    const std::vector<float> v = f.read_f32(p.name);
    std::copy(v.begin(), v.end(), out.weights.begin() + p.offset);
  }
  if (f.tensors().size() != table.params().size()) {
    for (const io::TensorInfo& t : f.tensors()) {
      bool known = false;
      for (const ParamInfo& p : table.params()) known = known || p.name == t.name;
      if (!known) throw Error(str(f.path(), ": tensor ", t.name, " does not belong to this base model's adapter"));
    }
  }
  return out;
}

}  // namespace forge
