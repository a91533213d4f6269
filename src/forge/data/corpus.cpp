#include "forge/data/corpus.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "forge/core/error.h"

namespace forge {

namespace fs = std::filesystem;

std::vector<std::string> read_fortune_dir(const std::string& dir) {
  if (!fs::is_directory(dir)) throw Error(str(dir, ": corpus directory not found"));
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string ext = e.path().extension().string();
    if (!e.is_regular_file() || ext == ".dat" || ext == ".u8") continue;
    files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  std::vector<std::string> docs;
  for (const auto& f : files) {
    std::ifstream in(f, std::ios::binary);
    std::string line, doc;
    while (std::getline(in, line)) {
      if (line == "%") {
        if (!doc.empty()) docs.push_back(doc);
        doc.clear();
      } else {
        doc += line + "\n";
      }
    }
    if (!doc.empty()) docs.push_back(doc);
  }
  if (docs.empty()) throw Error(str(dir, ": no documents found"));
  return docs;
}

std::vector<uint32_t> byte_encode(const std::vector<std::string>& docs) {
  std::vector<uint32_t> out;
  for (const auto& d : docs) {
    for (unsigned char c : d) out.push_back(c);
    out.push_back(kByteEndOfText);
  }
  return out;
}

std::string byte_decode(const std::vector<int32_t>& ids) {
  std::string raw;
  for (int32_t id : ids) raw += id >= 0 && id < 256 ? static_cast<char>(id) : '\n';
  return sanitize_utf8(raw);
}

std::string sanitize_utf8(std::string_view raw) {
  std::string out;
  size_t i = 0;
  while (i < raw.size()) {
    const unsigned char c = raw[i];
    int len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    bool ok = len > 0 && i + len <= raw.size();
    for (int k = 1; ok && k < len; ++k) ok = (static_cast<unsigned char>(raw[i + k]) >> 6) == 0x2;
    if (ok && len > 1) {
      uint32_t cp = c & (0x7F >> len);
      for (int k = 1; k < len; ++k) cp = (cp << 6) | (raw[i + k] & 0x3F);
      const uint32_t min_cp[] = {0, 0, 0x80, 0x800, 0x10000};
      ok = cp >= min_cp[len] && cp <= 0x10FFFF && !(cp >= 0xD800 && cp <= 0xDFFF);
    }
    if (ok) {
      out.append(raw.substr(i, len));
      i += len;
    } else {
      out += "\xEF\xBF\xBD";
      i += 1;
    }
  }
  return out;
}

}  // namespace forge
