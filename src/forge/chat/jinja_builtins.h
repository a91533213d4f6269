// What the interpreter offers templates besides syntax: attribute and item access (with the
// string and dict methods templates call), filters, tests, globals (raise_exception,
// strftime_now, namespace, dict, range) and transformers' tojson. Internal to chat/.
#pragma once

#include <ctime>
#include <optional>
#include <string>
#include <vector>

#include "forge/chat/jinja_value.h"

namespace forge::chat::jinja {

// obj.name: a dict's or string's method first (Python getattr), then the item of that name;
// loop and namespace attributes. Missing: undefined.
Value get_attr(const Value& obj, const std::string& name);
// obj[key]: the item, else (for a string key) the attribute of that name. Missing: undefined.
Value get_item(const Value& obj, const Value& key);
// obj[start:stop:step] with Python's rules (negative and missing bounds); strings by character.
Value get_slice(const Value& obj, const Value& start, const Value& stop, const Value& step);

Value apply_filter(const std::string& name, const Value& subject, const Args& args);
bool apply_test(const std::string& name, const Value& subject, const Args& args);
// Python's `item in container` (substring, element, key).
bool value_in(const Value& item, const Value& container);

// The global functions. `now`: the time strftime_now formats (default: the local time now).
std::vector<std::pair<std::string, Value>> make_globals(const std::optional<std::tm>& now);

// json.dumps(v, ensure_ascii=False, indent, separators, sort_keys) as transformers' tojson
// filter calls it. indent: none (one line), a number of spaces, or a string.
struct JsonOptions {
  std::optional<std::string> indent;
  std::string item_separator = ", ", key_separator = ": ";
  bool sort_keys = false;
  bool ensure_ascii = false;
};
TaintedString to_json(const Value& v, const JsonOptions& opt);

// Argument helpers for builtins: the i-th positional argument or the keyword `name`.
const Value* find_arg(const Args& args, size_t i, const char* name);
void check_arg_count(const Args& args, size_t max_positional, const char* fn);

// Python string operations on tainted text (origins follow the bytes they came from).
TaintedString py_strip(const TaintedString& s, const Value* chars, bool left, bool right);
List py_split(const Value& s, const Value* sep, int64_t maxsplit);
TaintedString py_replace(const TaintedString& s, const TaintedString& old, const TaintedString& rep,
                         int64_t count);
TaintedString ascii_case(const TaintedString& s, bool upper);

}  // namespace forge::chat::jinja
