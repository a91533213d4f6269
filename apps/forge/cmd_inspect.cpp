// forge inspect DIR [--json]: what a model directory holds — its configuration as Forge reads
// it, the parameter count, whether the embeddings are tied, and every tensor in its files with
// dtype and shape. Reads config.json and the safetensors headers only (weights stay on disk),
// but validates both fully, so a directory that inspects cleanly has well-formed files. A model
// that transformers would compute differently (interleaved RoPE, which only Forge's
// "forge_rope_style" key records) gets a warning line ("warnings" in --json).
#include <cstdio>
#include <nlohmann/json.hpp>

#include "args.h"
#include "commands.h"
#include "forge/core/error.h"
#include "forge/model/config.h"
#include "forge/model/model_dir.h"

namespace forge::cli {

namespace {

const Command kInspect = {
    "inspect",
    "show a model directory: config, parameter count, tensors",
    {{"json", "", "print one JSON object instead of text"}},
    false,
    "DIR",
    "DIR is a Hugging Face model directory (config.json + model.safetensors or shards)."};

// The model's features as forge computes them, and how its weights are stored when that is not
// plain (FP8 blocks, dequantized on load).
std::vector<std::string> features_of(const ModelDirInfo& info) {
  std::vector<std::string> f = model_features(info.config);
  if (info.fp8) f.push_back(fp8_feature(info.fp8));
  return f;
}

nlohmann::json config_json(const ModelDirInfo& info) {
  const ModelConfig& c = info.config;
  nlohmann::json j = {{"family", c.family_name()},
                      {"model_type", c.model_type()},
                      {"features", features_of(info)},
                      {"vocab_size", c.vocab_size},
                      {"max_seq_len", c.max_seq_len},
                      {"n_layer", c.n_layer},
                      {"n_embd", c.n_embd},
                      {"n_head", c.n_head},
                      {"n_kv_head", c.n_kv_head},
                      {"head_dim", c.head_dim()},
                      {"ffn_hidden", c.ffn_hidden},
                      {"norm_eps", c.norm_eps},
                      {"tie_embeddings", c.tie_embeddings}};
  if (c.family == Family::kLlama) {
    j["rope_theta"] = c.rope_theta;
    j["rope_style"] = rope_style_name(c.rope_style);
    j["sliding_window"] = c.sliding_window;
  }
  return j;
}

}  // namespace

int cmd_inspect(const Argv& argv) {
  const Args a = parse_args(kInspect, argv);
  if (a.help()) {
    print_help(kInspect);
    return 0;
  }
  if (a.positional().empty()) throw Error("missing DIR (see forge inspect --help)");
  const std::string dir = a.positional();
  const ModelDirInfo info = inspect_model_dir(dir);
  const ModelConfig& c = info.config;
  const std::vector<std::string> warnings = hf_config_warnings(c);
  if (a.has("json")) {
    nlohmann::json tensors = nlohmann::json::array();
    for (const auto& t : info.tensors)
      tensors.push_back({{"name", t.info.name},
                         {"dtype", io::st_dtype_name(t.info.dtype)},
                         {"shape", t.info.shape},
                         {"file", t.file},
                         {"bytes", t.info.end - t.info.begin}});
    const nlohmann::json j = {{"dir", dir},
                              {"model_type", info.hf_config.value("model_type", "")},
                              {"config", config_json(info)},
                              {"parameters", info.num_params},
                              {"tied", c.tie_embeddings},
                              {"tokenizer", info.has_tokenizer},
                              {"warnings", warnings},
                              {"tensors", tensors}};
    std::printf("%s\n", j.dump().c_str());
    return 0;
  }
  std::printf("%s: %s model (%s family), %.3fM parameters (%lld)\n", dir.c_str(),
              info.hf_config.value("model_type", "").c_str(), c.family_name().c_str(),
              info.num_params / 1e6, static_cast<long long>(info.num_params));
  const std::vector<std::string> features = features_of(info);
  std::string joined;
  for (const auto& f : features) joined += (joined.empty() ? "" : ", ") + f;
  std::printf("  features: %s\n", features.empty() ? "none beyond the family's plain form" : joined.c_str());
  std::printf(
      "  vocab_size %d | max_seq_len %d | n_layer %d | n_embd %d | n_head %d | n_kv_head %d"
      " | head_dim %d | ffn_hidden %d | norm_eps %g\n",
      c.vocab_size, c.max_seq_len, c.n_layer, c.n_embd, c.n_head, c.n_kv_head, c.head_dim(),
      c.ffn_hidden, c.norm_eps);
  if (c.family == Family::kLlama)
    std::printf("  rope_theta %g | rope_style %s | sliding_window %s\n", c.rope_theta,
                rope_style_name(c.rope_style),
                c.sliding_window > 0 ? std::to_string(c.sliding_window).c_str() : "none");
  for (const auto& w : warnings) std::printf("  warning: %s\n", w.c_str());
  std::printf("  embeddings %s | tokenizer.json %s\n", c.tie_embeddings ? "tied" : "untied",
              info.has_tokenizer ? "yes" : "no");
  std::printf("  %zu tensors:\n", info.tensors.size());
  for (const auto& t : info.tensors)
    std::printf("    %-48s %-5s %s\n", t.info.name.c_str(), io::st_dtype_name(t.info.dtype),
                shape_str(t.info.shape).c_str());
  return 0;
}

}  // namespace forge::cli
