#include "args.h"

#include <charconv>
#include <cstdio>

#include "forge/core/error.h"

namespace forge::cli {

namespace {

const Option* find_option(const Command& cmd, const std::string& name) {
  for (const auto& o : cmd.options)
    if (o.name == name) return &o;
  return nullptr;
}

}  // namespace

std::string Args::get(const std::string& name, const std::string& def) const {
  auto it = values_.find(name);
  return it == values_.end() || it->second.empty() ? def : it->second.back();
}

std::vector<std::string> Args::all(const std::string& name) const {
  auto it = values_.find(name);
  return it == values_.end() ? std::vector<std::string>{} : it->second;
}

int Args::get_int(const std::string& name, int def, int lo, int hi) const {
  return has(name) ? parse_int("--" + name, get(name), lo, hi) : def;
}

int64_t Args::get_int64(const std::string& name, int64_t def, int64_t lo, int64_t hi) const {
  return has(name) ? parse_int64("--" + name, get(name), lo, hi) : def;
}

uint64_t Args::get_uint64(const std::string& name, uint64_t def, uint64_t lo, uint64_t hi) const {
  return has(name) ? parse_uint64("--" + name, get(name), lo, hi) : def;
}

double Args::get_double(const std::string& name, double def, const Interval& range) const {
  return has(name) ? parse_double("--" + name, get(name), range) : def;
}

std::string Args::require(const std::string& name) const {
  if (!has(name) || get(name).empty()) throw Error(str("--", name, " is required"));
  return get(name);
}

Args parse_args(const Command& cmd, const std::vector<std::string>& argv) {
  Args a;
  const std::string see = " (see forge " + cmd.name + " --help)";
  for (size_t i = 0; i < argv.size(); ++i) {
    const std::string& arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      a.help_ = true;
      continue;
    }
    if (arg.starts_with("--")) {
      std::string name = arg.substr(2), value;
      const size_t eq = name.find('=');
      const bool inline_value = eq != std::string::npos;
      if (inline_value) {
        value = name.substr(eq + 1);
        name = name.substr(0, eq);
      }
      const Option* opt = find_option(cmd, name);
      if (!opt) throw Error(str("unknown option --", name, " for 'forge ", cmd.name, "'", see));
      auto& slot = a.values_[name];
      if (opt->metavar.empty()) {
        if (inline_value) throw Error(str("--", name, " takes no value", see));
        slot.push_back("true");
      } else if (inline_value) {
        slot.push_back(value);
      } else if (opt->multi) {
        size_t taken = 0;
        while (i + 1 < argv.size() && !argv[i + 1].starts_with("--")) slot.push_back(argv[++i]), ++taken;
        if (taken == 0) throw Error(str("--", name, " needs at least one ", opt->metavar, see));
      } else {
        if (i + 1 >= argv.size()) throw Error(str("--", name, " needs a value (", opt->metavar, ")", see));
        slot.push_back(argv[++i]);
      }
      continue;
    }
    const size_t eq = arg.find('=');
    if (cmd.takes_overrides && eq != std::string::npos && eq > 0) {
      a.overrides_.push_back({arg.substr(0, eq), arg.substr(eq + 1)});
      continue;
    }
    if (!cmd.positional.empty() && a.positional_.empty()) {
      a.positional_ = arg;
      continue;
    }
    throw Error(str("unexpected argument ", quote(arg), " for 'forge ", cmd.name, "'", see));
  }
  return a;
}

void print_help(const Command& cmd) {
  std::printf("forge %s — %s\n\nusage: forge %s%s%s [options]%s\n\noptions:\n", cmd.name.c_str(),
              cmd.summary.c_str(), cmd.name.c_str(), cmd.positional.empty() ? "" : " ",
              cmd.positional.c_str(), cmd.takes_overrides ? " [key=value ...]" : "");
  for (const auto& o : cmd.options) {
    std::string left = "--" + o.name + (o.metavar.empty() ? "" : " " + o.metavar + (o.multi ? "..." : ""));
    std::printf("  %-28s %s\n", left.c_str(), o.help.c_str());
  }
  std::printf("  %-28s %s\n", "--help", "show this help");
  if (!cmd.details.empty()) std::printf("\n%s\n", cmd.details.c_str());
}

std::vector<int> parse_id_list(const std::string& s) {
  std::vector<int> ids;
  size_t start = 0;
  while (start <= s.size()) {
    const size_t comma = s.find(',', start);
    const std::string tok = s.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    int id = 0;
    const auto [ptr, ec] = std::from_chars(tok.data(), tok.data() + tok.size(), id);
    if (tok.empty() || ec != std::errc() || ptr != tok.data() + tok.size() || id < 0)
      throw Error(str("bad token id ", quote(tok), " in ", quote(s), " (expected non-negative integers separated by commas)"));
    ids.push_back(id);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return ids;
}

}  // namespace forge::cli
