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

#include <cmath>
#include <cstdio>
#include <filesystem>
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
     {"json", "", "print one JSON object"}},
    false,
    "DIR",
    "Exit 0: the directory loads, survives a save/load round trip exactly, and computes finite\n"
    "logits. Any problem is a one-line error and exit 1."};

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

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
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
  Transformer<float> model = load_model_dir(dir);
  const ModelConfig& cfg = model.config();

  for (const auto& p : model.table().params())
    for (int64_t i = 0; i < p.numel(); ++i)
      if (!std::isfinite(model.weights()[p.offset + i]))
        throw Error(str(dir, ": tensor '", p.name, "' holds a non-finite value at element ", i));

  const TempDir tmp;
  const std::string first = tmp.path + "/first", second = tmp.path + "/second";
  save_model_dir(first, model);
  Transformer<float> reloaded = load_model_dir(first);
  if (reloaded.weights() != model.weights())
    throw Error(str(dir, ": weights changed in a save/load round trip (a Forge bug)"));
  save_model_dir(second, reloaded);
  const std::string a_bytes = slurp(first + "/model.safetensors");
  if (a_bytes.empty() || a_bytes != slurp(second + "/model.safetensors"))
    throw Error(str(dir, ": model.safetensors differs between two saves (a Forge bug)"));
  const std::string canonical_sha = sha256_file(first + "/model.safetensors");

  std::vector<std::string> files;
  for (const auto& t : info.tensors)
    if (files.empty() || files.back() != t.file) files.push_back(t.file);
  nlohmann::json file_sums = nlohmann::json::object();
  for (const auto& f : files) file_sums[f] = sha256_file(dir + "/" + f);
  const bool identical = files.size() == 1 && files[0] == "model.safetensors" &&
                         file_sums["model.safetensors"] == canonical_sha;

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
  const float* all = model.logits_of(tokens.data(), 1, T_);  // (T, Vp)
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

  const std::vector<std::string> warnings = hf_config_warnings(cfg);
  if (a.has("json")) {
    const nlohmann::json j = {{"dir", dir},
                              {"valid", true},
                              {"warnings", warnings},
                              {"model_type", info.hf_config.value("model_type", "")},
                              {"parameters", info.num_params},
                              {"sha256", file_sums},
                              {"canonical_sha256", canonical_sha},
                              {"identical_to_canonical", identical}};
    std::printf("%s\n", j.dump().c_str());
    return 0;
  }
  std::printf("%s: valid %s model, %lld parameters; save/load round trip exact; logits finite\n",
              dir.c_str(), info.hf_config.value("model_type", "").c_str(),
              static_cast<long long>(info.num_params));
  for (const auto& [f, sum] : file_sums.items())
    std::printf("  sha256 %s  %s\n", sum.get<std::string>().c_str(), f.c_str());
  std::printf("  sha256 %s  (canonical f32 model.safetensors%s)\n", canonical_sha.c_str(),
              identical ? ": byte-identical to the directory's" : "");
  for (const auto& w : warnings) std::printf("  warning: %s\n", w.c_str());
  return 0;
}

}  // namespace forge::cli
