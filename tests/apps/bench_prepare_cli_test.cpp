// `forge bench prepare` on a tiny corpus: the table, the JSON, the shard hash (recomputed here
// from `forge data prepare`'s own shards), the flag on thread counts above the cores, the scratch
// directory removed, and one-line errors.
#include <filesystem>
#include <nlohmann/json.hpp>
#include <thread>

#include "cli_runner.h"
#include "forge/core/sha256.h"
#include "forge/data/shard.h"
#include "testing.h"

namespace forge {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using testing::CmdResult;
using testing::slurp;

class BenchPrepareCli : public testing::CliTest {
 protected:
  // 400 documents, one a line, and a 300-token BPE tokenizer trained on them.
  void SetUp() override {
    CliTest::SetUp();
    std::string text;
    for (int i = 0; i < 400; ++i)
      text += "Line " + std::to_string(i) + ": the cat sat on the mat, caf\xc3\xa9 au lait.\n";
    corpus_ = write("corpus.txt", text);
    const CmdResult t =
        forge("tokenizer train --input " + corpus_ + " --vocab-size 300 --out " + p("tok.json"));
    ASSERT_EQ(t.code, 0) << t.err;
  }
  std::string corpus_;
};

// The hash the bench states: over the shards in name order, each its name, a NUL, its size
// (8 bytes, little-endian) and its bytes.
std::string hash_of_shards(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string n = e.path().filename().string();
    if (n.ends_with(".bin")) names.push_back(n);
  }
  std::sort(names.begin(), names.end());
  Sha256 h;
  for (const std::string& n : names) {
    const std::string bytes = slurp(fs::path(dir) / n);
    const uint64_t size = bytes.size();
    h.update(n.c_str(), n.size() + 1);
    h.update(&size, 8);
    h.update(bytes.data(), bytes.size());
  }
  return h.hex_digest();
}

TEST_F(BenchPrepareCli, TableJsonAndIdenticalShards) {
  const unsigned cores = std::thread::hardware_concurrency();
  fs::create_directories(p("scratch"));
  const CmdResult r =
      forge("bench prepare --tokenizer " + p("tok.json") + " --input " + corpus_ +
            " --format lines --threads 1,2," + std::to_string(cores + 1) +
            " --repeats 2 --scratch " + p("scratch") + " --json-out " + p("b.json"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("| threads | seconds | input MB/s | tokens/s   | speed-up vs 1  | peak RSS MB |"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("400 documents"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("shards: identical for every thread count and run"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find(std::to_string(cores + 1) + " * |"), std::string::npos) << r.out;
  EXPECT_TRUE(fs::is_empty(p("scratch")));  // the shards were removed

  const json j = json::parse(slurp(p("b.json")));
  EXPECT_EQ(j["input_bytes"].get<int64_t>(), static_cast<int64_t>(fs::file_size(corpus_)));
  EXPECT_EQ(j["documents"].get<int64_t>(), 400);
  EXPECT_EQ(j["hardware_threads"].get<unsigned>(), cores);
  ASSERT_EQ(j["rows"].size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(j["rows"][i]["threads"].get<unsigned>(), i == 2 ? cores + 1 : i + 1);
    EXPECT_EQ(j["rows"][i]["above_cores"].get<bool>(), i == 2 || i + 1 > cores);
    EXPECT_GT(j["rows"][i]["input_mb_s"].get<double>(), 0);
    EXPECT_GT(j["rows"][i]["peak_rss_bytes"].get<int64_t>(), 1'000'000);
  }
  EXPECT_DOUBLE_EQ(j["rows"][0]["speedup"].get<double>(), 1.0);

  // The same shards as forge data prepare writes, by their hash and token count.
  const CmdResult d = forge("data prepare --tokenizer " + p("tok.json") + " --input " + corpus_ +
                            " --format lines --out " + p("data"));
  ASSERT_EQ(d.code, 0) << d.err;
  EXPECT_EQ(j["shards_sha256"].get<std::string>(), hash_of_shards(p("data")));
  int64_t tokens = 0;
  for (const char* split : {"train", "val"})
    for (const std::string& s : list_shards(p("data"), split)) tokens += Shard::open(s).size();
  EXPECT_EQ(j["tokens"].get<int64_t>(), tokens);
  EXPECT_TRUE(j["read_ahead"].get<bool>());

  // Without the read-ahead: the same shards.
  const CmdResult n = forge("bench prepare --tokenizer " + p("tok.json") + " --input " + corpus_ +
                            " --format lines --threads 2 --no-read-ahead --json-out " + p("n.json"));
  ASSERT_EQ(n.code, 0) << n.err;
  EXPECT_NE(n.out.find("read-ahead off"), std::string::npos) << n.out;
  const json nj = json::parse(slurp(p("n.json")));
  EXPECT_FALSE(nj["read_ahead"].get<bool>());
  EXPECT_EQ(nj["shards_sha256"], j["shards_sha256"]);
}

TEST_F(BenchPrepareCli, BadArgumentsAreOneLineErrors) {
  const std::string tok = " --tokenizer " + p("tok.json");
  expect_user_error(forge("bench prepare" + tok), "--input is required");
  expect_user_error(forge("bench prepare" + tok + " --input " + p("missing.txt")),
                    p("missing.txt") + ": no such file");
  expect_user_error(forge("bench prepare" + tok + " --input " + corpus_ + " --threads 1,,2"),
                    "--threads: expected an integer");
  expect_user_error(forge("bench prepare" + tok + " --input " + corpus_ + " --format csv"),
                    "unknown document format 'csv'");
  const CmdResult h = forge("bench prepare --help");
  EXPECT_EQ(h.code, 0);
  EXPECT_NE(h.out.find("scripts/make_corpus.sh"), std::string::npos) << h.out;
}

}  // namespace
}  // namespace forge
