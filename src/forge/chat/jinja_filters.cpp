// jinja2's filters and tests (jinja2/filters.py, jinja2/tests.py) that chat templates use, with
// transformers' tojson in place of jinja2's (no HTML escaping, no key sorting, json.dumps'
// options). A template naming any other filter or test fails when it is parsed.
#include <algorithm>
#include <cmath>
#include <map>

#include "forge/chat/jinja_ast.h"
#include "forge/chat/jinja_builtins.h"
#include "forge/core/error.h"

namespace forge::chat::jinja {

namespace {

using FilterFn = Value (*)(const Value&, const Args&);
using TestFn = bool (*)(const Value&, const Args&);

const Value& arg_or(const Args& a, size_t i, const char* name, const Value& def) {
  const Value* v = find_arg(a, i, name);
  return v ? *v : def;
}

const Value* find_keyword(const Args& a, const char* name) {
  for (const auto& [k, v] : a.keyword)
    if (k == name) return &v;
  return nullptr;
}

Value need(const Args& a, size_t i, const char* name, const char* fn) {
  const Value* v = find_arg(a, i, name);
  if (v == nullptr) throw JinjaError(str(fn, "() is missing its argument '", name, "'"));
  return *v;
}

int64_t length_of(const Value& v) {
  using K = Value::Kind;
  switch (v.kind()) {
    case K::kUndefined:
      return 0;
    case K::kString:
      return static_cast<int64_t>(char_count(v.as_string().text()));
    case K::kList:
    case K::kTuple:
      return static_cast<int64_t>(v.as_list().size());
    case K::kDict:
      return static_cast<int64_t>(v.as_dict().items.size());
    default:
      throw JinjaError(str("object of type '", v.type_name(), "' has no len()"));
  }
}

// attribute="a.b.0": item lookups along the dotted path (jinja2's make_attrgetter).
Value attribute_path(const Value& v, const std::string& path) {
  Value cur = v;
  size_t b = 0;
  while (b <= path.size()) {
    const size_t e = std::min(path.find('.', b), path.size());
    const std::string part = path.substr(b, e - b);
    const bool digits = !part.empty() && std::all_of(part.begin(), part.end(), ::isdigit);
    cur = get_item(cur, digits ? Value::integer(std::stoll(part)) : Value::string(part));
    b = e + 1;
  }
  return cur;
}

// select/reject/selectattr/rejectattr: keep the items whose test (truthiness if none) agrees.
Value select_impl(const Value& seq, const Args& a, bool by_attr, bool keep) {
  size_t first_test_arg = 0;
  std::string attr;
  if (by_attr) {
    const Value name = need(a, 0, "attribute", by_attr ? "selectattr" : "select");
    attr = to_str(name).text();
    first_test_arg = 1;
  }
  const Value* test =
      first_test_arg < a.positional.size() ? &a.positional[first_test_arg] : nullptr;
  Args test_args;
  if (test != nullptr)
    test_args.positional.assign(
        a.positional.begin() + static_cast<std::ptrdiff_t>(first_test_arg) + 1, a.positional.end());
  const std::string test_name = test ? to_str(*test).text() : "";
  if (test && !has_test(test_name)) throw JinjaError(str("no test named '", test_name, "'"));
  List out;
  for (const Value& item : iterate(seq)) {
    const Value subject = by_attr ? attribute_path(item, attr) : item;
    const bool pass = test ? apply_test(test_name, subject, test_args) : truthy(subject);
    if (pass == keep) out.push_back(item);
  }
  return Value::list(std::move(out));
}

Value f_map(const Value& seq, const Args& a) {
  List out;
  if (const Value* attr = find_keyword(a, "attribute")) {
    const Value* def = find_keyword(a, "default");
    for (const Value& item : iterate(seq)) {
      Value v = attribute_path(item, to_str(*attr).text());
      out.push_back(v.is_undefined() && def ? *def : v);
    }
    return Value::list(std::move(out));
  }
  const Value name = need(a, 0, "filter", "map");
  const std::string filter = to_str(name).text();
  if (!has_filter(filter)) throw JinjaError(str("no filter named '", filter, "'"));
  Args rest;
  rest.positional.assign(a.positional.begin() + 1, a.positional.end());
  rest.keyword = a.keyword;
  for (const Value& item : iterate(seq)) out.push_back(apply_filter(filter, item, rest));
  return Value::list(std::move(out));
}

// Sort key for sort/unique/min/max: case-insensitive strings unless case_sensitive.
Value sort_key(const Value& item, const Args& a, size_t attr_pos) {
  const Value* attr = find_arg(a, attr_pos, "attribute");
  Value v = attr ? attribute_path(item, to_str(*attr).text()) : item;
  const Value* cs = find_arg(a, attr_pos - 1, "case_sensitive");
  if (v.is_string() && !(cs && truthy(*cs))) return Value::string(ascii_case(v.as_string(), false));
  return v;
}

Value f_sort(const Value& seq, const Args& a) {
  const Value* rev = find_arg(a, 0, "reverse");
  List items = iterate(seq);
  std::vector<std::pair<Value, Value>> keyed;
  for (const Value& v : items) keyed.emplace_back(sort_key(v, a, 2), v);
  const bool reverse = rev && truthy(*rev);  // ties keep their order either way, as in Python
  std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& x, const auto& y) {
    return reverse ? compare(y.first, x.first, "<") < 0 : compare(x.first, y.first, "<") < 0;
  });
  List out;
  for (auto& [k, v] : keyed) out.push_back(v);
  return Value::list(std::move(out));
}

