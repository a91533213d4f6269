// A tiny model over the byte-level chat test tokenizer (tests/data/chat/tokenizers/bytelevel.json,
// which has ChatML's special tokens), saved as a model directory with that tokenizer: what the
// SFT command-line tests train. One layer, width 32, 2 heads, FFN 64, context 48, weights seeded.
#pragma once

#include <string>

#include "forge/io/model_files.h"
#include "forge/model/config.h"
#include "forge/model/model_dir.h"
#include "forge/model/transformer.h"
#include "forge/tokenizer/tokenizer.h"

namespace forge::testing {

inline const std::string kChatTokenizer =
    std::string(FORGE_SOURCE_DIR) + "/tests/data/chat/tokenizers/bytelevel.json";

// Saves the model as `dir` (GPT-2 unless `family` says otherwise) and returns its configuration.
inline ModelConfig save_tiny_chat_model(const std::string& dir, Family family = Family::kGpt2) {
  ModelConfig cfg = preset_config("tiny");
  cfg.family = family;
  cfg.vocab_size = tok::Tokenizer::load(kChatTokenizer).vocab_size();
  cfg.max_seq_len = 48;
  cfg.n_layer = 1;
  cfg.n_embd = 32;
  cfg.n_head = cfg.n_kv_head = 2;
  cfg.ffn_hidden = 64;
  Transformer<float> model(cfg);
  model.init_weights(3);
  save_model_dir(dir, model, {.files = {{"tokenizer.json", io::read_file(kChatTokenizer)}}});
  return cfg;
}

}  // namespace forge::testing
