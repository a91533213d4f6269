// The symbols character-level BPE starts a piece from, as Hugging Face's BPE model makes them
// (BPE::merge_word): each character's own token; failing that, with byte_fallback, its UTF-8
// bytes as <0xNN> tokens (all of them, or none); failing that the unk token, a run of such
// characters making one unk with fuse_unk; failing that, nothing — `tokenizers` drops a character
// it has no token for when there is no unk token, and so does Forge.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace forge::tok {

class CharSymbols {
 public:
  struct Options {
    bool byte_fallback = false;
    int32_t unk_id = -1;  // -1: no unk token
    bool fuse_unk = false;
  };

  CharSymbols() = default;
  // vocab[id]: the token's text ("" for an unused id); the first id of a text wins.
  CharSymbols(const std::vector<std::string>& vocab, Options options);

  // Appends the symbols of `piece`. A byte that starts no valid UTF-8 character (Forge accepts
  // such input; `tokenizers` cannot be given it) is a character of its own, with no token: with
  // byte_fallback it becomes its <0xNN> token.
  void append(std::string_view piece, std::vector<int32_t>& out) const;

 private:
  // The id of a one-character token, or -1: ASCII by table, other characters by their UTF-8
  // bytes packed into a uint32 key.
  int32_t char_id(std::string_view ch) const;

  std::array<int32_t, 128> ascii_id_{};
  std::unordered_map<uint32_t, int32_t> other_id_;
  std::array<int32_t, 256> byte_token_id_{};  // id of "<0xNN>", or -1
  Options options_;
};

}  // namespace forge::tok