Value f_minmax(const Value& seq, const Args& a, bool max) {
  const List items = iterate(seq);
  if (items.empty()) return Value::undefined("no min/max of an empty sequence");
  size_t best = 0;
  for (size_t i = 1; i < items.size(); ++i) {
    const int c = compare(sort_key(items[i], a, 1), sort_key(items[best], a, 1), "<");
    if (max ? c > 0 : c < 0) best = i;
  }
  return items[best];
}

Value f_default(const Value& v, const Args& a) {
  const Value* boolean = find_arg(a, 1, "boolean");
  if (v.is_undefined() || (boolean && truthy(*boolean) && !truthy(v)))
    return arg_or(a, 0, "default_value", Value::string(""));
  return v;
}

Value f_int(const Value& v, const Args& a) {
  const Value def = arg_or(a, 0, "default", Value::integer(0));
  const Value* base_arg = find_arg(a, 1, "base");
  const int base = base_arg && base_arg->is_int() ? static_cast<int>(base_arg->as_int()) : 10;
  if (v.is_int()) return Value::integer(v.as_int(), v.origin());
  if (v.kind() == Value::Kind::kFloat && std::isfinite(v.as_double()))
    return Value::integer(int_from_double(v.as_double()), v.origin());
  if (!v.is_string()) return def;
  std::string t = py_strip(v.as_string(), nullptr, true, true).text();
  if (base == 16 && (t.starts_with("0x") || t.starts_with("0X"))) t = t.substr(2);
  size_t used = 0;
  try {
    const long long x = std::stoll(t, &used, base);
    if (used == t.size() && !t.empty() && t.find('_') == std::string::npos)
      return Value::integer(x, v.origin());
  } catch (...) {
  }
  double d = 0;
  try {  // "42.23"|int is 42 (jinja2 falls back to int(float(value)))
    d = std::stod(t, &used);
  } catch (...) {
    return def;
  }
  // Outside the try: a number beyond int64 is an overflow error, not the default.
  if (used == t.size() && std::isfinite(d)) return Value::integer(int_from_double(d), v.origin());
  return def;
}

