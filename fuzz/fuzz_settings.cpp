// libFuzzer target: `forge train` settings, `key=value` overrides (and the --config file's keys,
// which take the same path), one per input line, applied as cmd_train applies them: a model
// setting first (apply_model_override), else a training setting (TrainConfig::apply_override),
// else an unknown key. Each value must be accepted or refused with a one-line forge::Error; the
// resulting model configuration is then validated and its parameter table built, as a new run
// does before allocating anything.
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "forge/model/params.h"
#include "forge/train/train_config.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  forge::ModelConfig model = forge::preset_config("tiny");
  forge::TrainConfig train;
  for (size_t pos = 0; pos <= text.size();) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string_view::npos) eol = text.size();
    const std::string_view line = text.substr(pos, eol - pos);
    pos = eol + 1;
    const size_t eq = line.find('=');
    if (eq == std::string_view::npos) continue;
    const std::string key(line.substr(0, eq)), value(line.substr(eq + 1));
    forge::fuzz::expect_ok_or_error([&] {
      if (!forge::apply_model_override(model, key, value)) (void)train.apply_override(key, value);
    });
  }
  forge::fuzz::expect_ok_or_error([&] {
    const forge::ParamTable table(model);  // validates first
    forge::fuzz::require(table.total() > 0, "a valid model has parameters");
  });
  forge::fuzz::must_succeed("train_config_json round trip", [&] {
    const forge::TrainConfig back =
        forge::train_config_from_json(forge::train_config_json(train), "written");
    forge::fuzz::require(forge::train_config_json(back) == forge::train_config_json(train),
                         "training settings round trip");
  });
  return 0;
}
