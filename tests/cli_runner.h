// Running the forge binary from a test, as a user would: CmdResult (exit code, stdout, stderr),
// slurp (a file's bytes) and CliTest, the fixture base the command-line tests derive from.
//
// CliTest gives each test its own empty directory, <tmp>/forge_<suite>_<test>_<pid>, removed
// after the test; p(name) is a path inside it. forge(args) runs `FORGE_BIN args` through the
// shell (args are shell words: quote what needs it) with stdout and stderr to files in that
// directory and stdin from /dev/null (or a given file), and returns what it printed. The exit
// code is the process's, or -1 when it did not exit normally (killed by a signal).
// expect_user_error checks the shape every bad-input error must have: exit code 1 and exactly
// one line on stderr, ending in a newline, that contains the given text.
//
// A derived fixture that needs more in SetUp calls CliTest::SetUp() first.
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "forge_bin.h"

namespace forge::testing {

struct CmdResult {
  int code;  // exit code, or -1 when killed by a signal
  std::string out, err;
};

// The bytes of a file ("" when it cannot be opened).
inline std::string slurp(const std::filesystem::path& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

class CliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    std::string name = std::string("forge_") + info->test_suite_name() + "_" + info->name() + "_" +
                       std::to_string(::getpid());
    std::replace(name.begin(), name.end(), '/', '_');  // parameterized names hold '/'
    dir_ = std::filesystem::temp_directory_path() / name;
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // A path inside the test's directory.
  std::string p(const std::string& name) const { return (dir_ / name).string(); }

  // Writes `content` to p(name) (creating its parent directories); returns the path.
  std::string write(const std::string& name, const std::string& content) const {
    std::filesystem::create_directories((dir_ / name).parent_path());
    std::ofstream(p(name), std::ios::binary) << content;
    return p(name);
  }

  // `FORGE_BIN args`, stdin from `stdin_path`.
  CmdResult forge(const std::string& args, const std::string& stdin_path = "/dev/null") const {
    return forge_env("", args, stdin_path);
  }
  // `ENV FORGE_BIN args`: env is shell assignments such as "OMP_WAIT_POLICY=passive", or "".
  CmdResult forge_env(const std::string& env, const std::string& args,
                      const std::string& stdin_path = "/dev/null") const {
    const std::string out = p("stdout"), err = p("stderr");
    const std::string cmd = (env.empty() ? "" : env + " ") + FORGE_BIN + " " + args + " >" + out +
                            " 2>" + err + " <" + stdin_path;
    const int status = std::system(cmd.c_str());
    return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, slurp(out), slurp(err)};
  }

  // A bad-input error as users must see it: exit 1, one line on stderr that names `needle`.
  static void expect_user_error(const CmdResult& r, const std::string& needle) {
    EXPECT_EQ(r.code, 1) << r.err;
    EXPECT_NE(r.err.find(needle), std::string::npos) << needle << " in: " << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_TRUE(!r.err.empty() && r.err.back() == '\n') << "one line: " << r.err;
  }

  std::filesystem::path dir_;
};

}  // namespace forge::testing
