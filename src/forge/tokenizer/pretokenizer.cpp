// Pre-tokenization with PCRE2.
//
// Design decisions:
//  - PCRE2 in UTF + UCP mode, so \p{L}, \p{N} and \s are the Unicode classes the reference
//    implementations (Python's `regex`, Rust's fancy-regex, Oniguruma) use. The pattern is
//    JIT-compiled once; pcre2_jit_match is the per-piece call (no option re-checking), with
//    pcre2_match as the fallback where the JIT is unavailable.
//  - Invalid UTF-8: PCRE2 in UTF mode must not see it (with PCRE2_NO_UTF_CHECK it would be
//    undefined behaviour; without, the whole match fails). We validate ourselves, run the regex
//    on each maximal valid run, and make every invalid byte a piece of its own. So pieces always
//    concatenate to the input, and valid text is split exactly as the references split it
//    (they can only see valid text: Python str / Rust &str).
//  - Pieces are the regex matches *and* the gaps between them (Hugging Face's "Isolated" split
//    behaviour), so a custom pattern that does not cover every character still loses nothing.
//    The GPT-2/GPT-4 patterns cover everything, so for them there are no gaps.
//  - \s is rewritten to Unicode's White_Space set before compiling. PCRE2's \s (with UCP) is
//    \p{Zs} + \h + \v, which also holds U+180E (Mongolian vowel separator, no longer a space
//    since Unicode 6.3); tiktoken's Rust regex and Oniguruma follow White_Space. The original
//    pattern is what regex() returns and what tokenizer.json stores.
//  - Match data, match context and JIT stack are thread_local (created on first use in a thread)
//    so split() is thread-safe and allocation-free in the steady state. Match data with one
//    ovector pair suffices: we only need the bounds of the whole match.
#include "forge/tokenizer/pretokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <cstring>

#include "forge/core/error.h"

namespace forge::tok {

namespace {

// GPT-2 (openai/gpt-2 encoder.py).
constexpr const char* kGpt2Regex =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
// GPT-4 (tiktoken cl100k_base; Llama 3's tokenizer.json spells an equivalent regex).
constexpr const char* kGpt4Regex =
    R"('(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}{1,3})"
    R"(| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+)";

// Unicode White_Space, as members of a character class.
constexpr const char* kWhiteSpace =
    R"(\t-\r\x{20}\x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000})";

// `regex` with \s spelled as White_Space (and \S, outside classes, as its complement). Tracks
// character classes ([...], with a leading ] or ^] literal, [:posix:] inside) and \Q...\E.
std::string with_unicode_white_space(const std::string& regex) {
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < regex.size(); ++i) {
    const char c = regex[i];
    if (c == '\\' && i + 1 < regex.size()) {
      const char e = regex[++i];
      if (e == 's') {
        out += in_class ? std::string(kWhiteSpace) : str("[", kWhiteSpace, "]");
      } else if (e == 'S' && !in_class) {
        out += str("[^", kWhiteSpace, "]");
      } else if (e == 'Q') {  // literal up to \E
        const size_t end = regex.find("\\E", i + 1);
        const size_t stop = end == std::string::npos ? regex.size() : end + 2;
        out += regex.substr(i - 1, stop - (i - 1));
        i = stop - 1;
      } else {
        out += c;
        out += e;
      }
      continue;
    }
    out += c;
    if (!in_class && c == '[') {
      in_class = true;
      if (i + 1 < regex.size() && regex[i + 1] == '^') out += regex[++i];
      if (i + 1 < regex.size() && regex[i + 1] == ']') out += regex[++i];  // literal ]
    } else if (in_class && c == '[' && i + 1 < regex.size() && regex[i + 1] == ':') {
      const size_t end = regex.find(":]", i + 2);
      if (end != std::string::npos) {
        out += regex.substr(i + 1, end + 2 - (i + 1));
        i = end + 1;
      }
    } else if (in_class && c == ']') {
      in_class = false;
    }
  }
  return out;
}

// Per-thread PCRE2 scratch: match data (one ovector pair) and a JIT stack large enough for
// very long whitespace or letter runs (the default 32 KiB machine stack can run out).
struct MatchScratch {
  pcre2_match_data* data = nullptr;
  pcre2_match_context* context = nullptr;
  pcre2_jit_stack* jit_stack = nullptr;
  MatchScratch() {
    data = pcre2_match_data_create(1, nullptr);
    context = pcre2_match_context_create(nullptr);
    jit_stack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
    FORGE_CHECK(data && context && jit_stack, "PCRE2 scratch allocation failed");
    pcre2_jit_stack_assign(context, nullptr, jit_stack);
  }
  ~MatchScratch() {
    pcre2_jit_stack_free(jit_stack);
    pcre2_match_context_free(context);
    pcre2_match_data_free(data);
  }
};

MatchScratch& scratch() {
  thread_local MatchScratch s;
  return s;
}

// Length of the valid UTF-8 sequence starting at p[0] (p < end), or 0 if it is invalid
// (bad lead byte, bad or missing continuation, overlong form, surrogate, above U+10FFFF).
// The same rules as PCRE2's own UTF check.
inline size_t utf8_sequence_length(const unsigned char* p, const unsigned char* end) {
  const unsigned char c = p[0];
  if (c < 0x80) return 1;
  const size_t avail = static_cast<size_t>(end - p);
  auto cont = [](unsigned char b) { return (b & 0xC0) == 0x80; };
  if (c >= 0xC2 && c <= 0xDF) return (avail >= 2 && cont(p[1])) ? 2 : 0;
  if (c >= 0xE0 && c <= 0xEF) {
    if (avail < 3 || !cont(p[1]) || !cont(p[2])) return 0;
    if (c == 0xE0 && p[1] < 0xA0) return 0;  // overlong
    if (c == 0xED && p[1] > 0x9F) return 0;  // surrogates U+D800..U+DFFF
    return 3;
  }
  if (c >= 0xF0 && c <= 0xF4) {
    if (avail < 4 || !cont(p[1]) || !cont(p[2]) || !cont(p[3])) return 0;
    if (c == 0xF0 && p[1] < 0x90) return 0;  // overlong
    if (c == 0xF4 && p[1] > 0x8F) return 0;  // above U+10FFFF
    return 4;
  }
  return 0;
}

// End of the maximal valid UTF-8 run starting at `begin`. ASCII is checked 8 bytes at a time:
// most text is mostly ASCII, and this pass must not cost more than the regex.
size_t valid_run_end(std::string_view text, size_t begin) {
  const auto* base = reinterpret_cast<const unsigned char*>(text.data());
  const unsigned char* p = base + begin;
  const unsigned char* end = base + text.size();
  while (p < end) {
    while (end - p >= 8) {
      uint64_t w;
      std::memcpy(&w, p, 8);
      if (w & 0x8080808080808080ull) break;
      p += 8;
    }
    if (p == end) break;
    const size_t len = utf8_sequence_length(p, end);
    if (len == 0) break;
    p += len;
  }
  return static_cast<size_t>(p - base);
}

}  // namespace

