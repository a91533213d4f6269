// PEFT adapter directories, what peft's save_pretrained writes for a LoRA adapter and its
// from_pretrained reads:
//   adapter_config.json        {"peft_type": "LORA", "r", "lora_alpha", "target_modules",
//                              "lora_dropout": 0.0, "bias": "none", "task_type": "CAUSAL_LM",
//                              "base_model_name_or_path", "fan_in_fan_out": false, ...}
//   adapter_model.safetensors  the AdapterTable's tensors under PEFT's keys, f32
//   + files carried beside them (tokenizer files, generation_config.json), as a model save.
// Reading accepts only what Forge computes: plain LoRA (no DoRA, no rsLoRA scaling, no
// per-module rank or alpha patterns, no layer subsets, bias "none", fan_in_fan_out false) on
// the projections AdapterTable knows; anything else is a one-line forge::Error naming it.
#pragma once

#include <string>
#include <vector>

#include "forge/io/model_files.h"
#include "forge/model/lora.h"

namespace forge {

inline constexpr const char* kAdapterConfigFile = "adapter_config.json";
inline constexpr const char* kAdapterWeightsFile = "adapter_model.safetensors";

// Writes the adapter directory `dir` atomically (io::AtomicDir): replaced whole or not at all.
void save_adapter_dir(const std::string& dir, const AdapterTable& table, const std::vector<float>& adapter,
                      const std::string& base_model, const io::FileSet& files = {});

// The same files written into `dir`, an existing directory that holds none of them (a
// checkpoint's temporary directory); each file atomically.
void write_adapter_files(const std::string& dir, const AdapterTable& table, const std::vector<float>& adapter,
                         const std::string& base_model, const io::FileSet& files = {});

// Whether `dir` holds an adapter (its adapter_config.json).
bool is_adapter_dir(const std::string& dir);

// SHA-256 (hex) of a base model's f32 weight buffer: what a LoRA run records of its base, so
// that a resume refuses a base that changed.
std::string weights_sha256(const std::vector<float>& weights);

struct LoadedAdapter {
  LoraConfig lora;
  std::string base_model;        // base_model_name_or_path ("" when absent or null)
  std::vector<float> weights;    // in AdapterTable(base, lora)'s layout
};

// Reads an adapter directory for the base model `base`: every tensor of the adapter table must
// be there with its shape (a mismatched base, layer count or target set is an error naming the
// tensor), and no other.
LoadedAdapter load_adapter_dir(const std::string& dir, const ModelConfig& base);

}  // namespace forge
