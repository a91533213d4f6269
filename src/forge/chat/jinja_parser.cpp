// jinja2's parser (jinja2/parser.py), function for function where chat templates need it:
// parse_tuple → parse_condexpr → or / and / not → compare → + - → ~ → * / // % → ** → unary →
// primary with postfix ([], ., calls) and filter/test chains.
#include <initializer_list>

#include "forge/chat/jinja_ast.h"
#include "forge/core/error.h"

namespace forge::chat::jinja {

namespace {

ExprPtr make(Expr::Kind kind, int line) {
  auto e = std::make_unique<Expr>();
  e->kind = kind;
  e->line = line;
  return e;
}

ExprPtr make2(Expr::Kind kind, int line, ExprPtr a, ExprPtr b, std::string name = "") {
  ExprPtr e = make(kind, line);
  e->name = std::move(name);
  e->args.push_back(std::move(a));
  e->args.push_back(std::move(b));
  return e;
}

Node node(Node::Kind kind, int line) {
  Node n;
  n.kind = kind;
  n.line = line;
  return n;
}

std::string describe(const Token& t) {
  switch (t.type) {
    case TokenType::kData:
      return "template text";
    case TokenType::kVarBegin:
      return "'{{'";
    case TokenType::kVarEnd:
      return "end of print statement";
    case TokenType::kBlockBegin:
      return "'{%'";
    case TokenType::kBlockEnd:
      return "end of statement block";
    case TokenType::kName:
      return "'" + t.value + "'";
    case TokenType::kString:
      return "string";
    case TokenType::kInteger:
      return "integer";
    case TokenType::kFloat:
      return "float";
    case TokenType::kOperator:
      return "'" + t.value + "'";
    case TokenType::kEof:
      return "end of template";
  }
  return "?";
}

// Nesting deeper than this (brackets, unary operators, blocks) is refused: templates come from
// model directories, and unbounded recursion would overflow the stack instead of failing.
constexpr int kMaxDepth = 200;

class Parser {
 public:
  explicit Parser(const std::vector<Token>& tokens) : t_(tokens) {}

  Body parse_template() {
    Body body = parse_statements({});
    if (cur().type != TokenType::kEof) fail(str("unexpected ", describe(cur())));
    return body;
  }

 private:
  const Token& cur() const { return t_[i_]; }
  const Token& peek(size_t k = 1) const { return t_[std::min(i_ + k, t_.size() - 1)]; }
  const Token& next() { return t_[i_ < t_.size() - 1 ? i_++ : i_]; }
  [[noreturn]] void fail(const std::string& msg) const { throw JinjaError(msg, cur().line); }

  bool is_op(std::string_view op) const {
    return cur().type == TokenType::kOperator && cur().value == op;
  }
  bool is_name(std::string_view name) const {
    return cur().type == TokenType::kName && cur().value == name;
  }
  bool skip_op(std::string_view op) {
    if (!is_op(op)) return false;
    next();
    return true;
  }
  bool skip_name(std::string_view name) {
    if (!is_name(name)) return false;
    next();
    return true;
  }
  void expect_op(std::string_view op) {
    if (!skip_op(op)) fail(str("expected '", op, "', got ", describe(cur())));
  }
  void expect(TokenType type, const char* what) {
    if (cur().type != type) fail(str("expected ", what, ", got ", describe(cur())));
    next();
  }
  std::string expect_name() {
    if (cur().type != TokenType::kName) fail(str("expected a name, got ", describe(cur())));
    return next().value;
  }

