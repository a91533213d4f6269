// Attribute and item access, the str and dict methods templates call, the global functions and
// transformers' tojson. Python's semantics throughout; string results keep the origins of the
// bytes they are made of.
//
// Case mapping (upper, lower, title, capitalize) is ASCII only: non-ASCII letters keep their case,
// where Python would map them ("é".upper() is "É" in Python, "é" here). No chat template we know
// changes the case of message text.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "forge/chat/jinja_builtins.h"
#include "forge/core/error.h"

namespace forge::chat::jinja {

const Value* find_arg(const Args& args, size_t i, const char* name) {
  if (i < args.positional.size()) return &args.positional[i];
  for (const auto& [k, v] : args.keyword)
    if (k == name) return &v;
  return nullptr;
}

void check_arg_count(const Args& args, size_t max_positional, const char* fn) {
  if (args.positional.size() > max_positional)
    throw JinjaError(str(fn, "() takes at most ", max_positional, " positional argument",
                         max_positional == 1 ? "" : "s", " (", args.positional.size(), " given)"));
}

namespace {

const std::string& need_str(const Value& v, const char* what) {
  require_defined(v);
  if (!v.is_string()) throw JinjaError(str(what, " must be a string, not '", v.type_name(), "'"));
  return v.as_string().text();
}

int64_t need_int(const Value& v, const char* what) {
  require_defined(v);
  if (!v.is_int()) throw JinjaError(str(what, " must be an integer, not '", v.type_name(), "'"));
  return v.as_int();
}

// Byte offset → character index (Python indexes strings by character).
int64_t char_index(std::string_view s, size_t byte) {
  return static_cast<int64_t>(char_count(s.substr(0, byte)));
}

bool in_chars(uint32_t cp, const std::string* chars) {
  if (chars == nullptr) return py_isspace(cp);
  for (size_t i = 0; i < chars->size();) {
    size_t len;
    if (decode_char(*chars, i, &len) == cp) return true;
    i += len;
  }
  return false;
}

// Python's str.title(): a letter after a letter is lowered, any other letter raised.
TaintedString py_title(const TaintedString& s) {
  std::string t = s.text();
  bool prev_cased = false;
  for (char& c : t) {
    const bool alpha = std::isalpha(static_cast<unsigned char>(c));
    if (alpha) c = static_cast<char>(prev_cased ? std::tolower(c) : std::toupper(c));
    prev_cased = alpha || static_cast<unsigned char>(c) >= 0x80;
  }
  TaintedString out;
  for (const Span& sp : s.spans())
    out.append(std::string_view(t).substr(out.size(), sp.text.size()), sp.origin);
  return out;
}

TaintedString capitalize(const TaintedString& s) {
  TaintedString lower = ascii_case(s, false);
  if (lower.empty()) return lower;
  TaintedString out = ascii_case(lower.substr(0, 1), true);
  out.append(lower.substr(1));
  return out;
}

Value bound(const std::string& name, std::function<Value(const Args&)> fn) {
  return Value::callable(name, std::move(fn));
}

Value str_method(const Value& self, const std::string& name) {
  const TaintedString s = self.as_string();
  const int32_t o = self.origin();
  const std::string full = "str." + name;
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    return bound(full, [s, name, o](const Args& a) {
      check_arg_count(a, 1, name.c_str());
      const Value* chars = find_arg(a, 0, "chars");
      return Value::string(py_strip(s, chars, name != "rstrip", name != "lstrip"), o);
    });
  }
  if (name == "split") {
    return bound(full, [self](const Args& a) {
      check_arg_count(a, 2, "split");
      const Value* max = find_arg(a, 1, "maxsplit");
      return Value::list(
          py_split(self, find_arg(a, 0, "sep"), max ? need_int(*max, "maxsplit") : -1));
    });
  }
  if (name == "startswith" || name == "endswith") {
    return bound(full, [s, name](const Args& a) {
      check_arg_count(a, 1, name.c_str());
      const Value* p = find_arg(a, 0, "prefix");
      if (p == nullptr) throw JinjaError(name + "() takes exactly one argument");
      const List options = p->kind() == Value::Kind::kTuple ? p->as_list() : List{*p};
      for (const Value& opt : options) {
        const std::string& x = need_str(opt, name.c_str());
        if (name == "startswith" ? s.text().starts_with(x) : s.text().ends_with(x))
          return Value::boolean(true);
      }
      return Value::boolean(false);
    });
  }
  if (name == "upper" || name == "lower") {
    return bound(full, [s, name, o](const Args& a) {
      check_arg_count(a, 0, name.c_str());
      return Value::string(ascii_case(s, name == "upper"), o);
    });
  }
  if (name == "title" || name == "capitalize") {
    return bound(full, [s, name, o](const Args& a) {
      check_arg_count(a, 0, name.c_str());
      return Value::string(name == "title" ? py_title(s) : capitalize(s), o);
    });
  }
  if (name == "replace") {
    return bound(full, [s, o](const Args& a) {
      check_arg_count(a, 3, "replace");
      const Value* old = find_arg(a, 0, "old");
      const Value* rep = find_arg(a, 1, "new");
      const Value* count = find_arg(a, 2, "count");
      if (old == nullptr || rep == nullptr)
        throw JinjaError("replace() takes at least 2 arguments");
      need_str(*old, "replace() argument 1");
      need_str(*rep, "replace() argument 2");
      return Value::string(
          py_replace(s, old->as_string(), rep->as_string(), count ? need_int(*count, "count") : -1),
          o);
    });
  }
  if (name == "find" || name == "count") {
    return bound(full, [s, name](const Args& a) {
      check_arg_count(a, 1, name.c_str());
      const Value* sub = find_arg(a, 0, "sub");
      if (sub == nullptr) throw JinjaError(name + "() takes exactly one argument");
      const std::string& x = need_str(*sub, name.c_str());
      if (name == "find") {
        const size_t at = s.text().find(x);
        return Value::integer(at == std::string::npos ? -1 : char_index(s.text(), at));
      }
      if (x.empty()) return Value::integer(static_cast<int64_t>(char_count(s.text())) + 1);
      int64_t n = 0;
      for (size_t at = s.text().find(x); at != std::string::npos;
           at = s.text().find(x, at + x.size()))
        ++n;
      return Value::integer(n);
    });
  }
  if (name == "join") {
    return bound(full, [s](const Args& a) {
      check_arg_count(a, 1, "join");
      const Value* items = find_arg(a, 0, "iterable");
      if (items == nullptr) throw JinjaError("join() takes exactly one argument");
      TaintedString out;
      bool first = true;
      for (const Value& v : iterate(*items)) {
        if (!first) out.append(s);
        first = false;
        need_str(v, "join() item");
        check_text_size(out.size() + v.as_string().size());
        out.append(v.as_string());
      }
      return Value::string(out);
    });
  }
  return Value::undefined(str("'str object' has no attribute '", name, "'"));
}

Value dict_method(const Value& self, const std::string& name) {
  const std::string full = "dict." + name;
  if (name == "items" || name == "keys" || name == "values") {
    return bound(full, [self, name](const Args& a) {
      check_arg_count(a, 0, name.c_str());
      List out;
      for (const auto& [k, v] : self.as_dict().items) {
        if (name == "items") {
          out.push_back(Value::tuple({Value::string(k), v}, self.origin()));
        } else {
          out.push_back(name == "keys" ? Value::string(k) : v);
        }
      }
      return Value::list(std::move(out), self.origin());
    });
  }
  if (name == "get") {
    return bound(full, [self](const Args& a) {
      check_arg_count(a, 2, "get");
      const Value* key = find_arg(a, 0, "key");
      if (key == nullptr) throw JinjaError("get() takes at least 1 argument");
      const Value* def = find_arg(a, 1, "default");
      const Value* v = key->is_string() ? self.as_dict().find(key->as_string().text()) : nullptr;
      return v ? *v : def ? *def : Value::none();
    });
  }
  return Value();
}

// Python's slice.indices(n) and the positions it selects.
std::vector<int64_t> slice_positions(int64_t n, const Value& start, const Value& stop,
                                     const Value& step) {
  auto bound_or = [](const Value& v, const char* what) -> std::optional<int64_t> {
    if (v.is_none() || v.is_undefined()) return std::nullopt;
    return need_int(v, what);
  };
  const int64_t st = bound_or(step, "slice step").value_or(1);
  if (st == 0) throw JinjaError("slice step cannot be zero");
  auto clamp = [&](std::optional<int64_t> v, int64_t def) {
    if (!v) return def;
    int64_t x = *v < 0 ? *v + n : *v;
    if (st > 0) return std::clamp<int64_t>(x, 0, n);
    return std::clamp<int64_t>(x, -1, n - 1);
  };
  const int64_t b = clamp(bound_or(start, "slice start"), st > 0 ? 0 : n - 1);
  const int64_t e = clamp(bound_or(stop, "slice stop"), st > 0 ? n : -1);
  std::vector<int64_t> out;
  for (int64_t i = b; st > 0 ? i < e : i > e; i += st) out.push_back(i);
  return out;
}

}  // namespace

