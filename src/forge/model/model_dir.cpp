// Model directories (see model_dir.h). The tensors of a directory come from one
// model.safetensors or from the shards that model.safetensors.index.json maps them to; either
// way they are looked up by name through one TensorSet, so loading and inspecting don't care.
#include "forge/model/model_dir.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "forge/core/error.h"
#include "forge/io/atomic_file.h"
#include "forge/io/bf16.h"
#include "forge/model/fp8_checkpoint.h"

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
        throw Error(str(dir, ": tensor ", quote(t.name), " appears in both ",
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
      throw Error(str(index_path, ": weight_map[", quote(name), "] is not a string"));
    const std::string f = file.get<std::string>();
    if (f.empty() || f.find('/') != std::string::npos || f.starts_with("."))
      throw Error(
          str(index_path, ": weight_map[", quote(name), "] names a file outside the directory"));
    // The name goes into paths, and paths into messages: no control characters (a newline in
    // one made "cannot open" a two-line error; found by fuzz_safetensors_index).
    if (std::any_of(f.begin(), f.end(),
                    [](char c) { return static_cast<unsigned char>(c) < 0x20 || c == 0x7f; }))
      throw Error(str(index_path, ": weight_map[", quote(name), "] names ", quote(f),
                      ", which has control characters"));
    weight_map[name] = f;
    shard_names.insert(f);
  }
  for (const auto& f : shard_names) add_file(f);
  for (const auto& [name, file] : weight_map) {
    auto it = s.where.find(name);
    if (it == s.where.end() || s.file_names[it->second] != file)
      throw Error(str(index_path, ": tensor ", quote(name), " is not in ", quote(file)));
  }
  return s;
}

// config.json as Forge reads it, plus the one fact config.json may get wrong: a llama
// checkpoint without lm_head.weight is tied.
ModelConfig resolve_config(const std::string& dir, const nlohmann::json& j, const TensorSet& ts) {
  ModelConfig cfg;
  try {
    cfg = read_hf_config(j);
    fp8_quantization(j);  // an unsupported quantization is refused here, for every command
  } catch (const Error& e) {
    std::string msg = e.what();
    if (msg.starts_with("config.json: ")) msg = msg.substr(13);
    throw Error(str(dir, "/config.json: ", msg));
  }
  if (cfg.family == Family::kLlama && !cfg.tie_embeddings && !ts.find("lm_head.weight"))
    cfg.tie_embeddings = true;
  return cfg;
}

// config.json and the weights: the files a save makes itself.
bool weights_or_config(const std::string& name) {
  return name == "config.json" || name == "model.safetensors" ||
         name == "model.safetensors.index.json" ||
         (name.starts_with("model-") && name.ends_with(".safetensors"));  // shards
}

// The names a save writes or that an earlier save wrote: replaced (or dropped) by a new save.
bool written_by_save(const std::string& name) {
  if (weights_or_config(name) || name == io::kGenerationConfigFile) return true;
  for (const char* t : io::kTokenizerFiles)
    if (name == t) return true;
  return false;
}

void check_save_options(const std::string& dir, const ModelSaveOptions& opt) {
  if (opt.dtype != io::StDType::kF32 && opt.dtype != io::StDType::kBF16)
    throw Error(
        str(dir, ": cannot save weights as ", io::st_dtype_name(opt.dtype), " (F32 or BF16)"));
  if (opt.shard_size < 1)
    throw Error(str(dir, ": shard size ", opt.shard_size, " must be at least 1 byte"));
  for (const auto& [name, bytes] : opt.files)
    if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos ||
        weights_or_config(name))
      throw Error(str(dir, ": cannot write '", name, "' beside the weights"));
}

