// Regression tests of fuzzer findings (fuzz/README.md): each finding's exact input is kept in
// fuzz/regressions/<target>-<what>, fed by a test beside the parser's other tests to the call
// that once crashed or misbehaved on it, which must now throw one forge::Error of one line.
#pragma once

#include <gtest/gtest.h>

#include <fstream>
#include <initializer_list>
#include <sstream>
#include <string>

#include "forge/core/error.h"

namespace forge::testing {

// The bytes of fuzz/regressions/NAME.
inline std::string fuzz_regression(const std::string& name) {
  const std::string path = std::string(FORGE_SOURCE_DIR) + "/fuzz/regressions/" + name;
  std::ifstream f(path, std::ios::binary);
  EXPECT_TRUE(f.good()) << path;
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// `body` must throw forge::Error with a one-line message containing every one of `parts`.
template <class F>
void expect_one_line_error(F&& body, std::initializer_list<std::string> parts) {
  try {
    body();
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\r'), std::string::npos) << msg;
    for (const std::string& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << msg;
  }
}

}  // namespace forge::testing
