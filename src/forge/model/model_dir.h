// Hugging Face model directories: config.json + model.safetensors (or shards listed in
// model.safetensors.index.json) + tokenizer.json and generation_config.json when there are
// ones (read by tokenizer/ and generate/; this file copies them); the tensor names and layouts
// of the `gpt2` and `llama`/`mistral` model types. What Forge saves, `transformers` loads.
//
// Reading is strict. Every tensor of the parameter table must be present with the shape that
// config.json implies; any other tensor is an error naming it, except known non-parameters
// (rotary inv_freq tables, GPT-2's attention-mask buffers) and an lm_head.weight of a tied
// model. A llama checkpoint without lm_head.weight is tied, whatever config.json says (that is
// what transformers does). bf16/f16/f64 weights become f32 masters. config.json features that
// Forge does not implement (scaled RoPE, biases in llama, other activations) are errors naming
// the field, never silently ignored: a model that loads computes what transformers computes.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "forge/io/safetensors.h"
#include "forge/model/transformer.h"

namespace forge {

// from_hf_config plus the checks for features Forge lacks. Errors read "config.json: ...";
// a value of the wrong JSON type is an Error too, not a nlohmann exception.
ModelConfig read_hf_config(const nlohmann::json& j);

// Writes dir/config.json and dir/model.safetensors (creating dir), copies `tokenizer_json` (a
// path) to dir/tokenizer.json when it is not empty, and writes `generation_config_json` (the
// file's text, generate/generation_config.h) to dir/generation_config.json when it is not
// empty. Everything is read before anything is written, and each file is replaced atomically
// (io/atomic_file.h), so a failed save never leaves a file half-written, and one that fails on
// its input (an unreadable tokenizer) leaves an existing model as it was.
void save_model_dir(const std::string& dir, const Transformer<float>& model,
                    const std::string& tokenizer_json = "",
                    const std::string& generation_config_json = "");

// Reads a model directory. Throws forge::Error naming the file and the problem: missing files,
// malformed JSON, an unknown or missing tensor, a shape that disagrees with config.json.
Transformer<float> load_model_dir(const std::string& dir);

// What `forge inspect` shows: the directory's files read and checked, weights not converted.
struct ModelDirTensor {
  std::string file;  // the safetensors file it lives in (a name inside the directory)
  io::TensorInfo info;
};
struct ModelDirInfo {
  nlohmann::json hf_config;             // config.json as written
  ModelConfig config;                   // as Forge reads it (tie_embeddings resolved)
  std::vector<ModelDirTensor> tensors;  // every tensor in the files, in file order
  int64_t num_params = 0;  // real parameters (vocab_size rows; a tied embedding counted once)
  bool has_tokenizer = false;
};
ModelDirInfo inspect_model_dir(const std::string& dir);

}  // namespace forge
