// The atomic-replace helpers: a file or directory is replaced whole or not at all, temporary
// names never outlive a write, and every failure is a one-line error naming the path.
#include "forge/io/atomic_file.h"

#include <signal.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "forge/core/error.h"
#include "testing.h"

namespace forge::io {
namespace {

namespace fs = std::filesystem;

class AtomicFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "forge-atomic-XXXXXX").string();
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string path(const std::string& name) const { return dir_ + "/" + name; }
  static std::string read(const std::string& p) {
    std::ifstream f(p, std::ios::binary);
    std::stringstream s;
    s << f.rdbuf();
    return s.str();
  }
  // The error message of f(), or "" when it did not throw forge::Error.
  template <typename F>
  static std::string error_of(F&& f) {
    try {
      f();
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  }
  // Names in the test directory, sorted.
  std::vector<std::string> listing() const {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir_)) names.push_back(e.path().filename());
    std::sort(names.begin(), names.end());
    return names;
  }

  std::string dir_;
};

TEST_F(AtomicFileTest, WritesAndReplacesWholeFiles) {
  const std::string p = path("a.json");
  write_file_atomic(p, "first, and longer than the second");
  EXPECT_EQ(read(p), "first, and longer than the second");
  std::ofstream(p + ".tmp") << "stale leftover of a crashed write";
  write_file_atomic(p, "second");
  EXPECT_EQ(read(p), "second");
  write_file_atomic(p, "");
  EXPECT_EQ(read(p), "");
  EXPECT_EQ(listing(), std::vector<std::string>{"a.json"});
}

TEST_F(AtomicFileTest, StreamsPiecesAndOnlyCommitMakesThemVisible) {
  const std::string p = path("s.bin");
  write_file_atomic(p, "old");
  {
    AtomicFile f(p);
    f.write("abc", 3);
    f.write(std::string(100000, 'x'));
    EXPECT_EQ(read(p), "old");  // nothing visible before commit()
    EXPECT_TRUE(fs::exists(p + ".tmp"));
    f.commit();
  }
  EXPECT_EQ(read(p), "abc" + std::string(100000, 'x'));
  EXPECT_FALSE(fs::exists(p + ".tmp"));
}

TEST_F(AtomicFileTest, AbandonedWriteKeepsTheOldFileAndRemovesTheTemp) {
  const std::string p = path("model.safetensors");
  write_file_atomic(p, "good");
  const std::string msg = error_of([&] {
    AtomicFile f(p);
    f.write("half a fi", 9);
    throw Error("the writer failed half-way");
  });
  EXPECT_EQ(msg, "the writer failed half-way");
  EXPECT_EQ(read(p), "good");
  EXPECT_EQ(listing(), std::vector<std::string>{"model.safetensors"});
}

TEST_F(AtomicFileTest, MissingDirectoryIsAOneLineErrorAndCreatesNothing) {
  const std::string p = path("no/such/dir/x.bin");
  const std::string msg = error_of([&] { write_file_atomic(p, "x"); });
  EXPECT_NE(msg.find(p + ": cannot create " + p + ".tmp: "), std::string::npos) << msg;
  EXPECT_NE(msg.find(std::strerror(ENOENT)), std::string::npos) << msg;
  EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  EXPECT_TRUE(listing().empty());
}

TEST_F(AtomicFileTest, WriteErrorRemovesTheTempAndKeepsTheOldFile) {
  // The temp name points at /dev/full, so every write fails with ENOSPC.
  if (!fs::exists("/dev/full")) GTEST_SKIP() << "no /dev/full";
  const std::string p = path("tokenizer.json");
  write_file_atomic(p, "good");
  fs::create_symlink("/dev/full", p + ".tmp");
  const std::string msg = error_of([&] { write_file_atomic(p, "new contents"); });
  EXPECT_NE(msg.find(p + ": cannot write " + p + ".tmp: " + std::strerror(ENOSPC)),
            std::string::npos)
      << msg;
  EXPECT_EQ(read(p), "good");
  EXPECT_EQ(listing(), std::vector<std::string>{"tokenizer.json"});
}

TEST_F(AtomicFileTest, RenameErrorRemovesTheTempAndKeepsTheTarget) {
  // The target is a non-empty directory: rename() refuses.
  const std::string p = path("dir.bin");
  fs::create_directory(p);
  std::ofstream(p + "/keep") << "x";
  const std::string msg = error_of([&] { write_file_atomic(p, "data"); });
  EXPECT_NE(msg.find(p + ": cannot rename " + p + ".tmp over it: "), std::string::npos) << msg;
  EXPECT_EQ(read(p + "/keep"), "x");
  EXPECT_EQ(listing(), std::vector<std::string>{"dir.bin"});
}

