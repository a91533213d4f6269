// libFuzzer target: the whole load behind `forge eval` / `forge generate`, from config.json
// bytes to logits. config.json -> ModelConfig -> the model (weights initialised, since the
// weights file is not what is fuzzed here: fuzz_safetensors is) -> one forward pass over a few
// tokens -> a prefill and one decode step over the KV cache. Any config that reads must run;
// a bad one must fail in read_hf_config with a one-line forge::Error, not later as a crash, an
// arithmetic fault (num_attention_heads 0 once divided by zero) or an enormous allocation.
//
// Size policy: read_hf_config refuses absurd sizes (ModelConfig::validate); within those limits
// a config can still describe a real 100B model, which this process must not try to allocate.
// So the target itself skips models above kMaxParams parameters or kMaxActivations floats per
// position: the model code is the same at any size, and those caps keep each input in
// milliseconds and the process well under -rss_limit_mb.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <vector>

#include "forge/model/model_dir.h"
#include "forge/model/params.h"
#include "forge/model/transformer.h"
#include "fuzz_util.h"

namespace {

constexpr int64_t kMaxParams = 1 << 20;
constexpr int64_t kMaxActivations = 1 << 16;  // per position: widths, vocabulary, heads
constexpr int kMaxLayers = 8;

bool small_enough(const forge::ModelConfig& c, const forge::ParamTable& table) {
  const int64_t hs = c.head_dim();
  const int64_t widths[] = {c.n_embd, c.ffn_hidden, c.padded_vocab(),
                            (int64_t{c.n_head} + 2 * c.n_kv_head) * hs};
  for (const int64_t w : widths)
    if (w > kMaxActivations) return false;
  return table.total() <= kMaxParams && c.n_layer <= kMaxLayers;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(data, data + size);
  } catch (const nlohmann::json::exception&) {
    return 0;
  }
  forge::ModelConfig cfg;
  bool ok = false;
  forge::fuzz::expect_ok_or_error([&] {
    cfg = forge::read_hf_config(j);
    ok = true;
  });
  if (!ok || !small_enough(cfg, forge::ParamTable(cfg))) return 0;

  forge::Transformer<float> model(cfg);
  model.init_weights(1234);
  const int T = std::min(cfg.max_seq_len, 5);
  std::vector<int32_t> tokens(T), targets(T);
  for (int t = 0; t < T; ++t) {
    tokens[t] = (7 * t + 3) % cfg.vocab_size;
    targets[t] = (5 * t + 1) % cfg.vocab_size;
  }
  const double loss = model.loss(tokens.data(), targets.data(), 1, T);
  // A hostile config can ask for eps = 1e38 or rope_theta = 1e-38: numbers may be odd, but a
  // cross-entropy is never negative.
  forge::fuzz::require(!(loss < 0), "cross-entropy >= 0");

  // Generation: the prompt minus its last token prefilled, then one decode step at the next
  // position (a cache of T rows; a ring when the sliding window is shorter).
  model.plan_decode(1, T);
  const int P = std::max(1, T - 1);
  model.prefill(0, tokens.data(), P);
  if (P < T) {
    model.decode_tokens()[0] = tokens[P];
    model.decode_step();
  }
  return 0;
}
