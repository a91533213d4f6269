// ShardFileWriter (a shard streamed a chunk at a time) against write_shard (the whole token
// vector at once, itself checked against a hand-written llm.c shard in shard_test.cpp): the same
// bytes for both widths, over chunk boundaries and appends of any size, and nothing left behind
// when a writer is dropped unfinished.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "forge/core/error.h"
#include "forge/data/shard.h"
#include "testing.h"

namespace forge {
namespace {

namespace fs = std::filesystem;

class ShardWriterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("forge_shard_writer_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  static std::string bytes_of(const std::string& p) {
    std::ifstream f(p, std::ios::binary);
    std::stringstream s;
    s << f.rdbuf();
    return s.str();
  }
  // Streams `tokens` into `name` in appends of uneven sizes (1, 2, 3, ... then the rest in
  // pieces of 700,001: across the writer's 2^20-token chunks) and commits.
  void stream(const std::string& name, const std::vector<uint32_t>& tokens, bool may_be_wide) {
    ShardFileWriter w(path(name), may_be_wide);
    size_t at = 0;
    for (size_t n = 1; n <= 5 && at + n <= tokens.size(); at += n, ++n) w.append(&tokens[at], n);
    while (at < tokens.size()) {
      const size_t n = std::min<size_t>(700'001, tokens.size() - at);
      w.append(&tokens[at], n);
      at += n;
    }
    EXPECT_EQ(w.size(), static_cast<int64_t>(tokens.size()));
    w.commit();
  }
  std::vector<std::string> files() const {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir_)) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  }

  fs::path dir_;
};

// 2.5 M tokens (2.4 of the writer's chunks), every id below 65,536.
std::vector<uint32_t> narrow_tokens() {
  std::vector<uint32_t> t(2'500'000);
  for (size_t i = 0; i < t.size(); ++i) t[i] = static_cast<uint32_t>((i * 7919) % 65536);
  return t;
}

TEST_F(ShardWriterTest, SameBytesAsWriteShard) {
  const std::vector<uint32_t> narrow = narrow_tokens();
  std::vector<uint32_t> wide = narrow;
  wide[1'600'000] = 128'255;  // one id past uint16, in the second chunk
  write_shard(path("narrow_ref.bin"), narrow);
  write_shard(path("wide_ref.bin"), wide);
  const std::string narrow_ref = bytes_of(path("narrow_ref.bin"));
  const std::string wide_ref = bytes_of(path("wide_ref.bin"));
  ASSERT_EQ(narrow_ref.size(), 1024 + 2 * narrow.size());
  ASSERT_EQ(wide_ref.size(), 1024 + 4 * wide.size());

  stream("narrow.bin", narrow, false);              // uint16 straight to the file
  stream("narrow_spilled.bin", narrow, true);       // spilled as uint32, narrowed at commit
  stream("wide.bin", wide, true);                   // spilled, kept uint32
  EXPECT_TRUE(bytes_of(path("narrow.bin")) == narrow_ref);
  EXPECT_TRUE(bytes_of(path("narrow_spilled.bin")) == narrow_ref);
  EXPECT_TRUE(bytes_of(path("wide.bin")) == wide_ref);
  // A one-token shard and an empty one, as write_shard writes them.
  write_shard(path("one_ref.bin"), {70'000});
  stream("one.bin", {70'000}, true);
  EXPECT_EQ(bytes_of(path("one.bin")), bytes_of(path("one_ref.bin")));
  write_shard(path("empty_ref.bin"), {});
  stream("empty.bin", {}, false);
  EXPECT_EQ(bytes_of(path("empty.bin")), bytes_of(path("empty_ref.bin")));
  // No spill or temporary file is left beside them.
  EXPECT_EQ(files(), (std::vector<std::string>{"empty.bin", "empty_ref.bin", "narrow.bin",
                                               "narrow_ref.bin", "narrow_spilled.bin",
                                               "one.bin", "one_ref.bin", "wide.bin",
                                               "wide_ref.bin"}));
}

TEST_F(ShardWriterTest, UnfinishedWriterLeavesNothing) {
  const std::vector<uint32_t> t = narrow_tokens();
  for (const bool may_be_wide : {false, true}) {
    ShardFileWriter w(path("s.bin"), may_be_wide);
    w.append(t.data(), t.size());
    EXPECT_FALSE(files().empty());  // the temporary or spill file is there while it writes
  }
  EXPECT_TRUE(files().empty());
}

TEST_F(ShardWriterTest, AWideIdInANarrowShardIsAnError) {
  const std::vector<uint32_t> t = {1, 2, 70'000};
  {
    ShardFileWriter w(path("s.bin"), false);
    EXPECT_THROW(w.append(t.data(), t.size()), Error);
  }
  EXPECT_TRUE(files().empty());
}

}  // namespace
}  // namespace forge