TaintedString ascii_case(const TaintedString& s, bool upper) {
  TaintedString out;
  for (const Span& sp : s.spans()) {
    std::string t = sp.text;
    for (char& c : t)
      c = static_cast<char>(upper ? std::toupper(static_cast<unsigned char>(c))
                                  : std::tolower(static_cast<unsigned char>(c)));
    out.append(t, sp.origin);
  }
  return out;
}

TaintedString py_strip(const TaintedString& s, const Value* chars, bool left, bool right) {
  const std::string* set = nullptr;
  if (chars != nullptr && !chars->is_none()) set = &need_str(*chars, "strip() argument");
  const std::string& t = s.text();
  const std::vector<size_t> starts = char_starts(t);
  size_t b = 0, e = starts.size() - 1;
  size_t len;
  while (left && b < e && in_chars(decode_char(t, starts[b], &len), set)) ++b;
  while (right && e > b && in_chars(decode_char(t, starts[e - 1], &len), set)) --e;
  return s.substr(starts[b], starts[e] - starts[b]);
}

List py_split(const Value& self, const Value* sep, int64_t maxsplit) {
  const TaintedString& s = self.as_string();
  const std::string& t = s.text();
  List out;
  auto piece = [&](size_t b, size_t e) {
    out.push_back(Value::string(s.substr(b, e - b), self.origin()));
  };
  if (sep == nullptr || sep->is_none()) {
    // Runs of whitespace separate; leading and trailing whitespace make no empty pieces.
    auto space_at = [&](size_t i, size_t* len) { return py_isspace(decode_char(t, i, len)); };
    size_t i = 0, len;
    while (true) {
      while (i < t.size() && space_at(i, &len)) i += len;
      if (i >= t.size()) break;
      if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) {
        piece(i, t.size());
        break;
      }
      const size_t b = i;
      while (i < t.size() && !space_at(i, &len)) i += len;
      piece(b, i);
    }
    return out;
  }
  const std::string& x = need_str(*sep, "split() separator");
  if (x.empty()) throw JinjaError("empty separator");
  size_t b = 0;
  for (size_t at = t.find(x); at != std::string::npos; at = t.find(x, b)) {
    if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) break;
    piece(b, at);
    b = at + x.size();
  }
  piece(b, t.size());
  return out;
}

