#include "forge/data/shard.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "forge/core/error.h"
#include "forge/io/atomic_file.h"

namespace forge {

namespace fs = std::filesystem;

Shard Shard::open(const std::string& path, int64_t vocab_size) {
  Shard s;
  s.path_ = path;
  if (fs::is_directory(path)) throw Error(str(path, ": is a directory, expected a token shard"));
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) throw Error(str(path, ": cannot open token shard: ", std::strerror(errno)));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    throw Error(str(path, ": cannot stat: ", std::strerror(errno)));
  }
  const size_t bytes = static_cast<size_t>(st.st_size);
  const size_t header_bytes = kShardHeaderInts * sizeof(int32_t);
  if (bytes < header_bytes) {
    ::close(fd);
    throw Error(str(path, ": truncated token shard: ", bytes, " bytes, shorter than the ", header_bytes, "-byte header"));
  }
  void* map = ::mmap(nullptr, bytes, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (map == MAP_FAILED) throw Error(str(path, ": cannot mmap: ", std::strerror(errno)));
  s.map_ = map;
  s.map_bytes_ = bytes;
  int32_t header[3];
  std::memcpy(header, map, sizeof(header));
  if (header[0] == kShardMagicU16) {
    if (header[1] != 1) throw Error(str(path, ": token shard magic ", header[0], " with unsupported version ", header[1], " (expected 1)"));
    s.token_bytes_ = 2;
  } else if (header[0] == kShardMagicU32) {
    if (header[1] != 7) throw Error(str(path, ": token shard magic ", header[0], " with unsupported version ", header[1], " (expected 7)"));
    s.token_bytes_ = 4;
  } else {
    throw Error(str(path, ": not a token shard: wrong magic ", header[0], " (expected ", kShardMagicU16, " or ", kShardMagicU32, ")"));
  }
  if (header[2] < 0) throw Error(str(path, ": token shard header has a negative token count ", header[2]));
  s.num_tokens_ = header[2];
  const size_t expect = header_bytes + static_cast<size_t>(s.num_tokens_) * s.token_bytes_;
  if (bytes < expect)
    throw Error(str(path, ": truncated token shard: header says ", s.num_tokens_, " tokens (", expect, " bytes) but the file has ", bytes, " bytes"));
  if (bytes > expect)
    throw Error(str(path, ": token shard has ", bytes - expect, " bytes past the ", s.num_tokens_, " tokens its header declares"));
  s.tokens_ = static_cast<const uint8_t*>(map) + header_bytes;
  if (vocab_size > 0 && s.num_tokens_ > 0) {
    const uint32_t mx = s.max_token();
    if (static_cast<int64_t>(mx) >= vocab_size) {
      int64_t where = 0;
      while (s.at(where) != mx) ++where;
      throw Error(str(path, ": token id ", mx, " at position ", where, " is out of range for vocabulary size ", vocab_size));
    }
  }
  return s;
}

Shard::Shard(Shard&& o) noexcept { *this = std::move(o); }

Shard& Shard::operator=(Shard&& o) noexcept {
  if (this != &o) {
    if (map_) ::munmap(map_, map_bytes_);
    path_ = std::move(o.path_);
    map_ = o.map_;
    map_bytes_ = o.map_bytes_;
    tokens_ = o.tokens_;
    num_tokens_ = o.num_tokens_;
    token_bytes_ = o.token_bytes_;
    o.map_ = nullptr;
    o.tokens_ = nullptr;
  }
  return *this;
}

Shard::~Shard() {
  if (map_) ::munmap(map_, map_bytes_);
}

uint32_t Shard::at(int64_t i) const {
  if (token_bytes_ == 2) {
    uint16_t v;
    std::memcpy(&v, tokens_ + 2 * i, 2);
    return v;
  }
  uint32_t v;
  std::memcpy(&v, tokens_ + 4 * i, 4);
  return v;
}

void Shard::read(int64_t start, int64_t count, int32_t* out) const {
  FORGE_CHECK(start >= 0 && count >= 0 && start + count <= num_tokens_, "shard read [", start, ", +", count, ") past ", num_tokens_);
  for (int64_t i = 0; i < count; ++i) out[i] = static_cast<int32_t>(at(start + i));
}

uint32_t Shard::max_token() const {
  uint32_t mx = 0;
  if (token_bytes_ == 2) {
    const uint16_t* p = reinterpret_cast<const uint16_t*>(tokens_);  // header is 1024 bytes: aligned
#pragma omp parallel for reduction(max : mx)
    for (int64_t i = 0; i < num_tokens_; ++i) mx = std::max<uint32_t>(mx, p[i]);
  } else {
    const uint32_t* p = reinterpret_cast<const uint32_t*>(tokens_);
#pragma omp parallel for reduction(max : mx)
    for (int64_t i = 0; i < num_tokens_; ++i) mx = std::max<uint32_t>(mx, p[i]);
  }
  return mx;
}

