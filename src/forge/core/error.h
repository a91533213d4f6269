// Errors. Two kinds, as STYLE.md says:
//  - forge::Error: the user's fault (bad file, bad flag, shape mismatch from user input). The CLI
//    prints what() as one line and exits non-zero. Build messages with forge::str(...).
//  - FORGE_CHECK: a broken invariant inside Forge. Prints the statement and file:line, aborts.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace forge {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Concatenates anything streamable: str("[matmul] inner dims ", k1, " vs ", k2).
template <typename... Args>
std::string str(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}

[[noreturn]] void check_failed(const char* expr, const char* file, int line, const std::string& msg);

}  // namespace forge

#define FORGE_CHECK(cond, ...)                                                          \
  do {                                                                                  \
    if (!(cond)) ::forge::check_failed(#cond, __FILE__, __LINE__, ::forge::str(__VA_ARGS__)); \
  } while (0)