TaintedString py_replace(const TaintedString& s, const TaintedString& old, const TaintedString& rep,
                         int64_t count) {
  const std::string& t = s.text();
  TaintedString out;
  int64_t done = 0;
  if (old.empty()) {  // Python inserts `rep` before every character and at the end
    const std::vector<size_t> starts = char_starts(t);
    for (size_t c = 0; c + 1 < starts.size(); ++c) {
      if (count < 0 || done < count) {
        check_text_size(out.size() + rep.size());
        out.append(rep);
        ++done;
      }
      out.append(s.substr(starts[c], starts[c + 1] - starts[c]));
    }
    if (count < 0 || done < count) out.append(rep);
    return out;
  }
  size_t b = 0;
  for (size_t at = t.find(old.text()); at != std::string::npos && (count < 0 || done < count);
       at = t.find(old.text(), b)) {
    check_text_size(out.size() + (at - b) + rep.size());
    out.append(s.substr(b, at - b));
    out.append(rep);
    b = at + old.size();
    ++done;
  }
  out.append(s.substr(b));
  return out;
}

Value get_attr(const Value& obj, const std::string& name) {
  using K = Value::Kind;
  switch (obj.kind()) {
    case K::kUndefined:
      throw JinjaError(obj.undefined_hint());
    case K::kString:
      return str_method(obj, name);
    case K::kDict: {
      if (Value m = dict_method(obj, name); !m.is_undefined()) return m;
      if (const Value* v = obj.as_dict().find(name)) return *v;
      return Value::undefined(str("'dict object' has no attribute '", name, "'"));
    }
    case K::kNamespace:
      if (const Value* v = obj.as_dict().find(name)) return *v;
      return Value::undefined(str("'Namespace object' has no attribute '", name, "'"));
    case K::kNone:
      return Value::undefined(str("'None' has no attribute '", name, "'"));
    default:
      return Value::undefined(str("'", obj.type_name(), " object' has no attribute '", name, "'"));
  }
}

