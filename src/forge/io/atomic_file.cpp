#include "forge/io/atomic_file.h"

#include <fcntl.h>
#include <stdio.h>  // renameat2, RENAME_EXCHANGE (glibc >= 2.28, _GNU_SOURCE)
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "forge/core/error.h"

namespace forge::io {

namespace fs = std::filesystem;

namespace {

std::string parent_dir(const std::string& path) {
  const fs::path parent = fs::path(path).parent_path();
  return parent.empty() ? "." : parent.string();
}

}  // namespace

AtomicFile::AtomicFile(std::string path) : path_(std::move(path)), tmp_(path_ + ".tmp") {
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) throw Error(str(path_, ": cannot create ", tmp_, ": ", std::strerror(errno)));
}

AtomicFile::~AtomicFile() {
  if (fd_ < 0) return;  // committed, or already cleaned up by fail()
  ::close(fd_);
  ::unlink(tmp_.c_str());
}

void AtomicFile::fail(const char* step, int err) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  ::unlink(tmp_.c_str());
  throw Error(str(path_, ": cannot ", step, " ", tmp_, ": ", std::strerror(err)));
}

void AtomicFile::write(const void* data, size_t n) {
  FORGE_CHECK(fd_ >= 0, path_, ": write after commit or failure");
  const uint8_t* p = static_cast<const uint8_t*>(data);
  while (n > 0) {
    // Linux writes at most ~2 GiB per call; larger requests only come back short.
    const ssize_t w = ::write(fd_, p, std::min<size_t>(n, size_t{1} << 30));
    if (w < 0) {
      if (errno == EINTR) continue;
      fail("write", errno);
    }
    if (w == 0) fail("write", EIO);
    p += w;
    n -= static_cast<size_t>(w);
  }
}

void AtomicFile::write_at(uint64_t offset, const void* data, size_t n) {
  FORGE_CHECK(fd_ >= 0, path_, ": write after commit or failure");
  const uint8_t* p = static_cast<const uint8_t*>(data);
  while (n > 0) {
    const ssize_t w =
        ::pwrite(fd_, p, std::min<size_t>(n, size_t{1} << 30), static_cast<off_t>(offset));
    if (w < 0) {
      if (errno == EINTR) continue;
      fail("write", errno);
    }
    if (w == 0) fail("write", EIO);
    p += w;
    offset += static_cast<uint64_t>(w);
    n -= static_cast<size_t>(w);
  }
}

void AtomicFile::commit() {
  FORGE_CHECK(fd_ >= 0, path_, ": commit after commit or failure");
  if (::fsync(fd_) != 0) fail("fsync", errno);
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) {
    const int err = errno;
    ::unlink(tmp_.c_str());
    throw Error(str(path_, ": cannot close ", tmp_, ": ", std::strerror(err)));
  }
  if (::rename(tmp_.c_str(), path_.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp_.c_str());
    throw Error(str(path_, ": cannot rename ", tmp_, " over it: ", std::strerror(err)));
  }
  fsync_dir(parent_dir(path_));
}

void write_file_atomic(const std::string& path, std::string_view bytes) {
  AtomicFile f(path);
  f.write(bytes);
  f.commit();
}

void fsync_dir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

AtomicDir::AtomicDir(std::string path) : path_(std::move(path)) {
  const fs::path p(path_);
  tmp_ = (p.parent_path() / (kAtomicDirTmpPrefix + p.filename().string())).string();
  std::error_code ec;
  // A crash between the two renames of commit()'s fallback left PATH missing and the old
  // directory aside: put it back before anything else, so that it is not lost.
  const std::string old = tmp_ + ".old";
  if (!fs::exists(path_, ec) && fs::is_directory(old, ec)) fs::rename(old, path_, ec);
  fs::remove_all(tmp_, ec);
  if (ec) throw Error(str(path_, ": cannot remove the stale ", tmp_, ": ", ec.message()));
  if (!fs::create_directory(tmp_, ec) || ec)
    throw Error(
        str(path_, ": cannot create ", tmp_, ": ", ec ? ec.message() : std::string("it exists")));
}

AtomicDir::~AtomicDir() {
  if (committed_) return;
  std::error_code ec;
  fs::remove_all(tmp_, ec);
}

void AtomicDir::commit() {
  FORGE_CHECK(!committed_, path_, ": committed twice");
  fsync_dir(tmp_);
  std::error_code ec;
  const bool replace = fs::exists(path_, ec);
  if (replace) {
    // One atomic swap where the file system has it (Linux renameat2, ext4, xfs, btrfs, tmpfs):
    // PATH is the old directory or the new one at every instant, never missing. The old one is
    // then under the temporary name, which readers ignore and a later save removes.
    if (::renameat2(AT_FDCWD, tmp_.c_str(), AT_FDCWD, path_.c_str(), RENAME_EXCHANGE) == 0) {
      committed_ = true;
      fsync_dir(parent_dir(path_));
      fs::remove_all(tmp_, ec);
      return;
    }
    if (errno != EINVAL && errno != ENOSYS && errno != ENOTSUP)
      throw Error(str(path_, ": cannot swap ", tmp_, " into place: ", std::strerror(errno)));
  }
  // No swap: move the old directory aside, then rename (the constructor repairs a crash
  // between the two).
  const std::string old = tmp_ + ".old";
  fs::remove_all(old, ec);  // a crash between the renames of an earlier commit
  if (replace) {
    fs::rename(path_, old, ec);
    if (ec) throw Error(str(path_, ": cannot move it aside to ", old, ": ", ec.message()));
  }
  fs::rename(tmp_, path_, ec);
  if (ec) {
    const std::string why = ec.message();
    if (replace) fs::rename(old, path_, ec);  // put the old one back
    throw Error(str(path_, ": cannot rename ", tmp_, " to it: ", why));
  }
  committed_ = true;
  fsync_dir(parent_dir(path_));
  if (replace) fs::remove_all(old, ec);
}

}  // namespace forge::io
