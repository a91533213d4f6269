#include "forge/data/shard.h"

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "forge/core/error.h"
#include "forge/data/loader.h"
#include "testing.h"

namespace forge {
namespace {

namespace fs = std::filesystem;

class ShardTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("forge_shard_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  // Writes a shard byte by byte as llm.c does, independently of write_shard.
  void write_raw(const std::string& p, int32_t magic, int32_t version, int32_t count,
                 const std::vector<uint16_t>& tokens) {
    std::vector<int32_t> header(256, 0);
    header[0] = magic;
    header[1] = version;
    header[2] = count;
    std::ofstream f(p, std::ios::binary);
    f.write(reinterpret_cast<const char*>(header.data()), 1024);
    f.write(reinterpret_cast<const char*>(tokens.data()), tokens.size() * 2);
  }

  fs::path dir_;
};

TEST_F(ShardTest, ReadsAnLlmcShardWrittenByHand) {
  write_raw(path("a.bin"), 20240520, 1, 4, {7, 65535, 0, 300});
  const Shard s = Shard::open(path("a.bin"));
  ASSERT_EQ(s.size(), 4);
  EXPECT_EQ(s.token_bytes(), 2);
  EXPECT_EQ(s.at(0), 7u);
  EXPECT_EQ(s.at(1), 65535u);
  EXPECT_EQ(s.at(3), 300u);
  EXPECT_EQ(s.max_token(), 65535u);
}

TEST_F(ShardTest, WriteShardPicksTheFormatAndRoundTrips) {
  const std::vector<uint32_t> small = {1, 2, 3, 65535};
  write_shard(path("s.bin"), small);
  const Shard s = Shard::open(path("s.bin"));
  EXPECT_EQ(s.token_bytes(), 2);
  EXPECT_EQ(fs::file_size(path("s.bin")), 1024u + 4 * 2);
  const std::vector<uint32_t> wide = {1, 70000, 128255};
  write_shard(path("w.bin"), wide);
  const Shard w = Shard::open(path("w.bin"));
  EXPECT_EQ(w.token_bytes(), 4);
  std::vector<int32_t> out(3);
  w.read(0, 3, out.data());
  EXPECT_EQ(out, (std::vector<int32_t>{1, 70000, 128255}));
  std::ifstream f(path("w.bin"), std::ios::binary);
  int32_t header[3];
  f.read(reinterpret_cast<char*>(header), 12);
  EXPECT_EQ(header[0], 20240801);
  EXPECT_EQ(header[1], 7);
  EXPECT_EQ(header[2], 3);
}

void expect_error(const std::function<void()>& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "expected forge::Error mentioning '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << "multi-line: " << e.what();
  }
}

TEST_F(ShardTest, RejectsBadShardsWithOneLineErrors) {
  write_raw(path("magic.bin"), 12345, 1, 2, {1, 2});
  expect_error([&] { Shard::open(path("magic.bin")); }, "wrong magic 12345");
  write_raw(path("version.bin"), 20240520, 7, 2, {1, 2});
  expect_error([&] { Shard::open(path("version.bin")); }, "version 7");
  write_raw(path("trunc.bin"), 20240520, 1, 10, {1, 2});
  expect_error([&] { Shard::open(path("trunc.bin")); }, "truncated");
  write_raw(path("extra.bin"), 20240520, 1, 1, {1, 2});
  expect_error([&] { Shard::open(path("extra.bin")); }, "past the 1 tokens");
  {
    std::ofstream f(path("short.bin"), std::ios::binary);
    f << "tiny";
  }
  expect_error([&] { Shard::open(path("short.bin")); }, "shorter than the 1024-byte header");
  expect_error([&] { Shard::open(path("missing.bin")); }, "missing.bin");
  write_raw(path("ids.bin"), 20240520, 1, 3, {1, 50, 2});
  expect_error([&] { Shard::open(path("ids.bin"), 50); }, "token id 50 at position 1");
  EXPECT_NO_THROW(Shard::open(path("ids.bin"), 51));
}

TEST_F(ShardTest, ListShardsSortsAndFiltersBySplit) {
  for (const char* n : {"train_000001.bin", "train_000000.bin", "val_000000.bin", "notes.txt"})
    write_shard(path(n), {1, 2, 3});
  const auto train = list_shards(dir_.string(), "train");
  ASSERT_EQ(train.size(), 2u);
  EXPECT_TRUE(train[0].ends_with("train_000000.bin"));
  EXPECT_TRUE(train[1].ends_with("train_000001.bin"));
  EXPECT_EQ(list_shards(dir_.string(), "val").size(), 1u);
  EXPECT_EQ(list_shards(path("val_000000.bin"), "train").size(), 1u);  // a file is itself
  EXPECT_THROW(list_shards(path("nope"), "train"), Error);
}

TEST_F(ShardTest, TrainLoaderWindowsAreContiguousAndShifted) {
  std::vector<uint32_t> tokens(1000);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint32_t>(i % 997);
  write_shard(path("train_000000.bin"), tokens);
  write_shard(path("val_000000.bin"), tokens);
  Dataset ds = Dataset::open(dir_.string(), 1000);
  const int B = 4, T = 16;
  TrainLoader a(&ds.shards, ds.train, T, 7), b(&ds.shards, ds.train, T, 7);
  std::vector<int32_t> x(B * T), y(B * T), x2(B * T), y2(B * T);
  for (int step = 0; step < 5; ++step) {
    a.next_batch(B, x.data(), y.data());
    b.next_batch(B, x2.data(), y2.data());
    EXPECT_EQ(x, x2);  // same seed, same batches
    for (int r = 0; r < B; ++r)
      for (int t = 0; t < T; ++t) {
        EXPECT_EQ(y[r * T + t], (x[r * T + t] + 1) % 997);  // targets are inputs shifted by one
        if (t > 0) {
          EXPECT_EQ(x[r * T + t], (x[r * T + t - 1] + 1) % 997);
        }
      }
  }
  // Restoring the RNG offset restores the stream.
  TrainLoader c(&ds.shards, ds.train, T, 7);
  c.set_rng_offset(a.rng_offset());
  a.next_batch(B, x.data(), y.data());
  c.next_batch(B, x2.data(), y2.data());
  EXPECT_EQ(x, x2);
}

TEST_F(ShardTest, EvalWindowsFollowTheEvalContract) {
  std::vector<uint32_t> tokens(50);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint32_t>(i);
  write_shard(path("one.bin"), tokens);
  Dataset ds = Dataset::open(path("one.bin"), 100, 0.0);
  EvalWindows w(&ds.shards, ds.train, 8);
  EXPECT_EQ(w.count(), 6);  // windows need T + 1 tokens at stride T: (50 − 1) / 8
  std::vector<int32_t> x(8), y(8);
  w.window(2, x.data(), y.data());
  EXPECT_EQ(x[0], 16);
  EXPECT_EQ(y[7], 24);
}

TEST_F(ShardTest, SingleFileHoldsOutItsTailForValidation) {
  write_shard(path("one.bin"), std::vector<uint32_t>(1000, 3));
  Dataset ds = Dataset::open(path("one.bin"), 10);
  EXPECT_EQ(ds.train_tokens(), 950);
  EXPECT_EQ(ds.val_tokens(), 50);
}

// A shard that cannot be written (the disk is full) leaves the old shard and no temporary file.
TEST_F(ShardTest, FailedWriteKeepsTheOldShard) {
  if (!fs::exists("/dev/full")) GTEST_SKIP() << "no /dev/full";
  const std::string p = path("train_000000.bin");
  write_shard(p, {1, 2, 3});
  fs::create_symlink("/dev/full", p + ".tmp");
  try {
    write_shard(p, std::vector<uint32_t>(5000, 7));
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(p + ": cannot write"), std::string::npos) << e.what();
  }
  const Shard s = Shard::open(p);
  EXPECT_EQ(s.size(), 3);
  EXPECT_FALSE(fs::exists(fs::symlink_status(p + ".tmp")));
}

}  // namespace
}  // namespace forge
