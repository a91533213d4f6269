// SHA-256 against the FIPS 180-4 / NIST CAVP test vectors, and streaming in odd pieces.
#include "forge/core/sha256.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "forge/core/error.h"
#include "testing.h"

namespace forge {
namespace {

std::string sha(const std::string& s) {
  Sha256 h;
  h.update(s.data(), s.size());
  return h.hex_digest();
}

TEST(Sha256, StandardVectors) {
  EXPECT_EQ(sha(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(sha("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(sha("abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopq"
                "klmnopqrlmnopqrsmnopqrstnopqrstu"),
            "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1");
  EXPECT_EQ(sha(std::string(1000000, 'a')),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(Sha256, PaddingBoundaries) {
  // 55, 56 and 64 bytes: the length fits in the last block, just doesn't, exactly one block.
  // Values from Python's hashlib.sha256(b"a" * n).hexdigest().
  EXPECT_EQ(sha(std::string(55, 'a')),
            "9f4390f8d30c2dd92ec9f095b65e2b9ae9b0a925a5258e241c9f1e910f734318");
  EXPECT_EQ(sha(std::string(56, 'a')),
            "b35439a4ac6f0948b6d6f9e3c6af0f5f590ce20f1bde7090ef7970686ec6738a");
  EXPECT_EQ(sha(std::string(64, 'a')),
            "ffe054fe7ae0cb6dc65c3af9b61d5209f439851db43d0ba5997337df154668eb");
}

TEST(Sha256, StreamingInPiecesMatchesOneShot) {
  std::string s;
  for (int i = 0; i < 1000; ++i) s += static_cast<char>(i * 7 + 3);
  Sha256 h;
  for (size_t pos = 0, step = 1; pos < s.size(); pos += step, step = step % 67 + 1)
    h.update(s.data() + pos, std::min(step, s.size() - pos));
  EXPECT_EQ(h.hex_digest(), sha(s));
}

TEST(Sha256, File) {
  const auto path =
      std::filesystem::temp_directory_path() / ("forge_sha_" + std::to_string(::getpid()));
  std::ofstream(path, std::ios::binary) << "abc";
  EXPECT_EQ(sha256_file(path.string()),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  std::filesystem::remove(path);
  EXPECT_THROW(sha256_file(path.string()), Error);
}

}  // namespace
}  // namespace forge
