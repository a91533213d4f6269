// Data preparation with a byte-level tokenizer (256 byte tokens, no merges, <|endoftext|> = 256),
// so the expected shards can be written out by hand: EOT then the document's bytes.
#include "forge/data/prepare.h"

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <tuple>

#include "forge/core/error.h"
#include "forge/data/shard.h"
#include "testing.h"
#include "forge_bin.h"

namespace forge {
namespace {

namespace fs = std::filesystem;
using tok::Tokenizer;

constexpr uint32_t kEot = 256;

Tokenizer byte_tokenizer(std::vector<std::pair<int32_t, int32_t>> merges = {}) {
  std::vector<std::string> vocab;
  for (int b = 0; b < 256; ++b) vocab.push_back(std::string(1, static_cast<char>(b)));
  for (const auto& [l, r] : merges) vocab.push_back(vocab[l] + vocab[r]);
  const int32_t eot = static_cast<int32_t>(vocab.size());
  return Tokenizer::from_bpe(vocab, merges, {{"<|endoftext|>", eot}}, tok::SplitPattern::kGpt2);
}

// EOT followed by the bytes of each document.
std::vector<uint32_t> bytes_with_eot(const std::vector<std::string>& docs) {
  std::vector<uint32_t> out;
  for (const auto& d : docs) {
    out.push_back(kEot);
    for (unsigned char c : d) out.push_back(c);
  }
  return out;
}

class PrepareTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("forge_prepare_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string write(const std::string& name, const std::string& content) {
    const std::string p = (dir_ / name).string();
    std::ofstream(p, std::ios::binary) << content;
    return p;
  }
  std::string out() const { return (dir_ / "out").string(); }
  PrepareOptions options(std::vector<std::string> inputs, DocFormat format = DocFormat::kFile) {
    PrepareOptions o;
    o.inputs = std::move(inputs);
    o.out_dir = out();
    o.format = format;
    return o;
  }
  static std::vector<uint32_t> read_shard(const std::string& path) {
    const Shard s = Shard::open(path);
    std::vector<int32_t> t(s.size());
    s.read(0, s.size(), t.data());
    return std::vector<uint32_t>(t.begin(), t.end());
  }
  std::vector<std::string> files_in(const std::string& d) const {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(d)) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  }

  fs::path dir_;
};

TEST_F(PrepareTest, FilesAreDocumentsWithEotBeforeEach) {
  PrepareOptions o = options({write("a.txt", "ab"), write("b.txt", "c\nd"), write("e.txt", "")});
  o.val_fraction = 0;
  const PrepareStats s = prepare_data(byte_tokenizer(), o);
  EXPECT_EQ(s.documents, 2);     // the empty file is skipped
  EXPECT_EQ(s.train_tokens, 7);  // EOT a b, EOT c \n d
  EXPECT_EQ(s.val_documents, 0);
  EXPECT_EQ(files_in(out()), (std::vector<std::string>{"train_000000.bin"}));
  EXPECT_EQ(read_shard(out() + "/train_000000.bin"), bytes_with_eot({"ab", "c\nd"}));
}

TEST_F(PrepareTest, LinesAndValSplit) {
  // Blank lines are not documents; "\r\n" ends a line like "\n". Documents d0..d5; with
  // val_fraction 0.5, k = 2 and documents 1, 3, 5 go to val.
  PrepareOptions o = options({write("l.txt", "d0\n\nd1\r\nd2\nd3"), write("m.txt", "d4\nd5\n")},
                             DocFormat::kLines);
  o.val_fraction = 0.5;
  const PrepareStats s = prepare_data(byte_tokenizer(), o);
  EXPECT_EQ(s.documents, 6);
  EXPECT_EQ(s.train_documents, 3);
  EXPECT_EQ(s.val_documents, 3);
  EXPECT_EQ(read_shard(out() + "/train_000000.bin"), bytes_with_eot({"d0", "d2", "d4"}));
  EXPECT_EQ(read_shard(out() + "/val_000000.bin"), bytes_with_eot({"d1", "d3", "d5"}));
}

TEST_F(PrepareTest, TwoDocumentsAlwaysGiveAValDocument) {
  // Default fraction 0.005 → k = 200: document 1 is val, then 201, 401, ...
  const PrepareStats s =
      prepare_data(byte_tokenizer(), options({write("l.txt", "x\ny\nz\n")}, DocFormat::kLines));
  EXPECT_EQ(s.val_documents, 1);
  EXPECT_EQ(read_shard(out() + "/val_000000.bin"), bytes_with_eot({"y"}));
  EXPECT_EQ(read_shard(out() + "/train_000000.bin"), bytes_with_eot({"x", "z"}));
}