Value get_item(const Value& obj, const Value& key) {
  using K = Value::Kind;
  require_defined(obj);
  if (obj.kind() == K::kDict || obj.kind() == K::kNamespace) {
    if (key.is_string()) {
      if (const Value* v = obj.as_dict().find(key.as_string().text())) return *v;
      return get_attr(obj, key.as_string().text());
    }
    return Value::undefined(str("'dict object' has no attribute '", to_str(key).text(), "'"));
  }
  if ((obj.is_sequence() || obj.is_string()) && key.is_int()) {
    const std::vector<size_t> starts =
        obj.is_string() ? char_starts(obj.as_string().text()) : std::vector<size_t>{};
    const int64_t n = obj.is_string() ? static_cast<int64_t>(starts.size()) - 1
                                      : static_cast<int64_t>(obj.as_list().size());
    const int64_t i = key.as_int() < 0 ? key.as_int() + n : key.as_int();
    if (i < 0 || i >= n)
      return Value::undefined(str("'", obj.type_name(), " object' has no element ", key.as_int()));
    if (!obj.is_string()) return obj.as_list()[static_cast<size_t>(i)];
    const size_t b = starts[static_cast<size_t>(i)], e = starts[static_cast<size_t>(i) + 1];
    return Value::string(obj.as_string().substr(b, e - b), obj.origin());
  }
  if (key.is_string()) return get_attr(obj, key.as_string().text());
  return Value::undefined(
      str("'", obj.type_name(), " object' has no element ", to_str(key).text()));
}

Value get_slice(const Value& obj, const Value& start, const Value& stop, const Value& step) {
  require_defined(obj);
  if (obj.is_string()) {
    const TaintedString& s = obj.as_string();
    const std::vector<size_t> starts = char_starts(s.text());
    TaintedString out;
    for (int64_t i : slice_positions(static_cast<int64_t>(starts.size()) - 1, start, stop, step))
      out.append(s.substr(starts[static_cast<size_t>(i)],
                          starts[static_cast<size_t>(i) + 1] - starts[static_cast<size_t>(i)]));
    return Value::string(out, obj.origin());
  }
  if (obj.is_sequence()) {
    const List& items = obj.as_list();
    List out;
    for (int64_t i : slice_positions(static_cast<int64_t>(items.size()), start, stop, step))
      out.push_back(items[static_cast<size_t>(i)]);
    return obj.kind() == Value::Kind::kTuple ? Value::tuple(std::move(out), obj.origin())
                                             : Value::list(std::move(out), obj.origin());
  }
  throw JinjaError(str("'", obj.type_name(), "' object is not subscriptable"));
}

