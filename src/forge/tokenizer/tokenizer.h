// BPE tokenizer of two kinds, each exactly as Hugging Face `tokenizers` runs it:
//  - byte-level (GPT-2, Llama 3): pre-tokenize with regexes, then merge the bytes of each piece;
//  - character-level, SentencePiece style (Llama 2, Mistral): spaces become ▁ (normalizer or
//    Metaspace pre-tokenizer), merges start from characters, a character without a token becomes
//    its <0xNN> byte tokens (byte fallback) or <unk>, and a decoder chain makes text of tokens.
// Both apply merges in rank order within each piece (lowest rank first), with a cache of encoded
// pieces. Special tokens (e.g. <|endoftext|>, <s>) are matched exactly before splitting.
//
// Representation: vocab_[id] is the token's bytes (byte-level) or its text as the vocabulary
// spells it ("▁the", "<0x41>"; character-level); merges are (left id, right id) → merged id in
// rank order. Byte b's single-byte token may have any id (GPT-2's encoder.json does not put byte
// b at id b), so byte_id_[b] records it (byte-level only).
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

#include "forge/tokenizer/decoder.h"
#include "forge/tokenizer/normalizer.h"
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

// What a character-level (SentencePiece-style) tokenizer.json adds to BPE: how text becomes
// pieces (normalizer, Metaspace pre-tokenizer), what a character without a token becomes, and how
// tokens become text (decoder).
struct CharLevel {
  Normalizer normalizer;
  std::optional<Metaspace> metaspace;  // none: each stretch of text is one piece
  Decoder decoder;
  bool byte_fallback = false;  // a character without a token → its <0xNN> byte tokens
  std::string unk_token;       // else this token ("": the character is dropped)
  bool fuse_unk = false;       // a run of unknown characters → one unk
  // The components as read, for save_json (null: none).
  std::string normalizer_json = "null", pre_tokenizer_json = "null", decoder_json = "null";
};

class Tokenizer {
 public:
  // Loads tokenizer.json (Hugging Face, BPE model: byte-level, or character-level as Llama 2 and
  // Mistral ship it), or a directory holding tokenizer.json or encoder.json + vocab.bpe (GPT-2's
  // files). Throws forge::Error naming the file and the problem (or the unsupported component).
  static Tokenizer load(const std::string& path);

  // Builds a tokenizer from its parts. vocab[id] = bytes of token id (every byte must have a
  // single-byte token); merges in rank order as pairs of ids whose concatenation is a token.
  static Tokenizer from_bpe(std::vector<std::string> vocab,
                            const std::vector<std::pair<int32_t, int32_t>>& merges,
                            std::vector<SpecialToken> specials, SplitPattern pattern);

  // Text → ids. encode() recognises special tokens; encode_ordinary() treats them as text.
  std::vector<int32_t> encode(std::string_view text) const;
  std::vector<int32_t> encode_ordinary(std::string_view text) const;
  // encode_ordinary() of text that may not begin the input: what encode() does with the text
  // after a special token (starts_input false), where Metaspace's prepend_scheme "first" adds no
  // "▁". For callers that find the special tokens themselves (chat/chat_encode.h).
  std::vector<int32_t> encode_ordinary(std::string_view text, bool starts_input) const;
  // ids → text, as `tokenizers` decodes with skip_special_tokens=False. Byte-level: the bytes
  // (not necessarily valid UTF-8 when the ids split a character). Character-level: the decoder
  // chain's text (invalid byte-fallback runs become U+FFFD, Llama 2's Strip drops the space
  // before the first word). Throws forge::Error naming an unknown id.
  std::string decode(const std::vector<int32_t>& ids) const;
  // The bytes of one token (a special token: its text), as they appear inside decoded text: for
  // a byte-level tokenizer decode({id}); for a character-level one "▁the" gives " the" and
  // "<0xE4>" the byte 0xE4, what a stream concatenates (see Decoder::token_bytes). The view lives
  // as long as the tokenizer. Throws forge::Error naming an unknown id.
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
  // ByteLevel decoder, added_tokens for the specials; a character-level tokenizer: its model
  // options and the normalizer, pre-tokenizer and decoder it was read with) that `tokenizers`
  // loads and encodes identically. Replaced atomically (io/atomic_file.h: temporary name,
  // fsync, rename).
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
  // ignore_merges (a piece that is itself a token is emitted whole, as Llama 3 asks), the
  // post-processor, and for a character-level tokenizer what it adds (no split regexes then).
  static Tokenizer build(std::vector<std::string> vocab,
                         const std::vector<std::pair<int32_t, int32_t>>& merges,
                         std::vector<SpecialToken> specials, std::vector<std::string> split_regexes,
                         bool ignore_merges, PostProcessor post_processor = {},
                         std::optional<CharLevel> char_level = std::nullopt);
  const std::vector<std::string>& split_regexes() const;
  bool ignore_merges() const;
  const CharLevel* char_level() const;  // nullptr: byte-level
  // starts_input: `text` begins the whole input (Metaspace's prepend scheme "first" asks).
  void encode_ordinary_into(std::string_view text, bool starts_input,
                            std::vector<int32_t>& out) const;
  void encode_piece(std::string_view piece, std::vector<int32_t>& out) const;
};

// Tokenizers keep tables indexed by token id, so ids must be nearly dense: at most twice the
// number of tokens plus kIdSlack (real vocabularies have a few unused ids, if any). Throws
// forge::Error otherwise, before anything of that size is allocated: a file of three tokens with
// ids in the tens of millions would otherwise take gigabytes (found by fuzz_gpt2_vocab).
inline constexpr int64_t kIdSlack = 1024;
void check_ids_dense(int64_t id_end, size_t tokens);

// GPT-2's printable stand-in for every byte (bytes_to_unicode in openai/gpt-2's encoder.py),
// as UTF-8: the alphabet vocab files and tokenizer.json spell tokens in.
const std::array<std::string, 256>& byte_to_unicode();

}  // namespace forge::tok
