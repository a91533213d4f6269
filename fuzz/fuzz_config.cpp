// libFuzzer target: arbitrary bytes as a Hugging Face config.json (model/hf_config.cpp, and its
// quantization_config: model/fp8_checkpoint.h). Reading must give a valid ModelConfig or throw a
// one-line forge::Error; a config that reads must
// survive to_hf_config -> read_hf_config unchanged, and its parameter table (what inspect and
// every load build first) must come out without allocating more than its size implies.
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>

#include "forge/model/model_dir.h"
#include "forge/model/params.h"
#include "fuzz_util.h"

namespace {

bool layers_use_rope_alike(const forge::ModelConfig& c, const forge::ModelConfig& d) {
  for (int l = 0; l < c.n_layer; ++l)
    if (c.layer_uses_rope(l) != d.layer_uses_rope(l)) return false;
  return true;
}

bool same(const forge::ModelConfig& c, const forge::ModelConfig& d) {
  return c.family == d.family && c.vocab_size == d.vocab_size && c.max_seq_len == d.max_seq_len &&
         c.n_layer == d.n_layer && c.n_embd == d.n_embd && c.n_head == d.n_head &&
         c.n_kv_head == d.n_kv_head && c.ffn_hidden == d.ffn_hidden && c.norm_eps == d.norm_eps &&
         c.rope_theta == d.rope_theta && c.tie_embeddings == d.tie_embeddings &&
         c.sliding_window == d.sliding_window && c.rope_style == d.rope_style &&
         c.variant == d.variant && c.head_dim() == d.head_dim() && c.qkv_bias == d.qkv_bias &&
         c.o_bias == d.o_bias && c.qk_norm == d.qk_norm && c.rope_scaling == d.rope_scaling &&
         c.pad_token_id == d.pad_token_id && layers_use_rope_alike(c, d);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(data, data + size);
  } catch (const nlohmann::json::exception&) {  // not JSON: the file readers' business
    return 0;
  }
  // An FP8 quantization_config gives its block size or a one-line error (model/fp8_checkpoint.h).
  forge::fuzz::expect_ok_or_error([&] { (void)forge::fp8_quantization(j); });
  forge::ModelConfig c;
  bool ok = false;
  forge::fuzz::expect_ok_or_error([&] {
    c = forge::read_hf_config(j);
    ok = true;
  });
  if (!ok) return 0;
  forge::fuzz::must_succeed("a config that read", [&] {
    const forge::ModelConfig d = forge::read_hf_config(forge::to_hf_config(c));
    forge::fuzz::require(same(c, d), "config.json round trip");
    const forge::ParamTable table(c);
    forge::fuzz::require(table.total() > 0, "a valid config has parameters");
    (void)forge::model_features(c);
    (void)forge::hf_config_warnings(c);
  });
  return 0;
}
