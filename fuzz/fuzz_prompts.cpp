// libFuzzer target: arbitrary bytes as the prompts JSONL of `forge generate --input`
// (generate/prompts.h). Parsing must give requests or throw a one-line forge::Error "NAME:LINE:
// what"; a request that parses has exactly one of prompt and ids, ids inside the vocabulary,
// non-empty stop strings and sampling settings check_sampling accepts.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "forge/generate/prompts.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  constexpr int kVocab = 1000;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  std::vector<forge::PromptRequest> requests;
  bool ok = false;
  forge::fuzz::expect_ok_or_error([&] {
    requests = forge::parse_prompts(text, "prompts.jsonl", kVocab);
    ok = true;
  });
  if (!ok) return 0;
  forge::fuzz::require(!requests.empty(), "a file that parses has a request");
  for (const forge::PromptRequest& r : requests) {
    forge::fuzz::require(r.prompt.has_value() != !r.ids.empty(), "prompt xor ids");
    for (const int32_t id : r.ids) forge::fuzz::require(id >= 0 && id < kVocab, "id in range");
    for (const std::string& s : r.stop) forge::fuzz::require(!s.empty(), "stop non-empty");
    forge::fuzz::must_succeed("check_sampling", [&] { forge::check_sampling(r.sampling); });
  }
  return 0;
}
