// Checked parsing of the text of a setting: a command-line option (--steps 100), a key=value
// override (seed=7), a value of a --config file or of a run's config.json. The whole text must
// be one base-10 number inside the accepted range: no spaces, no '+', no trailing characters,
// no sign on an unsigned value, nothing that wraps or rounds. Anything else throws a one-line
// forge::Error naming the setting, the range and what was found:
//   --steps: expected an integer in [1, 2147483647], got '4294967297'
// `what` is the setting as the user names it ("--steps", "seed", "run/config.json: train.lr").
//
// Integers are parsed as integers (std::from_chars), never through a double: a 64-bit seed
// survives exactly. Doubles are parsed correctly rounded, so the shortest round-trip text of a
// double (what nlohmann::json writes) reads back bit-exact.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <string_view>

namespace forge {

// The accepted values of a floating-point setting; always finite. Printed as "[0, 1)", "> 0".
struct Interval {
  double lo = -std::numeric_limits<double>::infinity();
  double hi = std::numeric_limits<double>::infinity();
  bool lo_open = false;  // lo itself is excluded
  bool hi_open = false;  // hi itself is excluded

  bool contains(double x) const;
  std::string bounds() const;    // "[0, 1)", "> 0", "any"
  std::string describe() const;  // "a number in [0, 1)", "a number > 0", "a finite number"
};

int parse_int(const std::string& what, std::string_view text, int lo, int hi);
int64_t parse_int64(const std::string& what, std::string_view text, int64_t lo, int64_t hi);
uint64_t parse_uint64(const std::string& what, std::string_view text, uint64_t lo = 0,
                      uint64_t hi = std::numeric_limits<uint64_t>::max());
double parse_double(const std::string& what, std::string_view text, const Interval& range = {});
// true/false/1/0.
bool parse_bool(const std::string& what, std::string_view text);

}  // namespace forge
