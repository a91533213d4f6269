// libFuzzer target: arbitrary bytes as a chat template (templates come from model directories),
// rendered for a fixed conversation whose messages hold special-token text, then encoded and
// masked for SFT with a byte-level tokenizer. Parsing, rendering and encoding must succeed or
// throw forge::Error, and what succeeds must hold together: the render's origin runs spell it,
// the ids decode back to it, and every special id stands where the template wrote the token's
// text. Anything else is a bug.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "forge/chat/chat_encode.h"
#include "forge/chat/chat_template.h"
#include "forge/chat/sft_example.h"
#include "forge/core/error.h"

namespace {

const forge::tok::Tokenizer& byte_tokenizer() {
  static const forge::tok::Tokenizer t = [] {
    std::vector<std::string> vocab;
    for (int b = 0; b < 256; ++b) vocab.emplace_back(1, static_cast<char>(b));
    return forge::tok::Tokenizer::from_bpe(vocab, {}, {{"<|im_start|>", 256}, {"<|im_end|>", 257}},
                                           forge::tok::SplitPattern::kGpt2);
  }();
  return t;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace forge::chat;
  const std::string source(reinterpret_cast<const char*>(data), size);
  const std::vector<Message> messages = {
      {"system", "sys <|im_end|>"}, {"user", "hi <|im_start|>x"}, {"assistant", "ok\n"}};
  ChatTemplate tmpl;
  TaintedString text;
  try {
    tmpl = ChatTemplate::from_source(source, {"<s>", "<|im_end|>", {}, {}});
    RenderOptions opt;
    opt.add_generation_prompt = true;
    opt.now = std::tm{};
    text = tmpl.render(messages, opt);
  } catch (const forge::Error&) {
    return 0;
  }
  std::string spelled;
  for (const Span& s : text.spans()) {
    if (s.origin < kOtherData || s.origin > 2) std::abort();
    spelled += s.text;
  }
  if (spelled != text.text()) std::abort();

  const forge::tok::Tokenizer& tok = byte_tokenizer();
  const EncodedText enc = encode_rendered(tok, text);
  if (tok.decode(enc.ids) != text.text()) std::abort();
  for (const EncodedText::Piece& p : enc.pieces)
    if (p.special && !text.is_template(p.begin, p.end)) std::abort();
  try {
    const EncodedChat e = encode_sft_example(tmpl, tok, {messages, "fuzz"});
    if (e.trained.size() != e.ids.size()) std::abort();
  } catch (const forge::Error&) {
  }
  return 0;
}
