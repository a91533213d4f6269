// The interpreter: statements write to a TaintedString, expressions evaluate to Values.
//
// Scoping follows jinja2: a for loop's body runs in a fresh scope on every iteration (an
// assignment inside the loop is gone at the next iteration and after the loop, which is why
// templates use namespace()); if blocks share their enclosing scope.
#include <algorithm>
#include <cmath>
#include <unordered_map>

#include "forge/chat/jinja.h"
#include "forge/chat/jinja_builtins.h"
#include "forge/chat/jinja_lexer.h"
#include "forge/core/error.h"

namespace forge::chat::jinja {

namespace {

enum class Flow { kNormal, kBreak, kContinue };

int64_t floor_div(int64_t a, int64_t b) {
  if (b == -1) return int_sub(0, a);  // INT64_MIN / -1 overflows
  int64_t q = a / b;
  if (a % b != 0 && ((a < 0) != (b < 0))) --q;
  return q;
}

int64_t floor_mod(int64_t a, int64_t b) {
  if (b == -1) return 0;  // INT64_MIN % -1 is undefined in C++
  int64_t r = a % b;
  if (r != 0 && ((r < 0) != (b < 0))) r += b;
  return r;
}

double float_mod(double a, double b) {
  double r = std::fmod(a, b);
  if (r != 0 && ((r < 0) != (b < 0))) r += b;
  return r;
}

[[noreturn]] void bad_operands(const std::string& op, const Value& a, const Value& b) {
  require_defined(a);
  require_defined(b);
  if (op == "+" && a.is_string())
    throw JinjaError(str("can only concatenate str (not \"", b.type_name(), "\") to str"));
  throw JinjaError(str("unsupported operand type(s) for ", op, ": '", a.type_name(), "' and '",
                       b.type_name(), "'"));
}

Value arithmetic(const std::string& op, const Value& a, const Value& b) {
  if (op == "~") {
    TaintedString s = to_str(a);
    const TaintedString t = to_str(b);
    check_text_size(s.size() + t.size());
    s.append(t);
    return Value::string(s);
  }
  const bool nums = a.is_number() && b.is_number();
  const bool ints = a.is_int() && b.is_int();
  if (op == "+") {
    if (ints) return Value::integer(int_add(a.as_int(), b.as_int()));
    if (nums) return Value::number(a.as_double() + b.as_double());
    if (a.is_string() && b.is_string()) {
      check_text_size(a.as_string().size() + b.as_string().size());
      TaintedString s = a.as_string();
      s.append(b.as_string());
      return Value::string(s, a.origin());
    }
    if (a.is_sequence() && a.kind() == b.kind()) {
      if (a.as_list().size() + b.as_list().size() > kMaxItems) throw JinjaError("list too long");
      List items = a.as_list();
      items.insert(items.end(), b.as_list().begin(), b.as_list().end());
      return a.kind() == Value::Kind::kTuple ? Value::tuple(std::move(items))
                                             : Value::list(std::move(items));
    }
    bad_operands(op, a, b);
  }
  if (op == "*") {
    if (ints) return Value::integer(int_mul(a.as_int(), b.as_int()));
    if (nums) return Value::number(a.as_double() * b.as_double());
    const Value& seq = a.is_int() ? b : a;
    const Value& n = a.is_int() ? a : b;
    if (n.is_int() && (seq.is_string() || seq.is_sequence())) {
      const int64_t times = std::max<int64_t>(0, n.as_int());
      const size_t unit = seq.is_string() ? seq.as_string().size() : seq.as_list().size();
      if (unit > 0 &&
          static_cast<uint64_t>(times) > (seq.is_string() ? kMaxText : kMaxItems) / unit)
        throw JinjaError(seq.is_string() ? "repeated string too long" : "repeated list too long");
      if (seq.is_string()) {
        TaintedString s;
        // unit == 0 ("" * 2**63 - 1): the bound above does not apply, and the result is empty.
        for (int64_t i = 0; unit > 0 && i < times; ++i) s.append(seq.as_string());
        return Value::string(s, seq.origin());
      }
      List items;
      for (int64_t i = 0; unit > 0 && i < times; ++i)
        items.insert(items.end(), seq.as_list().begin(), seq.as_list().end());
      return Value::list(std::move(items));
    }
    bad_operands(op, a, b);
  }
  if (!nums) {
    if (op == "%" && a.is_string()) throw JinjaError("string formatting with '%' is not supported");
    bad_operands(op, a, b);
  }
  if (op == "-")
    return ints ? Value::integer(int_sub(a.as_int(), b.as_int()))
                : Value::number(a.as_double() - b.as_double());
  if (op == "**") {
    if (ints && b.as_int() >= 0) {  // by squaring; wraps where Python would grow a big int
      uint64_t r = 1, base = static_cast<uint64_t>(a.as_int());
      for (uint64_t e = static_cast<uint64_t>(b.as_int()); e > 0; e >>= 1, base *= base)
        if (e & 1) r *= base;
      return Value::integer(static_cast<int64_t>(r));
    }
    return Value::number(std::pow(a.as_double(), b.as_double()));
  }
  if (b.as_double() == 0)
    throw JinjaError(op == "/" ? "division by zero"
                     : ints    ? "integer division or modulo by zero"
                               : "float modulo");
  if (op == "/") return Value::number(a.as_double() / b.as_double());
  if (op == "//")
    return ints ? Value::integer(floor_div(a.as_int(), b.as_int()))
                : Value::number(std::floor(a.as_double() / b.as_double()));
  if (op == "%")
    return ints ? Value::integer(floor_mod(a.as_int(), b.as_int()))
                : Value::number(float_mod(a.as_double(), b.as_double()));
  throw JinjaError(str("unknown operator ", op));
}

class Evaluator {
 public:
  explicit Evaluator(const RenderInput& in) {
    frames_.emplace_back();
    for (auto& [k, v] : make_globals(in.now)) frames_[0][k] = v;
    for (const auto& [k, v] : in.variables) frames_[0][k] = v;
    frames_.emplace_back();  // the template's own assignments
  }
  // Namespaces are the only values a template can change, so `{% set ns.me = [ns] %}` makes one
  // hold itself: a cycle of shared_ptrs that outlived the render (LeakSanitizer, on the test of
  // runaway nesting). Every cycle passes through an attribute set (any other reference points
  // to an older value), and nothing of a render outlives it but text: emptying the namespaces
  // assigned into when the render ends, thrown or not, frees them all.
  ~Evaluator() {
    for (auto& [dict, ns] : assigned_namespaces_) ns.namespace_dict().items.clear();
  }
  Evaluator(const Evaluator&) = delete;
  Evaluator& operator=(const Evaluator&) = delete;

