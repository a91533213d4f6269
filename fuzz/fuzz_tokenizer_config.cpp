// libFuzzer target: arbitrary bytes as tokenizer_config.json, read where Forge reads it: next to
// a tokenizer.json, to name the end-of-text, BOS and pad tokens of a saved model's
// generation_config.json (generation_config_for_tokenizer). The tokenizer.json beside it is a
// fixed small byte-level one holding <|endoftext|>, <s> and </s>.
#include <cstddef>
#include <cstdint>

#include "forge/generate/generation_config.h"
#include "forge/tokenizer/tokenizer.h"
#include "fuzz_util.h"

namespace {

std::string fixed_tokenizer(const forge::fuzz::ScratchDir& dir) {
  std::vector<std::string> vocab;
  for (int b = 0; b < 256; ++b) vocab.push_back(std::string(1, static_cast<char>(b)));
  const auto t = forge::tok::Tokenizer::from_bpe(
      vocab, {}, {{"<|endoftext|>", 256}, {"<s>", 257}, {"</s>", 258}},
      forge::tok::SplitPattern::kGpt2);
  const std::string path = dir.path() + "/tokenizer.json";
  t.save_json(path);
  return path;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static forge::fuzz::ScratchDir dir("fuzz-tokenizer-config");
  static const std::string tokenizer = fixed_tokenizer(dir);
  const std::string config = dir.write("tokenizer_config.json", data, size);
  forge::fuzz::expect_ok_or_error([&] {
    const forge::GenerationConfig c = forge::generation_config_for_tokenizer(tokenizer, config);
    for (const int32_t id : c.eos_token_ids)
      forge::fuzz::require(id >= 0 && id < 259, "eos id names a token of the tokenizer");
  });
  return 0;
}
