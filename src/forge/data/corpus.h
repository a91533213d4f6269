// Reading plain-text corpora into documents, and the byte-level encoding quickstart uses until
// Forge has its own BPE tokenizer: ids 0..255 are bytes, 256 is <|endoftext|> between documents.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace forge {

inline constexpr int kByteVocab = 257;
inline constexpr uint32_t kByteEndOfText = 256;

// Documents of a `fortune` database directory (Debian's `fortunes` package installs them in
// /usr/share/games/fortunes): every regular file except the *.dat indexes and *.u8 copies, in
// name order, split at lines holding a single '%'. Throws forge::Error if none are found.
std::vector<std::string> read_fortune_dir(const std::string& dir);

// Each document's bytes followed by kByteEndOfText.
std::vector<uint32_t> byte_encode(const std::vector<std::string>& docs);

// Bytes back to text; ids >= 256 become "\n" (a document boundary). Invalid UTF-8 sequences
// are replaced by U+FFFD so the result is always valid UTF-8.
std::string byte_decode(const std::vector<int32_t>& ids);

// `bytes` with every invalid UTF-8 sequence's first byte replaced by U+FFFD (for printing
// model output, which may stop inside a character).
std::string sanitize_utf8(std::string_view bytes);

}  // namespace forge
