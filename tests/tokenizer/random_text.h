// Random text for the tokenizer tests: valid UTF-8 over every Unicode plane, and raw bytes
// (mostly invalid UTF-8).
#pragma once

#include <cstdint>
#include <string>

#include "forge/core/rng.h"

namespace forge::tok::testing {

inline void append_utf8(std::string& s, uint32_t cp) {
  if (cp < 0x80) {
    s.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    s.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    s.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    s.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    s.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    s.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    s.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

// n_chars code points: 2/5 ASCII, 1/5 each two-byte, three-byte (no surrogates) and four-byte.
inline std::string random_utf8(Rng& rng, size_t n_chars) {
  std::string s;
  for (size_t i = 0; i < n_chars; ++i) {
    uint32_t cp;
    switch (rng.below(5)) {
      case 0:
      case 1:
        cp = static_cast<uint32_t>(rng.below(0x80));
        break;
      case 2:
        cp = 0x80 + static_cast<uint32_t>(rng.below(0x800 - 0x80));
        break;
      case 3:
        do cp = 0x800 + static_cast<uint32_t>(rng.below(0x10000 - 0x800));
        while (cp >= 0xD800 && cp <= 0xDFFF);
        break;
      default:
        cp = 0x10000 + static_cast<uint32_t>(rng.below(0x110000 - 0x10000));
    }
    append_utf8(s, cp);
  }
  return s;
}

inline std::string random_raw_bytes(Rng& rng, size_t n) {
  std::string s;
  for (size_t i = 0; i < n; ++i) s.push_back(static_cast<char>(rng.below(256)));
  return s;
}

}  // namespace forge::tok::testing
