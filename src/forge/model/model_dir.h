// Hugging Face model directories: config.json + model.safetensors (or shards listed in
// model.safetensors.index.json) + the files carried beside them unchanged (io/model_files.h:
// tokenizer.json and its companions, generation_config.json); the tensor names and layouts of
// the `gpt2` and `llama`/`mistral` model types. What Forge saves, `transformers` loads.
//
// Reading is strict. Every tensor of the parameter table must be present with the shape that
// config.json implies; any other tensor is an error naming it, except known non-parameters
// (rotary inv_freq tables, GPT-2's attention-mask buffers) and an lm_head.weight of a tied
// model. A llama checkpoint without lm_head.weight is tied, whatever config.json says (that is
// what transformers does). bf16/f16/f64 weights become f32 masters. config.json features that
// Forge does not implement (scaled RoPE, biases in llama, other activations) are errors naming
// the field, never silently ignored: a model that loads computes what transformers computes.
//
// Writing is what transformers' save_pretrained writes: the tensors in F32 or BF16, in one
// model.safetensors up to a size limit and in model-00001-of-0000N.safetensors shards with an
// index above it (save_model_dir below).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "forge/io/model_files.h"
#include "forge/io/safetensors.h"
#include "forge/model/fp8_checkpoint.h"
#include "forge/model/transformer.h"

namespace forge {

// from_hf_config plus the checks for features Forge lacks. Errors read "config.json: ...";
// a value of the wrong JSON type is an Error too, not a nlohmann exception.
ModelConfig read_hf_config(const nlohmann::json& j);

// transformers 4's max_shard_size default, "5GB" = 5·10^9 bytes (huggingface_hub parses GB as
// 10^9, GiB as 2^30). transformers 5 raised its default to 50GB; 5GB is still what the Hub
// recommends per file, and the shards load in either version.
inline constexpr int64_t kDefaultShardSize = 5'000'000'000;

struct ModelSaveOptions {
  // F32 (exact: the master weights) or BF16 (each weight rounded to nearest even, half the
  // bytes; config.json's torch_dtype then says bfloat16).
  io::StDType dtype = io::StDType::kF32;
  // Largest weights file in bytes (>= 1). Tensors that do not fit one file are sharded.
  int64_t shard_size = kDefaultShardSize;
  // Written beside the weights byte for byte: tokenizer files, generation_config.json. Plain
  // file names only, none of the names the save writes itself.
  io::FileSet files;
};

// "f32" -> kF32, "bf16" -> kBF16 (the names of the save_dtype setting); forge::Error otherwise.
io::StDType save_dtype_from_name(const std::string& name);

// How transformers (huggingface_hub's split_state_dict_into_shards_factory) groups tensors of
// these sizes, in this order, into files of at most `limit` bytes: tensors are added to the
// current file until the next would overflow it; a tensor larger than the limit gets a file of
// its own at once, ahead of the file being filled. Returns indices into `bytes` per file.
std::vector<std::vector<size_t>> plan_weight_shards(const std::vector<uint64_t>& bytes,
                                                    uint64_t limit);

// Saves the model as the Hugging Face model directory `dir`: config.json, the weights in one
// model.safetensors, or, when they exceed opt.shard_size, model-00001-of-0000N.safetensors ...
// with model.safetensors.index.json ({"metadata": {"total_parameters", "total_size"},
// "weight_map": {tensor: file}}, as transformers writes it), and opt.files.
//
// The directory is built under PARENT/.tmp-NAME and renamed over `dir` (io::AtomicDir), so a
// crash or an error leaves the old model or the new one, never a mix: no stale shard of an
// earlier save survives, and readers never see a half-written one. Files of an existing `dir`
// that a save does not write (a model card, another tool's files) are carried into the new
// directory (hard links, copies where links fail); the earlier save's own files are not.
void save_model_dir(const std::string& dir, const Transformer<float>& model,
                    const ModelSaveOptions& opt = {});

// The files of save_model_dir written into `dir`, an existing directory that holds none of
// them yet (a checkpoint's temporary directory); each file is written atomically.
void write_model_files(const std::string& dir, const Transformer<float>& model,
                       const ModelSaveOptions& opt);

// Reads a model directory. Throws forge::Error naming the file and the problem: missing files,
// malformed JSON, an unknown or missing tensor, a shape that disagrees with config.json.
// grads: GradBuffers::kNone for a model that only runs forward (half the memory).
Transformer<float> load_model_dir(const std::string& dir, GradBuffers grads = GradBuffers::kAllocate);

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
  Fp8Blocks fp8;  // block-scaled FP8 weights, dequantized on load (model/fp8_checkpoint.h)
};
ModelDirInfo inspect_model_dir(const std::string& dir);

}  // namespace forge