  // Statements until one of `end_tags` opens a block ({% end_tag ...); that block's opening
  // "{%" is consumed and cur() is the tag name.
  // `opened_tag` / `opened_line`: the block being read, for the error when it never closes.
  Body parse_statements(std::initializer_list<std::string_view> end_tags,
                        const char* opened_tag = "", int opened_line = 0) {
    Body body;
    while (true) {
      const Token& t = cur();
      if (t.type == TokenType::kEof) {
        if (end_tags.size() == 0) return body;
        std::string want;
        for (std::string_view e : end_tags)
          want += (want.empty() ? "'" : " or '") + std::string(e) + "'";
        throw JinjaError(str("unexpected end of template: the '", opened_tag,
                             "' here is never closed (looking for ", want, ")"),
                         opened_line);
      }
      if (t.type == TokenType::kData) {
        Node n = node(Node::Kind::kText, t.line);
        n.text = t.value;
        body.push_back(std::move(n));
        next();
      } else if (t.type == TokenType::kVarBegin) {
        next();
        Node n = node(Node::Kind::kPrint, t.line);
        n.expr = parse_tuple(true);
        expect(TokenType::kVarEnd, "end of print statement");
        body.push_back(std::move(n));
      } else if (t.type == TokenType::kBlockBegin) {
        next();
        if (cur().type == TokenType::kName)
          for (std::string_view e : end_tags)
            if (cur().value == e) return body;
        body.push_back(parse_statement());
      } else {
        fail(str("unexpected ", describe(t)));
      }
    }
  }

  Node parse_statement() {
    const Deeper guard(this);
    const int line = cur().line;
    if (cur().type != TokenType::kName) fail("tag name expected");
    const std::string tag = cur().value;
    if (tag == "if") return parse_if();
    if (tag == "for") return parse_for();
    if (tag == "set") return parse_set();
    if (tag == "generation") {
      next();
      expect(TokenType::kBlockEnd, "end of statement block");
      Node n = node(Node::Kind::kBlock, line);
      n.body = parse_statements({"endgeneration"}, "generation", line);
      next();
      expect(TokenType::kBlockEnd, "end of statement block");
      return n;
    }
    if (tag == "break" || tag == "continue") {
      if (loop_depth_ == 0) fail(str("'", tag, "' outside a for loop"));
      next();
      expect(TokenType::kBlockEnd, "end of statement block");
      return node(tag == "break" ? Node::Kind::kBreak : Node::Kind::kContinue, line);
    }
    if (tag == "macro" || tag == "call" || tag == "filter" || tag == "with" || tag == "raw" ||
        tag == "include" || tag == "import" || tag == "from" || tag == "extends" ||
        tag == "block" || tag == "do")
      fail(str("the tag '", tag, "' is not supported by Forge's chat-template interpreter"));
    fail(str("unknown tag '", tag, "'"));
  }

  Node parse_if() {
    Node n = node(Node::Kind::kIf, cur().line);
    next();  // if
    while (true) {
      ExprPtr test = parse_tuple(false);
      expect(TokenType::kBlockEnd, "end of statement block");
      Body body = parse_statements({"elif", "else", "endif"}, "if", n.line);
      n.branches.emplace_back(std::move(test), std::move(body));
      const std::string tag = next().value;
      if (tag == "elif") continue;
      if (tag == "else") {
        expect(TokenType::kBlockEnd, "end of statement block");
        n.else_body = parse_statements({"endif"}, "if", n.line);
        next();
      }
      break;
    }
    expect(TokenType::kBlockEnd, "end of statement block");
    return n;
  }

  // for a[, b ...] in iterable [if filter] %} body [{% else %} body] {% endfor %}
  Node parse_for() {
    Node n = node(Node::Kind::kFor, cur().line);
    next();  // for
    const bool paren = skip_op("(");
    do {
      n.targets.push_back(expect_name());
    } while (skip_op(","));
    if (paren) expect_op(")");
    if (!skip_name("in")) fail(str("expected 'in', got ", describe(cur())));
    n.expr = parse_tuple(false, /*stop_at_if=*/true);
    if (skip_name("if")) n.filter = parse_tuple(false);
    if (is_name("recursive")) fail("recursive loops are not supported");
    expect(TokenType::kBlockEnd, "end of statement block");
    ++loop_depth_;
    n.body = parse_statements({"endfor", "else"}, "for", n.line);
    --loop_depth_;
    if (next().value == "else") {
      expect(TokenType::kBlockEnd, "end of statement block");
      n.else_body = parse_statements({"endfor"}, "for", n.line);
      next();
    }
    expect(TokenType::kBlockEnd, "end of statement block");
    return n;
  }

