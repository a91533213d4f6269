#include "forge/io/model_files.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "forge/core/error.h"
#include "forge/io/atomic_file.h"

namespace forge::io {

namespace fs = std::filesystem;

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error(str(path, ": cannot open"));
  std::stringstream text;
  text << f.rdbuf();
  if (f.bad()) throw Error(str(path, ": read failed"));
  return text.str();
}

FileSet read_files(const std::string& dir, std::span<const char* const> names) {
  FileSet files;
  for (const char* name : names) {
    const std::string path = (fs::path(dir) / name).string();
    std::error_code ec;
    if (fs::is_regular_file(path, ec)) files[name] = read_file(path);
  }
  return files;
}

void write_files(const std::string& dir, const FileSet& files) {
  for (const auto& [name, bytes] : files) write_file_atomic((fs::path(dir) / name).string(), bytes);
}

}  // namespace forge::io
