#include "forge/chat/jinja_value.h"

#include <charconv>
#include <cmath>
#include <cstdio>

#include "forge/core/error.h"
#include "forge/tokenizer/utf8.h"

namespace forge::chat::jinja {

const Value* Dict::find(std::string_view key) const {
  for (const auto& [k, v] : items)
    if (k.text() == key) return &v;
  return nullptr;
}

void Dict::set(const TaintedString& key, Value v) {
  for (auto& [k, old] : items)
    if (k.text() == key.text()) {
      old = std::move(v);
      return;
    }
  items.emplace_back(key, std::move(v));
}

Value Value::undefined(std::string hint) {
  Value v;
  v.s_ = std::make_shared<const TaintedString>(hint, kTemplate);
  return v;
}

Value Value::none(int32_t origin) {
  Value v;
  v.kind_ = Kind::kNone;
  v.origin_ = origin;
  return v;
}

Value Value::boolean(bool b, int32_t origin) {
  Value v;
  v.kind_ = Kind::kBool;
  v.i_ = b ? 1 : 0;
  v.origin_ = origin;
  return v;
}

Value Value::integer(int64_t i, int32_t origin) {
  Value v;
  v.kind_ = Kind::kInt;
  v.i_ = i;
  v.origin_ = origin;
  return v;
}

Value Value::number(double f, int32_t origin) {
  Value v;
  v.kind_ = Kind::kFloat;
  v.f_ = f;
  v.origin_ = origin;
  return v;
}

Value Value::string(TaintedString s, int32_t origin) {
  Value v;
  v.kind_ = Kind::kString;
  v.origin_ = s.empty() ? origin : s.origin_at(0);
  v.s_ = std::make_shared<const TaintedString>(std::move(s));
  return v;
}

Value Value::string(std::string_view s, int32_t origin) {
  return string(TaintedString(s, origin), origin);
}

Value Value::list(List items, int32_t origin) {
  Value v;
  v.kind_ = Kind::kList;
  v.origin_ = origin;
  v.list_ = std::make_shared<const List>(std::move(items));
  return v;
}

Value Value::tuple(List items, int32_t origin) {
  Value v = list(std::move(items), origin);
  v.kind_ = Kind::kTuple;
  return v;
}

Value Value::dict(Dict d, int32_t origin) {
  Value v;
  v.kind_ = Kind::kDict;
  v.origin_ = origin;
  v.dict_ = std::make_shared<Dict>(std::move(d));
  return v;
}

Value Value::ns(Dict d) {
  Value v = dict(std::move(d));
  v.kind_ = Kind::kNamespace;
  return v;
}

Value Value::callable(std::string name, std::function<Value(const Args&)> fn) {
  Value v;
  v.kind_ = Kind::kCallable;
  v.fn_ = std::make_shared<const Callable>(Callable{std::move(name), std::move(fn)});
  return v;
}

std::string Value::type_name() const {
  switch (kind_) {
    case Kind::kUndefined:
      return "Undefined";
    case Kind::kNone:
      return "NoneType";
    case Kind::kBool:
      return "bool";
    case Kind::kInt:
      return "int";
    case Kind::kFloat:
      return "float";
    case Kind::kString:
      return "str";
    case Kind::kList:
      return "list";
    case Kind::kTuple:
      return "tuple";
    case Kind::kDict:
      return "dict";
    case Kind::kNamespace:
      return "Namespace";
    case Kind::kCallable:
      return "function";
  }
  return "?";
}

void check_text_size(size_t bytes) {
  if (bytes > kMaxText)
    throw JinjaError(str("text longer than ", kMaxText >> 20, " MiB: a runaway template?"));
}

void require_defined(const Value& v) {
  if (v.is_undefined()) throw JinjaError(v.undefined_hint());
}

bool truthy(const Value& v) {
  using K = Value::Kind;
  switch (v.kind()) {
    case K::kUndefined:
    case K::kNone:
      return false;
    case K::kBool:
    case K::kInt:
      return v.as_int() != 0;
    case K::kFloat:
      return v.as_double() != 0.0;
    case K::kString:
      return !v.as_string().empty();
    case K::kList:
    case K::kTuple:
      return !v.as_list().empty();
    case K::kDict:
      return !v.as_dict().items.empty();
    case K::kNamespace:
    case K::kCallable:
      return true;
  }
  return false;
}

namespace {

// Values can nest without end (a namespace holding itself); walking one is refused past this.
constexpr int kMaxNesting = 100;

void check_nesting(int depth) {
  if (depth > kMaxNesting)
    throw JinjaError(str("value nested more than ", kMaxNesting, " levels deep"));
}

bool equal_at(const Value& a, const Value& b, int depth);

}  // namespace

bool equal(const Value& a, const Value& b) {
  return equal_at(a, b, 0);
}

namespace {

bool equal_at(const Value& a, const Value& b, int depth) {
  check_nesting(depth);
  using K = Value::Kind;
  if (a.is_number() && b.is_number()) {
    if (a.kind() == K::kFloat || b.kind() == K::kFloat) return a.as_double() == b.as_double();
    return a.as_int() == b.as_int();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case K::kUndefined:
    case K::kNone:
      return true;
    case K::kString:
      return a.as_string().text() == b.as_string().text();
    case K::kList:
    case K::kTuple: {
      const List &x = a.as_list(), &y = b.as_list();
      if (x.size() != y.size()) return false;
      for (size_t i = 0; i < x.size(); ++i)
        if (!equal_at(x[i], y[i], depth + 1)) return false;
      return true;
    }
    case K::kDict: {
      const Dict &x = a.as_dict(), &y = b.as_dict();
      if (x.items.size() != y.items.size()) return false;
      for (const auto& [k, v] : x.items) {
        const Value* w = y.find(k.text());
        if (w == nullptr || !equal_at(v, *w, depth + 1)) return false;
      }
      return true;
    }
    case K::kNamespace:
      return &a.namespace_dict() == &b.namespace_dict();
    case K::kCallable:
      return &a.as_callable() == &b.as_callable();
    default:
      return false;
  }
}

}  // namespace

int compare(const Value& a, const Value& b, const char* op) {
  if (a.is_number() && b.is_number()) {
    if (a.kind() == Value::Kind::kFloat || b.kind() == Value::Kind::kFloat) {
      const double x = a.as_double(), y = b.as_double();
      return x < y ? -1 : x > y ? 1 : 0;
    }
    return a.as_int() < b.as_int() ? -1 : a.as_int() > b.as_int() ? 1 : 0;
  }
  if (a.is_string() && b.is_string()) {
    // UTF-8 byte order is code point order, which is how Python compares strings.
    const int c = a.as_string().text().compare(b.as_string().text());
    return c < 0 ? -1 : c > 0 ? 1 : 0;
  }
  if (a.is_sequence() && b.kind() == a.kind()) {
    const List &x = a.as_list(), &y = b.as_list();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i)
      if (!equal(x[i], y[i])) return compare(x[i], y[i], op);
    return x.size() < y.size() ? -1 : x.size() > y.size() ? 1 : 0;
  }
  require_defined(a);
  require_defined(b);
  throw JinjaError(str("'", op, "' not supported between instances of '", a.type_name(), "' and '",
                       b.type_name(), "'"));
}

