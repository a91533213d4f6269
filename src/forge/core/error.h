// Errors. Two kinds, as STYLE.md says:
//  - forge::Error: the user's fault (bad file, bad flag, shape mismatch from user input). The CLI
//    prints what() as one line and exits non-zero. Build messages with forge::str(...).
//  - FORGE_CHECK: a broken invariant inside Forge. Prints the statement and file:line, aborts.
#pragma once

#include <cstddef>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>

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

// `text` quoted for an error message: 'text', with control characters (a newline among them)
// written as \xNN and anything past `max` bytes cut to "...". For every name or value that comes
// from a file, the command line or the environment, so that it can neither break the message's
// one line nor flood it.
std::string quote(std::string_view text, size_t max = 120);

[[noreturn]] void check_failed(const char* expr, const char* file, int line, const std::string& msg);

}  // namespace forge

#define FORGE_CHECK(cond, ...)                                                          \
  do {                                                                                  \
    if (!(cond)) ::forge::check_failed(#cond, __FILE__, __LINE__, ::forge::str(__VA_ARGS__)); \
  } while (0)
