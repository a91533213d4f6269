// libFuzzer target: GPT-2's own tokenizer files, encoder.json + vocab.bpe, as a tokenizer
// directory (Tokenizer::load of a directory without tokenizer.json). One input holds both files:
// encoder.json's bytes, a NUL byte, vocab.bpe's bytes (no NUL: both are one file then, and
// vocab.bpe is empty). A pair that loads must encode and decode a sentence.
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "forge/tokenizer/tokenizer.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static forge::fuzz::ScratchDir dir("fuzz-gpt2-vocab");
  const uint8_t* nul = static_cast<const uint8_t*>(std::memchr(data, 0, size));
  const size_t encoder_size = nul ? static_cast<size_t>(nul - data) : size;
  dir.write("encoder.json", data, encoder_size);
  dir.write("vocab.bpe", nul ? nul + 1 : data + size, nul ? size - encoder_size - 1 : 0);
  forge::fuzz::expect_ok_or_error([&] {
    const forge::tok::Tokenizer t = forge::tok::Tokenizer::load(dir.path());
    const std::vector<int32_t> ids = t.encode("Hello world, it's 2024! <|endoftext|> caf\xc3\xa9");
    for (const int32_t id : ids)
      forge::fuzz::require(id >= 0 && id < t.vocab_size(), "encoded id in range");
    (void)t.decode(ids);
  });
  return 0;
}