TEST_F(PrepareTest, ShardsHoldAtMostShardTokens) {
  PrepareOptions o = options({write("a", "abcd"), write("b", "efg")});
  o.val_fraction = 0;
  o.shard_tokens = 3;
  const PrepareStats s = prepare_data(byte_tokenizer(), o);
  // Stream: EOT a b c d EOT e f g = 9 tokens → three shards of 3.
  EXPECT_EQ(s.train_shards, 3);
  const std::vector<uint32_t> all = bytes_with_eot({"abcd", "efg"});
  for (int i = 0; i < 3; ++i) {
    char name[32];
    std::snprintf(name, sizeof(name), "/train_%06d.bin", i);
    EXPECT_EQ(read_shard(out() + name),
              std::vector<uint32_t>(all.begin() + 3 * i, all.begin() + 3 * i + 3));
  }
}

TEST_F(PrepareTest, Jsonl) {
  PrepareOptions o = options({write("d.jsonl",
                                    "{\"text\": \"h\\u00e9\", \"id\": 1}\n\n"
                                    "{\"text\": \"<|endoftext|>\"}\n")},
                             DocFormat::kJsonl);
  o.val_fraction = 0;
  prepare_data(byte_tokenizer(), o);
  // é is two bytes; a special token's text inside a document stays text.
  EXPECT_EQ(read_shard(out() + "/train_000000.bin"),
            bytes_with_eot({"h\xc3\xa9", "<|endoftext|>"}));
}

TEST_F(PrepareTest, JsonlErrorsNameFileAndLine) {
  const std::string bad = write("bad.jsonl", "{\"text\": \"ok\"}\n{\"text\": \n");
  try {
    prepare_data(byte_tokenizer(), options({bad}, DocFormat::kJsonl));
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(bad + ":2: malformed JSON"), std::string::npos)
        << e.what();
  }
  EXPECT_FALSE(fs::exists(out() + "/train_000000.bin"));
  const std::string notext = write("n.jsonl", "{\"text\": \"ok\"}\n{\"txt\": \"x\"}\n");
  try {
    prepare_data(byte_tokenizer(), options({notext}, DocFormat::kJsonl));
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(notext + ":2: expected a JSON object with a \"text\""),
              std::string::npos)
        << e.what();
  }
}

TEST_F(PrepareTest, InvalidUtf8IsAnErrorUnlessAllowed) {
  const std::string p = write("latin1.txt", "ok\ncaf\xe9\n");
  try {
    prepare_data(byte_tokenizer(), options({p}, DocFormat::kLines));
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(p + ": invalid UTF-8 at byte 6 (line 2)"),
              std::string::npos)
        << e.what();
  }
  PrepareOptions o = options({p}, DocFormat::kLines);
  o.allow_invalid_utf8 = true;
  o.val_fraction = 0;
  prepare_data(byte_tokenizer(), o);
  EXPECT_EQ(read_shard(out() + "/train_000000.bin"), bytes_with_eot({"ok", "caf\xe9"}));
}

TEST_F(PrepareTest, RefusesToOverwriteShards) {
  const std::string in = write("a.txt", "abc");
  prepare_data(byte_tokenizer(), options({in}));
  EXPECT_THROW(prepare_data(byte_tokenizer(), options({in})), Error);
  EXPECT_EQ(read_shard(out() + "/train_000000.bin"), bytes_with_eot({"abc"}));
}

TEST_F(PrepareTest, BadInputs) {
  EXPECT_THROW(prepare_data(byte_tokenizer(), options({(dir_ / "missing.txt").string()})), Error);
  const std::string in = write("a.txt", "abc");
  PrepareOptions o = options({in});
  o.eot = "<|end|>";
  EXPECT_THROW(prepare_data(byte_tokenizer(), o), Error);
  o = options({in});
  o.val_fraction = 0.9;
  EXPECT_THROW(prepare_data(byte_tokenizer(), o), Error);
  EXPECT_THROW(prepare_data(byte_tokenizer(), options({write("e.txt", "")})), Error);
  EXPECT_THROW(parse_doc_format("csv"), Error);
}

