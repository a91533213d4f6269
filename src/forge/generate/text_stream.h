// Streaming generated text: fed one token id at a time, a TextStream returns the text that is
// safe to print now.
//  - Only whole UTF-8 characters: a byte-level BPE token may end inside a character (an emoji
//    is often two GPT-2 tokens), so its first bytes wait for the rest. Bytes that can no longer
//    become a valid character print as U+FFFD at once, one per byte, exactly as sanitize_utf8
//    (data/corpus.h) replaces them; finish() does the same for an incomplete tail. Without stop
//    strings, everything returned, joined, is sanitize_utf8 of all the tokens' bytes.
//  - Stop strings (OpenAI semantics): the text ends just before the first stop string to
//    complete; neither it nor anything after it is returned, and stopped() turns true. A tail
//    that could still grow into a stop string is held back until it can no longer (then it is
//    returned) or it completes. "First to complete" is the occurrence that ends earliest in
//    the text (the longest of those ending together), so the result does not depend on how the
//    text was cut into tokens.
// Matching is on text (after the U+FFFD replacement), byte for byte; stop strings must be
// valid, non-empty UTF-8.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "forge/tokenizer/tokenizer.h"

namespace forge {

class TextStream {
 public:
  // A token's bytes (need not be valid UTF-8 on their own). May throw for an unknown id.
  using TokenBytes = std::function<std::string(int32_t)>;

  // Throws forge::Error for an empty stop string or one that is not valid UTF-8.
  explicit TextStream(TokenBytes bytes_of, std::vector<std::string> stop = {});
  // Bytes from tokenizer.token_bytes (the tokenizer must outlive the stream); skip_special:
  // special tokens (<|endoftext|>, ...) add no text.
  explicit TextStream(const tok::Tokenizer& tokenizer, std::vector<std::string> stop = {},
                      bool skip_special = false);

  // Adds one token; returns the text now safe to print (often "", e.g. half a character).
  // Once stopped() or after finish(), tokens are ignored and "" comes back.
  std::string push(int32_t id);
  // Ends the stream: returns what was held back (an incomplete character's bytes as U+FFFD).
  // A stop string can still complete here (through a U+FFFD it contains). Idempotent.
  std::string finish();

  bool stopped() const { return stopped_; }
  // The stop string that completed; "" when none has.
  const std::string& stop_string() const { return stop_string_; }
  // Everything returned so far, joined.
  const std::string& text() const { return text_; }

 private:
  void decode_bytes(bool final);
  std::string release(bool final);

  TokenBytes bytes_of_;
  std::vector<std::string> stop_;
  size_t longest_stop_ = 0;
  std::string bytes_;  // raw bytes not yet turned into characters (an incomplete one)
  std::string held_;   // valid UTF-8 not yet returned: a tail that may begin a stop string
  std::string text_;
  std::string stop_string_;
  bool stopped_ = false, finished_ = false;
};

}  // namespace forge
