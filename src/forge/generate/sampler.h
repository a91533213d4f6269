// Token sampling and a plain decode loop. Without a KV cache (that arrives with the generation
// work) every new token re-runs the forward over the context window: fine for the small CPU
// models of quickstart, quadratic for long outputs.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "forge/core/rng.h"
#include "forge/model/transformer.h"

namespace forge {

struct SampleOptions {
  int max_new_tokens = 128;
  float temperature = 1.0f;  // 0 = greedy
  int top_k = 0;             // 0 = no top-k cut
  float top_p = 1.0f;        // nucleus; 1 = off
  uint64_t seed = 0;
  int stop_token = -1;       // stop after emitting this id (-1: none)
};

// Picks the next id from logits over the real vocabulary [0, V).
int32_t sample_token(const float* logits, int V, const SampleOptions& opt, Rng& rng);

// Extends `prompt` (non-empty) by up to max_new_tokens ids; calls on_token for each new id.
// Returns the new ids only.
std::vector<int32_t> generate(Transformer<float>& model, const std::vector<int32_t>& prompt,
                              const SampleOptions& opt,
                              const std::function<void(int32_t)>& on_token = {});

}  // namespace forge