std::string float_repr(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x < 0 ? "-inf" : "inf";
  // Shortest round-trip digits, then Python's choice of notation: fixed for decimal exponents
  // in [-4, 16), scientific with a two-digit exponent otherwise.
  char buf[64];
  const auto res = std::to_chars(buf, buf + sizeof(buf), x, std::chars_format::scientific);
  std::string s(buf, res.ptr);
  std::string sign;
  if (s[0] == '-') {
    sign = "-";
    s.erase(0, 1);
  }
  const size_t e = s.find('e');
  std::string digits = s.substr(0, e);
  const int exp = std::stoi(s.substr(e + 1));
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  if (exp >= -4 && exp < 16) {
    std::string out;
    if (exp < 0) {
      out = "0." + std::string(static_cast<size_t>(-exp - 1), '0') + digits;
    } else if (static_cast<int>(digits.size()) <= exp + 1) {
      out = digits + std::string(static_cast<size_t>(exp + 1) - digits.size(), '0') + ".0";
    } else {
      out = digits.substr(0, static_cast<size_t>(exp + 1)) + "." +
            digits.substr(static_cast<size_t>(exp + 1));
    }
    return sign + out;
  }
  std::string mant = digits.substr(0, 1);
  if (digits.size() > 1) mant += "." + digits.substr(1);
  char ebuf[16];
  std::snprintf(ebuf, sizeof(ebuf), "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
  return sign + mant + ebuf;
}

uint32_t decode_char(std::string_view s, size_t i, size_t* len) {
  const size_t n = tok::utf8_char_len(s, i);
  if (n == 0) {  // not UTF-8: one byte stands for itself
    *len = 1;
    return static_cast<unsigned char>(s[i]);
  }
  *len = n;
  const auto c = static_cast<unsigned char>(s[i]);
  uint32_t cp = n == 1 ? c : c & (0x7F >> n);
  for (size_t k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
  return cp;
}

std::vector<size_t> char_starts(std::string_view s) {
  std::vector<size_t> out;
  out.reserve(s.size() + 1);
  for (size_t i = 0; i < s.size();) {
    out.push_back(i);
    size_t len;
    decode_char(s, i, &len);
    i += len;
  }
  out.push_back(s.size());
  return out;
}

size_t char_count(std::string_view s) {
  return char_starts(s).size() - 1;
}

bool py_isspace(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 ||
         cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 ||
         cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

namespace {

// What Python's repr escapes: controls, and (approximately; Python consults the full Unicode
// database) the separators, format characters and private-use code points it deems unprintable.
bool py_printable(uint32_t cp) {
  if (cp < 0x20 || (cp >= 0x7F && cp <= 0xA0) || cp == 0xAD) return false;
  if (cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200F) || (cp >= 0x2028 && cp <= 0x202F))
    return false;
  if ((cp >= 0x205F && cp <= 0x206F) || cp == 0x3000 || cp == 0xFEFF) return false;
  if ((cp >= 0xE000 && cp <= 0xF8FF) || (cp >= 0xFFF0 && cp <= 0xFFFB)) return false;
  return true;
}

void repr_string(const TaintedString& s, int32_t quote_origin, TaintedString& out) {
  const std::string& t = s.text();
  const bool has_single = t.find('\'') != std::string::npos;
  const bool has_double = t.find('"') != std::string::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  out.append(std::string_view(&quote, 1), quote_origin);
  for (size_t i = 0; i < t.size();) {
    size_t len;
    const uint32_t cp = decode_char(t, i, &len);
    const int32_t origin = s.origin_at(i);
    char buf[16];
    if (cp == static_cast<uint32_t>(quote) || cp == '\\') {
      buf[0] = '\\';
      buf[1] = static_cast<char>(cp);
      out.append(std::string_view(buf, 2), origin);
    } else if (cp == '\n' || cp == '\r' || cp == '\t') {
      out.append(cp == '\n' ? "\\n" : cp == '\r' ? "\\r" : "\\t", origin);
    } else if (!py_printable(cp)) {
      std::snprintf(buf, sizeof(buf),
                    cp < 0x100     ? "\\x%02x"
                    : cp < 0x10000 ? "\\u%04x"
                                   : "\\U%08x",
                    cp);
      out.append(buf, origin);
    } else {
      out.append(std::string_view(t).substr(i, len), origin);
    }
    i += len;
  }
  out.append(std::string_view(&quote, 1), quote_origin);
}

void print_value(const Value& v, bool repr, TaintedString& out, int depth = 0) {
  check_nesting(depth);
  using K = Value::Kind;
  const int32_t o = v.origin();
  switch (v.kind()) {
    case K::kUndefined:
      return;
    case K::kNone:
      out.append("None", o);
      return;
    case K::kBool:
      out.append(v.as_bool() ? "True" : "False", o);
      return;
    case K::kInt:
      out.append(std::to_string(v.as_int()), o);
      return;
    case K::kFloat:
      out.append(float_repr(v.as_double()), o);
      return;
    case K::kString:
      if (repr) {
        repr_string(v.as_string(), o, out);
      } else {
        out.append(v.as_string());
      }
      return;
    case K::kList:
    case K::kTuple: {
      const bool tuple = v.kind() == K::kTuple;
      out.append(tuple ? "(" : "[", o);
      const List& items = v.as_list();
      for (size_t i = 0; i < items.size(); ++i) {
        if (i > 0) out.append(", ", o);
        print_value(items[i], true, out, depth + 1);
      }
      if (tuple && items.size() == 1) out.append(",", o);
      out.append(tuple ? ")" : "]", o);
      return;
    }
    case K::kDict:
    case K::kNamespace: {
      const bool ns = v.kind() == K::kNamespace;
      out.append(ns ? "<Namespace {" : "{", o);
      bool first = true;
      for (const auto& [k, item] : v.as_dict().items) {
        if (!first) out.append(", ", o);
        first = false;
        repr_string(k, o, out);
        out.append(": ", o);
        print_value(item, true, out, depth + 1);
      }
      out.append(ns ? "}>" : "}", o);
      return;
    }
    case K::kCallable:
      out.append("<function " + v.as_callable().name + ">", o);
      return;
  }
}

}  // namespace

TaintedString to_str(const Value& v) {
  if (v.is_string()) return v.as_string();
  TaintedString out;
  print_value(v, false, out);
  return out;
}

TaintedString to_repr(const Value& v) {
  TaintedString out;
  print_value(v, true, out);
  return out;
}

List iterate(const Value& v) {
  using K = Value::Kind;
  switch (v.kind()) {
    case K::kUndefined:
      return {};
    case K::kList:
    case K::kTuple:
      return v.as_list();
    case K::kDict: {
      List keys;
      for (const auto& [k, item] : v.as_dict().items) keys.push_back(Value::string(k));
      return keys;
    }
    case K::kString: {
      const TaintedString& s = v.as_string();
      if (s.size() > kMaxItems) throw JinjaError("string too long to iterate over its characters");
      const std::vector<size_t> starts = char_starts(s.text());
      List chars;
      for (size_t c = 0; c + 1 < starts.size(); ++c)
        chars.push_back(Value::string(s.substr(starts[c], starts[c + 1] - starts[c]), v.origin()));
      return chars;
    }
    default:
      throw JinjaError(str("'", v.type_name(), "' object is not iterable"));
  }
}

}  // namespace forge::chat::jinja
