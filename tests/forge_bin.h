// The forge binary the CLI tests run. FORGE_TEST_BIN from the environment when it is set and not
// empty: the GPU machine runs test binaries built on another machine, where the build tree's path
// (FORGE_BIN_BUILT, set by tests/CMakeLists.txt) does not exist. Otherwise the build tree's.
// FORGE_BIN stays the name the tests use (a const char*).
#pragma once

#include <cstdlib>

namespace forge::testing {

inline const char* forge_bin() {
  static const char* const path = [] {
    const char* env = std::getenv("FORGE_TEST_BIN");
    return env != nullptr && *env != '\0' ? env : FORGE_BIN_BUILT;
  }();
  return path;
}

}  // namespace forge::testing

#define FORGE_BIN (::forge::testing::forge_bin())
