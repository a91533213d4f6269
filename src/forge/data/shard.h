// Token shards in llm.c's format, so llm.c's data scripts and Forge's are interchangeable:
// a header of 256 int32 {magic, version, num_tokens, 0...} followed by the tokens.
//   magic 20240520, version 1: uint16 tokens (vocabularies up to 65,536)
//   magic 20240801, version 7: uint32 tokens (larger vocabularies, as llm.c writes for Llama 3)
// Shards are memory-mapped and validated on open: magic/version pair, a token count that
// matches the file size exactly, and (given the vocabulary) every id below it — one pass at
// open, so a bad shard fails before training starts rather than hours into it.
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

namespace forge {

namespace io {
class AtomicFile;
}  // namespace io

inline constexpr int32_t kShardMagicU16 = 20240520;
inline constexpr int32_t kShardMagicU32 = 20240801;
inline constexpr int kShardHeaderInts = 256;

class Shard {
 public:
  // Throws forge::Error naming the file and the problem. vocab_size > 0 also checks the ids.
  static Shard open(const std::string& path, int64_t vocab_size = 0);
  Shard(Shard&& o) noexcept;
  Shard& operator=(Shard&& o) noexcept;
  Shard(const Shard&) = delete;
  Shard& operator=(const Shard&) = delete;
  ~Shard();

  int64_t size() const { return num_tokens_; }
  int token_bytes() const { return token_bytes_; }
  uint32_t at(int64_t i) const;
  // Copies tokens [start, start + count) as int32.
  void read(int64_t start, int64_t count, int32_t* out) const;
  uint32_t max_token() const;
  const std::string& path() const { return path_; }

 private:
  Shard() = default;
  std::string path_;
  void* map_ = nullptr;
  size_t map_bytes_ = 0;
  const uint8_t* tokens_ = nullptr;
  int64_t num_tokens_ = 0;
  int token_bytes_ = 2;
};

// Writes a shard atomically (io/atomic_file.h: temporary name, fsync, rename). Uses the uint16
// format when every id fits, else the uint32 one. Throws forge::Error on I/O failure.
void write_shard(const std::string& path, const std::vector<uint32_t>& tokens);

// Writes one shard a chunk at a time: memory stays one chunk whatever the shard's size, and the
// bytes equal write_shard's for the same tokens. With may_be_wide false the caller promises ids
// below 65,536 (a vocabulary that small): tokens go to PATH.tmp as uint16 and the header is
// filled in at commit(). With may_be_wide true the width is known only at the end (write_shard
// picks uint16 when every id fits), so tokens are spilled as uint32 to PATH.u32 and copied into
// the shard at commit(), narrowed when every id fitted. Destroyed without commit() (an exception
// on the way), it removes what it wrote. Throws forge::Error on I/O failure.
class ShardFileWriter {
 public:
  ShardFileWriter(std::string path, bool may_be_wide);
  ShardFileWriter(const ShardFileWriter&) = delete;
  ShardFileWriter& operator=(const ShardFileWriter&) = delete;
  ~ShardFileWriter();

  void append(const uint32_t* tokens, size_t n);
  // Writes the header, fsyncs and renames the shard into place (io/atomic_file.h).
  void commit();
  int64_t size() const { return count_; }  // tokens appended so far

 private:
  void flush();

  std::string path_;
  bool may_be_wide_;
  std::unique_ptr<io::AtomicFile> file_;  // narrow: the shard; wide: opened at commit()
  std::FILE* spill_ = nullptr;            // wide: the uint32 tokens so far
  std::vector<uint16_t> buf16_;
  std::vector<uint32_t> buf32_;
  int64_t count_ = 0;
  uint32_t max_ = 0;
};

// The shards a --data argument names: a file is itself (for any split); a directory gives its
// `<split>_*.bin` files in name order (split is "train" or "val"); may be empty for "val".
std::vector<std::string> list_shards(const std::string& data, const std::string& split);

}  // namespace forge
