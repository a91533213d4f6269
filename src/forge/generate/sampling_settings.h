// Sampling settings as a request gives them. The keys of prompts.jsonl, the Hugging Face
// sampling fields of generation_config.json and `forge generate`'s flags all land in one
// SamplingOverrides and are checked by one function, so a value is accepted or refused the same
// way wherever it comes from. The layers stack: a flag over a prompts.jsonl line over
// generation_config.json over the command's defaults (SamplingOverrides::over).
#pragma once

#include <cstdint>
#include <optional>

#include "forge/ops/sample.h"

namespace forge {

// nullopt: not given (a lower layer, or the command's default, applies).
struct SamplingOverrides {
  std::optional<double> temperature;         // >= 0; 0: greedy
  std::optional<int64_t> top_k;              // >= 0; 0: off
  std::optional<double> top_p;               // (0, 1]; 1: off
  std::optional<double> min_p;               // [0, 1); 0: off
  std::optional<double> repetition_penalty;  // > 0; 1: off
  std::optional<int64_t> max_new_tokens;     // >= 0
  std::optional<uint64_t> seed;              // any 64-bit value

  // This one's fields where given, `base`'s elsewhere.
  SamplingOverrides over(const SamplingOverrides& base) const;
  bool operator==(const SamplingOverrides&) const = default;
};

// How check_sampling names a field: "top_p" (prompts.jsonl, generation_config.json) or
// "--top-p" (the command line).
enum class SettingNames { kKeys, kFlags };

// Throws forge::Error "top_p: expected a number in (0, 1], got 1.5" for the first given value
// out of range (the ranges above; every value must also fit where the sampler holds it: a finite
// float, an int32 top_k, an int max_new_tokens).
void check_sampling(const SamplingOverrides& s, SettingNames names = SettingNames::kKeys);

// `base` with the given sampler fields of `s` written over it, after check_sampling(s).
// max_new_tokens is not a sampler setting and is left to the caller.
SamplerSettings apply_sampling(const SamplingOverrides& s, SamplerSettings base = {});

}  // namespace forge