TEST_F(PrepareTest, SameShardsForAnyThreadCount) {
  // A tokenizer with a few merges and a corpus of many random lines of varied length.
  const Tokenizer t = byte_tokenizer({{'a', 'b'}, {256, 'c'}, {' ', 'a'}});
  Rng rng(5, 0);
  const char* pieces[] = {"a", "b", "c", " ", "ab", "\xc3\xa9"};
  std::string text;
  for (int i = 0; i < 3000; ++i) {
    for (int j = 0, n = static_cast<int>(rng.below(200)); j < n; ++j) text += pieces[rng.below(6)];
    text.push_back('\n');
  }
  const std::string in = write("r.txt", text);
  std::vector<std::vector<uint32_t>> results;
  for (int threads : {1, 2, 3}) {
    PrepareOptions o = options({in}, DocFormat::kLines);
    o.out_dir = (dir_ / "t").string() + std::to_string(threads);
    o.threads = threads;
    o.val_fraction = 0.1;
    prepare_data(t, o);
    results.push_back(read_shard(o.out_dir + "/train_000000.bin"));
    const std::vector<uint32_t> v = read_shard(o.out_dir + "/val_000000.bin");
    results.back().insert(results.back().end(), v.begin(), v.end());
  }
  EXPECT_EQ(results[0], results[1]);
  EXPECT_EQ(results[0], results[2]);
}

