// Replacing files and directories so that a crash or an I/O error never leaves a half-written
// one where a good one was (DESIGN.md, "Files a user sees"). Every writer of a file a user sees
// goes through here: model and optimizer safetensors, config.json, tokenizer.json,
// trainer_state.json, token shards, metrics cut back on resume, loss.svg, and checkpoint
// directories.
//
// A file is written to PATH.tmp in the same directory (a rename is atomic only within one file
// system), fsync'd and closed, renamed over PATH, and then the directory is fsync'd so that the
// rename itself survives a power loss. Readers see the old file or the new one, never a mix. On
// any error the temporary file is removed, PATH is untouched, and the forge::Error is one line,
// "PATH: cannot <step> PATH.tmp: <reason>". A stale PATH.tmp (a writer that crashed) is
// overwritten. One writer per path at a time: two writers of the same path share the name.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace forge::io {

// A file being written under its temporary name; commit() puts it in place. Destroyed without
// commit() (an exception on the way), it removes the temporary file and leaves PATH alone.
class AtomicFile {
 public:
  // Creates (or truncates) PATH.tmp. Throws forge::Error, e.g. when the directory is missing.
  explicit AtomicFile(std::string path);
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  ~AtomicFile();

  // Appends all n bytes (retrying short writes and EINTR). Throws forge::Error; the temporary
  // file is then already removed.
  void write(const void* data, size_t n);
  void write(std::string_view bytes) { write(bytes.data(), bytes.size()); }
  // Overwrites n bytes at `offset` (a header filled in once the rest is written); appending
  // with write() goes on at the end. Throws forge::Error as write() does.
  void write_at(uint64_t offset, const void* data, size_t n);
  // fsync, close, rename over PATH, fsync the directory. Throws forge::Error (temp removed).
  void commit();

  const std::string& path() const { return path_; }

 private:
  [[noreturn]] void fail(const char* step, int err);

  std::string path_, tmp_;
  int fd_ = -1;
};

// The whole file at once: AtomicFile(path), write(bytes), commit().
void write_file_atomic(const std::string& path, std::string_view bytes);

// fsyncs a directory, so that renames and creations inside it survive a crash. Best effort:
// some file systems refuse fsync on directories, and the data are safe under one name anyway.
void fsync_dir(const std::string& dir);

// A directory built under PARENT/.tmp-NAME and renamed to PARENT/NAME by commit(), replacing a
// directory of that name. Files inside are written with the functions above (so each is
// fsync'd); commit() fsyncs the temporary directory and renames it to PARENT/NAME. An existing
// PARENT/NAME is swapped with it in one atomic renameat2(RENAME_EXCHANGE) and then removed from
// the temporary name; on a file system without the swap it is moved aside to
// PARENT/.tmp-NAME.old first (rename() cannot replace a non-empty directory) and removed after.
// PARENT is fsync'd. A crash leaves PARENT/NAME complete (old or new), or, in the fallback's
// instant between its two renames, no PARENT/NAME but both complete directories under .tmp-
// names: the next AtomicDir of that name puts the old one back. Readers of PARENT must ignore
// ".tmp-" names. Destroyed without commit(), it removes the temporary directory; a multi-file
// save built in it is therefore seen whole or not at all, never as a mix of old and new files.
class AtomicDir {
 public:
  // Restores PARENT/NAME from a crashed fallback commit (above), removes a stale
  // PARENT/.tmp-NAME and creates it empty. PARENT must exist.
  explicit AtomicDir(std::string path);
  AtomicDir(const AtomicDir&) = delete;
  AtomicDir& operator=(const AtomicDir&) = delete;
  ~AtomicDir();

  const std::string& tmp_path() const { return tmp_; }
  void commit();

 private:
  std::string path_, tmp_;
  bool committed_ = false;
};

// ".tmp-": the prefix of AtomicDir's temporary names.
inline constexpr const char* kAtomicDirTmpPrefix = ".tmp-";

}  // namespace forge::io
