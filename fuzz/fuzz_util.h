// What every fuzz target shares: the contract a reader of outside input must keep, and the
// plumbing to hand bytes to readers that take a path.
//
// The contract (the CLI's: "bad input gets a one-line error naming the problem, never a
// crash"): a reader either succeeds or throws forge::Error whose message is one non-empty line.
// Anything else is a finding and aborts the input: a crash or sanitizer report, a FORGE_CHECK,
// an exception of another type (a nlohmann::json or std exception means a check is missing:
// the CLI would print it without naming the file), a message with a newline in it (a name
// from the file printed raw can forge extra lines in a log), or std::bad_alloc (a size from
// the file was trusted before allocating).
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <new>
#include <string>
#include <string_view>

#include "forge/core/error.h"

namespace forge::fuzz {

// Aborts (a finding) unless `msg` is one non-empty line.
inline void require_one_line(const char* msg) {
  const std::string_view m(msg);
  if (m.empty() || m.find('\n') != std::string_view::npos ||
      m.find('\r') != std::string_view::npos) {
    std::fprintf(stderr, "fuzz: error message is not one line: [%s]\n", msg);
    std::abort();
  }
}

// Runs `body`; forge::Error with a one-line message is an accepted outcome, anything else that
// escapes aborts with what it was.
template <class F>
void expect_ok_or_error(F&& body) {
  try {
    body();
  } catch (const Error& e) {
    require_one_line(e.what());
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "fuzz: std::bad_alloc: a size from the input was trusted\n");
    std::abort();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fuzz: escaped exception (not forge::Error): %s\n", e.what());
    std::abort();
  }
}

// Runs `body`, which must not throw at all (the second half of a round trip, a check of what a
// successful read gave): any exception aborts.
template <class F>
void must_succeed(const char* what, F&& body) {
  try {
    body();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fuzz: %s threw: %s\n", what, e.what());
    std::abort();
  }
}

// Aborts with `what` when `ok` is false: an invariant of a successful read does not hold.
inline void require(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "fuzz: invariant broken: %s\n", what);
    std::abort();
  }
}

// An anonymous in-memory file (memfd) that readers open by path, /proc/self/fd/N: no disk
// traffic, and readers take their real open/mmap path. One per target, rewritten per input.
class MemFile {
 public:
  explicit MemFile(const char* name) : fd_(memfd_create(name, 0)) {
    if (fd_ < 0) {
      std::perror("memfd_create");
      std::abort();
    }
    path_ = "/proc/self/fd/" + std::to_string(fd_);
  }
  // Replaces the contents with `data`.
  const std::string& set(const uint8_t* data, size_t size) {
    if (ftruncate(fd_, 0) != 0 ||
        (size > 0 && pwrite(fd_, data, size, 0) != static_cast<ssize_t>(size))) {
      std::perror("memfd write");
      std::abort();
    }
    return path_;
  }
  const std::string& path() const { return path_; }

 private:
  int fd_;
  std::string path_;
};

// A scratch directory for readers that take a directory (model directories, checkpoints, GPT-2
// tokenizer files), made once per process under $TMPDIR and removed at exit.
class ScratchDir {
 public:
  explicit ScratchDir(const char* name) {
    namespace fs = std::filesystem;
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern =
        (fs::path(tmp && *tmp ? tmp : "/tmp") / (std::string(name) + "-XXXXXX")).string();
    if (!mkdtemp(pattern.data())) {
      std::perror("mkdtemp");
      std::abort();
    }
    path_ = pattern;
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;

  const std::string& path() const { return path_; }
  // Writes `size` bytes to PATH/name (replacing it) and returns the file's path.
  std::string write(const std::string& name, const void* data, size_t size) const {
    const std::string p = path_ + "/" + name;
    FILE* f = std::fopen(p.c_str(), "wb");
    if (!f || (size > 0 && std::fwrite(data, 1, size, f) != size) || std::fclose(f) != 0) {
      std::perror(p.c_str());
      std::abort();
    }
    return p;
  }
  std::string write(const std::string& name, std::string_view text) const {
    return write(name, text.data(), text.size());
  }

 private:
  std::string path_;
};

}  // namespace forge::fuzz