Value f_float(const Value& v, const Args& a) {
  const Value def = arg_or(a, 0, "default", Value::number(0.0));
  if (v.is_number()) return Value::number(v.as_double(), v.origin());
  if (!v.is_string()) return def;
  const std::string t = py_strip(v.as_string(), nullptr, true, true).text();
  try {
    size_t used = 0;
    const double d = std::stod(t, &used);
    if (used == t.size()) return Value::number(d, v.origin());
  } catch (...) {
  }
  return def;
}

Value f_round(const Value& v, const Args& a) {
  const Value* prec = find_arg(a, 0, "precision");
  const Value* method = find_arg(a, 1, "method");
  if (!v.is_number()) throw JinjaError(str("round needs a number, not '", v.type_name(), "'"));
  const double scale = std::pow(10.0, prec ? static_cast<double>(prec->as_int()) : 0.0);
  const std::string m = method ? to_str(*method).text() : "common";
  const double x = v.as_double() * scale;
  double r;
  if (m == "common") {
    r = std::nearbyint(x);  // Python's round(): halves to even
  } else if (m == "floor") {
    r = std::floor(x);
  } else if (m == "ceil") {
    r = std::ceil(x);
  } else {
    throw JinjaError("round method must be 'common', 'ceil' or 'floor'");
  }
  return Value::number(r / scale);
}

Value f_tojson(const Value& v, const Args& a) {
  JsonOptions opt;
  if (const Value* e = find_arg(a, 0, "ensure_ascii")) opt.ensure_ascii = truthy(*e);
  if (const Value* ind = find_arg(a, 1, "indent"); ind && !ind->is_none()) {
    if (ind->is_int()) {
      opt.indent = std::string(static_cast<size_t>(std::max<int64_t>(0, ind->as_int())), ' ');
    } else {
      opt.indent = to_str(*ind).text();
    }
    opt.item_separator.assign(1, ',');  // json.dumps: (',', ': ') once indent is set
  }
  if (const Value* sep = find_arg(a, 2, "separators"); sep && !sep->is_none()) {
    if (!sep->is_sequence() || sep->as_list().size() != 2)
      throw JinjaError("tojson separators must be a pair of strings");
    opt.item_separator = to_str(sep->as_list()[0]).text();
    opt.key_separator = to_str(sep->as_list()[1]).text();
  }
  if (const Value* sk = find_arg(a, 3, "sort_keys")) opt.sort_keys = truthy(*sk);
  return Value::string(to_json(v, opt), v.origin());
}

Value f_join(const Value& v, const Args& a) {
  const Value sep = arg_or(a, 0, "d", Value::string(""));
  const Value* attr = find_arg(a, 1, "attribute");
  TaintedString out;
  bool first = true;
  for (const Value& item : iterate(v)) {
    if (!first) out.append(to_str(sep));
    first = false;
    check_text_size(out.size());
    out.append(to_str(attr ? attribute_path(item, to_str(*attr).text()) : item));
  }
  return Value::string(out);
}

Value f_title(const Value& v, const Args&) {
  // jinja2's own word split: runs of "-", whitespace, "(", "{", "[", "<" separate words; each
  // word gets an upper first character and a lower rest.
  const TaintedString s = to_str(v);
  const std::string& t = s.text();
  TaintedString out;
  auto sep = [](char c) {
    return c == '-' || c == '(' || c == '{' || c == '[' || c == '<' ||
           std::isspace(static_cast<unsigned char>(c));
  };
  for (size_t i = 0; i < t.size();) {
    size_t j = i;
    const bool is_sep = sep(t[i]);
    while (j < t.size() && sep(t[j]) == is_sep) ++j;
    if (is_sep) {
      out.append(s.substr(i, j - i));
    } else {
      out.append(ascii_case(s.substr(i, 1), true));
      out.append(ascii_case(s.substr(i + 1, j - i - 1), false));
    }
    i = j;
  }
  return Value::string(out, v.origin());
}

