// libFuzzer target: arbitrary bytes as a Hugging Face tokenizer.json (tokenizer/tokenizer_io.cpp).
// Loading must give a tokenizer or throw a one-line forge::Error; a tokenizer that loads must
// encode text (with and without special tokens, through its post-processor) and decode what it
// encoded without crashing, and every id it produces must be below vocab_size().
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "forge/tokenizer/tokenizer.h"
#include "fuzz_util.h"

namespace {

// Words, spaces, digits, punctuation, multi-byte UTF-8, an invalid byte and GPT-2's separator.
constexpr std::string_view kText =
    "Hello world, it's 2024!  Tabs\tand\nnewlines; caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac "
    "\xf0\x9f\x99\x82 \xff<|endoftext|> <s>[INST] x </s>";

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static forge::fuzz::MemFile file("tokenizer.json");
  const std::string& path = file.set(data, size);
  forge::fuzz::expect_ok_or_error([&] {
    const forge::tok::Tokenizer t = forge::tok::Tokenizer::load(path);
    const int32_t V = t.vocab_size();
    for (const bool specials : {true, false}) {
      const std::vector<int32_t> ids = specials ? t.encode(kText) : t.encode_ordinary(kText);
      for (const int32_t id : ids) forge::fuzz::require(id >= 0 && id < V, "encoded id in range");
      (void)t.decode(ids);
      for (const int32_t id : ids) (void)t.token_bytes(id);
      forge::fuzz::expect_ok_or_error([&] { (void)t.with_special_tokens(ids); });
    }
  });
  return 0;
}
