// libFuzzer target: arbitrary bytes as an SFT JSONL file (chat/sft_example.h), read by
// read_sft_jsonl as training data is, then each example rendered with a fixed ChatML template and
// encoded with a byte-level tokenizer. Reading must give examples or throw a one-line
// forge::Error "FILE:LINE: problem"; an example that reads has known roles and an assistant
// turn, and its encoding must succeed (ChatML is prefix-stable, so no example may be refused),
// decode back to the rendering, carry one mask flag per id and train at least one token.
#include <cstddef>
#include <cstdint>
#include <ctime>
#include <string>
#include <vector>

#include "forge/chat/chat_template.h"
#include "forge/chat/sft_example.h"
#include "fuzz_util.h"

namespace {

using namespace forge::chat;

const forge::tok::Tokenizer& byte_tokenizer() {
  static const forge::tok::Tokenizer t = [] {
    std::vector<std::string> vocab;
    for (int b = 0; b < 256; ++b) vocab.emplace_back(1, static_cast<char>(b));
    return forge::tok::Tokenizer::from_bpe(vocab, {}, {{"<|im_start|>", 256}, {"<|im_end|>", 257}},
                                           forge::tok::SplitPattern::kGpt2);
  }();
  return t;
}

const ChatTemplate& chatml() {
  static const ChatTemplate t = ChatTemplate::from_source(
      "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
      "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
      {"<|im_start|>", "<|im_end|>", {}, {}});
  return t;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static forge::fuzz::MemFile file("sft.jsonl");
  const std::string& path = file.set(data, size);
  std::vector<SftExample> examples;
  bool ok = false;
  forge::fuzz::expect_ok_or_error([&] {
    examples = read_sft_jsonl(path);
    ok = true;
  });
  if (!ok) return 0;
  for (const SftExample& ex : examples) {
    bool assistant = false;
    for (const Message& m : ex.messages) {
      forge::fuzz::require(m.role == "system" || m.role == "user" || m.role == "assistant",
                           "a known role");
      assistant |= m.role == "assistant";
    }
    forge::fuzz::require(assistant, "an example that reads has an assistant turn");
    RenderOptions opt;
    opt.now = std::tm{};
    forge::fuzz::must_succeed("encode_sft_example", [&] {
      const forge::tok::Tokenizer& tok = byte_tokenizer();
      const EncodedChat e = encode_sft_example(chatml(), tok, ex, opt);
      forge::fuzz::require(e.trained.size() == e.ids.size(), "one mask flag per id");
      forge::fuzz::require(tok.decode(e.ids) == e.text.text(), "ids decode to the rendering");
      size_t trained = 0;
      for (const uint8_t t : e.trained) trained += t;
      forge::fuzz::require(trained > 0, "an assistant turn trains a token");
    });
  }
  return 0;
}
