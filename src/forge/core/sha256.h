// SHA-256 (FIPS 180-4), for checksums that `forge validate` prints and that anyone can
// reproduce with `sha256sum`. Streaming: update() any number of times, then digest().
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace forge {

class Sha256 {
 public:
  Sha256();
  void update(const void* data, size_t n);
  // The 32-byte digest; the object must not be updated afterwards.
  std::array<uint8_t, 32> digest();
  // The digest as 64 lowercase hex digits.
  std::string hex_digest();

 private:
  void compress(const uint8_t* block);  // one 64-byte block

  std::array<uint32_t, 8> h_;
  std::array<uint8_t, 64> buf_{};
  size_t buf_len_ = 0;
  uint64_t total_bytes_ = 0;
};

// SHA-256 of a whole file, as hex; throws forge::Error if it cannot be read.
std::string sha256_file(const std::string& path);

}  // namespace forge
