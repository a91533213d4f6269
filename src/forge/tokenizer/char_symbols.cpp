// CharSymbols (see char_symbols.h). Only one-character tokens can start a piece, so the lookup
// tables hold just those: a 128-entry array for ASCII (most characters of most text) and a hash
// map keyed by the packed UTF-8 bytes for the rest (a few thousand entries at most), instead of
// hashing a string per character.
#include "forge/tokenizer/char_symbols.h"

#include <cstdio>
#include <cstring>

#include "forge/tokenizer/utf8.h"

namespace forge::tok {

namespace {

uint32_t pack(std::string_view ch) {
  uint32_t key = 0;
  std::memcpy(&key, ch.data(), ch.size());  // ch.size() <= 4; distinct sizes differ in lead byte
  return key;
}

}  // namespace

CharSymbols::CharSymbols(const std::vector<std::string>& vocab, Options options)
    : options_(options) {
  ascii_id_.fill(-1);
  byte_token_id_.fill(-1);
  std::unordered_map<std::string, int> byte_of;  // "<0x41>" → 0x41, spelled as `tokenizers` does
  char name[8];
  for (int b = 0; b < 256; ++b) {
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    byte_of.emplace(name, b);
  }
  for (size_t id = 0; id < vocab.size(); ++id) {
    const std::string& t = vocab[id];
    if (t.empty()) continue;
    if (const auto it = byte_of.find(t); it != byte_of.end() && byte_token_id_[it->second] < 0)
      byte_token_id_[it->second] = static_cast<int32_t>(id);
    if (utf8_char_len(t, 0) != t.size()) continue;  // not one character
    if (t.size() == 1) {
      if (ascii_id_[static_cast<unsigned char>(t[0])] < 0)
        ascii_id_[static_cast<unsigned char>(t[0])] = static_cast<int32_t>(id);
    } else {
      other_id_.emplace(pack(t), static_cast<int32_t>(id));
    }
  }
}

int32_t CharSymbols::char_id(std::string_view ch) const {
  if (ch.size() == 1) {
    const auto c = static_cast<unsigned char>(ch[0]);
    return c < 0x80 ? ascii_id_[c] : -1;  // a lone byte >= 0x80 is never a token
  }
  const auto it = other_id_.find(pack(ch));
  return it == other_id_.end() ? -1 : it->second;
}

void CharSymbols::append(std::string_view piece, std::vector<int32_t>& out) const {
  // `tokenizers` holds back an unk until a character with a token (or the end) shows whether a
  // fused run goes on; byte-fallback symbols do not release it, so an unk can follow them.
  bool pending_unk = false;
  for (size_t i = 0; i < piece.size();) {
    size_t len = utf8_char_len(piece, i);
    if (len == 0) len = 1;
    const std::string_view ch = piece.substr(i, len);
    i += len;
    if (const int32_t id = char_id(ch); id >= 0) {
      if (pending_unk) out.push_back(options_.unk_id);
      pending_unk = false;
      out.push_back(id);
      continue;
    }
    if (options_.byte_fallback) {
      bool all = true;
      for (const char c : ch) all = all && byte_token_id_[static_cast<unsigned char>(c)] >= 0;
      if (all) {
        for (const char c : ch) out.push_back(byte_token_id_[static_cast<unsigned char>(c)]);
        continue;
      }
    }
    if (options_.unk_id < 0) continue;
    if (pending_unk && !options_.fuse_unk) out.push_back(options_.unk_id);
    pending_unk = true;
  }
  if (pending_unk) out.push_back(options_.unk_id);
}

}  // namespace forge::tok
