// libFuzzer target: arbitrary bytes as a Hugging Face config.json. Parsing must either give a
// valid ModelConfig or throw (a nlohmann exception for bad JSON syntax, forge::Error for
// everything after it); a config that reads must survive a round trip through to_hf_config
// unchanged. Anything else is a bug.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "forge/core/error.h"
#include "forge/model/model_dir.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(data, data + size);
  } catch (const nlohmann::json::exception&) {  // parse_error, out_of_range (number overflow)
    return 0;
  }
  forge::ModelConfig c;
  try {
    c = forge::read_hf_config(j);
  } catch (const forge::Error&) {
    return 0;
  }
  const forge::ModelConfig d = forge::read_hf_config(forge::to_hf_config(c));
  const bool same = c.family == d.family && c.vocab_size == d.vocab_size &&
                    c.max_seq_len == d.max_seq_len && c.n_layer == d.n_layer &&
                    c.n_embd == d.n_embd && c.n_head == d.n_head && c.n_kv_head == d.n_kv_head &&
                    c.ffn_hidden == d.ffn_hidden && c.norm_eps == d.norm_eps &&
                    c.rope_theta == d.rope_theta && c.tie_embeddings == d.tie_embeddings &&
                    c.sliding_window == d.sliding_window && c.rope_style == d.rope_style;
  if (!same) std::abort();
  return 0;
}
