// What SentencePiece-style tokenizer.json files do to text before BPE, as Hugging Face
// `tokenizers` does it: the normalizers Prepend and Replace (Llama 2 spells "a space before the
// text, every space as ▁" as Sequence[Prepend("▁"), Replace(" " → "▁")]) and the Metaspace
// pre-tokenizer (Mistral's newer files: the same with a prepend scheme, optionally split before
// every ▁). Both run on one stretch of text between special tokens at a time.
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace forge::tok {

// tokenizer.json's "normalizer": Prepend and Replace (a literal String pattern) steps, applied in
// order. Other normalizers (NFC, NFKC, Lowercase, Strip, regex Replace...) are refused.
class Normalizer {
 public:
  struct Step {
    enum class Kind { kPrepend, kReplace };
    Kind kind;
    std::string pattern;  // kReplace: the text replaced (every occurrence, left to right)
    std::string content;  // what is put before the text, or in place of the pattern
  };

  // Reads the "normalizer" value (null: none). Throws forge::Error naming `path` and the first
  // normalizer type Forge does not apply.
  static Normalizer from_json(const nlohmann::json& j, const std::string& path);

  bool empty() const { return steps_.empty(); }
  // `text` normalized. Prepend leaves empty text empty, as `tokenizers` does.
  std::string apply(std::string_view text) const;

 private:
  std::vector<Step> steps_;
};

// The Metaspace pre-tokenizer: every space becomes `replacement`; one is put before the text
// unless it already starts with one (kAlways), only for text at the start of the input (kFirst:
// not after a special token), or never; then, if `split`, the text is cut before every
// replacement character ("▁a▁▁b" → "▁a", "▁", "▁b").
struct Metaspace {
  enum class Prepend { kAlways, kFirst, kNever };
  std::string replacement = "\xE2\x96\x81";  // U+2581 ▁, as UTF-8
  Prepend prepend = Prepend::kAlways;
  bool split = true;

  // Reads a Metaspace pre-tokenizer or decoder object, with the defaults and the legacy
  // add_prefix_space field as `tokenizers` reads them. Throws forge::Error naming `path`.
  static Metaspace from_json(const nlohmann::json& j, const std::string& path,
                             const std::string& where);

  // Rewrites `text` in place (spaces replaced, the prepended replacement) and appends its pieces
  // to `pieces` as views into it. starts_input: `text` begins the whole input (kFirst).
  void pre_tokenize(std::string& text, bool starts_input,
                    std::vector<std::string_view>& pieces) const;
};

// Every occurrence of `pattern` (non-empty) in `text` replaced by `content`, left to right.
std::string replace_all(std::string_view text, std::string_view pattern, std::string_view content);

}  // namespace forge::tok
