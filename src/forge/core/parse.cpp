#include "forge/core/parse.h"

#include <climits>

#include "forge/core/error.h"

namespace forge {

int parse_setting_int(const std::string& key, const std::string& v) {
  try {
    size_t pos = 0;
    const long x = std::stol(v, &pos);
    if (pos == v.size() && x >= INT_MIN && x <= INT_MAX) return static_cast<int>(x);
  } catch (...) {
  }
  throw Error(str("override ", key, "=", v, ": expected an integer"));
}

double parse_setting_double(const std::string& key, const std::string& v) {
  try {
    size_t pos = 0;
    const double x = std::stod(v, &pos);
    if (pos == v.size()) return x;
  } catch (...) {
  }
  throw Error(str("override ", key, "=", v, ": expected a number"));
}

bool parse_setting_bool(const std::string& key, const std::string& v) {
  if (v == "true" || v == "1") return true;
  if (v == "false" || v == "0") return false;
  throw Error(str("override ", key, "=", v, ": expected true or false"));
}

}  // namespace forge
