// Sampling settings of one generation and a single-prompt convenience over the batched KV-cache
// generator (generate/generator.h) on the CPU model; the sampler itself is ops/sample.h.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "forge/model/transformer.h"
#include "forge/ops/sample.h"

namespace forge {

struct SampleOptions {
  int max_new_tokens = 128;
  float temperature = 1.0f;         // 0 = greedy
  int top_k = 0;                    // 0 = no top-k cut
  float top_p = 1.0f;               // nucleus; 1 = off
  float min_p = 0.0f;               // 0 = off
  float repetition_penalty = 1.0f;  // 1 = off
  uint64_t seed = 0;
  int stop_token = -1;  // stop after emitting this id (-1: none)

  SamplerSettings sampler() const {
    SamplerSettings s;
    s.temperature = temperature;
    s.top_k = top_k;
    s.top_p = top_p;
    s.min_p = min_p;
    s.repetition_penalty = repetition_penalty;
    s.seed = seed;
    return s;
  }
};

// Extends `prompt` (non-empty, at most max_seq_len ids) by up to max_new_tokens ids, stopping at
// the context; calls on_token for each new id. Returns the new ids only.
std::vector<int32_t> generate(Transformer<float>& model, const std::vector<int32_t>& prompt,
                              const SampleOptions& opt,
                              const std::function<void(int32_t)>& on_token = {});

}  // namespace forge