// The tokenizer travels with the shards: out gets tokenizer.json (whatever the given file's
// name) and the companions beside it, byte for byte, and nothing else from that directory.
TEST_F(PrepareTest, CopiesTheTokenizerFilesBesideTheShards) {
  const std::string in = write("a.txt", "abc");
  fs::create_directories(dir_ / "tok");
  byte_tokenizer().save_json((dir_ / "tok/my_tokenizer.json").string());
  const std::map<std::string, std::string> companions = {
      {"tokenizer_config.json", "{\"chat_template\": \"{{ messages }}\", \"eos_token\": null}"},
      {"special_tokens_map.json", "{\"eos_token\": \"<|endoftext|>\"}\n"},
      {"chat_template.jinja", "{% for m in messages %}{{ m['content'] }}{% endfor %}"}};
  for (const auto& [name, text] : companions) write("tok/" + name, text);
  write("tok/notes.txt", "not a tokenizer file");
  PrepareOptions o = options({in});
  o.tokenizer_path = (dir_ / "tok/my_tokenizer.json").string();
  const PrepareStats s = prepare_data(byte_tokenizer(), o);
  EXPECT_EQ(s.tokenizer_files,
            (std::vector<std::string>{"chat_template.jinja", "special_tokens_map.json",
                                      "tokenizer.json", "tokenizer_config.json"}));
  EXPECT_EQ(files_in(out()), (std::vector<std::string>{
                                 "chat_template.jinja", "special_tokens_map.json", "tokenizer.json",
                                 "tokenizer_config.json", "train_000000.bin"}));
  auto read = [](const fs::path& p) {
    std::ifstream f(p, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  };
  EXPECT_EQ(read(out() + "/tokenizer.json"), read(dir_ / "tok/my_tokenizer.json"));
  for (const auto& [name, text] : companions) EXPECT_EQ(read(out() + "/" + name), text) << name;

  // A directory holding tokenizer.json, and the tokenizer living in --out itself: the same.
  fs::rename(dir_ / "tok/my_tokenizer.json", dir_ / "tok/tokenizer.json");
  o.out_dir = (dir_ / "out2").string();
  o.tokenizer_path = (dir_ / "tok").string();
  EXPECT_EQ(prepare_data(byte_tokenizer(), o).tokenizer_files.size(), 4u);
  EXPECT_EQ(read(dir_ / "out2/tokenizer.json"), read(dir_ / "tok/tokenizer.json"));
  o.out_dir = o.tokenizer_path;
  prepare_data(byte_tokenizer(), o);
  EXPECT_EQ(read(dir_ / "tok/tokenizer.json"), read(dir_ / "out2/tokenizer.json"));
}

// GPT-2's encoder.json + vocab.bpe are copied, and a tokenizer.json converted from them is
// written beside them: the file the trainer, forge generate and transformers read. It encodes
// as the pair does.
TEST_F(PrepareTest, Gpt2FilesComeWithAConvertedTokenizerJson) {
  const fs::path gpt2 = dir_ / "gpt2";
  fs::create_directories(gpt2);
  byte_tokenizer().save_json((dir_ / "byte.json").string());
  nlohmann::json encoder =
      nlohmann::json::parse(std::ifstream(dir_ / "byte.json"))["model"]["vocab"];
  encoder["<|endoftext|>"] = kEot;
  write("gpt2/encoder.json", encoder.dump());
  write("gpt2/vocab.bpe", "#version: 0.2\n");
  const Tokenizer t = Tokenizer::load(gpt2.string());
  PrepareOptions o = options({write("a.txt", "caf\xc3\xa9 <|endoftext|> 12")});
  o.tokenizer_path = gpt2.string();
  const PrepareStats s = prepare_data(t, o);
  EXPECT_EQ(s.tokenizer_files,
            (std::vector<std::string>{"encoder.json", "tokenizer.json", "vocab.bpe"}));
  EXPECT_EQ(files_in(out()), (std::vector<std::string>{"encoder.json", "tokenizer.json",
                                                       "train_000000.bin", "vocab.bpe"}));
  const Tokenizer converted = Tokenizer::load(out() + "/tokenizer.json");
  const std::string text = "caf\xc3\xa9 au lait <|endoftext|> 12";
  EXPECT_EQ(converted.encode(text), t.encode(text));
  EXPECT_EQ(converted.eot_id(), t.eot_id());
}

// An --out holding a different file of a name it would write is refused before any shard is
// written: shards beside another tokenizer's files would be read with the wrong one.
TEST_F(PrepareTest, RefusesADifferentTokenizerFileInOut) {
  const std::string in = write("a.txt", "abc");
  byte_tokenizer().save_json((dir_ / "tokenizer.json").string());
  fs::create_directories(out());
  write("out/tokenizer_config.json", "{}");
  write("tokenizer_config.json", "{\"eos_token\": \"<|endoftext|>\"}");
  PrepareOptions o = options({in});
  o.tokenizer_path = (dir_ / "tokenizer.json").string();
  try {
    prepare_data(byte_tokenizer(), o);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(out() + "/tokenizer_config.json exists and differs"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(files_in(out()), std::vector<std::string>{"tokenizer_config.json"});
}

// Many small batches (each read while the one before is encoded), shards that end inside a
// batch and documents that straddle shards: the shards hold every document in order, as one
// batch would give them, for any thread count; progress comes once a batch, in order.
TEST_F(PrepareTest, ManyBatchesGiveTheSameShardsAsOne) {
  std::vector<std::string> lines;
  std::string text;
  for (int i = 0; i < 2000; ++i) {
    lines.push_back("line " + std::to_string(i) + std::string(i % 37, 'x'));
    text += lines.back() + "\n";
  }
  const std::string in = write("l.txt", text);
  std::vector<std::string> train_docs, val_docs;
  for (size_t g = 0; g < lines.size(); ++g) (g % 10 == 1 ? val_docs : train_docs).push_back(lines[g]);
  for (const int threads : {1, 3, -1}) {  // -1: one thread, no read-ahead
    PrepareOptions o = options({in}, DocFormat::kLines);
    o.out_dir = (dir_ / "t").string() + std::to_string(threads + 1);
    o.threads = std::max(threads, 1);
    o.read_ahead = threads > 0;
    o.val_fraction = 0.1;
    o.shard_tokens = 1000;
    o.batch_bytes = 500;
    std::vector<int64_t> done;
    o.progress = [&](const PrepareProgress& p) { done.push_back(p.bytes_done); };
    const PrepareStats s = prepare_data(byte_tokenizer(), o);
    EXPECT_GT(done.size(), 50u);
    EXPECT_TRUE(std::is_sorted(done.begin(), done.end()));
    EXPECT_EQ(done.back(), static_cast<int64_t>(text.size()));
    for (const auto& [split, docs, shards] :
         {std::tuple{"train", &train_docs, s.train_shards}, {"val", &val_docs, s.val_shards}}) {
      std::vector<uint32_t> got;
      for (int i = 0; i < shards; ++i) {
        char name[32];
        std::snprintf(name, sizeof(name), "/%s_%06d.bin", split, i);
        const std::vector<uint32_t> part = read_shard(o.out_dir + name);
        EXPECT_EQ(part.size(), i + 1 < shards ? 1000u : part.size()) << name;
        got.insert(got.end(), part.begin(), part.end());
      }
      EXPECT_EQ(got, bytes_with_eot(*docs)) << split << ", " << threads << " threads";
    }
  }
}

// A vocabulary past 65,536 ids (fillers that no merge makes) streams its shards through a uint32
// spill: they come out uint16 when every id in them fits, as write_shard decides, and uint32
// when one does not (here the EOT at 70,000), across several shards.
TEST_F(PrepareTest, ShardWidthFollowsTheIdsWithALargeVocabulary) {
  auto tokenizer = [](int32_t eot, int32_t other_special) {
    std::vector<std::string> vocab;
    for (int b = 0; b < 256; ++b) vocab.push_back(std::string(1, static_cast<char>(b)));
    while (vocab.size() < 70'000) vocab.push_back("<f" + std::to_string(vocab.size()) + ">");
    return Tokenizer::from_bpe(vocab, {},
                               {{"<|endoftext|>", eot}, {"<|other|>", other_special}},
                               tok::SplitPattern::kGpt2);
  };
  const std::string a = write("a.txt", "hello"), b = write("b.txt", "world!");
  for (const uint32_t eot : {70'000u, 256u}) {
    fs::remove_all(out());
    PrepareOptions o = options({a, b});
    o.val_fraction = 0;
    o.shard_tokens = 4;
    const Tokenizer t = eot == 256 ? tokenizer(256, 70'000) : tokenizer(70'000, 70'001);
    ASSERT_GT(t.vocab_size(), 65'536);
    const PrepareStats s = prepare_data(t, o);
    ASSERT_EQ(s.train_shards, 4);  // 13 tokens
    std::vector<uint32_t> all = bytes_with_eot({"hello", "world!"});
    for (uint32_t& id : all)
      if (id == kEot) id = eot;
    std::vector<uint32_t> got;
    for (int i = 0; i < 4; ++i) {
      const std::string name = out() + "/train_00000" + std::to_string(i) + ".bin";
      const bool has_eot = i == 0 || i == 1;  // EOT h e l | l o EOT w | o r l d | !
      EXPECT_EQ(Shard::open(name).token_bytes(), eot > 0xFFFF && has_eot ? 4 : 2) << name;
      const std::vector<uint32_t> part = read_shard(name);
      got.insert(got.end(), part.begin(), part.end());
    }
    EXPECT_EQ(got, all);
  }
}

// Nothing half-done stays in --out (prepare.cpp): a bad document after several shards were
// written leaves no shard, an --out the run created is removed again, an --out that existed
// keeps what it held, and the rerun with the input fixed works.
TEST_F(PrepareTest, AFailureMidwayLeavesNothingAndARerunWorks) {
  std::string text;
  for (int i = 0; i < 3000; ++i) text += static_cast<char>('a' + i % 26);
  const std::string a = write("a.txt", text), b = write("b.txt", "caf\xe9");
  PrepareOptions o = options({a, b});
  o.shard_tokens = 500;  // a.txt alone fills 6 shards before b.txt is looked at
  o.val_fraction = 0;
  EXPECT_THROW(prepare_data(byte_tokenizer(), o), Error);
  EXPECT_FALSE(fs::exists(out()));
  fs::create_directories(out());
  write("out/notes.txt", "mine");
  EXPECT_THROW(prepare_data(byte_tokenizer(), o), Error);
  EXPECT_EQ(files_in(out()), std::vector<std::string>{"notes.txt"});
  write("b.txt", "cafe");
  const PrepareStats st = prepare_data(byte_tokenizer(), o);
  EXPECT_EQ(st.train_shards, 7);  // 3001 + 5 tokens
  EXPECT_EQ(files_in(out()).size(), 8u);
  EXPECT_EQ(read_shard(out() + "/train_000006.bin"),
            std::vector<uint32_t>({static_cast<uint32_t>(text.back()), kEot, 'c', 'a', 'f', 'e'}));
}

// Any exception, not only forge::Error, cleans up: here one from the progress callback, thrown
// while the shards of the first batch sit staged.
TEST_F(PrepareTest, AnyExceptionLeavesNothing) {
  std::string text(3000, 'x');
  PrepareOptions o = options({write("a.txt", text)});
  o.shard_tokens = 500;
  o.val_fraction = 0;
  std::vector<std::string> staged;
  o.progress = [&](const PrepareProgress&) {
    staged = files_in(out() + "/.tmp-prepare");
    throw std::runtime_error("interrupted");
  };
  EXPECT_THROW(prepare_data(byte_tokenizer(), o), std::runtime_error);
  // There was something to clean up: six full shards and the seventh being written.
  EXPECT_EQ(staged.size(), 7u);
  EXPECT_EQ(std::count(staged.begin(), staged.end(), "train_000006.bin.tmp"), 1);
  EXPECT_FALSE(fs::exists(out()));
}

// A killed run leaves its staging directory (and nothing else): the next run removes it.
TEST_F(PrepareTest, AKilledRunsStagingDirectoryIsRemovedByTheNextRun) {
  write("out/.tmp-prepare/train_000000.bin", "half a shard");
  prepare_data(byte_tokenizer(), options({write("a.txt", "abc")}));
  EXPECT_EQ(files_in(out()), std::vector<std::string>{"train_000000.bin"});
  EXPECT_EQ(read_shard(out() + "/train_000000.bin"), bytes_with_eot({"abc"}));
}

// A full disk through the forge binary, simulated with a file-size limit (RLIMIT_FSIZE; no
// root needed, and root cannot ignore it): the shards fit, the tokenizer.json copied beside
// them does not — after special_tokens_map.json was already written. Exit code 1, a message
// naming the file and the OS error, nothing left in --out; the rerun without the limit works.
TEST_F(PrepareTest, FullDiskLeavesNothingAndARerunWorks) {
  std::string text(3000, 'y');
  const std::string in = write("a.txt", text);
  fs::create_directories(dir_ / "tok");
  byte_tokenizer().save_json((dir_ / "tok/tokenizer.json").string());
  write("tok/special_tokens_map.json", "{\"eos_token\": \"<|endoftext|>\"}\n");
  const rlim_t limit = 2100;  // a shard of 500 uint16 tokens is 1024 + 1000 bytes
  ASSERT_GT(fs::file_size(dir_ / "tok/tokenizer.json"), limit);
  const std::vector<std::string> args = {
      "data",           "prepare", "--tokenizer",    (dir_ / "tok/tokenizer.json").string(),
      "--input",        in,        "--out",          out(),
      "--val-fraction", "0",       "--shard-tokens", "500"};
  auto run = [&](rlim_t fsize) {
    const std::string err = (dir_ / "stderr").string();
    const pid_t pid = fork();
    if (pid == 0) {
      if (!freopen("/dev/null", "w", stdout) || !freopen(err.c_str(), "w", stderr)) _exit(126);
      setenv("OMP_WAIT_POLICY", "passive", 1);
      const rlimit lim{fsize, fsize};
      if (fsize > 0 && setrlimit(RLIMIT_FSIZE, &lim) != 0) _exit(125);
      std::vector<char*> argv = {const_cast<char*>(FORGE_BIN)};
      for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      execv(FORGE_BIN, argv.data());
      _exit(127);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    std::ifstream f(err);
    std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    return std::make_pair(WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status), text);
  };
  const auto [code, err] = run(limit);
  EXPECT_EQ(code, 1) << err;
  EXPECT_NE(err.find(out() + "/tokenizer.json: cannot write"), std::string::npos) << err;
  EXPECT_NE(err.find(std::strerror(EFBIG)), std::string::npos) << err;
  EXPECT_FALSE(fs::exists(out()));
  const auto [code2, err2] = run(0);
  EXPECT_EQ(code2, 0) << err2;
  EXPECT_EQ(files_in(out()), (std::vector<std::string>{
                                 "special_tokens_map.json", "tokenizer.json", "train_000000.bin",
                                 "train_000001.bin", "train_000002.bin", "train_000003.bin",
                                 "train_000004.bin", "train_000005.bin", "train_000006.bin"}));
}

TEST(PrepareUtf8, FindsTheFirstInvalidByte) {
  EXPECT_EQ(find_invalid_utf8(""), -1);
  EXPECT_EQ(find_invalid_utf8("plain ascii text, longer than eight bytes"), -1);
  EXPECT_EQ(find_invalid_utf8("\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80 \xf4\x8f\xbf\xbf"), -1);
  EXPECT_EQ(find_invalid_utf8("0123456789abcdef\x80"), 16);     // lone continuation
  EXPECT_EQ(find_invalid_utf8("ab\xc0\xaf"), 2);                // overlong '/'
  EXPECT_EQ(find_invalid_utf8("abc\xe0\x80\xaf"), 3);           // overlong, 3 bytes
  EXPECT_EQ(find_invalid_utf8("\xed\xa0\x80"), 0);              // surrogate U+D800
  EXPECT_EQ(find_invalid_utf8("x\xf4\x90\x80\x80"), 1);         // above U+10FFFF
  EXPECT_EQ(find_invalid_utf8("0123456789\xe2\x82"), 10);       // truncated at the end
  EXPECT_EQ(find_invalid_utf8("\xe2\x82x"), 0);                 // bad continuation
  EXPECT_EQ(find_invalid_utf8(std::string("a\0b\xff", 4)), 3);  // NUL is valid
}

}  // namespace
}  // namespace forge
