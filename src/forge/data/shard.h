// Token shards in llm.c's format, so llm.c's data scripts and Forge's are interchangeable:
// a header of 256 int32 {magic, version, num_tokens, 0...} followed by the tokens.
//   magic 20240520, version 1: uint16 tokens (vocabularies up to 65,536)
//   magic 20240801, version 7: uint32 tokens (larger vocabularies, as llm.c writes for Llama 3)
// Shards are memory-mapped and validated on open: magic/version pair, a token count that
// matches the file size exactly, and (given the vocabulary) every id below it — one pass at
// open, so a bad shard fails before training starts rather than hours into it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace forge {

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

// The shards a --data argument names: a file is itself (for any split); a directory gives its
// `<split>_*.bin` files in name order (split is "train" or "val"); may be empty for "val".
std::vector<std::string> list_shards(const std::string& data, const std::string& split);

}  // namespace forge