  Flow exec(const Body& body, TaintedString& out) {
    for (const Node& n : body) {
      Flow f;
      try {
        f = exec_node(n, out);
      } catch (const JinjaError& e) {
        if (e.line() == 0) throw JinjaError(e.message(), n.line);
        throw;
      }
      if (f != Flow::kNormal) return f;
    }
    return Flow::kNormal;
  }

 private:
  using Frame = std::unordered_map<std::string, Value>;

  Value lookup(const std::string& name) const {
    for (auto it = frames_.rbegin(); it != frames_.rend(); ++it)
      if (const auto f = it->find(name); f != it->end()) return f->second;
    return Value::undefined(str("'", name, "' is undefined"));
  }

  void bind(const std::vector<std::string>& targets, const Value& v, Frame& frame) {
    if (targets.size() == 1) {
      frame[targets[0]] = v;
      return;
    }
    const List items = v.is_string() ? iterate(v) : v.is_sequence() ? v.as_list() : List{};
    if (!v.is_string() && !v.is_sequence())
      throw JinjaError(str("cannot unpack non-iterable ", v.type_name(), " object"));
    if (items.size() != targets.size())
      throw JinjaError(items.size() < targets.size()
                           ? str("not enough values to unpack (expected ", targets.size(), ", got ",
                                 items.size(), ")")
                           : str("too many values to unpack (expected ", targets.size(), ")"));
    for (size_t i = 0; i < targets.size(); ++i) frame[targets[i]] = items[i];
  }

