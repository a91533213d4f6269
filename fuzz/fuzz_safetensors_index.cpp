// libFuzzer target: arbitrary bytes as model.safetensors.index.json, the map of a sharded model
// directory's tensors to its files (model/model_dir.h). The directory is otherwise fixed and
// valid: a tiny GPT-2 saved in several shards (and config.json); the index is what varies, and
// it is read as `forge inspect` and every model load read it. A load that succeeds must give
// the saved weights exactly: a hostile index can refuse a good model, never change it.
#include <cstddef>
#include <cstdint>
#include <filesystem>

#include "forge/model/model_dir.h"
#include "fuzz_util.h"

namespace {

struct Saved {
  std::string dir;
  std::vector<float> weights;
};

// A tiny GPT-2 saved with a 600-byte shard limit: every tensor group in its own file.
Saved save_sharded(const forge::fuzz::ScratchDir& scratch) {
  forge::ModelConfig c = forge::preset_config("tiny");
  c.vocab_size = 16;
  c.max_seq_len = 8;
  c.n_layer = 1;
  c.n_embd = 8;
  c.n_head = c.n_kv_head = 2;
  c.ffn_hidden = 32;
  forge::Transformer<float> model(c);
  model.init_weights(1);
  const std::string dir = scratch.path() + "/model";
  forge::ModelSaveOptions opt;
  opt.shard_size = 600;
  forge::save_model_dir(dir, model, opt);
  return {dir, model.weights()};
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static forge::fuzz::ScratchDir scratch("fuzz-safetensors-index");
  static const Saved saved = save_sharded(scratch);
  static const forge::fuzz::ScratchDir* once = [] {
    // A sharded directory has no model.safetensors; the reader must take the index.
    forge::fuzz::require(!std::filesystem::exists(saved.dir + "/model.safetensors"),
                         "the fixed model is sharded");
    return &scratch;
  }();
  (void)once;
  scratch.write("model/model.safetensors.index.json", data, size);
  forge::fuzz::expect_ok_or_error([&] { (void)forge::inspect_model_dir(saved.dir); });
  forge::fuzz::expect_ok_or_error([&] {
    const forge::Transformer<float> m = forge::load_model_dir(saved.dir);
    forge::fuzz::require(m.weights() == saved.weights, "a load gives the saved weights");
  });
  return 0;
}