  // set x = expr | set a, b = expr | set ns.attr = expr | set x %}...{% endset %}
  Node parse_set() {
    Node n = node(Node::Kind::kSet, cur().line);
    next();  // set
    n.targets.push_back(expect_name());
    if (skip_op(".")) {
      n.attr = expect_name();
    } else {
      while (skip_op(",")) n.targets.push_back(expect_name());
    }
    if (cur().type == TokenType::kBlockEnd && n.targets.size() == 1 && n.attr.empty()) {
      next();
      n.kind = Node::Kind::kSetBlock;
      n.body = parse_statements({"endset"}, "set", n.line);
      next();
      expect(TokenType::kBlockEnd, "end of statement block");
      return n;
    }
    expect_op("=");
    n.expr = parse_tuple(true);
    expect(TokenType::kBlockEnd, "end of statement block");
    return n;
  }

  // Expressions separated by commas form a tuple (jinja2's parse_tuple).
  ExprPtr parse_tuple(bool with_condexpr, bool stop_at_if = false, bool explicit_parens = false) {
    const int line = cur().line;
    std::vector<ExprPtr> items;
    bool comma = false;
    while (true) {
      if (!items.empty()) {
        if (!skip_op(",")) break;
        comma = true;
      }
      if (tuple_ends(stop_at_if)) break;
      items.push_back(with_condexpr ? parse_condexpr() : parse_or());
    }
    if (!comma) {
      if (!items.empty()) return std::move(items[0]);
      if (!explicit_parens) fail(str("expected an expression, got ", describe(cur())));
    }
    ExprPtr t = make(Expr::Kind::kTuple, line);
    t->args = std::move(items);
    return t;
  }

  bool tuple_ends(bool stop_at_if) const {
    const Token& t = cur();
    if (t.type == TokenType::kVarEnd || t.type == TokenType::kBlockEnd || t.type == TokenType::kEof)
      return true;
    if (t.type == TokenType::kOperator && (t.value == ")" || t.value == "]" || t.value == "}"))
      return true;
    return stop_at_if && t.type == TokenType::kName && t.value == "if";
  }

  ExprPtr parse_condexpr() {
    const int line = cur().line;
    ExprPtr e = parse_or();
    while (skip_name("if")) {
      ExprPtr cond = parse_or();
      ExprPtr other = skip_name("else") ? parse_condexpr() : nullptr;
      ExprPtr c = make(Expr::Kind::kCond, line);
      c->args.push_back(std::move(e));
      c->args.push_back(std::move(cond));
      c->args.push_back(std::move(other));
      e = std::move(c);
    }
    return e;
  }

  ExprPtr parse_or() {
    ExprPtr e = parse_and();
    while (is_name("or")) {
      const int line = next().line;
      e = make2(Expr::Kind::kOr, line, std::move(e), parse_and());
    }
    return e;
  }

  ExprPtr parse_and() {
    ExprPtr e = parse_not();
    while (is_name("and")) {
      const int line = next().line;
      e = make2(Expr::Kind::kAnd, line, std::move(e), parse_not());
    }
    return e;
  }

  ExprPtr parse_not() {
    const Deeper guard(this);
    if (is_name("not")) {
      ExprPtr e = make(Expr::Kind::kNot, next().line);
      e->args.push_back(parse_not());
      return e;
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    const int line = cur().line;
    ExprPtr first = parse_math1();
    ExprPtr cmp;
    while (true) {
      std::string op;
      if (cur().type == TokenType::kOperator &&
          (cur().value == "==" || cur().value == "!=" || cur().value == "<" ||
           cur().value == "<=" || cur().value == ">" || cur().value == ">=")) {
        op = next().value;
      } else if (skip_name("in")) {
        op = "in";
      } else if (is_name("not") && peek().type == TokenType::kName && peek().value == "in") {
        next();
        next();
        op = "notin";
      } else {
        break;
      }
      if (!cmp) {
        cmp = make(Expr::Kind::kCompare, line);
        cmp->args.push_back(std::move(first));
      }
      cmp->ops.push_back(op);
      cmp->args.push_back(parse_math1());
    }
    return cmp ? std::move(cmp) : std::move(first);
  }

  ExprPtr parse_math1() {
    ExprPtr e = parse_concat();
    while (is_op("+") || is_op("-")) {
      const Token& op = next();
      e = make2(Expr::Kind::kBinary, op.line, std::move(e), parse_concat(), op.value);
    }
    return e;
  }

  ExprPtr parse_concat() {
    ExprPtr e = parse_math2();
    while (is_op("~")) {
      const int line = next().line;
      e = make2(Expr::Kind::kBinary, line, std::move(e), parse_math2(), "~");
    }
    return e;
  }

  ExprPtr parse_math2() {
    ExprPtr e = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const Token& op = next();
      e = make2(Expr::Kind::kBinary, op.line, std::move(e), parse_pow(), op.value);
    }
    return e;
  }

