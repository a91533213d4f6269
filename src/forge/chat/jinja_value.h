// The values of the chat-template interpreter (chat/jinja.h), with Python's semantics as jinja2
// gives them to templates: None, bool, int, float, str (a TaintedString: it knows which bytes
// came from data), list, tuple, dict (insertion-ordered, string keys), jinja2's namespace, and
// callables (globals such as raise_exception, bound string/dict methods, loop.cycle).
// Undefined is jinja2's default Undefined: printed as "", falsy, iterable as empty, and an error
// for anything else (attribute access, arithmetic, calls).
//
// Values are immutable (transformers renders in an ImmutableSandboxedEnvironment) except a
// namespace, whose attributes `{% set ns.x = ... %}` assigns; copies share storage.
//
// Strings are UTF-8; length, indexing and slicing count code points, as Python's str does.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "forge/chat/tainted_string.h"

namespace forge::chat::jinja {

// A failure while rendering, without the line yet: the interpreter adds the line of the innermost
// node it was evaluating and turns it into a forge::Error.
class JinjaError {
 public:
  explicit JinjaError(std::string message, int line = 0)
      : message_(std::move(message)), line_(line) {}
  const std::string& message() const { return message_; }
  int line() const { return line_; }

 private:
  std::string message_;
  int line_;
};

// Integer arithmetic of templates. Python's integers grow without bound, Forge's are 64-bit: a
// result outside int64 is an error, never a wrapped number (signed overflow is undefined
// behaviour; `34 * 9223372036814775808` was one, found by fuzz_chat_template).
[[noreturn]] inline void integer_overflow() {
  throw JinjaError("integer overflow (template integers are 64-bit)");
}
inline int64_t int_add(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_add_overflow(a, b, &r)) integer_overflow();
  return r;
}
inline int64_t int_sub(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_sub_overflow(a, b, &r)) integer_overflow();
  return r;
}
inline int64_t int_mul(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_mul_overflow(a, b, &r)) integer_overflow();
  return r;
}
// A double truncated to an integer (int(x)): one outside int64 is an overflow too.
inline int64_t int_from_double(double x) {
  if (!(x >= -9223372036854775808.0 && x < 9223372036854775808.0)) integer_overflow();
  return static_cast<int64_t>(x);
}

class Value;
using List = std::vector<Value>;

// Insertion-ordered string-keyed map (Python dicts keep insertion order; messages have few keys).
struct Dict {
  std::vector<std::pair<TaintedString, Value>> items;
  const Value* find(std::string_view key) const;
  void set(const TaintedString& key, Value v);
};

struct Args {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
};

struct Callable {
  std::string name;  // for messages: "raise_exception", "str.strip", "loop.cycle"
  std::function<Value(const Args&)> fn;
};

class Value {
 public:
  enum class Kind : uint8_t {
    kUndefined,
    kNone,
    kBool,
    kInt,
    kFloat,
    kString,
    kList,
    kTuple,
    kDict,
    kNamespace,
    kCallable
  };

  Value() = default;  // undefined
  // `hint` is the error given when the undefined value is used: "'foo' is undefined".
  static Value undefined(std::string hint);
  static Value none(int32_t origin = kTemplate);
  static Value boolean(bool b, int32_t origin = kTemplate);
  static Value integer(int64_t i, int32_t origin = kTemplate);
  static Value number(double f, int32_t origin = kTemplate);
  static Value string(TaintedString s, int32_t origin = kTemplate);
  static Value string(std::string_view s, int32_t origin = kTemplate);
  static Value list(List items, int32_t origin = kTemplate);
  static Value tuple(List items, int32_t origin = kTemplate);
  static Value dict(Dict d, int32_t origin = kTemplate);
  static Value ns(Dict d);
  static Value callable(std::string name, std::function<Value(const Args&)> fn);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_int() const { return kind_ == Kind::kInt || kind_ == Kind::kBool; }  // bool is an int
  bool is_number() const { return is_int() || kind_ == Kind::kFloat; }
  bool is_sequence() const { return kind_ == Kind::kList || kind_ == Kind::kTuple; }
  bool is_dict() const { return kind_ == Kind::kDict; }

  bool as_bool() const { return i_ != 0; }
  int64_t as_int() const { return i_; }  // bool: 0 or 1
  double as_double() const { return kind_ == Kind::kFloat ? f_ : static_cast<double>(i_); }
  const TaintedString& as_string() const { return *s_; }
  const List& as_list() const { return *list_; }
  const Dict& as_dict() const { return *dict_; }
  Dict& namespace_dict() const { return *dict_; }
  const Callable& as_callable() const { return *fn_; }
  const std::string& undefined_hint() const { return s_->text(); }

  // Where a scalar or container came from (strings: per byte, see as_string()).
  int32_t origin() const { return origin_; }

  // Python's type name, for messages: "str", "int", "list", "dict", "NoneType", "Undefined".
  std::string type_name() const;

 private:
  Kind kind_ = Kind::kUndefined;
  int32_t origin_ = kTemplate;
  int64_t i_ = 0;
  double f_ = 0;
  std::shared_ptr<const TaintedString> s_;  // string; undefined: the hint
  std::shared_ptr<const List> list_;
  std::shared_ptr<Dict> dict_;  // mutable only for a namespace
  std::shared_ptr<const Callable> fn_;
};

// Limits that turn a runaway template (templates come from model directories) into an error
// instead of exhausting memory or time; real chat templates stay far below them.
inline constexpr size_t kMaxText = size_t{64} << 20;      // bytes of one string or output
inline constexpr size_t kMaxItems = size_t{1} << 20;      // elements of one list
inline constexpr int64_t kMaxLoopIterations = 1'000'000;  // per render
// Throws JinjaError when a string of `bytes` would pass kMaxText.
void check_text_size(size_t bytes);

// Python semantics.
bool truthy(const Value& v);
bool equal(const Value& a, const Value& b);  // ==, deep; 1 == 1.0 == True
// <, <=, ... : -1, 0, 1; throws JinjaError for types Python cannot order.
int compare(const Value& a, const Value& b, const char* op);
// str(v), keeping the origins of string bytes; containers as Python prints them.
TaintedString to_str(const Value& v);
// repr(v): strings quoted and escaped as Python does.
TaintedString to_repr(const Value& v);
// repr(float) as Python writes it: shortest round trip, "1e-05", "1e+16", "2.0", "inf".
std::string float_repr(double x);
// Raises JinjaError "'foo' is undefined" for an undefined value.
void require_defined(const Value& v);
// The elements of an iterable (list, tuple, dict keys, string characters); undefined: none.
List iterate(const Value& v);

// Python's str.isspace for one code point.
bool py_isspace(uint32_t cp);
// Code points of UTF-8 text (the text is valid UTF-8: it came from JSON or the template).
std::vector<size_t> char_starts(std::string_view s);  // byte offset of each character + size()
size_t char_count(std::string_view s);
uint32_t decode_char(std::string_view s, size_t i, size_t* len);

}  // namespace forge::chat::jinja
