// tokenizer.json decoders of SentencePiece-style files, chained as Hugging Face `tokenizers`
// chains them: each step maps the list of token strings to a new list — Replace and Strip act on
// each token, ByteFallback turns runs of <0xNN> tokens into text, Fuse joins the list into one
// string, Metaspace turns ▁ back into spaces — and the decoded text is the concatenation of the
// last list. The order matters: Llama 2's Strip(" ", 1, 0) comes after Fuse, so it removes the
// space before the first word of the text, not of every token.
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "forge/tokenizer/normalizer.h"

namespace forge::tok {

class Decoder {
 public:
  struct Step {
    enum class Kind { kReplace, kByteFallback, kFuse, kStrip, kMetaspace };
    Kind kind = Kind::kFuse;
    std::string pattern;         // kReplace: the literal text replaced in each token
    std::string content;         // kReplace: its replacement; kStrip: the character removed
    size_t start = 0, stop = 0;  // kStrip: at most this many `content` from the start / end
    Metaspace metaspace;         // kMetaspace: the replacement and the prepend scheme
  };

  // Reads tokenizer.json's "decoder" (null: tokens joined with spaces, as `tokenizers` does).
  // Throws forge::Error naming `path` and the first decoder type Forge does not apply.
  static Decoder from_json(const nlohmann::json& j, const std::string& path);

  // The text of a token sequence (valid UTF-8 if the tokens are: ByteFallback replaces each byte
  // of a run that is not valid UTF-8 by U+FFFD, the whole run, as `tokenizers` does).
  std::string decode(std::vector<std::string> tokens) const;

  // The bytes `token` stands for inside a decoded text, for streaming (Tokenizer::token_bytes):
  // the steps applied as to a token that is not the first, a <0xNN> token giving its raw byte
  // (the stream judges UTF-8 itself), and Strip left out once Fuse has run (it then acts on the
  // whole text, not on this token).
  std::string token_bytes(std::string_view token) const;

 private:
  std::vector<Step> steps_;
  bool join_with_spaces_ = false;
};

// The byte a ByteFallback token stands for ("<0x41>" → 0x41, as Rust's u8::from_str_radix reads
// the two characters after "<0x"), or -1 if `token` is not one.
int byte_token_value(std::string_view token);

}  // namespace forge::tok
