#include "forge/chat/chat_encode.h"

#include <algorithm>
#include <array>

namespace forge::chat {

EncodedText encode_rendered(const tok::Tokenizer& tok, const TaintedString& text) {
  std::vector<const tok::SpecialToken*> specials;
  std::array<bool, 256> first{};
  for (const tok::SpecialToken& sp : tok.specials()) {
    specials.push_back(&sp);
    first[static_cast<unsigned char>(sp.text[0])] = true;
  }
  std::stable_sort(specials.begin(), specials.end(),
                   [](auto* a, auto* b) { return a->text.size() > b->text.size(); });

  EncodedText enc;
  const std::string& t = text.text();
  auto add_text = [&](size_t b, size_t e) {
    if (b == e) return;
    enc.pieces.push_back({b, e, enc.ids.size(), false});
    const std::vector<int32_t> ids =
        tok.encode_ordinary(std::string_view(t).substr(b, e - b), b == 0);
    enc.ids.insert(enc.ids.end(), ids.begin(), ids.end());
  };
  size_t begin = 0, i = 0;
  while (i < t.size()) {
    if (!first[static_cast<unsigned char>(t[i])]) {
      ++i;
      continue;
    }
    const tok::SpecialToken* hit = nullptr;
    for (const tok::SpecialToken* sp : specials)
      if (t.compare(i, sp->text.size(), sp->text) == 0 &&
          text.is_template(i, i + sp->text.size())) {
        hit = sp;
        break;
      }
    if (hit == nullptr) {
      ++i;
      continue;
    }
    add_text(begin, i);
    enc.pieces.push_back({i, i + hit->text.size(), enc.ids.size(), true});
    enc.ids.push_back(hit->id);
    i += hit->text.size();
    begin = i;
  }
  add_text(begin, t.size());
  return enc;
}

TokenBoundary token_boundary(const tok::Tokenizer& tok, const std::string& text,
                             const EncodedText& enc, size_t b) {
  for (size_t k = 0; k < enc.pieces.size(); ++k) {
    const EncodedText::Piece& p = enc.pieces[k];
    if (b >= p.end) continue;
    if (b <= p.begin) return {p.first_token, true};
    if (p.special) return {p.first_token, false};
    const size_t last = k + 1 < enc.pieces.size() ? enc.pieces[k + 1].first_token : enc.ids.size();
    const std::string_view piece = std::string_view(text).substr(p.begin, p.end - p.begin);
    // The tokens' bytes spell the piece (byte-level BPE always; SentencePiece-style with the
    // "▁" it prepends as a space in front, unless a character became <unk>): then offsets are
    // exact.
    std::string spelled;
    for (size_t t = p.first_token; t < last; ++t) spelled += tok.token_bytes(enc.ids[t]);
    size_t shift = std::string::npos;
    if (spelled == piece) {
      shift = 0;
    } else if (spelled.size() == piece.size() + 1 && spelled[0] == ' ' &&
               std::string_view(spelled).substr(1) == piece) {
      shift = 1;
    }
    if (shift != std::string::npos) {
      const size_t target = b - p.begin + shift;
      size_t pos = 0;
      for (size_t t = p.first_token; t < last; ++t) {
        if (pos == target) return {t, true};
        pos += tok.token_bytes(enc.ids[t]).size();
        if (pos > target) return {t, false};
      }
      return {last, true};
    }
    // Otherwise: the ids of the piece's text before b against the piece's ids.
    const std::vector<int32_t> prefix =
        tok.encode_ordinary(piece.substr(0, b - p.begin), p.begin == 0);
    size_t lcp = 0;
    while (lcp < prefix.size() && p.first_token + lcp < last &&
           prefix[lcp] == enc.ids[p.first_token + lcp])
      ++lcp;
    return {p.first_token + lcp, lcp == prefix.size()};
  }
  return {enc.ids.size(), true};
}

}  // namespace forge::chat