std::vector<std::pair<std::string, Value>> make_globals(const std::optional<std::tm>& now) {
  std::vector<std::pair<std::string, Value>> g;
  g.emplace_back("raise_exception", Value::callable("raise_exception", [](const Args& a) -> Value {
                   const Value* msg = find_arg(a, 0, "message");
                   std::string text = msg ? to_str(*msg).text() : "";
                   std::replace(text.begin(), text.end(), '\n', ' ');  // errors are one line
                   throw JinjaError("raise_exception: " + text);
                 }));
  g.emplace_back("strftime_now", Value::callable("strftime_now", [now](const Args& a) {
                   check_arg_count(a, 1, "strftime_now");
                   const Value* fmt = find_arg(a, 0, "format");
                   if (fmt == nullptr)
                     throw JinjaError("strftime_now() takes exactly one argument");
                   const std::string& f = need_str(*fmt, "strftime_now() format");
                   std::tm tm{};
                   if (now) {
                     tm = *now;
                   } else {
                     const std::time_t t = std::time(nullptr);
                     localtime_r(&t, &tm);
                   }
                   std::string buf(f.size() * 4 + 64, '\0');
                   const size_t n =
                       f.empty() ? 0 : std::strftime(buf.data(), buf.size(), f.c_str(), &tm);
                   buf.resize(n);
                   return Value::string(buf);
                 }));
  // namespace(...) and dict(...): from keyword arguments and an optional mapping.
  auto build = [](const Args& a, const char* fn) {
    check_arg_count(a, 1, fn);
    Dict d;
    if (!a.positional.empty()) {
      const Value& m = a.positional[0];
      if (m.is_dict() || m.kind() == Value::Kind::kNamespace) {
        d = m.as_dict();
      } else {
        for (const Value& pair : iterate(m)) {
          if (!pair.is_sequence() || pair.as_list().size() != 2)
            throw JinjaError(str(fn, "() needs a mapping or key/value pairs"));
          d.set(TaintedString(need_str(pair.as_list()[0], "key"), kTemplate), pair.as_list()[1]);
        }
      }
    }
    for (const auto& [k, v] : a.keyword) d.set(TaintedString(k, kTemplate), v);
    return d;
  };
  g.emplace_back("namespace", Value::callable("namespace", [build](const Args& a) {
                   return Value::ns(build(a, "namespace"));
                 }));
  g.emplace_back("dict", Value::callable("dict", [build](const Args& a) {
                   return Value::dict(build(a, "dict"));
                 }));
  g.emplace_back("range", Value::callable("range", [](const Args& a) {
                   check_arg_count(a, 3, "range");
                   if (a.positional.empty() || !a.keyword.empty())
                     throw JinjaError("range() takes 1 to 3 integers");
                   int64_t start = 0, stop, step = 1;
                   if (a.positional.size() == 1) {
                     stop = need_int(a.positional[0], "range() argument");
                   } else {
                     start = need_int(a.positional[0], "range() argument");
                     stop = need_int(a.positional[1], "range() argument");
                     if (a.positional.size() == 3)
                       step = need_int(a.positional[2], "range() argument");
                   }
                   if (step == 0) throw JinjaError("range() arg 3 must not be zero");
                   List out;
                   // i + step past int64 is past stop too: the range ends there.
                   for (int64_t i = start; step > 0 ? i < stop : i > stop;) {
                     if (out.size() >= 100000)
                       throw JinjaError("range too big (more than 100000 items)");
                     out.push_back(Value::integer(i));
                     if (__builtin_add_overflow(i, step, &i)) break;
                   }
                   return Value::list(std::move(out));
                 }));
  return g;
}