  ExprPtr parse_pow() {
    ExprPtr e = parse_unary(true);
    while (is_op("**")) {
      const int line = next().line;
      e = make2(Expr::Kind::kBinary, line, std::move(e), parse_unary(true), "**");
    }
    return e;
  }

  ExprPtr parse_unary(bool with_filter) {
    const Deeper guard(this);
    ExprPtr e;
    if (is_op("-") || is_op("+")) {
      const Token& op = next();
      e = make(op.value == "-" ? Expr::Kind::kNeg : Expr::Kind::kPos, op.line);
      e->args.push_back(parse_unary(false));
    } else {
      e = parse_primary();
    }
    e = parse_postfix(std::move(e));
    if (with_filter) e = parse_filter_expr(std::move(e));
    return e;
  }

  ExprPtr parse_primary() {
    const Token& t = cur();
    ExprPtr e;
    switch (t.type) {
      case TokenType::kName:
        e = make(Expr::Kind::kConst, t.line);
        if (t.value == "true" || t.value == "True" || t.value == "false" || t.value == "False") {
          e->value = Value::boolean(t.value == "true" || t.value == "True");
        } else if (t.value == "none" || t.value == "None") {
          e->value = Value::none();
        } else {
          e->kind = Expr::Kind::kName;
          e->name = t.value;
        }
        next();
        return e;
      case TokenType::kString: {
        std::string s;
        while (cur().type == TokenType::kString) s += next().value;  // adjacent literals join
        e = make(Expr::Kind::kConst, t.line);
        e->value = Value::string(s);
        return e;
      }
      case TokenType::kInteger:
      case TokenType::kFloat:
        e = make(Expr::Kind::kConst, t.line);
        e->value =
            t.type == TokenType::kInteger ? Value::integer(t.integer) : Value::number(t.real);
        next();
        return e;
      case TokenType::kOperator:
        if (t.value == "(") {
          next();
          e = parse_tuple(true, false, true);
          expect_op(")");
          return e;
        }
        if (t.value == "[") return parse_list();
        if (t.value == "{") return parse_dict();
        break;
      default:
        break;
    }
    fail(str("unexpected ", describe(t)));
  }

  ExprPtr parse_list() {
    ExprPtr e = make(Expr::Kind::kList, next().line);
    while (!is_op("]")) {
      if (!e->args.empty()) expect_op(",");
      if (is_op("]")) break;
      e->args.push_back(parse_condexpr());
    }
    expect_op("]");
    return e;
  }

  ExprPtr parse_dict() {
    ExprPtr e = make(Expr::Kind::kDict, next().line);
    while (!is_op("}")) {
      if (!e->args.empty()) expect_op(",");
      if (is_op("}")) break;
      e->args.push_back(parse_condexpr());
      expect_op(":");
      e->args.push_back(parse_condexpr());
    }
    expect_op("}");
    return e;
  }

