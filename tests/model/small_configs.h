// Small model shapes shared by the GPU model and runner tests: two layers, 64 channels, a
// 100-token vocabulary (padded to 128), GPT-2 with tied embeddings or Llama with GQA (4 heads
// over 2 kv heads), head size 16 — fast to check against the CPU reference.
#pragma once

#include "forge/model/config.h"

namespace forge::testing {

inline ModelConfig small_config(Family f) {
  ModelConfig c;
  c.family = f;
  c.vocab_size = 100;  // padded to 128
  c.max_seq_len = 32;
  c.n_layer = 2;
  c.n_embd = 64;
  c.n_head = 4;
  c.n_kv_head = f == Family::kGpt2 ? 4 : 2;
  c.ffn_hidden = f == Family::kGpt2 ? 256 : 96;
  c.tie_embeddings = f == Family::kGpt2;
  return c;
}

}  // namespace forge::testing
