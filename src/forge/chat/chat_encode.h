// Token ids of a rendered conversation under the rule of issue 14: special tokens come only from
// the chat template. A special token's text counts as the token only where every byte of it is
// template text (chat/tainted_string.h); the same text inside a message (a user typing
// "<|im_end|>") is encoded as plain text, as `forge data prepare` encodes documents.
//
// How: the text is cut where special tokens stand in template text (longest first at each
// position, left to right, the way Tokenizer::encode finds them), and each stretch between them
// is encoded whole with encode_ordinary, whatever its origin. So BPE merges across the boundary
// between template text and message text exactly as it would in the whole string, and when no
// message holds a special token's text the ids are those of Tokenizer::encode of the whole
// render, which is what transformers' apply_chat_template(tokenize=True) gives.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "forge/chat/tainted_string.h"
#include "forge/tokenizer/tokenizer.h"

namespace forge::chat {

struct EncodedText {
  // A special token, or a stretch of text between them; its tokens are
  // ids[first_token, next piece's first_token).
  struct Piece {
    size_t begin, end;  // bytes of the text
    size_t first_token;
    bool special;
  };
  std::vector<int32_t> ids;
  std::vector<Piece> pieces;
};

EncodedText encode_rendered(const tok::Tokenizer& tok, const TaintedString& text);

// Where byte offset `b` of the encoded text falls among its tokens: `index` tokens lie wholly
// before it when `exact`; otherwise tokens[index] straddles b (BPE merged across it). Offsets
// come from the tokens' bytes where they spell the text (always for byte-level BPE; for
// SentencePiece-style tokenizers unless a character became <unk>); else from comparing the ids
// of the text before b with the ids of the whole, where tokens[index] is the first that differs.
struct TokenBoundary {
  size_t index;
  bool exact;
};
TokenBoundary token_boundary(const tok::Tokenizer& tok, const std::string& text,
                             const EncodedText& enc, size_t b);

}  // namespace forge::chat