  Flow exec_node(const Node& n, TaintedString& out) {
    switch (n.kind) {
      case Node::Kind::kText:
        check_text_size(out.size() + n.text.size());
        out.append(n.text, kTemplate);
        return Flow::kNormal;
      case Node::Kind::kPrint: {
        const TaintedString s = to_str(eval(*n.expr));
        check_text_size(out.size() + s.size());
        out.append(s);
        return Flow::kNormal;
      }
      case Node::Kind::kIf:
        for (const auto& [test, body] : n.branches)
          if (truthy(eval(*test))) return exec(body, out);
        return exec(n.else_body, out);
      case Node::Kind::kFor:
        return exec_for(n, out);
      case Node::Kind::kSet: {
        const Value v = eval(*n.expr);
        if (!n.attr.empty()) {
          const Value ns = lookup(n.targets[0]);
          if (ns.kind() != Value::Kind::kNamespace)
            throw JinjaError(
                str("cannot assign attribute on non-namespace object '", n.targets[0], "'"));
          ns.namespace_dict().set(TaintedString(n.attr, kTemplate), v);
          assigned_namespaces_.emplace(&ns.namespace_dict(), ns);
        } else {
          bind(n.targets, v, frames_.back());
        }
        return Flow::kNormal;
      }
      case Node::Kind::kSetBlock: {
        TaintedString captured;
        exec(n.body, captured);
        frames_.back()[n.targets[0]] = Value::string(captured);
        return Flow::kNormal;
      }
      case Node::Kind::kBreak:
        return Flow::kBreak;
      case Node::Kind::kContinue:
        return Flow::kContinue;
      case Node::Kind::kBlock:
        return exec(n.body, out);
    }
    return Flow::kNormal;
  }

  Flow exec_for(const Node& n, TaintedString& out) {
    const Value seq = eval(*n.expr);
    if (seq.is_none()) throw JinjaError("'NoneType' object is not iterable");
    List items = iterate(seq);
    if (n.filter) {
      List kept;
      for (const Value& item : items) {
        frames_.emplace_back();
        bind(n.targets, item, frames_.back());
        const bool keep = truthy(eval(*n.filter));
        frames_.pop_back();
        if (keep) kept.push_back(item);
      }
      items = std::move(kept);
    }
    const int64_t count = static_cast<int64_t>(items.size());
    Loop loop(items);
    for (int64_t i = 0; i < count; ++i) {
      if (++iterations_ > kMaxLoopIterations)
        throw JinjaError(
            str("more than ", kMaxLoopIterations, " loop iterations: a runaway template?"));
      frames_.emplace_back();
      bind(n.targets, items[static_cast<size_t>(i)], frames_.back());
      frames_.back()["loop"] = loop.at(i);
      Flow f;
      try {
        f = exec(n.body, out);
      } catch (...) {
        frames_.pop_back();
        throw;
      }
      frames_.pop_back();
      if (f == Flow::kBreak) break;
    }
    if (count == 0) return exec(n.else_body, out);
    return Flow::kNormal;
  }

