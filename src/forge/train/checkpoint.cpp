// Checkpoint directories (see checkpoint.h). The model part is save_model_dir/load_model_dir,
// so a checkpoint is also a model directory that `forge eval` and transformers read as is.
#include "forge/train/checkpoint.h"

#include <algorithm>
#include <climits>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>

#include "forge/core/error.h"
#include "forge/data/loader.h"
#include "forge/io/atomic_file.h"
#include "forge/io/safetensors.h"
#include "forge/model/lora_dir.h"
#include "forge/model/model_dir.h"

namespace forge {

namespace fs = std::filesystem;

namespace {

// 2: rng.loader names the loader's real Philox stream (TrainLoader::kRngStream).
constexpr int kStateVersion = 2;

// Rows of a parameter in a checkpoint: the embedding (and an untied head) drop their padding.
Shape saved_shape(const ParamTable& table, const ParamInfo& p, const ModelConfig& cfg) {
  if (p.offset == table.wte() || p.offset == table.lm_head()) return {cfg.vocab_size, cfg.n_embd};
  return p.shape;
}

// Parses "step_000042" -> 42; -1 for anything else.
int parse_checkpoint_name(const std::string& name) {
  if (!name.starts_with("step_") || name.size() < 6) return -1;
  int step = 0;
  for (size_t i = 5; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9' || step > 100'000'000) return -1;
    step = step * 10 + (name[i] - '0');
  }
  return step;
}

nlohmann::json loss_scale_json(const LossScaleState& ls) {
  return {{"scale", ls.scale},
          {"good_steps", ls.good_steps},
          {"skipped_total", ls.skipped_total},
          {"growth_interval", ls.growth_interval},
          {"step_scale", ls.step_scale},
          {"skipped", ls.skipped}};
}

LossScaleState loss_scale_from_json(const std::string& path, const nlohmann::json& j) {
  auto bad = [&](const std::string& what) {
    return Error(str(path, ": bad \"loss_scale\": ", what));
  };
  if (!j.is_object()) throw bad(str("expected an object, found ", j.dump()));
  auto number = [&](const char* k) {
    if (!j.contains(k) || !j[k].is_number()) throw bad(str("\"", k, "\" missing or not a number"));
    return j[k].get<double>();
  };
  auto integer = [&](const char* k, int64_t lo) {
    if (!j.contains(k) || !j[k].is_number_integer() || j[k].get<int64_t>() < lo ||
        j[k].get<int64_t>() > INT32_MAX)
      throw bad(str("\"", k, "\" must be an integer >= ", lo));
    return static_cast<int32_t>(j[k].get<int64_t>());
  };
  LossScaleState ls;
  const double scale = number("scale"), step_scale = number("step_scale");
  constexpr double kMax = std::numeric_limits<float>::max();
  if (!(scale > 0 && scale <= kMax)) throw bad(str("scale ", scale, " is not a positive float"));
  if (!(step_scale >= 0 && step_scale <= kMax))
    throw bad(str("step_scale ", step_scale, " is not a float >= 0"));
  ls.scale = static_cast<float>(scale);
  ls.step_scale = static_cast<float>(step_scale);
  ls.good_steps = integer("good_steps", 0);
  ls.skipped_total = integer("skipped_total", 0);
  ls.growth_interval = integer("growth_interval", 1);
  ls.skipped = integer("skipped", 0);
  if (ls.skipped > 1) throw bad(str("\"skipped\" is ", ls.skipped, ", expected 0 or 1"));
  return ls;
}

nlohmann::json state_json(const TrainerState& s) {
  nlohmann::json j = {
      {"format", "forge-trainer-state"},
      {"version", kStateVersion},
      {"step", s.step},
      {"seed", s.seed},
      {"rng",
       {{"loader",
         {{"seed", s.seed},
          {"stream", TrainLoader::kRngStream},
          {"offset", s.loader_rng_offset}}}}},
      {"data_loader", {{"kind", "random_windows"}, {"rng_offset", s.loader_rng_offset}}},
      {"config", s.config},
      {"skipped_steps", s.skipped_steps}};
  if (s.loss_scale) j["loss_scale"] = loss_scale_json(*s.loss_scale);
  return j;
}

TrainerState state_from_json(const std::string& path, const nlohmann::json& j) {
  auto need = [&](bool ok, const char* what) {
    if (!ok) throw Error(str(path, ": ", what));
  };
  need(j.is_object() && j.value("format", "") == "forge-trainer-state",
       "not a forge trainer state (no \"format\": \"forge-trainer-state\")");
  const int64_t version =
      j.contains("version") && j["version"].is_number_integer() ? j["version"].get<int64_t>() : 0;
  if (version != 1 && version != kStateVersion)
    throw Error(str(path, ": unsupported trainer state version ",
                    j.contains("version") ? j["version"].dump() : "(none)", " (expected 1 or ",
                    kStateVersion, ")"));
  // step is an int everywhere after this (get<int> of 2^31 would wrap to a negative step).
  need(j.contains("step") && j["step"].is_number_unsigned() &&
           j["step"].get<uint64_t>() <= uint64_t{INT32_MAX},
       "missing or bad \"step\" (an integer in [0, 2147483647])");
  need(j.contains("seed") && j["seed"].is_number_unsigned(), "missing or bad \"seed\"");
  need(j.contains("data_loader") && j["data_loader"].is_object() &&
           j["data_loader"].contains("rng_offset") &&
           j["data_loader"]["rng_offset"].is_number_unsigned(),
       "missing or bad \"data_loader\": {\"rng_offset\"}");
  need(j.contains("config") && j["config"].is_object(), "missing \"config\"");
  TrainerState s;
  s.step = j["step"].get<int>();
  s.seed = j["seed"].get<uint64_t>();
  s.loader_rng_offset = j["data_loader"]["rng_offset"].get<uint64_t>();
  // Version 1 wrote "stream": 0 although TrainLoader has always drawn from stream 1: its rng
  // entry is not read. From version 2 on it must name the loader's stream, seed and offset.
  if (version >= 2) {
    need(j.contains("rng") && j["rng"].is_object() && j["rng"].contains("loader") &&
             j["rng"]["loader"].is_object(),
         "missing \"rng\": {\"loader\"}");
    const nlohmann::json& r = j["rng"]["loader"];
    for (const char* k : {"seed", "stream", "offset"})
      if (!r.contains(k) || !r[k].is_number_unsigned())
        throw Error(str(path, ": missing or bad \"rng\": {\"loader\": {\"", k, "\"}}"));
    if (r["stream"].get<uint64_t>() != TrainLoader::kRngStream)
      throw Error(str(path, ": rng.loader.stream is ", r["stream"].get<uint64_t>(),
                      ", but the data loader draws from Philox stream ", TrainLoader::kRngStream));
    if (r["seed"].get<uint64_t>() != s.seed)
      throw Error(str(path, ": rng.loader.seed ", r["seed"].get<uint64_t>(),
                      " disagrees with \"seed\" ", s.seed));
    if (r["offset"].get<uint64_t>() != s.loader_rng_offset)
      throw Error(str(path, ": rng.loader.offset ", r["offset"].get<uint64_t>(),
                      " disagrees with data_loader.rng_offset ", s.loader_rng_offset));
  }
  s.config = j["config"];
  if (j.contains("skipped_steps")) {
    const nlohmann::json& k = j["skipped_steps"];
    need(k.is_number_integer() && k.get<int64_t>() >= 0 && k.get<int64_t>() <= s.step,
         "bad \"skipped_steps\" (an integer in [0, step])");
    s.skipped_steps = k.get<int>();
  }
  if (j.contains("loss_scale")) s.loss_scale = loss_scale_from_json(path, j["loss_scale"]);
  return s;
}

// A LoRA checkpoint holds the adapters; the base is the run's init_from, which must still be
// the model the run began on (the SHA-256 of its weights, recorded in the run configuration's
// "lora" entry).
Transformer<float> load_lora_model(const std::string& dir, const TrainerState& state) {
  const std::string where = dir + "/trainer_state.json";
  const nlohmann::json& rc = state.config;
  if (!rc.contains("init_from") || !rc["init_from"].is_string() || !rc.contains("lora") ||
      !rc["lora"].is_object() || !rc["lora"].contains("base_sha256") || !rc["lora"]["base_sha256"].is_string())
    throw Error(str(where, ": a LoRA checkpoint needs \"init_from\" and \"lora\": {\"base_sha256\"} in its config"));
  const std::string base_dir = rc["init_from"].get<std::string>();
  Transformer<float> model = load_model_dir(base_dir, GradBuffers::kNone);  // the run's host copy
  if (weights_sha256(model.weights()) != rc["lora"]["base_sha256"].get<std::string>())
    throw Error(str("the LoRA run's base model ", base_dir,
                    " changed since the run began (the SHA-256 of its weights differs from ", where,
                    "); resume needs the base it trained on"));
  LoadedAdapter a = load_adapter_dir(dir, model.config());
  model.attach_lora(a.lora, 0);
  model.adapter_weights() = std::move(a.weights);
  return model;
}

}  // namespace

std::string checkpoint_name(int step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step_%06d", step);
  return buf;
}

std::vector<std::pair<int, std::string>> list_checkpoints(const std::string& run_dir) {
  std::vector<std::pair<int, std::string>> out;
  const fs::path dir = fs::path(run_dir) / "checkpoints";
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return out;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const int step = parse_checkpoint_name(e.path().filename().string());
    if (step >= 0 && e.is_directory()) out.emplace_back(step, e.path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::string save_checkpoint(const std::string& run_dir, const Transformer<float>& model,
                            const std::vector<float>& m, const std::vector<float>& v,
                            const TrainerState& state, int keep, const io::FileSet& files,
                            int64_t shard_size) {
  const ParamTable& table = model.table();
  const ModelConfig& cfg = model.config();
  const AdapterTable* lora = model.adapter_table();  // LoRA: the adapters are what trains
  const int64_t trained = lora ? lora->total() : table.total();
  FORGE_CHECK(static_cast<int64_t>(m.size()) == trained && static_cast<int64_t>(v.size()) == trained,
              "optimizer state has ", m.size(), "/", v.size(), " elements, model ", trained);
  const fs::path dir = fs::path(run_dir) / "checkpoints";
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw Error(str(dir.string(), ": cannot create directory: ", ec.message()));
  // Leftovers of a save that crashed (best effort: AtomicDir removes a stale one of its own
  // name anyway, and readers ignore them).
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.path().filename().string().starts_with(io::kAtomicDirTmpPrefix)) {
      std::error_code rm;
      fs::remove_all(e.path(), rm);
    }

  const fs::path final_path = dir / checkpoint_name(state.step);
  io::AtomicDir out(final_path.string());
  const fs::path tmp = out.tmp_path();
  if (lora) {  // the adapter directory; the base is re-read from the run's init_from on resume
    const std::string base = state.config.value("init_from", "");
    write_adapter_files(tmp.string(), *lora, model.adapter_weights(), base, files);
  } else {
    write_model_files(tmp.string(), model, {io::StDType::kF32, shard_size, files});
  }
  // The embedding's padding rows are not saved; they must be zero in m and v as in the weights,
  // or a resumed run would differ. They are (the padded logits get no gradient).
  for (const auto* buf : {&m, &v}) {
    if (lora) break;
    for (const int64_t off : {table.wte(), table.lm_head()}) {
      const int64_t first = off + int64_t{cfg.vocab_size} * cfg.n_embd;
      const int64_t last = off + int64_t{cfg.padded_vocab()} * cfg.n_embd;
      for (int64_t i = first; i < last; ++i)
        FORGE_CHECK((*buf)[i] == 0.0f, "Adam state in the embedding's padding rows is non-zero");
    }
  }
  std::vector<io::TensorToWrite> tensors;
  std::vector<std::string> names;
  const std::vector<ParamInfo>& params = lora ? lora->params() : table.params();
  names.reserve(2 * params.size());
  for (const char* which : {"m.", "v."}) {
    const std::vector<float>& buf = which[0] == 'm' ? m : v;
    for (const auto& p : params) {
      names.push_back(which + p.name);
      tensors.push_back({names.back(), io::StDType::kF32, lora ? p.shape : saved_shape(table, p, cfg),
                         buf.data() + p.offset});
    }
  }
  io::write_safetensors((tmp / "optimizer.safetensors").string(), tensors,
                        {{"format", "forge-adamw"}, {"step", std::to_string(state.step)}});
  io::write_file_atomic((tmp / "trainer_state.json").string(), state_json(state).dump(2) + "\n");
  // Replaces a checkpoint of the same step (a run resumed and stopped again at the same place).
  out.commit();

  // Pruning is best effort: an old checkpoint that cannot be removed is no reason to fail a
  // save that succeeded (resume takes the newest).
  if (keep > 0) {
    auto all = list_checkpoints(run_dir);
    for (size_t i = 0; i + keep < all.size(); ++i) fs::remove_all(all[i].second, ec);
  }
  return final_path.string();
}

Checkpoint load_checkpoint(const std::string& dir) {
  const std::string state_path = dir + "/trainer_state.json";
  std::ifstream f(state_path);
  if (!f) throw Error(str(state_path, ": cannot open"));
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(f);
  } catch (const nlohmann::json::exception& e) {
    throw Error(str(state_path, ": malformed JSON: ", e.what()));
  }
  TrainerState state;
  try {
    state = state_from_json(state_path, j);
  } catch (const nlohmann::json::exception& e) {
    throw Error(str(state_path, ": a field has the wrong type: ", e.what()));
  }
  Checkpoint c{is_adapter_dir(dir) ? load_lora_model(dir, state) : load_model_dir(dir, GradBuffers::kNone), {}, {}, std::move(state)};
  const ParamTable& table = c.model.table();
  const ModelConfig& cfg = c.model.config();
  const AdapterTable* lora = c.model.adapter_table();
  const std::vector<ParamInfo>& params = lora ? lora->params() : table.params();
  const auto saved = [&](const ParamInfo& p) { return lora ? p.shape : saved_shape(table, p, cfg); };
  c.m.assign(lora ? lora->total() : table.total(), 0.0f);
  c.v.assign(c.m.size(), 0.0f);
  const auto opt = io::SafetensorsFile::open(dir + "/optimizer.safetensors");
  for (const char* which : {"m.", "v."}) {
    std::vector<float>& buf = which[0] == 'm' ? c.m : c.v;
    for (const auto& p : params) {
      const std::string name = which + p.name;
      const io::TensorInfo* t = opt.find(name);
      if (!t) throw Error(str(opt.path(), ": missing tensor '", name, "'"));
      if (t->dtype != io::StDType::kF32)
        throw Error(str(opt.path(), ": tensor '", name, "' is ", io::st_dtype_name(t->dtype),
                        ", expected F32 (optimizer state is stored exactly)"));
      if (t->shape != saved(p))
        throw Error(str(opt.path(), ": tensor '", name, "' has shape ", shape_str(t->shape),
                        ", expected ", shape_str(saved(p))));
      const std::vector<float> data = opt.read_f32(name);
      std::copy(data.begin(), data.end(), buf.begin() + p.offset);
    }
  }
  if (opt.tensors().size() != 2 * params.size())
    throw Error(str(opt.path(), ": holds ", opt.tensors().size(), " tensors, expected ",
                    2 * params.size(), " (m and v of every parameter)"));
  return c;
}

}  // namespace forge