TEST_F(AtomicFileTest, DirectoryIsReplacedWholeOrNotAtAll) {
  const std::string p = path("step_000005");
  {
    AtomicDir d(p);
    EXPECT_EQ(d.tmp_path(), path(".tmp-step_000005"));
    write_file_atomic(d.tmp_path() + "/a", "1");
    EXPECT_FALSE(fs::exists(p));
    d.commit();
  }
  EXPECT_EQ(read(p + "/a"), "1");
  // Replacing it: the new contents only, no leftovers.
  {
    AtomicDir d(p);
    write_file_atomic(d.tmp_path() + "/b", "2");
    d.commit();
  }
  EXPECT_FALSE(fs::exists(p + "/a"));
  EXPECT_EQ(read(p + "/b"), "2");
  EXPECT_EQ(listing(), std::vector<std::string>{"step_000005"});
  // Abandoned half-way (an exception): the old directory stays, the temporary one goes.
  const std::string msg = error_of([&] {
    AtomicDir d(p);
    write_file_atomic(d.tmp_path() + "/c", "3");
    throw Error("save failed");
  });
  EXPECT_EQ(msg, "save failed");
  EXPECT_EQ(read(p + "/b"), "2");
  EXPECT_FALSE(fs::exists(p + "/c"));
  EXPECT_EQ(listing(), std::vector<std::string>{"step_000005"});
  // A stale temporary directory of a crashed save is replaced, not merged into.
  fs::create_directory(path(".tmp-step_000006"));
  std::ofstream(path(".tmp-step_000006/stale")) << "x";
  {
    AtomicDir d(path("step_000006"));
    d.commit();
  }
  EXPECT_TRUE(fs::is_empty(path("step_000006")));
  const std::string missing = error_of([&] { AtomicDir d(path("none/step_1")); });
  EXPECT_NE(missing.find(path("none/step_1") + ": cannot create "), std::string::npos) << missing;
}

// A full disk as a file-size limit (RLIMIT_FSIZE, which root cannot ignore either) in a child
// process, SIGXFSZ ignored as forge ignores it: the write fails with EFBIG part-way, the error
// names the file and the reason, the old file is intact and the temporary file is gone.
TEST_F(AtomicFileTest, FileSizeLimitFailsTheWriteAndKeepsTheOldFile) {
  const std::string p = path("model.safetensors");
  write_file_atomic(p, "good");
  const std::string msg_path = path("message");
  const pid_t pid = fork();
  if (pid == 0) {
    signal(SIGXFSZ, SIG_IGN);
    const rlimit lim{1000, 1000};
    if (setrlimit(RLIMIT_FSIZE, &lim) != 0) _exit(2);
    try {
      write_file_atomic(p, std::string(5000, 'x'));
    } catch (const Error& e) {
      FILE* f = std::fopen(msg_path.c_str(), "w");  // a few bytes: under the limit
      std::fputs(e.what(), f);
      std::fclose(f);
      _exit(0);
    }
    _exit(3);  // no error
  }
  int status = 0;
  waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFEXITED(status)) << "killed by signal " << WTERMSIG(status);
  ASSERT_EQ(WEXITSTATUS(status), 0);
  const std::string msg = read(msg_path);
  EXPECT_NE(msg.find(p + ": cannot write " + p + ".tmp: " + std::strerror(EFBIG)),
            std::string::npos)
      << msg;
  EXPECT_EQ(read(p), "good");
  EXPECT_EQ(listing(), (std::vector<std::string>{"message", "model.safetensors"}));
}

// Replacing a directory leaves no trace of the old one beside it (the swap, or the fallback's
// cleanup); and where the fallback's two renames were cut apart by a crash — no NAME, the old
// directory under .tmp-NAME.old, the new one complete under .tmp-NAME — the next AtomicDir of
// that name puts the old one back before it starts.
TEST_F(AtomicFileTest, CrashBetweenTheFallbacksRenamesLosesNothing) {
  const std::string p = path("model");
  for (const char* content : {"1", "2"}) {
    AtomicDir d(p);
    write_file_atomic(d.tmp_path() + "/w", content);
    d.commit();
  }
  EXPECT_EQ(read(p + "/w"), "2");
  EXPECT_EQ(listing(), std::vector<std::string>{"model"});
  fs::rename(p, path(".tmp-model.old"));
  fs::create_directory(path(".tmp-model"));
  std::ofstream(path(".tmp-model/w")) << "3";
  {
    AtomicDir d(p);  // abandoned: only the repair happens
    EXPECT_EQ(read(p + "/w"), "2");
  }
  EXPECT_EQ(listing(), std::vector<std::string>{"model"});
}

}  // namespace
}  // namespace forge::io