// Hard-links (or, where the file system refuses, copies) every entry of `old_dir` that is not a
// file of a save into `new_dir`: what a user keeps in a model directory outlives a re-save.
void keep_foreign_files(const fs::path& old_dir, const std::string& new_dir) {
  for (const auto& e : fs::directory_iterator(old_dir)) {
    const std::string name = e.path().filename().string();
    // A stale NAME.tmp belongs to a writer of NAME that crashed.
    const std::string base = name.ends_with(".tmp") ? name.substr(0, name.size() - 4) : name;
    if (written_by_save(base)) continue;
    const fs::path to = fs::path(new_dir) / name;
    std::error_code ec;
    fs::copy(e.path(), to, fs::copy_options::recursive | fs::copy_options::create_hard_links, ec);
    if (ec) {
      fs::remove_all(to, ec);
      fs::copy(e.path(), to, fs::copy_options::recursive, ec);
      if (ec)
        throw Error(str(e.path().string(), ": cannot keep it in the new save: ", ec.message()));
    }
  }
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

io::StDType save_dtype_from_name(const std::string& name) {
  if (name == "f32") return io::StDType::kF32;
  if (name == "bf16") return io::StDType::kBF16;
  throw Error(str("unknown save dtype ", quote(name), " (expected f32 or bf16)"));
}

std::vector<std::vector<size_t>> plan_weight_shards(const std::vector<uint64_t>& bytes,
                                                    uint64_t limit) {
  std::vector<std::vector<size_t>> shards;
  std::vector<size_t> current;
  uint64_t current_bytes = 0;
  for (size_t i = 0; i < bytes.size(); ++i) {
    if (bytes[i] > limit) {  // alone, and (as huggingface_hub does) ahead of the open file
      shards.push_back({i});
      continue;
    }
    if (current_bytes + bytes[i] > limit) {
      shards.push_back(std::move(current));
      current.clear();
      current_bytes = 0;
    }
    current.push_back(i);
    current_bytes += bytes[i];
  }
  if (!current.empty()) shards.push_back(std::move(current));
  return shards;
}

void write_model_files(const std::string& dir, const Transformer<float>& model,
                       const ModelSaveOptions& opt) {
  check_save_options(dir, opt);
  const ModelConfig& cfg = model.config();
  const size_t elem = io::st_dtype_size(opt.dtype);
  std::vector<const ParamInfo*> params;
  std::vector<Shape> shapes;
  std::vector<uint64_t> bytes;
  int64_t numel = 0;
  for (const auto& p : model.table().params()) {
    params.push_back(&p);
    shapes.push_back(checkpoint_shape(model.table(), p, cfg));
    bytes.push_back(static_cast<uint64_t>(shape_numel(shapes.back())) * elem);
    numel += shape_numel(shapes.back());
  }
  const auto shards = plan_weight_shards(bytes, static_cast<uint64_t>(opt.shard_size));
  nlohmann::json weight_map = nlohmann::json::object();
  for (size_t s = 0; s < shards.size(); ++s) {
    char name[64];
    std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", s + 1, shards.size());
    const std::string file = shards.size() == 1 ? "model.safetensors" : name;
    // BF16: one shard's tensors converted at a time, so a big model needs half a shard of
    // extra memory, not half the model.
    std::vector<uint16_t> half;
    if (opt.dtype == io::StDType::kBF16) {
      size_t n = 0;
      for (const size_t i : shards[s]) n += static_cast<size_t>(shape_numel(shapes[i]));
      half.resize(n);
    }
    std::vector<io::TensorToWrite> tensors;
    size_t at = 0;
    for (const size_t i : shards[s]) {
      const float* w = model.weights().data() + params[i]->offset;
      const void* data = w;
      if (opt.dtype == io::StDType::kBF16) {
        const int64_t n = shape_numel(shapes[i]);
        for (int64_t k = 0; k < n; ++k) half[at + k] = f32_to_bf16(w[k]);
        data = half.data() + at;
        at += static_cast<size_t>(n);
      }
      tensors.push_back({params[i]->name, opt.dtype, shapes[i], data});
      weight_map[params[i]->name] = file;
    }
    io::write_safetensors(dir + "/" + file, tensors, {{"format", "pt"}});
  }
  if (shards.size() > 1) {
    uint64_t total = 0;
    for (const uint64_t b : bytes) total += b;
    // Keys sorted, 2-space indent, a final newline: json.dumps(index, indent=2, sort_keys=True)
    // + "\n", as transformers writes it; total_parameters as it has since June 2025
    // (huggingface/transformers#38531).
    const nlohmann::json index = {
        {"metadata", {{"total_parameters", numel}, {"total_size", total}}},
        {"weight_map", weight_map}};
    io::write_file_atomic(dir + "/model.safetensors.index.json", index.dump(2) + "\n");
  }
  nlohmann::json config = to_hf_config(cfg);
  const char* dtype = opt.dtype == io::StDType::kBF16 ? "bfloat16" : "float32";
  config["torch_dtype"] = dtype;
  if (config.contains("dtype")) config["dtype"] = dtype;  // transformers 5's name for it
  io::write_file_atomic(dir + "/config.json", config.dump(2) + "\n");
  io::write_files(dir, opt.files);
}

void save_model_dir(const std::string& dir, const Transformer<float>& model,
                    const ModelSaveOptions& opt) {
  check_save_options(dir, opt);  // before anything on disk changes
  fs::path path = fs::path(dir).lexically_normal();
  if (path.filename().empty()) path = path.parent_path();  // "out/model/" -> "out/model"
  std::error_code ec;
  if (fs::exists(path, ec) && !fs::is_directory(path, ec))
    throw Error(str(dir, ": exists and is not a directory"));
  if (!path.parent_path().empty()) {
    fs::create_directories(path.parent_path(), ec);
    if (ec)
      throw Error(str(path.parent_path().string(), ": cannot create directory: ", ec.message()));
  }
  io::AtomicDir out(path.string());
  if (fs::is_directory(path, ec)) keep_foreign_files(path, out.tmp_path());
  write_model_files(out.tmp_path(), model, opt);
  out.commit();
}

namespace {

bool is_fp8(io::StDType t) { return t == io::StDType::kF8E4M3 || t == io::StDType::kF8E5M2; }

// An FP8 parameter tensor needs the quantization_config that says how it is scaled, two
// dimensions and its block scales beside it, of ⌈rows/block⌉ × ⌈cols/block⌉ (fp8_checkpoint.h).
void check_fp8_tensor(const TensorSet& ts, const std::string& dir, const io::TensorInfo& t, const Shape& shape,
                      Fp8Blocks fp8) {
  if (!is_fp8(t.dtype)) return;
  const std::string where = tensor_file_name(ts, dir, t.name);
  if (!fp8)
    throw Error(str(where, ": tensor ", quote(t.name), " is ", io::st_dtype_name(t.dtype),
                    " but config.json has no FP8 quantization_config to scale it"));
  if (t.dtype != io::StDType::kF8E4M3)
    throw Error(str(where, ": tensor ", quote(t.name), " is F8_E5M2; FP8 checkpoints store weights as F8_E4M3"));
  if (shape.size() != 2) throw Error(str(where, ": FP8 tensor ", quote(t.name), " is not a matrix"));
  const std::string scale = fp8_scale_name(t.name);
  const io::TensorInfo* s = ts.find(scale);
  if (!s) throw Error(str(where, ": FP8 tensor ", quote(t.name), " has no block scales ", quote(scale)));
  const Shape want = {(shape[0] + fp8.rows - 1) / fp8.rows, (shape[1] + fp8.cols - 1) / fp8.cols};
  if (s->shape != want)
    throw Error(str(tensor_file_name(ts, dir, scale), ": tensor ", quote(scale), " has shape ", shape_str(s->shape),
                    " but ", shape_str(shape), " in blocks of ", fp8.rows, "x", fp8.cols, " needs ", shape_str(want)));
  if (s->dtype != io::StDType::kF32 && s->dtype != io::StDType::kBF16 && s->dtype != io::StDType::kF16)
    throw Error(str(tensor_file_name(ts, dir, scale), ": block scales ", quote(scale), " are ",
                    io::st_dtype_name(s->dtype), " (expected F32, BF16 or F16)"));
}

}  // namespace

Transformer<float> load_model_dir(const std::string& dir, GradBuffers grads) {
  if (!fs::is_directory(dir)) throw Error(str(dir, ": not a model directory"));
  const nlohmann::json j = read_json_file(dir + "/config.json");
  const TensorSet ts = open_tensors(dir);
  const ModelConfig cfg = resolve_config(dir, j, ts);
  const Fp8Blocks fp8 = fp8_quantization(j);
  // Every tensor is found and its shape checked against the parameter table before the model is
  // allocated: a config.json that claims a far bigger model than its files hold fails here,
  // naming the first tensor that disagrees, instead of first allocating what it claims.
  const ParamTable table(cfg);
  std::vector<std::string> names;  // each parameter's name in the files
  for (const auto& p : table.params()) {
    std::string name = p.name;
    if (!ts.find(name) && name.starts_with("transformer.") && ts.find(name.substr(12)))
      name = name.substr(12);  // original OpenAI GPT-2 exports omit the "transformer." prefix
    const io::TensorInfo* t = ts.find(name);
    if (!t) throw Error(str(tensor_file_name(ts, dir, name), ": missing tensor '", p.name, "'"));
    const Shape want = checkpoint_shape(table, p, cfg);
    if (t->shape != want)
      throw Error(str(tensor_file_name(ts, dir, name), ": tensor '", name, "' has shape ",
                      shape_str(t->shape), " but config.json implies ", shape_str(want)));
    check_fp8_tensor(ts, dir, *t, want, fp8);
    names.push_back(std::move(name));
  }
  std::set<std::string> used(names.begin(), names.end());
  for (const auto& name : names)
    if (is_fp8(ts.find(name)->dtype)) used.insert(fp8_scale_name(name));
  for (const auto& [name, file] : ts.where) {
    if (used.count(name) || is_known_buffer(name)) continue;
    if (name == "lm_head.weight" && cfg.tie_embeddings) continue;  // tied: the embedding wins
    throw Error(str(dir, "/", ts.file_names[file], ": unexpected tensor ", quote(name),
                    " for model_type ", cfg.family_name()));
  }
  Transformer<float> model(cfg, grads);
  for (size_t i = 0; i < names.size(); ++i) {
    const io::SafetensorsFile& f = ts.file_of(names[i]);
    const ParamInfo& p = table.params()[i];  // the file holds the checked shape (vocabulary rows unpadded)
    const auto n = static_cast<size_t>(shape_numel(checkpoint_shape(table, p, cfg)));
    float* w = model.weights().data() + p.offset;
    f.read_f32_into(names[i], w, n);
    f.release_pages(*ts.find(names[i]));  // the file's pages need not stay beside the f32 copy
    if (is_fp8(ts.find(names[i])->dtype)) {  // 2-D, its scales checked by check_fp8_tensor
      const Shape& s = ts.find(names[i])->shape;
      const std::vector<float> scales = ts.file_of(fp8_scale_name(names[i])).read_f32(fp8_scale_name(names[i]));
      apply_fp8_block_scales(w, s[0], s[1], scales.data(), fp8);
    }
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
  info.fp8 = fp8_quantization(info.hf_config);
  return info;
}

}  // namespace forge
