// Hugging Face model directories: config.json + model.safetensors (f32), the tensor names and
// layouts of the `gpt2` and `llama` model types. What Forge saves, `transformers` loads.
#pragma once

#include <string>

#include "forge/model/transformer.h"

namespace forge {

// Writes dir/config.json and dir/model.safetensors (creating dir). Each file is written under a
// temporary name and renamed, so an existing model is never left half-written.
void save_model_dir(const std::string& dir, const Transformer<float>& model);

// Reads a model directory. Throws forge::Error naming the file and the problem: missing files,
// malformed JSON, an unknown or missing tensor, a shape that disagrees with config.json.
Transformer<float> load_model_dir(const std::string& dir);

}  // namespace forge
