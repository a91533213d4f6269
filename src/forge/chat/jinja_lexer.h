// Template source → tokens, as jinja2's lexer produces them for the environment transformers
// renders chat templates in (trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=False):
//  - "\r\n" and "\r" become "\n", and one newline at the very end of the source is dropped;
//  - {{ }}, {% %}, {# #} with "-" (strip the whitespace on that side, newlines included) and
//    "+" (keep it) modifiers;
//  - trim_blocks: the first newline after a block or comment tag is removed;
//  - lstrip_blocks: spaces and tabs between the start of a line and a block or comment tag
//    are removed;
//  - inside tags: names, strings (Python escapes), integers, floats, operators. While brackets are
//    open, "}}" and "%}" close brackets, not the tag (jinja2's balancing stack).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace forge::chat::jinja {

enum class TokenType : uint8_t {
  kData,        // template text between tags
  kVarBegin,    // {{
  kVarEnd,      // }}
  kBlockBegin,  // {%
  kBlockEnd,    // %}
  kName,
  kString,
  kInteger,
  kFloat,
  kOperator,  // value: "+", "//", "==", "(", ...
  kEof,
};

struct Token {
  TokenType type;
  std::string value;  // data text, name, operator, or the unescaped string
  int line;           // 1-based line of the token's first character
  int64_t integer = 0;
  double real = 0;
};

// Throws JinjaError (with the line) for an unterminated tag, comment or string, or a character
// that starts no token.
std::vector<Token> lex(std::string_view source);

}  // namespace forge::chat::jinja