  ExprPtr parse_postfix(ExprPtr e) {
    while (true) {
      if (is_op(".") || is_op("[")) {
        e = parse_subscript(std::move(e));
      } else if (is_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_filter_expr(ExprPtr e) {
    while (true) {
      if (is_op("|")) {
        e = parse_filter(std::move(e));
      } else if (is_name("is")) {
        e = parse_test(std::move(e));
      } else if (is_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr obj) {
    const Token& t = next();
    if (t.value == ".") {
      const Token& attr = cur();
      if (attr.type == TokenType::kName) {
        next();
        ExprPtr e = make(Expr::Kind::kGetattr, t.line);
        e->name = attr.value;
        e->args.push_back(std::move(obj));
        return e;
      }
      if (attr.type != TokenType::kInteger) fail("expected a name or a number after '.'");
      next();
      ExprPtr key = make(Expr::Kind::kConst, attr.line);
      key->value = Value::integer(attr.integer);
      return make2(Expr::Kind::kGetitem, t.line, std::move(obj), std::move(key));
    }
    // [key] or [start:stop:step]
    ExprPtr parts[3];
    bool slice = false;
    int part = 0;
    while (!is_op("]")) {
      if (is_op(":")) {
        next();
        slice = true;
        if (++part > 2) fail("too many ':' in a slice");
        continue;
      }
      if (parts[part]) fail(str("unexpected ", describe(cur())));
      parts[part] = parse_tuple(true);
    }
    expect_op("]");
    if (!slice) {
      if (!parts[0]) fail("expected a subscript");
      return make2(Expr::Kind::kGetitem, t.line, std::move(obj), std::move(parts[0]));
    }
    ExprPtr e = make(Expr::Kind::kSlice, t.line);
    e->args.push_back(std::move(obj));
    for (ExprPtr& p : parts) e->args.push_back(std::move(p));
    return e;
  }

  void parse_call_args(Expr& e) {
    expect_op("(");
    const size_t base = e.args.size();  // the callee, or the filter's or test's subject
    while (!is_op(")")) {
      if (e.args.size() + e.kwargs.size() > base) {
        expect_op(",");
        if (is_op(")")) break;
      }
      if (is_op("*") || is_op("**")) fail("*args and **kwargs in calls are not supported");
      if (cur().type == TokenType::kName && peek().type == TokenType::kOperator &&
          peek().value == "=") {
        std::string key = next().value;
        next();
        e.kwargs.emplace_back(std::move(key), parse_condexpr());
      } else {
        if (!e.kwargs.empty()) fail("a positional argument follows a keyword argument");
        e.args.push_back(parse_condexpr());
      }
    }
    expect_op(")");
  }

  ExprPtr parse_call(ExprPtr callee) {
    ExprPtr e = make(Expr::Kind::kCall, cur().line);
    e->args.push_back(std::move(callee));
    parse_call_args(*e);
    return e;
  }

  // | name[.name...][(args)]
  ExprPtr parse_filter(ExprPtr subject) {
    const int line = next().line;  // |
    ExprPtr e = make(Expr::Kind::kFilter, line);
    e->name = expect_name();
    while (skip_op(".")) {
      e->name.push_back('.');
      e->name += expect_name();
    }
    if (!has_filter(e->name)) throw JinjaError(str("no filter named '", e->name, "'"), line);
    e->args.push_back(std::move(subject));
    if (is_op("(")) parse_call_args(*e);
    return e;
  }

  // is [not] name [arg | (args)]
  ExprPtr parse_test(ExprPtr subject) {
    const int line = next().line;  // is
    const bool negated = skip_name("not");
    ExprPtr e = make(Expr::Kind::kTest, line);
    e->name = expect_name();
    while (skip_op(".")) {
      e->name.push_back('.');
      e->name += expect_name();
    }
    if (!has_test(e->name)) throw JinjaError(str("no test named '", e->name, "'"), line);
    e->args.push_back(std::move(subject));
    const Token& t = cur();
    if (is_op("(")) {
      parse_call_args(*e);
    } else if ((t.type == TokenType::kName || t.type == TokenType::kString ||
                t.type == TokenType::kInteger || t.type == TokenType::kFloat ||
                (t.type == TokenType::kOperator && (t.value == "[" || t.value == "{"))) &&
               !is_name("else") && !is_name("or") && !is_name("and")) {
      if (is_name("is")) fail("tests cannot be chained with 'is'");
      e->args.push_back(parse_postfix(parse_primary()));
    }
    if (!negated) return e;
    ExprPtr n = make(Expr::Kind::kNot, line);
    n->args.push_back(std::move(e));
    return n;
  }

  const std::vector<Token>& t_;
  struct Deeper {
    explicit Deeper(Parser* p) : p(p) {
      if (++p->depth_ > kMaxDepth) p->fail(str("nested more than ", kMaxDepth, " levels deep"));
    }
    ~Deeper() { --p->depth_; }
    Parser* p;
  };

  size_t i_ = 0;
  int loop_depth_ = 0;
  int depth_ = 0;
};

}  // namespace

Body parse(const std::vector<Token>& tokens) {
  return Parser(tokens).parse_template();
}

}  // namespace forge::chat::jinja