void write_shard(const std::string& path, const std::vector<uint32_t>& tokens) {
  const uint32_t mx = tokens.empty() ? 0 : *std::max_element(tokens.begin(), tokens.end());
  const bool wide = mx > 0xFFFF;
  if (tokens.size() > static_cast<size_t>(INT32_MAX))
    throw Error(str(path, ": ", tokens.size(), " tokens do not fit one shard (at most 2^31 - 1)"));
  int32_t header[kShardHeaderInts] = {};
  header[0] = wide ? kShardMagicU32 : kShardMagicU16;
  header[1] = wide ? 7 : 1;
  header[2] = static_cast<int32_t>(tokens.size());
  io::AtomicFile f(path);
  f.write(header, sizeof(header));
  if (wide) {
    f.write(tokens.data(), tokens.size() * 4);
  } else {
    // Narrowed to uint16 a chunk at a time: no second copy of a multi-GB shard in memory.
    constexpr size_t kChunk = size_t{1} << 20;
    std::vector<uint16_t> chunk;
    for (size_t i = 0; i < tokens.size(); i += kChunk) {
      const size_t n = std::min(kChunk, tokens.size() - i);
      chunk.assign(tokens.begin() + i, tokens.begin() + i + n);
      f.write(chunk.data(), n * 2);
    }
  }
  f.commit();
}

namespace {

constexpr size_t kWriterChunk = size_t{1} << 20;  // tokens buffered before a write

// The 1024-byte header write_shard writes for `count` tokens of that width.
std::vector<int32_t> shard_header(bool wide, int64_t count) {
  std::vector<int32_t> h(kShardHeaderInts, 0);
  h[0] = wide ? kShardMagicU32 : kShardMagicU16;
  h[1] = wide ? 7 : 1;
  h[2] = static_cast<int32_t>(count);
  return h;
}

}  // namespace

ShardFileWriter::ShardFileWriter(std::string path, bool may_be_wide)
    : path_(std::move(path)), may_be_wide_(may_be_wide) {
  if (may_be_wide_) {
    const std::string spill = path_ + ".u32";
    spill_ = std::fopen(spill.c_str(), "w+b");
    if (!spill_) throw Error(str(path_, ": cannot create ", spill, ": ", std::strerror(errno)));
    buf32_.reserve(kWriterChunk);
  } else {
    file_ = std::make_unique<io::AtomicFile>(path_);
    const std::vector<int32_t> placeholder(kShardHeaderInts, 0);  // filled in by commit()
    file_->write(placeholder.data(), placeholder.size() * sizeof(int32_t));
    buf16_.reserve(kWriterChunk);
  }
}

ShardFileWriter::~ShardFileWriter() {
  if (spill_) {
    std::fclose(spill_);
    std::remove((path_ + ".u32").c_str());
  }
  // file_'s destructor removes PATH.tmp unless committed.
}

void ShardFileWriter::append(const uint32_t* tokens, size_t n) {
  if (count_ + static_cast<int64_t>(n) > INT32_MAX)
    throw Error(str(path_, ": more than 2^31 - 1 tokens do not fit one shard"));
  for (size_t i = 0; i < n; ++i) {
    const uint32_t t = tokens[i];
    max_ = std::max(max_, t);
    if (may_be_wide_) {
      buf32_.push_back(t);
      if (buf32_.size() == kWriterChunk) flush();
    } else {
      if (t > 0xFFFF)
        throw Error(str(path_, ": token id ", t, " does not fit the uint16 shard it was promised"));
      buf16_.push_back(static_cast<uint16_t>(t));
      if (buf16_.size() == kWriterChunk) flush();
    }
  }
  count_ += static_cast<int64_t>(n);
}

void ShardFileWriter::flush() {
  if (may_be_wide_) {
    if (!buf32_.empty() &&
        std::fwrite(buf32_.data(), 4, buf32_.size(), spill_) != buf32_.size())
      throw Error(str(path_, ": cannot write ", path_, ".u32: ", std::strerror(errno)));
    buf32_.clear();
  } else {
    file_->write(buf16_.data(), buf16_.size() * 2);
    buf16_.clear();
  }
}

void ShardFileWriter::commit() {
  flush();
  const bool wide = max_ > 0xFFFF;
  const std::vector<int32_t> header = shard_header(wide, count_);
  if (!may_be_wide_) {
    file_->write_at(0, header.data(), header.size() * sizeof(int32_t));
    file_->commit();
    return;
  }
  // Copy the spill into the shard, a chunk at a time, narrowed when every id fits.
  if (std::fflush(spill_) != 0 || std::fseek(spill_, 0, SEEK_SET) != 0)
    throw Error(str(path_, ": cannot read back ", path_, ".u32: ", std::strerror(errno)));
  file_ = std::make_unique<io::AtomicFile>(path_);
  file_->write(header.data(), header.size() * sizeof(int32_t));
  std::vector<uint32_t> chunk(kWriterChunk);
  std::vector<uint16_t> narrow;
  for (int64_t left = count_; left > 0;) {
    const size_t n = static_cast<size_t>(std::min<int64_t>(left, kWriterChunk));
    if (std::fread(chunk.data(), 4, n, spill_) != n)
      throw Error(str(path_, ": cannot read back ", path_, ".u32"));
    if (wide) {
      file_->write(chunk.data(), n * 4);
    } else {
      narrow.assign(chunk.begin(), chunk.begin() + static_cast<ptrdiff_t>(n));
      file_->write(narrow.data(), n * 2);
    }
    left -= static_cast<int64_t>(n);
  }
  file_->commit();
}

std::vector<std::string> list_shards(const std::string& data, const std::string& split) {
  if (!fs::exists(data)) throw Error(str(data, ": no such file or directory"));
  if (!fs::is_directory(data)) return {data};
  std::vector<std::string> out;
  const std::string prefix = split + "_";
  for (const auto& e : fs::directory_iterator(data)) {
    const std::string name = e.path().filename().string();
    if (e.is_regular_file() && name.starts_with(prefix) && name.ends_with(".bin")) out.push_back(e.path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace forge
