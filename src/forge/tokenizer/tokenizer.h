// Byte-level BPE tokenizer, exactly as GPT-2 does it: pre-tokenize with a regex, then apply
// merges in rank order within each piece (lowest rank first), with a cache of encoded pieces.
// Special tokens (e.g. <|endoftext|>) are matched exactly before splitting.
//
// Representation: vocab_[id] is the token's bytes; merges are (left id, right id) → merged id in
// rank order. Byte b's single-byte token may have any id (GPT-2's encoder.json does not put byte
// b at id b), so byte_id_[b] records it.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "forge/tokenizer/pretokenizer.h"

namespace forge::tok {

struct SpecialToken {
  std::string text;
  int32_t id;
};

// What tokenizer.json's post_processor puts around one sequence: the "single" template of a
// TemplateProcessing (its SpecialToken pieces before and after the one Sequence piece $A), a
// Sequence of processors composed in order, ByteLevel adding nothing to the ids.
struct PostProcessor {
  std::vector<int32_t> prefix, suffix;  // special-token ids before / after the text's ids
  std::string json;  // the post_processor object as read (save_json writes it back); "": none
  // Why with_special_tokens() cannot apply it (a one-line message naming the file): a processor
  // Forge does not implement, or a template that names tokens the file does not have. Such a
  // tokenizer still loads and encodes as before (the post-processor was ignored before Forge
  // read it, and encode() never applies it).
  std::string problem;
};

class Tokenizer {
 public:
  // Loads tokenizer.json (Hugging Face, BPE model with ByteLevel pre-tokenizer/decoder), or a
  // directory holding tokenizer.json or encoder.json + vocab.bpe (GPT-2's files). Throws
  // forge::Error naming the file and the problem (or the unsupported component).
  static Tokenizer load(const std::string& path);

  // Builds a tokenizer from its parts. vocab[id] = bytes of token id (every byte must have a
  // single-byte token); merges in rank order as pairs of ids whose concatenation is a token.
  static Tokenizer from_bpe(std::vector<std::string> vocab,
                            const std::vector<std::pair<int32_t, int32_t>>& merges,
                            std::vector<SpecialToken> specials, SplitPattern pattern);

  // Text → ids. encode() recognises special tokens; encode_ordinary() treats them as text.
  std::vector<int32_t> encode(std::string_view text) const;
  std::vector<int32_t> encode_ordinary(std::string_view text) const;
  // ids → bytes (not necessarily valid UTF-8 when the ids split a character). Throws
  // forge::Error naming an unknown id.
  std::string decode(const std::vector<int32_t>& ids) const;
  // The bytes of one token (a special token: its text), as decode({id}) without the copy; the
  // view lives as long as the tokenizer. Throws forge::Error naming an unknown id.
  std::string_view token_bytes(int32_t id) const;
  bool is_special(int32_t id) const;

  // `ids` with the post-processor's special tokens around them (e.g. BOS first), as
  // `tokenizers` encodes one sequence with add_special_tokens=True; unchanged when the
  // tokenizer has no post-processor. Throws forge::Error for one it cannot apply
  // (PostProcessor::problem).
  std::vector<int32_t> with_special_tokens(std::vector<int32_t> ids) const;
  const PostProcessor& post_processor() const;

  int32_t vocab_size() const;  // regular + special tokens (max id + 1)
  std::optional<int32_t> special_id(const std::string& text) const;
  // The id of <|endoftext|> if the tokenizer has it.
  std::optional<int32_t> eot_id() const { return special_id("<|endoftext|>"); }
  const std::vector<std::string>& vocab() const { return vocab_; }
  const std::vector<std::pair<int32_t, int32_t>>& merges() const { return merges_; }
  const std::vector<SpecialToken>& specials() const { return specials_; }

  // Writes a Hugging Face tokenizer.json (BPE model, ByteLevel pre-tokenizer with this regex,
  // ByteLevel decoder, added_tokens for the specials) that `tokenizers` loads and encodes
  // identically. Replaced atomically (io/atomic_file.h: temporary name, fsync, rename).
  void save_json(const std::string& path) const;

 private:
  std::vector<std::string> vocab_;
  std::vector<std::pair<int32_t, int32_t>> merges_;
  std::vector<SpecialToken> specials_;
  std::array<int32_t, 256> byte_id_{};
  // Implementation detail left to tokenizer.cpp: merge-rank table, pre-tokenizer, piece cache.
  struct State;
  std::shared_ptr<State> state_;

  // What from_bpe does, with what tokenizer.json can add: a chain of split regexes applied in
  // turn (Hugging Face's Sequence of Split pre-tokenizers; none = the text is one piece), and
  // ignore_merges (a piece that is itself a token is emitted whole, as Llama 3 asks), and
  // the post-processor.
  static Tokenizer build(std::vector<std::string> vocab,
                         const std::vector<std::pair<int32_t, int32_t>>& merges,
                         std::vector<SpecialToken> specials, std::vector<std::string> split_regexes,
                         bool ignore_merges, PostProcessor post_processor = {});
  const std::vector<std::string>& split_regexes() const;
  bool ignore_merges() const;
  void encode_ordinary_into(std::string_view text, std::vector<int32_t>& out) const;
  void encode_piece(std::string_view piece, std::vector<int32_t>& out) const;
};

// GPT-2's printable stand-in for every byte (bytes_to_unicode in openai/gpt-2's encoder.py),
// as UTF-8: the alphabet vocab files and tokenizer.json spell tokens in.
const std::array<std::string, 256>& byte_to_unicode();

}  // namespace forge::tok