Value f_indent(const Value& v, const Args& a) {
  const Value* w = find_arg(a, 0, "width");
  const Value* first = find_arg(a, 1, "first");
  const Value* blank = find_arg(a, 2, "blank");
  const std::string pad = w && w->is_string()
                              ? w->as_string().text()
                              : std::string(w ? static_cast<size_t>(w->as_int()) : 4, ' ');
  const TaintedString s = to_str(v);
  const Value newline = Value::string("\n");
  const List lines = py_split(Value::string(s), &newline, -1);
  TaintedString out;
  for (size_t i = 0; i < lines.size(); ++i) {
    const TaintedString& line = lines[i].as_string();
    if (i > 0) out.append("\n", kTemplate);
    if ((i > 0 || (first && truthy(*first))) && (!line.empty() || (blank && truthy(*blank))))
      out.append(pad, kTemplate);
    out.append(line);
  }
  return Value::string(out, v.origin());
}

const std::map<std::string, FilterFn>& filters() {
  static const std::map<std::string, FilterFn> m = {
      {"abs",
       [](const Value& v, const Args&) {
         if (v.kind() == Value::Kind::kFloat) return Value::number(std::fabs(v.as_double()));
         if (!v.is_int())
           throw JinjaError(str("bad operand type for abs(): '", v.type_name(), "'"));
         return Value::integer(v.as_int() < 0 ? int_sub(0, v.as_int()) : v.as_int());
       }},
      {"capitalize",
       [](const Value& v, const Args&) {
         return get_attr(Value::string(to_str(v)), "capitalize").as_callable().fn({});
       }},
      {"count", [](const Value& v, const Args&) { return Value::integer(length_of(v)); }},
      {"d", f_default},
      {"default", f_default},
      {"first",
       [](const Value& v, const Args&) {
         const List items = iterate(v);
         return items.empty() ? Value::undefined("no first item, sequence was empty")
                              : items.front();
       }},
      {"float", f_float},
      {"indent", f_indent},
      {"int", f_int},
      {"items",
       [](const Value& v, const Args&) {
         if (v.is_undefined()) return Value::list({});
         if (!v.is_dict()) throw JinjaError("can only get item pairs from a mapping");
         return get_attr(v, "items").as_callable().fn({});
       }},
      {"join", f_join},
      {"last",
       [](const Value& v, const Args&) {
         const List items = iterate(v);
         return items.empty() ? Value::undefined("no last item, sequence was empty") : items.back();
       }},
      {"length", [](const Value& v, const Args&) { return Value::integer(length_of(v)); }},
      {"list", [](const Value& v, const Args&) { return Value::list(iterate(v)); }},
      {"lower",
       [](const Value& v, const Args&) {
         return Value::string(ascii_case(to_str(v), false), v.origin());
       }},
      {"map", f_map},
      {"max", [](const Value& v, const Args& a) { return f_minmax(v, a, true); }},
      {"min", [](const Value& v, const Args& a) { return f_minmax(v, a, false); }},
      {"reject", [](const Value& v, const Args& a) { return select_impl(v, a, false, false); }},
      {"rejectattr", [](const Value& v, const Args& a) { return select_impl(v, a, true, false); }},
      {"replace",
       [](const Value& v, const Args& a) {
         const Value s = Value::string(to_str(v), v.origin());
         return get_attr(s, "replace").as_callable().fn(a);
       }},
      {"reverse",
       [](const Value& v, const Args&) {
         if (v.is_string()) return get_slice(v, Value::none(), Value::none(), Value::integer(-1));
         List items = iterate(v);
         std::reverse(items.begin(), items.end());
         return Value::list(std::move(items));
       }},
      {"round", f_round},
      {"safe", [](const Value& v, const Args&) { return v; }},
      {"select", [](const Value& v, const Args& a) { return select_impl(v, a, false, true); }},
      {"selectattr", [](const Value& v, const Args& a) { return select_impl(v, a, true, true); }},
      {"sort", f_sort},
      {"string", [](const Value& v, const Args&) { return Value::string(to_str(v), v.origin()); }},
      {"sum",
       [](const Value& v, const Args& a) {
         const Value* attr = find_arg(a, 0, "attribute");
         Value total = arg_or(a, 1, "start", Value::integer(0));
         for (const Value& item : iterate(v)) {
           const Value x = attr ? attribute_path(item, to_str(*attr).text()) : item;
           if (!x.is_number() || !total.is_number()) throw JinjaError("sum needs numbers");
           total = x.kind() == Value::Kind::kFloat || total.kind() == Value::Kind::kFloat
                       ? Value::number(total.as_double() + x.as_double())
                       : Value::integer(int_add(total.as_int(), x.as_int()));
         }
         return total;
       }},
      {"title", f_title},
      {"tojson", f_tojson},
      {"trim",
       [](const Value& v, const Args& a) {
         return Value::string(py_strip(to_str(v), find_arg(a, 0, "chars"), true, true), v.origin());
       }},
      {"unique",
       [](const Value& v, const Args& a) {
         List out, keys;
         for (const Value& item : iterate(v)) {
           const Value k = sort_key(item, a, 1);
           if (std::none_of(keys.begin(), keys.end(),
                            [&](const Value& x) { return equal(x, k); })) {
             keys.push_back(k);
             out.push_back(item);
           }
         }
         return Value::list(std::move(out));
       }},
      {"upper", [](const Value& v,
                   const Args&) { return Value::string(ascii_case(to_str(v), true), v.origin()); }},
  };
  return m;
}

