// generation_config.json: Hugging Face's file of generation defaults beside config.json.
//   {"bos_token_id": 50256, "eos_token_id": 50256}                                  (GPT-2)
//   {"bos_token_id": 1, "eos_token_id": [2, 32000], "do_sample": true, "temperature": 0.6,
//    "top_p": 0.9, "max_new_tokens": 256}
// Forge reads the token ids and the sampling fields it implements (ranges: check_sampling);
// other keys (max_length, num_beams, transformers_version, ...) are allowed and ignored. A field
// of the wrong type or out of range is a one-line forge::Error naming the file and the field.
//
// Every model Forge trains saves one (train/trainer.cpp): the --init-from model's file as it
// is, or one naming the end-of-text token of the run's tokenizer — so generation stops at
// <|endoftext|> instead of running past it.
//
// BOS: generation adds what the tokenizer's post-processor asks for
// (Tokenizer::with_special_tokens), as a transformers tokenizer does; bos_token_id is what
// transformers starts an empty prompt with.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <vector>

#include "forge/generate/sampling_settings.h"

namespace forge {

struct GenerationConfig {
  std::vector<int32_t> eos_token_ids;  // generation ends after any of these; empty: none known
  std::optional<int32_t> bos_token_id;
  std::optional<int32_t> pad_token_id;
  std::optional<bool> do_sample;  // transformers: false samples greedily whatever the temperature
  // temperature, top_k, top_p, min_p, repetition_penalty, max_new_tokens where the file gives
  // them (never seed: generation_config.json has none).
  SamplingOverrides sampling;

  // The defaults this file asks for, do_sample folded in as transformers reads it: do_sample
  // false means greedy (temperature 0). Without do_sample the fields stand as they are (Forge's
  // own defaults fill the rest; transformers would sample greedily).
  SamplingOverrides sampling_defaults() const;
  bool operator==(const GenerationConfig&) const = default;
};

// From the parsed file; `path` names it in errors ("PATH: eos_token_id: ...").
GenerationConfig parse_generation_config(const nlohmann::json& j, const std::string& path);
// Reads and parses PATH (missing file, malformed JSON: forge::Error naming it).
GenerationConfig read_generation_config(const std::string& path);

// The file's text in transformers' layout: keys sorted, 2-space indent, eos_token_id an integer
// when there is one id and a list when there are more; unset fields are left out.
std::string generation_config_json(const GenerationConfig& c);

// What a model saved with this tokenizer.json should say: eos = tokenizer_config.json's
// eos_token when that file is given and names a token, else <|endoftext|> if the tokenizer has
// it; bos = tokenizer_config.json's bos_token, else the post-processor's one BOS, else
// <|endoftext|> when that is the eos (the GPT-2 convention: Forge's shards put it before every
// document); pad = tokenizer_config.json's pad_token. A tokenizer.json Forge cannot read gives
// an empty config (nothing known), never an error: training copies such files as they are.
// tokenizer_config.json, when given, must be valid (forge::Error naming it and the field).
GenerationConfig generation_config_for_tokenizer(const std::string& tokenizer_json,
                                                 const std::string& tokenizer_config_json = "");

// A model directory's generation settings: generation_config.json when present; the token ids
// it lacks come from config.json (eos_token_id, bos_token_id, pad_token_id, as transformers
// does), then from tokenizer.json (+ tokenizer_config.json) as generation_config_for_tokenizer
// says. Without any of these files: defaults (no eos, no sampling fields).
GenerationConfig load_generation_config(const std::string& model_dir);

}  // namespace forge
