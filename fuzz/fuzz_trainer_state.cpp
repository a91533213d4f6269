// libFuzzer target: arbitrary bytes as a checkpoint's trainer_state.json (train/checkpoint.h),
// read as `forge train --resume` reads it: load_checkpoint of a checkpoint directory whose other
// files (a tiny model, its optimizer state) are fixed and valid, then the run configuration it
// carries through train_config_from_json. A state that loads must name a step >= 0.
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>

#include "forge/train/checkpoint.h"
#include "forge/train/train_config.h"
#include "fuzz_util.h"

namespace {

// A valid checkpoint of a tiny GPT-2 under dir/checkpoints/step_000001; returns its path.
std::string make_checkpoint(const forge::fuzz::ScratchDir& dir) {
  forge::ModelConfig c = forge::preset_config("tiny");
  c.vocab_size = 16;
  c.max_seq_len = 8;
  c.n_layer = 1;
  c.n_embd = 8;
  c.n_head = c.n_kv_head = 2;
  c.ffn_hidden = 32;
  forge::Transformer<float> model(c);
  model.init_weights(1);
  const std::vector<float> m(model.num_params(), 0.0f), v(model.num_params(), 0.0f);
  forge::TrainerState state;
  state.step = 1;
  state.config = {{"model", forge::to_hf_config(c)},
                  {"train", forge::train_config_json(forge::TrainConfig{})},
                  {"device", "cpu"}};
  return forge::save_checkpoint(dir.path(), model, m, v, state, 0);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static forge::fuzz::ScratchDir dir("fuzz-trainer-state");
  static const std::string checkpoint = make_checkpoint(dir);
  dir.write("checkpoints/step_000001/trainer_state.json", data, size);
  forge::fuzz::expect_ok_or_error([&] {
    const std::string path = checkpoint + "/trainer_state.json";
    const forge::Checkpoint ck = forge::load_checkpoint(checkpoint);
    forge::fuzz::require(ck.state.step >= 0, "step >= 0");
    const nlohmann::json& rc = ck.state.config;
    (void)forge::train_config_from_json(rc.value("train", nlohmann::json::object()), path);
  });
  return 0;
}
