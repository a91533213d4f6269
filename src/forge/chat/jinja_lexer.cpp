#include "forge/chat/jinja_lexer.h"

#include <cctype>
#include <charconv>
#include <cstdlib>

#include "forge/chat/jinja_value.h"
#include "forge/core/error.h"

namespace forge::chat::jinja {

namespace {

// jinja2 normalises newlines before lexing and, with keep_trailing_newline=False, drops one
// newline at the end of the source.
std::string normalize_source(std::string_view src) {
  std::string out;
  out.reserve(src.size());
  for (size_t i = 0; i < src.size(); ++i) {
    if (src[i] == '\r') {
      out.push_back('\n');
      if (i + 1 < src.size() && src[i + 1] == '\n') ++i;
    } else {
      out.push_back(src[i]);
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

// Length of the run of Python whitespace (Unicode) starting at s[i].
size_t whitespace_run(std::string_view s, size_t i) {
  size_t j = i;
  while (j < s.size()) {
    size_t len;
    if (!py_isspace(decode_char(s, j, &len))) break;
    j += len;
  }
  return j - i;
}

// Python's str.rstrip(): the length of `s` without its trailing whitespace.
size_t rstripped_size(std::string_view s) {
  const std::vector<size_t> starts = char_starts(s);
  size_t n = starts.size() - 1;
  while (n > 0) {
    size_t len;
    if (!py_isspace(decode_char(s, starts[n - 1], &len))) break;
    --n;
  }
  return starts[n];
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

// The body of a string literal decoded as Python's "unicode-escape" codec does (what jinja2
// applies to string literals): \n \t \\ \' \" \a \b \f \v \r, octal, \xhh, \uhhhh, \Uhhhhhhhh,
// backslash-newline removed, any other backslash kept as it is.
std::string unescape(std::string_view s, int line) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '\\' || i + 1 == s.size()) {
      out.push_back(s[i]);
      continue;
    }
    const char c = s[++i];
    switch (c) {
      case '\n':
        break;
      case '\\':
        out.push_back('\\');
        break;
      case '\'':
        out.push_back('\'');
        break;
      case '"':
        out.push_back('"');
        break;
      case 'a':
        out.push_back('\a');
        break;
      case 'b':
        out.push_back('\b');
        break;
      case 'f':
        out.push_back('\f');
        break;
      case 'n':
        out.push_back('\n');
        break;
      case 'r':
        out.push_back('\r');
        break;
      case 't':
        out.push_back('\t');
        break;
      case 'v':
        out.push_back('\v');
        break;
      case 'x':
      case 'u':
      case 'U': {
        const size_t n = c == 'x' ? 2 : c == 'u' ? 4 : 8;
        uint32_t cp = 0;
        if (i + n >= s.size() ||
            std::from_chars(s.data() + i + 1, s.data() + i + 1 + n, cp, 16).ptr !=
                s.data() + i + 1 + n ||
            !std::isxdigit(static_cast<unsigned char>(s[i + 1])))
          throw JinjaError(str("truncated \\", c, " escape in a string literal"), line);
        if (cp > 0x10FFFF) throw JinjaError("illegal Unicode character in a string literal", line);
        append_utf8(out, cp);
        i += n;
        break;
      }
      default:
        if (c >= '0' && c <= '7') {
          uint32_t cp = static_cast<uint32_t>(c - '0');
          for (int k = 0; k < 2 && i + 1 < s.size() && s[i + 1] >= '0' && s[i + 1] <= '7'; ++k)
            cp = cp * 8 + static_cast<uint32_t>(s[++i] - '0');
          append_utf8(out, cp);
        } else {
          out.push_back('\\');
          out.push_back(c);
        }
    }
  }
  return out;
}

// Operators, longest first (jinja2 sorts its operator regex by length).
constexpr std::string_view kOperators[] = {"//", "**", "==", "!=", ">=", "<=", "+", "-", "/",
                                           "*",  "%",  "~",  "[",  "]",  "(",  ")", "{", "}",
                                           ">",  "<",  "=",  ".",  ":",  "|",  ",", ";"};

bool is_digit(char c) {
  return c >= '0' && c <= '9';
}
bool is_name_start(char c) {
  return std::isalpha(static_cast<unsigned char>(c)) || c == '_';
}
bool is_name_char(char c) {
  return is_name_start(c) || is_digit(c);
}

// Length of jinja2's `(\d+_)*\d+` at s[i] (0 if none).
size_t digits_run(std::string_view s, size_t i) {
  size_t j = i;
  while (true) {
    size_t k = j;
    while (k < s.size() && is_digit(s[k])) ++k;
    if (k == j) return j == i ? 0 : j - 1 - i;  // a trailing '_' is not part of the number
    j = k;
    if (j < s.size() && s[j] == '_' && j + 1 < s.size() && is_digit(s[j + 1])) {
      ++j;
      continue;
    }
    return j - i;
  }
}

// Length of a float literal at s[i] (jinja2's float_re), 0 if none.
size_t float_run(std::string_view s, size_t i) {
  if (i > 0 && s[i - 1] == '.') return 0;
  size_t j = i + digits_run(s, i);
  if (j == i) return 0;
  auto exponent = [&](size_t k) -> size_t {  // e[+-]?digits at k, returns its end or 0
    if (k >= s.size() || (s[k] != 'e' && s[k] != 'E')) return 0;
    ++k;
    if (k < s.size() && (s[k] == '+' || s[k] == '-')) ++k;
    const size_t d = digits_run(s, k);
    return d == 0 ? 0 : k + d;
  };
  size_t frac_end = 0;
  if (j < s.size() && s[j] == '.') {
    const size_t d = digits_run(s, j + 1);
    if (d > 0) frac_end = j + 1 + d;
  }
  if (frac_end) {
    const size_t e = exponent(frac_end);
    return (e ? e : frac_end) - i;
  }
  const size_t e = exponent(j);
  return e ? e - i : 0;
}

std::string without_underscores(std::string_view s) {
  std::string out;
  for (char c : s)
    if (c != '_') out.push_back(c);
  return out;
}

class Lexer {
 public:
  explicit Lexer(std::string src) : src_(std::move(src)) {}

  std::vector<Token> run() {
    bool line_starting = true;
    while (pos_ < src_.size()) {
      size_t tag = src_.find('{', pos_);
      while (tag != std::string::npos && tag + 1 < src_.size() && src_[tag + 1] != '{' &&
             src_[tag + 1] != '%' && src_[tag + 1] != '#')
        tag = src_.find('{', tag + 1);
      if (tag == std::string::npos || tag + 1 >= src_.size()) {
        emit_data(src_.substr(pos_));
        advance(src_.size());
        break;
      }
      const char kind = src_[tag + 1];
      const char sign = tag + 2 < src_.size() && (src_[tag + 2] == '-' || src_[tag + 2] == '+')
                            ? src_[tag + 2]
                            : 0;
      std::string text = src_.substr(pos_, tag - pos_);
      if (sign == '-') {
        text.resize(rstripped_size(text));
      } else if (sign != '+' && kind != '{') {
        // lstrip_blocks: only spaces and tabs between the line start and the tag are removed.
        const size_t l_pos = text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1;
        if ((l_pos > 0 || line_starting) &&
            text.find_first_not_of(" \t", l_pos) == std::string::npos)
          text.resize(l_pos);
      }
      emit_data(text);
      advance(tag + 2 + (sign ? 1 : 0));
      if (kind == '#') {
        line_starting = comment();
      } else {
        line_starting = tag_body(kind == '%');
      }
    }
    tokens_.push_back({TokenType::kEof, "", line_, 0, 0});
    return std::move(tokens_);
  }

 private:
  void advance(size_t to) {
    for (size_t i = pos_; i < to; ++i)
      if (src_[i] == '\n') ++line_;
    pos_ = to;
  }

  void emit_data(std::string text) {
    if (!text.empty()) tokens_.push_back({TokenType::kData, std::move(text), line_, 0, 0});
  }

  // After "{#": skips to "#}" and its whitespace handling. Returns whether it ended at a newline.
  bool comment() {
    const int start_line = line_;
    const size_t end = src_.find("#}", pos_);
    if (end == std::string::npos) throw JinjaError("missing end of comment tag", start_line);
    const char before = end > pos_ ? src_[end - 1] : 0;
    size_t stop = end + 2;
    if (before == '-') {
      stop += whitespace_run(src_, stop);
    } else if (before != '+' && stop < src_.size() && src_[stop] == '\n') {
      ++stop;  // trim_blocks
    }
    advance(stop);
    return src_[stop - 1] == '\n';
  }

  // After "{{" or "{%" (and its sign): the tokens up to the closing delimiter.
  bool tag_body(bool block) {
    tokens_.push_back({block ? TokenType::kBlockBegin : TokenType::kVarBegin, "", line_, 0, 0});
    const int start_line = line_;
    std::string brackets;  // expected closers
    while (true) {
      if (pos_ >= src_.size())
        throw JinjaError(block ? "unexpected end of template: missing '%}'"
                               : "unexpected end of template: missing '}}'",
                         start_line);
      if (brackets.empty()) {
        if (const size_t stop = tag_end(block)) {
          tokens_.push_back({block ? TokenType::kBlockEnd : TokenType::kVarEnd, "", line_, 0, 0});
          advance(stop);
          return src_[stop - 1] == '\n';
        }
      }
      const std::string_view rest = std::string_view(src_).substr(pos_);
      if (const size_t ws = whitespace_run(src_, pos_)) {
        advance(pos_ + ws);
      } else if (const size_t f = float_run(src_, pos_)) {
        const std::string text = without_underscores(rest.substr(0, f));
        // strtod, not stod: "1e999" is inf in Python, not an error.
        tokens_.push_back({TokenType::kFloat, text, line_, 0, std::strtod(text.c_str(), nullptr)});
        advance(pos_ + f);
      } else if (const size_t d = digits_run(src_, pos_)) {
        const std::string text = without_underscores(rest.substr(0, d));
        int64_t v = 0;
        if (std::from_chars(text.data(), text.data() + text.size(), v).ec != std::errc())
          throw JinjaError(str("integer literal ", text, " is out of range"), line_);
        tokens_.push_back({TokenType::kInteger, text, line_, v, 0});
        advance(pos_ + d);
      } else if (is_name_start(rest[0])) {
        size_t n = 1;
        while (n < rest.size() && is_name_char(rest[n])) ++n;
        tokens_.push_back({TokenType::kName, std::string(rest.substr(0, n)), line_, 0, 0});
        advance(pos_ + n);
      } else if (rest[0] == '\'' || rest[0] == '"') {
        size_t i = 1;
        while (i < rest.size() && rest[i] != rest[0]) i += rest[i] == '\\' ? 2 : 1;
        if (i >= rest.size()) throw JinjaError("unterminated string literal", line_);
        tokens_.push_back(
            {TokenType::kString, unescape(rest.substr(1, i - 1), line_), line_, 0, 0});
        advance(pos_ + i + 1);
      } else {
        std::string_view op;
        for (std::string_view o : kOperators)
          if (rest.starts_with(o)) {
            op = o;
            break;
          }
        if (op.empty())
          throw JinjaError(str("unexpected character '", rest.substr(0, 1), "'"), line_);
        if (op == "(" || op == "[" || op == "{") {
          brackets.push_back(op == "(" ? ')' : op == "[" ? ']' : '}');
        } else if (op == ")" || op == "]" || op == "}") {
          if (brackets.empty() || brackets.back() != op[0])
            throw JinjaError(str("unexpected '", op, "'"), line_);
          brackets.pop_back();
        }
        tokens_.push_back({TokenType::kOperator, std::string(op), line_, 0, 0});
        advance(pos_ + op.size());
      }
    }
  }

  // If the closing delimiter starts at pos_: where the text after it (and after the whitespace
  // it removes) begins. 0 otherwise.
  size_t tag_end(bool block) const {
    const std::string_view rest = std::string_view(src_).substr(pos_);
    const std::string_view close = block ? "%}" : "}}";
    if (rest.size() > 2 && rest[0] == '-' && rest.substr(1, 2) == close)
      return pos_ + 3 + whitespace_run(src_, pos_ + 3);
    if (block && rest.size() > 2 && rest[0] == '+' && rest.substr(1, 2) == close) return pos_ + 3;
    if (rest.starts_with(close)) {
      const size_t stop = pos_ + 2;
      return block && stop < src_.size() && src_[stop] == '\n' ? stop + 1 : stop;  // trim_blocks
    }
    return 0;
  }

  std::string src_;
  size_t pos_ = 0;
  int line_ = 1;
  std::vector<Token> tokens_;
};

}  // namespace

std::vector<Token> lex(std::string_view source) {
  return Lexer(normalize_source(source)).run();
}

}  // namespace forge::chat::jinja