bool contains(const Value& container, const Value& item) {
  using K = Value::Kind;
  switch (container.kind()) {
    case K::kUndefined:
      return false;
    case K::kString:
      if (!item.is_string())
        throw JinjaError(
            str("'in <string>' requires string as left operand, not ", item.type_name()));
      return container.as_string().text().find(item.as_string().text()) != std::string::npos;
    case K::kList:
    case K::kTuple:
      return std::any_of(container.as_list().begin(), container.as_list().end(),
                         [&](const Value& x) { return equal(x, item); });
    case K::kDict:
    case K::kNamespace:
      return item.is_string() && container.as_dict().find(item.as_string().text());
    default:
      throw JinjaError(str("argument of type '", container.type_name(), "' is not iterable"));
  }
}

bool t_compare(const Value& v, const Args& a, const char* op) {
  const Value other = need(a, 0, "other", op);
  if (std::string_view(op) == "==") return equal(v, other);
  if (std::string_view(op) == "!=") return !equal(v, other);
  const int c = compare(v, other, op);
  const std::string_view o = op;
  return o == "<" ? c < 0 : o == "<=" ? c <= 0 : o == ">" ? c > 0 : c >= 0;
}

const std::map<std::string, TestFn>& tests() {
  using K = Value::Kind;
  static const std::map<std::string, TestFn> m = {
      {"boolean", [](const Value& v, const Args&) { return v.kind() == K::kBool; }},
      {"callable", [](const Value& v, const Args&) { return v.kind() == K::kCallable; }},
      {"defined", [](const Value& v, const Args&) { return !v.is_undefined(); }},
      {"divisibleby",
       [](const Value& v, const Args& a) {
         const int64_t n = need(a, 0, "num", "divisibleby").as_int();
         if (n == 0) throw JinjaError("integer division or modulo by zero");
         return v.as_int() % n == 0;
       }},
      {"eq", [](const Value& v, const Args& a) { return t_compare(v, a, "=="); }},
      {"equalto", [](const Value& v, const Args& a) { return t_compare(v, a, "=="); }},
      {"==", [](const Value& v, const Args& a) { return t_compare(v, a, "=="); }},
      {"ne", [](const Value& v, const Args& a) { return t_compare(v, a, "!="); }},
      {"!=", [](const Value& v, const Args& a) { return t_compare(v, a, "!="); }},
      {"lt", [](const Value& v, const Args& a) { return t_compare(v, a, "<"); }},
      {"lessthan", [](const Value& v, const Args& a) { return t_compare(v, a, "<"); }},
      {"le", [](const Value& v, const Args& a) { return t_compare(v, a, "<="); }},
      {"gt", [](const Value& v, const Args& a) { return t_compare(v, a, ">"); }},
      {"greaterthan", [](const Value& v, const Args& a) { return t_compare(v, a, ">"); }},
      {"ge", [](const Value& v, const Args& a) { return t_compare(v, a, ">="); }},
      {"even", [](const Value& v, const Args&) { return v.is_int() && v.as_int() % 2 == 0; }},
      {"odd", [](const Value& v, const Args&) { return v.is_int() && v.as_int() % 2 != 0; }},
      {"false", [](const Value& v, const Args&) { return v.kind() == K::kBool && !v.as_bool(); }},
      {"true", [](const Value& v, const Args&) { return v.kind() == K::kBool && v.as_bool(); }},
      {"float", [](const Value& v, const Args&) { return v.kind() == K::kFloat; }},
      {"integer", [](const Value& v, const Args&) { return v.kind() == K::kInt; }},
      {"in", [](const Value& v, const Args& a) { return contains(need(a, 0, "seq", "in"), v); }},
      {"iterable",
       [](const Value& v, const Args&) {
         return v.is_undefined() || v.is_string() || v.is_sequence() || v.is_dict();
       }},
      {"lower",
       [](const Value& v, const Args&) {
         return v.is_string() && v.as_string().text() == ascii_case(v.as_string(), false).text() &&
                v.as_string().text() != ascii_case(v.as_string(), true).text();
       }},
      {"upper",
       [](const Value& v, const Args&) {
         return v.is_string() && v.as_string().text() == ascii_case(v.as_string(), true).text() &&
                v.as_string().text() != ascii_case(v.as_string(), false).text();
       }},
      {"mapping", [](const Value& v, const Args&) { return v.is_dict(); }},
      {"none", [](const Value& v, const Args&) { return v.is_none(); }},
      {"number", [](const Value& v, const Args&) { return v.is_number(); }},
      {"sameas",
       [](const Value& v, const Args& a) {
         const Value other = need(a, 0, "other", "sameas");
         if (v.kind() != other.kind()) return false;
         // Python's `is`: None and the booleans are singletons, containers are compared by
         // identity; small numbers and strings are interned in CPython, so equality stands in.
         if (v.is_sequence()) return &v.as_list() == &other.as_list();
         if (v.is_dict()) return &v.as_dict() == &other.as_dict();
         return equal(v, other);
       }},
      {"sequence",
       [](const Value& v, const Args&) {
         return v.is_undefined() || v.is_string() || v.is_sequence() || v.is_dict();
       }},
      {"string", [](const Value& v, const Args&) { return v.is_string(); }},
      {"undefined", [](const Value& v, const Args&) { return v.is_undefined(); }},
  };
  return m;
}

}  // namespace

bool has_filter(const std::string& name) {
  return filters().count(name) > 0;
}
bool has_test(const std::string& name) {
  return tests().count(name) > 0;
}

Value apply_filter(const std::string& name, const Value& subject, const Args& args) {
  const auto it = filters().find(name);
  if (it == filters().end()) throw JinjaError(str("no filter named '", name, "'"));
  // Filters see undefined as jinja2's Undefined does: empty for the string-like ones, an error
  // where Python would need its value.
  return it->second(subject, args);
}

bool apply_test(const std::string& name, const Value& subject, const Args& args) {
  const auto it = tests().find(name);
  if (it == tests().end()) throw JinjaError(str("no test named '", name, "'"));
  return it->second(subject, args);
}

bool value_in(const Value& item, const Value& container) {
  return contains(container, item);
}

}  // namespace forge::chat::jinja
