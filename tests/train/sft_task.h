// The word-reversal task the SFT and LoRA trainer tests share (sft_trainer_test.cpp,
// lora_trainer_test.cpp): random words, JSONL prompt/response lines, a tiny model briefly
// pretrained on shards of random words (a one-token-per-byte tokenizer with ChatML's special
// tokens beside it), the SFT run settings, and the share of held-out words a model reverses.
#pragma once

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "forge/chat/chat_template.h"
#include "forge/chat/sft_example.h"
#include "forge/core/rng.h"
#include "forge/data/prepare.h"
#include "forge/generate/engine.h"
#include "forge/model/config.h"
#include "forge/model/transformer.h"
#include "forge/tokenizer/trainer.h"
#include "forge/train/trainer.h"

namespace forge::sft_task {

// A random lower-case word of `length` letters (0: 3 to 5) from the first 10 of the alphabet.
inline std::string word(Rng& rng, int length = 0) {
  const int letters = 10;
  std::string w(length > 0 ? static_cast<size_t>(length) : 3 + rng.below(3), 'a');
  for (char& c : w) c = static_cast<char>('a' + rng.below(static_cast<uint64_t>(letters)));
  return w;
}

inline std::string reversed(std::string w) {
  std::reverse(w.begin(), w.end());
  return w;
}

inline std::string pair_line(const std::string& prompt, const std::string& response) {
  return nlohmann::json{{"prompt", prompt}, {"response", response}}.dump() + "\n";
}

// The SFT tests' tiny GPT-2: the tiny preset at width 64, 4 heads, MLP 256, 2 layers.
inline ModelConfig tiny_gpt2() {
  ModelConfig m = preset_config("tiny");
  m.n_layer = 2;
  m.n_embd = 64;
  m.n_head = m.n_kv_head = 4;
  m.ffn_hidden = 256;
  return m;
}

// In `dir`: a byte-level tokenizer without merges (one token per letter) and ChatML's special
// tokens, pretraining shards of random words made with it, and the model `m` (vocabulary 259,
// context max_seq_len) pretrained on them (windows of 32) for `steps` steps into dir/pre. Returns dir/pre/model (the
// tokenizer beside the weights).
inline std::string pretrained_model(const std::filesystem::path& dir, int steps, ModelConfig m,
                                    int max_seq_len = 32) {
  Rng rng(99, 0);
  std::string text;
  for (int i = 0; i < 6000; ++i) text += word(rng) + (i % 8 == 7 ? "\n" : " ");
  std::ofstream(dir / "corpus.txt") << text;
  tok::BpeTrainOptions o;
  o.vocab_size = 256 + 3;  // no merges: one token per byte
  o.specials = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
  o.threads = 1;
  tok::train_bpe({text}, o).save_json((dir / "tokenizer.json").string());
  PrepareOptions p;
  p.inputs = {(dir / "corpus.txt").string()};
  p.out_dir = (dir / "data").string();
  p.format = DocFormat::kLines;
  p.val_fraction = 0.05;
  p.threads = 1;
  p.tokenizer_path = (dir / "tokenizer.json").string();
  prepare_data(tok::Tokenizer::load(p.tokenizer_path), p);

  m.vocab_size = 259;
  m.max_seq_len = max_seq_len;  // pretrained on windows of 32 either way
  TrainConfig t;
  t.steps = steps;
  t.batch_size = 16;
  t.seq_len = 32;
  t.lr = 3e-3;
  t.warmup_steps = 5;
  t.eval_every = 1000;
  t.eval_windows = 16;
  t.quiet = true;
  train(m, t, (dir / "data").string(), (dir / "pre").string());
  return (dir / "pre" / "model").string();
}

// The fine-tuning runs' settings: batch 16 of 32 tokens, no weight decay, quiet.
inline TrainConfig sft_config(int steps, double lr) {
  TrainConfig t;
  t.steps = steps;
  t.batch_size = 16;
  t.seq_len = 32;
  t.lr = lr;
  t.warmup_steps = 10;
  t.weight_decay = 0;
  t.eval_every = 1000;
  t.eval_windows = 64;
  t.quiet = true;
  return t;
}

inline std::vector<nlohmann::json> metrics(const std::filesystem::path& run) {
  std::vector<nlohmann::json> out;
  std::ifstream f(run / "metrics.jsonl");
  for (std::string line; std::getline(f, line);) out.push_back(nlohmann::json::parse(line));
  return out;
}

// The share of `words` whose greedy answer (up to <|im_end|>) is the word reversed, with the
// tokenizer and chat template of `tok_dir`.
inline double reversal_accuracy(const Transformer<float>& model, const std::string& tok_dir,
                                const std::vector<std::string>& words) {
  const tok::Tokenizer tok = tok::Tokenizer::load(tok_dir + "/tokenizer.json");
  const chat::ChatTemplate tmpl = chat::ChatTemplate::load(tok_dir);
  const int32_t end = tok.encode("<|im_end|>").at(0);
  std::vector<GenRequest> reqs;
  for (const std::string& w : words) {
    chat::RenderOptions ro;
    ro.add_generation_prompt = true;
    GenRequest r;
    r.prompt = chat::encode_chat(tmpl, tok, {{"user", w}}, ro, "test").ids;
    r.max_new_tokens = 8;
    r.stop_ids = {end};
    reqs.push_back(r);
  }
  auto engine = make_cpu_engine(model.config(), model.weights());
  const std::vector<GenResult> out = engine->generate(reqs, GenOptions{});
  int right = 0;
  for (size_t i = 0; i < words.size(); ++i) {
    std::vector<int32_t> ids = out[i].ids;
    if (!ids.empty() && ids.back() == end) ids.pop_back();
    right += tok.decode(ids) == reversed(words[i]);
  }
  return static_cast<double>(right) / static_cast<double>(words.size());
}

}  // namespace forge::sft_task
