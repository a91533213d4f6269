// A small command-line parser for the subcommands: `--name value`, `--name=value`, flags,
// options taking several values (`--input a b c`), and `key=value` overrides. Every command
// declares its options once; --help is generated from the declaration, and an unknown option is
// a one-line error that points at --help.
#pragma once

#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "forge/core/parse.h"

namespace forge::cli {

struct Option {
  std::string name;     // without the leading "--"
  std::string metavar;  // empty for a flag
  std::string help;
  bool multi = false;   // takes one or more values
};

struct Command {
  std::string name;      // "train"
  std::string summary;   // one line
  std::vector<Option> options;
  bool takes_overrides = false;  // accepts key=value arguments
  std::string positional;        // metavar of one positional argument, or empty
  std::string details;           // printed after the options in --help
};

class Args {
 public:
  bool has(const std::string& name) const { return values_.count(name) > 0; }
  std::string get(const std::string& name, const std::string& def = "") const;
  std::vector<std::string> all(const std::string& name) const;
  // Checked numbers (forge/core/parse.h): `def` when absent; otherwise the whole value must be
  // a number in the range, or forge::Error "--steps: expected an integer in [1, 2147483647],
  // got '4294967297'". Every caller states the range it accepts.
  int get_int(const std::string& name, int def, int lo, int hi) const;
  int64_t get_int64(const std::string& name, int64_t def, int64_t lo, int64_t hi) const;
  uint64_t get_uint64(const std::string& name, uint64_t def, uint64_t lo = 0,
                      uint64_t hi = std::numeric_limits<uint64_t>::max()) const;
  double get_double(const std::string& name, double def, const Interval& range) const;
  // Throws forge::Error "--name is required" when absent.
  std::string require(const std::string& name) const;
  const std::vector<std::pair<std::string, std::string>>& overrides() const { return overrides_; }
  const std::string& positional() const { return positional_; }
  bool help() const { return help_; }

  friend Args parse_args(const Command& cmd, const std::vector<std::string>& argv);

 private:
  std::map<std::string, std::vector<std::string>> values_;
  std::vector<std::pair<std::string, std::string>> overrides_;
  std::string positional_;
  bool help_ = false;
};

// Throws forge::Error for an unknown option, a missing value or a stray argument.
Args parse_args(const Command& cmd, const std::vector<std::string>& argv);
void print_help(const Command& cmd);

// Parses "1,2,3" into ids; throws forge::Error naming the bad element.
std::vector<int> parse_id_list(const std::string& s);

}  // namespace forge::cli
