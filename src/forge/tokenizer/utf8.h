// UTF-8 character boundaries for the character-level tokenizer code: what Rust's str (which
// `tokenizers` works on) accepts as a character, so that Forge splits and validates text alike.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace forge::tok {

// The length (1-4) of the valid UTF-8 character at s[i], or 0 if none starts there: a stray
// continuation byte, a sequence cut short, an overlong form, a surrogate, or beyond U+10FFFF.
inline size_t utf8_char_len(std::string_view s, size_t i) {
  const auto c = static_cast<unsigned char>(s[i]);
  if (c < 0x80) return 1;
  const size_t len = (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
  if (len == 0 || i + len > s.size()) return 0;
  uint32_t cp = c & (0x7F >> len);
  for (size_t k = 1; k < len; ++k) {
    const auto b = static_cast<unsigned char>(s[i + k]);
    if ((b >> 6) != 0x2) return 0;
    cp = (cp << 6) | (b & 0x3F);
  }
  constexpr uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
  if (cp < kMin[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
  return len;
}

inline bool is_valid_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const size_t len = utf8_char_len(s, i);
    if (len == 0) return false;
    i += len;
  }
  return true;
}

}  // namespace forge::tok