  // jinja2's `loop`: one object per loop whose fields advance with each iteration (as jinja2's
  // LoopContext does), so an iteration costs a few assignments, not a new object.
  class Loop {
   public:
    explicit Loop(const List& items) : items_(items), index_(std::make_shared<int64_t>(0)) {
      Dict d;
      for (const char* k : kFields) d.items.emplace_back(TaintedString(k, kTemplate), Value());
      d.items.emplace_back(TaintedString("cycle", kTemplate),
                           Value::callable("loop.cycle", [index = index_](const Args& a) {
                             if (a.positional.empty())
                               throw JinjaError("no items for cycling given");
                             return a.positional[static_cast<size_t>(*index) % a.positional.size()];
                           }));
      value_ = Value::ns(std::move(d));
    }
    const Value& at(int64_t i) {
      const int64_t n = static_cast<int64_t>(items_.size());
      *index_ = i;
      const Value fields[] = {Value::integer(i + 1),
                              Value::integer(i),
                              Value::integer(n - i),
                              Value::integer(n - i - 1),
                              Value::boolean(i == 0),
                              Value::boolean(i == n - 1),
                              Value::integer(n),
                              Value::integer(1),
                              Value::integer(0),
                              i > 0 ? items_[static_cast<size_t>(i - 1)]
                                    : Value::undefined("there is no previous item"),
                              i + 1 < n ? items_[static_cast<size_t>(i + 1)]
                                        : Value::undefined("there is no next item")};
      auto& slots = value_.namespace_dict().items;
      for (size_t k = 0; k < std::size(fields); ++k) slots[k].second = fields[k];
      return value_;
    }

   private:
    static constexpr const char* kFields[] = {"index",  "index0",   "revindex", "revindex0",
                                              "first",  "last",     "length",   "depth",
                                              "depth0", "previtem", "nextitem"};
    const List& items_;
    std::shared_ptr<int64_t> index_;
    Value value_;
  };

  Args eval_args(const Expr& e) {
    Args a;
    for (size_t i = 1; i < e.args.size(); ++i) a.positional.push_back(eval(*e.args[i]));
    for (const auto& [k, v] : e.kwargs) a.keyword.emplace_back(k, eval(*v));
    return a;
  }

 public:
  Value eval(const Expr& e) {
    try {
      return eval_inner(e);
    } catch (const JinjaError& err) {
      if (err.line() == 0) throw JinjaError(err.message(), e.line);
      throw;
    }
  }

 private:
  Value eval_inner(const Expr& e) {
    using K = Expr::Kind;
    switch (e.kind) {
      case K::kConst:
        return e.value;
      case K::kName:
        return lookup(e.name);
      case K::kGetattr:
        return get_attr(eval(*e.args[0]), e.name);
      case K::kGetitem: {
        const Value obj = eval(*e.args[0]);
        return get_item(obj, eval(*e.args[1]));
      }
      case K::kSlice: {
        const Value obj = eval(*e.args[0]);
        Value parts[3];
        for (int i = 0; i < 3; ++i) parts[i] = e.args[i + 1] ? eval(*e.args[i + 1]) : Value::none();
        return get_slice(obj, parts[0], parts[1], parts[2]);
      }
      case K::kCall: {
        const Value fn = eval(*e.args[0]);
        require_defined(fn);
        if (fn.kind() != Value::Kind::kCallable)
          throw JinjaError(str("'", fn.type_name(), "' object is not callable"));
        return fn.as_callable().fn(eval_args(e));
      }
      case K::kFilter: {
        const Value subject = eval(*e.args[0]);
        return apply_filter(e.name, subject, eval_args(e));
      }
      case K::kTest: {
        const Value subject = eval(*e.args[0]);
        return Value::boolean(apply_test(e.name, subject, eval_args(e)));
      }
      case K::kNeg:
      case K::kPos: {
        const Value v = eval(*e.args[0]);
        require_defined(v);
        if (!v.is_number())
          throw JinjaError(str("bad operand type for unary ", e.kind == K::kNeg ? "-" : "+", ": '",
                               v.type_name(), "'"));
        if (e.kind == K::kPos)
          return v.kind() == Value::Kind::kBool ? Value::integer(v.as_int()) : v;
        return v.kind() == Value::Kind::kFloat ? Value::number(-v.as_double())
                                               : Value::integer(int_sub(0, v.as_int()));
      }
      case K::kNot:
        return Value::boolean(!truthy(eval(*e.args[0])));
      case K::kAnd: {
        Value a = eval(*e.args[0]);
        return truthy(a) ? eval(*e.args[1]) : a;
      }
      case K::kOr: {
        Value a = eval(*e.args[0]);
        return truthy(a) ? a : eval(*e.args[1]);
      }
      case K::kBinary: {
        const Value a = eval(*e.args[0]);
        const Value b = eval(*e.args[1]);
        return arithmetic(e.name, a, b);
      }
      case K::kCompare: {
        Value left = eval(*e.args[0]);
        for (size_t i = 0; i < e.ops.size(); ++i) {
          Value right = eval(*e.args[i + 1]);
          const std::string& op = e.ops[i];
          bool ok;
          if (op == "==") {
            ok = equal(left, right);
          } else if (op == "!=") {
            ok = !equal(left, right);
          } else if (op == "in" || op == "notin") {
            ok = value_in(left, right) == (op == "in");
          } else {
            const int c = compare(left, right, op.c_str());
            ok = op == "<" ? c < 0 : op == "<=" ? c <= 0 : op == ">" ? c > 0 : c >= 0;
          }
          if (!ok) return Value::boolean(false);
          left = std::move(right);
        }
        return Value::boolean(true);
      }
      case K::kCond:
        if (truthy(eval(*e.args[1]))) return eval(*e.args[0]);
        if (e.args[2]) return eval(*e.args[2]);
        return Value::undefined("the inline if-expression evaluated to false and has no else");
      case K::kList:
      case K::kTuple: {
        List items;
        for (const ExprPtr& x : e.args) items.push_back(eval(*x));
        return e.kind == K::kList ? Value::list(std::move(items)) : Value::tuple(std::move(items));
      }
      case K::kDict: {
        Dict d;
        for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
          const Value k = eval(*e.args[i]);
          if (!k.is_string())
            throw JinjaError(str("dict keys must be strings, not '", k.type_name(), "'"));
          d.set(k.as_string(), eval(*e.args[i + 1]));
        }
        return Value::dict(std::move(d));
      }
    }
    return Value();
  }