namespace {

void json_string(const TaintedString& s, int32_t quote_origin, bool ensure_ascii,
                 TaintedString& out) {
  out.append("\"", quote_origin);
  const std::string& t = s.text();
  for (size_t i = 0; i < t.size();) {
    size_t len;
    const uint32_t cp = decode_char(t, i, &len);
    const int32_t o = s.origin_at(i);
    char buf[16];
    switch (cp) {
      case '"':
        out.append("\\\"", o);
        break;
      case '\\':
        out.append("\\\\", o);
        break;
      case '\n':
        out.append("\\n", o);
        break;
      case '\r':
        out.append("\\r", o);
        break;
      case '\t':
        out.append("\\t", o);
        break;
      case '\b':
        out.append("\\b", o);
        break;
      case '\f':
        out.append("\\f", o);
        break;
      default:
        if (cp < 0x20 || (ensure_ascii && cp >= 0x80)) {
          if (cp >= 0x10000) {  // a surrogate pair, as json.dumps writes it
            const uint32_t v = cp - 0x10000;
            std::snprintf(buf, sizeof(buf), "\\u%04x\\u%04x", 0xD800 + (v >> 10),
                          0xDC00 + (v & 0x3FF));
          } else {
            std::snprintf(buf, sizeof(buf), "\\u%04x", cp);
          }
          out.append(buf, o);
        } else {
          out.append(std::string_view(t).substr(i, len), o);
        }
    }
    i += len;
  }
  out.append("\"", quote_origin);
}

void json_value(const Value& v, const JsonOptions& opt, int depth, TaintedString& out) {
  if (depth > 100) throw JinjaError("value nested more than 100 levels deep");
  using K = Value::Kind;
  const int32_t o = v.origin();
  auto newline = [&](int level) {
    if (!opt.indent) return;
    out.append("\n", o);
    for (int i = 0; i < level; ++i) out.append(*opt.indent, o);
  };
  switch (v.kind()) {
    case K::kNone:
      out.append("null", o);
      return;
    case K::kBool:
      out.append(v.as_bool() ? "true" : "false", o);
      return;
    case K::kInt:
      out.append(std::to_string(v.as_int()), o);
      return;
    case K::kFloat: {
      const double x = v.as_double();
      out.append(std::isnan(x)   ? "NaN"
                 : std::isinf(x) ? (x < 0 ? "-Infinity" : "Infinity")
                                 : float_repr(x),
                 o);
      return;
    }
    case K::kString:
      json_string(v.as_string(), o, opt.ensure_ascii, out);
      return;
    case K::kList:
    case K::kTuple: {
      const List& items = v.as_list();
      if (items.empty()) {
        out.append("[]", o);
        return;
      }
      out.append("[", o);
      for (size_t i = 0; i < items.size(); ++i) {
        if (i > 0) out.append(opt.item_separator, o);
        newline(depth + 1);
        json_value(items[i], opt, depth + 1, out);
      }
      newline(depth);
      out.append("]", o);
      return;
    }
    case K::kDict: {
      std::vector<const std::pair<TaintedString, Value>*> items;
      for (const auto& kv : v.as_dict().items) items.push_back(&kv);
      if (opt.sort_keys)
        std::stable_sort(items.begin(), items.end(),
                         [](auto* a, auto* b) { return a->first.text() < b->first.text(); });
      if (items.empty()) {
        out.append("{}", o);
        return;
      }
      out.append("{", o);
      for (size_t i = 0; i < items.size(); ++i) {
        if (i > 0) out.append(opt.item_separator, o);
        newline(depth + 1);
        json_string(items[i]->first, o, opt.ensure_ascii, out);
        out.append(opt.key_separator, o);
        json_value(items[i]->second, opt, depth + 1, out);
      }
      newline(depth);
      out.append("}", o);
      return;
    }
    default:
      throw JinjaError(str("Object of type ", v.type_name(), " is not JSON serializable"));
  }
}

}  // namespace

TaintedString to_json(const Value& v, const JsonOptions& opt) {
  TaintedString out;
  json_value(v, opt, 0, out);
  return out;
}

}  // namespace forge::chat::jinja
