// Pre-tokenization: splitting text into the pieces BPE merges within, with the regular
// expressions GPT-2 and GPT-4 (cl100k) use. PCRE2 (Debian's libpcre2-dev) in UTF mode with
// Unicode properties, JIT-compiled, so \p{L}, \p{N} and \s are right for all of Unicode.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace forge::tok {

enum class SplitPattern { kGpt2, kGpt4, kNone };

// The regex source of a pattern ("" for kNone: the whole text is one piece).
const char* split_regex(SplitPattern p);
// "gpt2" | "gpt4" | "none"; throws forge::Error naming a bad value.
SplitPattern parse_split_pattern(const std::string& name);

class PreTokenizer {
 public:
  explicit PreTokenizer(SplitPattern p);
  // A custom regex (e.g. read from a tokenizer.json); throws forge::Error if it does not compile.
  explicit PreTokenizer(const std::string& regex);
  ~PreTokenizer();
  PreTokenizer(PreTokenizer&&) noexcept;
  PreTokenizer& operator=(PreTokenizer&&) noexcept;

  // Appends the pieces of `text` to `out` as views into `text`. Their concatenation is `text`
  // exactly. Invalid UTF-8 never crashes: such bytes become pieces of their own. Thread-safe.
  void split(std::string_view text, std::vector<std::string_view>& out) const;
  const std::string& regex() const { return regex_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::string regex_;
};

}  // namespace forge::tok