  std::vector<Frame> frames_;
  std::unordered_map<const Dict*, Value> assigned_namespaces_;  // held until the render ends
  int64_t iterations_ = 0;
};

std::string located(const std::string& name, const JinjaError& e) {
  return e.line() > 0 ? str(name, " line ", e.line(), ": ", e.message())
                      : str(name, ": ", e.message());
}

}  // namespace

Template Template::parse(std::string_view source, std::string name) {
  Template t;
  t.name_ = std::move(name);
  try {
    t.body_ = std::make_shared<const Body>(jinja::parse(lex(source)));
  } catch (const JinjaError& e) {
    throw Error(located(t.name_, e));
  }
  return t;
}

TaintedString Template::render(const RenderInput& input) const {
  TaintedString out;
  try {
    Evaluator(input).exec(*body_, out);
  } catch (const JinjaError& e) {
    throw Error(located(name_, e));
  }
  return out;
}

Value from_json(const nlohmann::ordered_json& j, int32_t origin) {
  using T = nlohmann::ordered_json::value_t;
  switch (j.type()) {
    case T::null:
      return Value::none(origin);
    case T::boolean:
      return Value::boolean(j.get<bool>(), origin);
    case T::number_integer:
      return Value::integer(j.get<int64_t>(), origin);
    case T::number_unsigned: {
      const uint64_t u = j.get<uint64_t>();
      return u <= static_cast<uint64_t>(INT64_MAX) ? Value::integer(static_cast<int64_t>(u), origin)
                                                   : Value::number(static_cast<double>(u), origin);
    }
    case T::number_float:
      return Value::number(j.get<double>(), origin);
    case T::string:
      return Value::string(j.get_ref<const std::string&>(), origin);
    case T::array: {
      List items;
      for (const auto& x : j) items.push_back(from_json(x, origin));
      return Value::list(std::move(items), origin);
    }
    case T::object: {
      Dict d;
      for (const auto& [k, v] : j.items())
        d.items.emplace_back(TaintedString(k, origin), from_json(v, origin));
      return Value::dict(std::move(d), origin);
    }
    default:
      return Value::none(origin);
  }
}

}  // namespace forge::chat::jinja
