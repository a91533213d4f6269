// forge validate DIR: loads a model directory with every check the loader makes, saves it to a
// temporary directory, loads that and saves it again, and requires the two saves to be
// byte-identical and the weights bit-identical (the save/load round trip loses nothing). Also
// runs one forward pass and requires finite weights and logits. Prints SHA-256 checksums of the
// directory's weight files and of the canonical (f32, Forge-ordered) model.safetensors, and a
// warning line for a model that transformers would compute differently (hf_config_warnings).
//
// --ids with --logits FILE writes the logits of that sequence as JSON, for comparing Forge
// with transformers (tools/check_hf_export.py).
#include <stdlib.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <optional>
#include <fstream>
#include <nlohmann/json.hpp>

#include "args.h"
#include "commands.h"
#include "forge/core/error.h"
#include "forge/model/config.h"
#include "forge/core/sha256.h"
#include "forge/model/model_dir.h"

namespace forge::cli {

namespace {

namespace fs = std::filesystem;

const Command kValidate = {
    "validate",
    "check a model directory: load, save, reload, compare, checksum",
    {{"ids", "1,2,3", "token ids for the forward-pass check (default 0..7)"},
     {"logits", "FILE", "write the logits for --ids as JSON {\"ids\", \"logits\": [T][V]}"},
     {"shard-size", "BYTES", "largest weights file of the round trip's saves (default 5000000000, as every save)"},
     {"json", "", "print one JSON object"}},
    false,
    "DIR",
    "Exit 0: the directory loads, survives a save/load round trip exactly, and computes finite\n"
    "logits. Any problem is a one-line error and exit 1. The canonical checksum is that of the f32\n"
    "model.safetensors Forge saves from these weights; when that save is sharded (weights above\n"
    "--shard-size), one per file of it, the index included (--json: an object of file -> sha256)."};

// A temporary directory that removes itself.
struct TempDir {
  std::string path;
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "forge-validate-XXXXXX").string();
    if (!mkdtemp(tmpl.data())) throw Error("cannot create a temporary directory");
    path = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

// The sha256 of each weights file a save wrote into d: model.safetensors, or the shards and
// their index. Files are hashed as streams, never held whole.
nlohmann::json weight_file_sums(const std::string& d) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(d)) {
    const std::string n = e.path().filename().string();
    if (n.ends_with(".safetensors") || n == "model.safetensors.index.json") names.push_back(n);
  }
  std::sort(names.begin(), names.end());
  nlohmann::json sums = nlohmann::json::object();
  for (const auto& n : names) sums[n] = sha256_file(d + "/" + n);
  return sums;
}

}  // namespace