struct PreTokenizer::Impl {
  pcre2_code* code = nullptr;  // null for SplitPattern::kNone
  bool jit = false;
  ~Impl() { pcre2_code_free(code); }

  // Splits valid UTF-8 `run` into matches and the gaps between them.
  void split_valid(std::string_view run, std::vector<std::string_view>& out) const {
    if (code == nullptr) {
      out.push_back(run);
      return;
    }
    MatchScratch& s = scratch();
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(run.data());
    const size_t n = run.size();
    size_t emitted = 0;  // run[0, emitted) has been pushed
    size_t start = 0;    // where the next search begins
    while (start < n) {
      const int rc =
          jit ? pcre2_jit_match(code, subject, n, start, 0, s.data, s.context)
              : pcre2_match(code, subject, n, start, PCRE2_NO_UTF_CHECK, s.data, s.context);
      if (rc == PCRE2_ERROR_NOMATCH) break;
      if (rc < 0) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(rc, msg, sizeof(msg));
        throw Error(str("[pretokenizer] regex match failed: ", reinterpret_cast<char*>(msg)));
      }
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(s.data);
      const size_t m0 = ov[0], m1 = ov[1];
      if (m1 == m0) {  // empty match: step over one character; it joins the next gap
        start = m0 + utf8_sequence_length(subject + m0, subject + n);
        continue;
      }
      if (m0 > emitted) out.push_back(run.substr(emitted, m0 - emitted));
      out.push_back(run.substr(m0, m1 - m0));
      emitted = start = m1;
    }
    if (emitted < n) out.push_back(run.substr(emitted));
  }
};

const char* split_regex(SplitPattern p) {
  switch (p) {
    case SplitPattern::kGpt2:
      return kGpt2Regex;
    case SplitPattern::kGpt4:
      return kGpt4Regex;
    case SplitPattern::kNone:
      return "";
  }
  return "";
}

SplitPattern parse_split_pattern(const std::string& name) {
  if (name == "gpt2") return SplitPattern::kGpt2;
  if (name == "gpt4") return SplitPattern::kGpt4;
  if (name == "none") return SplitPattern::kNone;
  throw Error(
      str("[pretokenizer] unknown split pattern ", quote(name), " (expected gpt2, gpt4 or none)"));
}

PreTokenizer::PreTokenizer(SplitPattern p) : PreTokenizer(std::string(split_regex(p))) {}

PreTokenizer::PreTokenizer(const std::string& regex)
    : impl_(std::make_unique<Impl>()), regex_(regex) {
  if (regex.empty()) return;
  int err = 0;
  PCRE2_SIZE err_offset = 0;
  const std::string dialect = with_unicode_white_space(regex);
  impl_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(dialect.data()), dialect.size(),
                              PCRE2_UTF | PCRE2_UCP, &err, &err_offset, nullptr);
  if (impl_->code == nullptr) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof(msg));
    throw Error(str("[pretokenizer] regex does not compile at offset ", err_offset, ": ",
                    reinterpret_cast<char*>(msg), " (regex: ", regex, ")"));
  }
  impl_->jit = pcre2_jit_compile(impl_->code, PCRE2_JIT_COMPLETE) == 0;
}

PreTokenizer::~PreTokenizer() = default;
PreTokenizer::PreTokenizer(PreTokenizer&&) noexcept = default;
PreTokenizer& PreTokenizer::operator=(PreTokenizer&&) noexcept = default;

void PreTokenizer::split(std::string_view text, std::vector<std::string_view>& out) const {
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t run_end = valid_run_end(text, pos);
    if (run_end > pos) impl_->split_valid(text.substr(pos, run_end - pos), out);
    if (run_end < text.size()) out.push_back(text.substr(run_end, 1));  // an invalid byte
    pos = run_end + 1;
  }
}

}  // namespace forge::tok
