// The syntax tree of a chat template (jinja2's grammar, the parts chat templates use) and the
// parser that builds it from the lexer's tokens. Unknown filters and tests are errors here, at
// parse time, as jinja2 reports them when it compiles a template.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "forge/chat/jinja_lexer.h"
#include "forge/chat/jinja_value.h"

namespace forge::chat::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind : uint8_t {
    kConst,    // value
    kName,     // name
    kGetattr,  // args[0].name
    kGetitem,  // args[0][args[1]]
    kSlice,    // args[0][args[1]:args[2]:args[3]] (absent parts are null)
    kCall,     // args[0](args[1..], kwargs)
    kFilter,   // args[0] | name(args[1..], kwargs)
    kTest,     // args[0] is name(args[1..], kwargs)
    kNeg,      // -args[0]
    kPos,      // +args[0]
    kNot,      // not args[0]
    kBinary,   // args[0] name args[1]; name: + - * / // % ** ~
    kAnd,      // args[0] and args[1]
    kOr,       // args[0] or args[1]
    kCompare,  // args[0] ops[0] args[1] ops[1] args[2] ...; ops: == != < <= > >= in notin
    kCond,     // args[0] if args[1] else args[2] (args[2] null: undefined)
    kList,     // [args...]
    kTuple,    // (args...)
    kDict,     // {args[0]: args[1], args[2]: args[3], ...}
  };
  Kind kind;
  int line;
  Value value;
  std::string name;
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  std::vector<std::string> ops;
};

struct Node;
using Body = std::vector<Node>;

struct Node {
  enum class Kind : uint8_t {
    kText,      // template text
    kPrint,     // {{ expr }}
    kIf,        // branches (test, body) ..., else_body
    kFor,       // for targets in expr [if filter]: body, else_body
    kSet,       // set targets = expr, or set targets[0].attr = expr (attr non-empty)
    kSetBlock,  // set targets[0] %}body{% endset
    kBreak,
    kContinue,
    kBlock,  // a body rendered as is: {% generation %} (transformers' assistant-mask marker)
  };
  Kind kind;
  int line;
  std::string text;
  ExprPtr expr;
  ExprPtr filter;
  std::vector<std::string> targets;
  std::string attr;
  std::vector<std::pair<ExprPtr, Body>> branches;
  Body body, else_body;
};

// Tokens → tree. Throws JinjaError with the line of the offending token.
Body parse(const std::vector<Token>& tokens);

// Whether a filter / test of this name exists (jinja_builtins.cpp).
bool has_filter(const std::string& name);
bool has_test(const std::string& name);

}  // namespace forge::chat::jinja
