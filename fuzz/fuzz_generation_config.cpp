// libFuzzer target: arbitrary bytes as generation_config.json (generate/generation_config.h),
// read through the file reader as `forge generate` reads it. A file that reads must write back
// (generation_config_json) as a file that reads to the same settings.
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>

#include "forge/generate/generation_config.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static forge::fuzz::MemFile file("generation_config.json");
  const std::string& path = file.set(data, size);
  forge::GenerationConfig c;
  bool ok = false;
  forge::fuzz::expect_ok_or_error([&] {
    c = forge::read_generation_config(path);
    ok = true;
  });
  if (!ok) return 0;
  forge::fuzz::must_succeed("writing and re-reading generation_config.json", [&] {
    (void)c.sampling_defaults();
    const std::string text = forge::generation_config_json(c);
    const forge::GenerationConfig d =
        forge::parse_generation_config(nlohmann::json::parse(text), "written");
    forge::fuzz::require(c == d, "generation_config.json round trip");
  });
  return 0;
}