int cmd_validate(const Argv& argv) {
  const Args a = parse_args(kValidate, argv);
  if (a.help()) {
    print_help(kValidate);
    return 0;
  }
  if (a.positional().empty()) throw Error("missing DIR (see forge validate --help)");
  const std::string dir = a.positional();
  const ModelDirInfo info = inspect_model_dir(dir);
  // The model is released before its saved copy is loaded: peak memory one model, not two. The
  // canonical save holds every weight as f32, verbatim, so "the reloaded weights equal the
  // loaded ones" is "the second save's files equal the first's", which is checked below.
  std::optional<Transformer<float>> model(load_model_dir(dir, GradBuffers::kNone));
  const ModelConfig cfg = model->config();

  for (const auto& p : model->table().params())
    for (int64_t i = 0; i < p.numel(); ++i)
      if (!std::isfinite(model->weights()[p.offset + i]))
        throw Error(str(dir, ": tensor '", p.name, "' holds a non-finite value at element ", i));

  std::vector<int> ids;
  if (a.has("ids"))
    ids = parse_id_list(a.get("ids"));
  else
    for (int i = 0; i < std::min(8, cfg.vocab_size); ++i) ids.push_back(i);
  if (ids.empty() || static_cast<int>(ids.size()) > cfg.max_seq_len)
    throw Error(str("--ids: need 1 to ", cfg.max_seq_len, " ids, got ", ids.size()));
  for (const int id : ids)
    if (id < 0 || id >= cfg.vocab_size)
      throw Error(str("--ids: id ", id, " is out of range for vocabulary size ", cfg.vocab_size));
  const std::vector<int32_t> tokens(ids.begin(), ids.end());
  const int T_ = static_cast<int>(tokens.size()), V = cfg.vocab_size, Vp = cfg.padded_vocab();
  const float* all = model->logits_of(tokens.data(), 1, T_);  // (T, Vp)
  nlohmann::json logits = nlohmann::json::array();
  for (int t = 0; t < T_; ++t) {
    const float* row = all + static_cast<size_t>(t) * Vp;  // (Vp)
    for (int v = 0; v < V; ++v)
      if (!std::isfinite(row[v]))
        throw Error(str(dir, ": non-finite logit at position ", t, ", token ", v));
    if (a.has("logits")) logits.push_back(std::vector<float>(row, row + V));
  }
  if (a.has("logits")) {
    std::ofstream f(a.get("logits"));
    if (!f) throw Error(str(a.get("logits"), ": cannot write"));
    f << nlohmann::json{{"ids", ids}, {"logits", logits}}.dump() << "\n";
  }

  const TempDir tmp;
  const std::string first = tmp.path + "/first", second = tmp.path + "/second";
  ModelSaveOptions save;
  save.shard_size = a.get_int64("shard-size", kDefaultShardSize, 1, std::numeric_limits<int64_t>::max());
  save_model_dir(first, *model, save);
  model.reset();
  save_model_dir(second, load_model_dir(first, GradBuffers::kNone), save);
  const nlohmann::json canonical = weight_file_sums(first);
  if (canonical.empty() || canonical != weight_file_sums(second))
    throw Error(str(dir, ": weights changed in a save/load round trip: the two saves' files differ (a Forge bug)"));

  std::vector<std::string> files;
  for (const auto& t : info.tensors)
    if (files.empty() || files.back() != t.file) files.push_back(t.file);
  nlohmann::json file_sums = nlohmann::json::object();
  for (const auto& f : files) file_sums[f] = sha256_file(dir + "/" + f);
  // Identical: the directory's weights files are the canonical save's, byte for byte (a
  // sharded directory's index is not compared: its JSON may be laid out differently).
  bool identical = true;
  size_t canonical_weights = 0;
  for (const auto& [f, sum] : canonical.items()) {
    if (f.ends_with(".json")) continue;
    ++canonical_weights;
    identical = identical && file_sums.contains(f) && file_sums[f] == sum;
  }
  identical = identical && canonical_weights == file_sums.size();
  const bool one_file = canonical.size() == 1;

  const std::vector<std::string> warnings = hf_config_warnings(cfg);
  if (a.has("json")) {
    const nlohmann::json j = {{"dir", dir},
                              {"valid", true},
                              {"warnings", warnings},
                              {"model_type", info.hf_config.value("model_type", "")},
                              {"parameters", info.num_params},
                              {"sha256", file_sums},
                              {"canonical_sha256", one_file ? canonical.begin().value() : canonical},
                              {"identical_to_canonical", identical}};
    std::printf("%s\n", j.dump().c_str());
    return 0;
  }
  std::printf("%s: valid %s model, %lld parameters; save/load round trip exact; logits finite\n",
              dir.c_str(), info.hf_config.value("model_type", "").c_str(),
              static_cast<long long>(info.num_params));
  for (const auto& [f, sum] : file_sums.items())
    std::printf("  sha256 %s  %s\n", sum.get<std::string>().c_str(), f.c_str());
  for (const auto& [f, sum] : canonical.items())
    std::printf("  sha256 %s  (canonical f32 %s%s)\n", sum.get<std::string>().c_str(), f.c_str(),
                identical && !f.ends_with(".json") ? ": byte-identical to the directory's" : "");
  for (const auto& w : warnings) std::printf("  warning: %s\n", w.c_str());
  return 0;
}

}  // namespace forge::cli
