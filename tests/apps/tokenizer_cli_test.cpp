// forge tokenizer / data / bench as a user meets them: train → encode → decode round trips,
// shards that decode back to the documents, one-line errors, --help, JSON output.
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli_runner.h"
#include "forge/data/shard.h"
#include "forge/tokenizer/tokenizer.h"
#include "testing.h"

namespace forge {
namespace {

namespace fs = std::filesystem;
using testing::CmdResult;
using testing::slurp;

class TokenizerCli : public testing::CliTest {
 protected:
  // A small corpus with plenty of repetition, so merges have something to learn.
  std::string corpus() {
    std::string text;
    for (int i = 0; i < 200; ++i)
      text += "The cat sat on the mat. Line " + std::to_string(i) + ": caf\xc3\xa9 au lait!\n";
    return write("corpus.txt", text);
  }
};

TEST_F(TokenizerCli, Help) {
  for (const char* cmd : {"tokenizer train", "tokenizer encode", "tokenizer decode", "data prepare",
                          "bench tokenizer"}) {
    const CmdResult r = forge(std::string(cmd) + " --help");
    EXPECT_EQ(r.code, 0) << cmd;
    EXPECT_NE(r.out.find("usage: forge " + std::string(cmd)), std::string::npos) << r.out;
  }
  for (const char* cmd : {"tokenizer", "data", "bench"})
    EXPECT_EQ(forge(std::string(cmd) + " --help").code, 0);
  EXPECT_NE(forge("--help").out.find("tokenizer"), std::string::npos);
}

TEST_F(TokenizerCli, TrainEncodeDecodeRoundTrip) {
  const std::string text_path = corpus();
  const CmdResult t =
      forge("tokenizer train --input " + text_path + " --vocab-size 300 --out " + p("tok.json"));
  ASSERT_EQ(t.code, 0) << t.err;
  EXPECT_NE(t.out.find("trained 300 tokens: 256 bytes, 43 merges, 1 special token(s)"),
            std::string::npos)
      << t.out;
  const std::string tok = " --tokenizer " + p("tok.json");

  const CmdResult e = forge("tokenizer encode" + tok + " --input " + text_path);
  ASSERT_EQ(e.code, 0) << e.err;
  write("ids.txt", e.out);
  const CmdResult d = forge("tokenizer decode" + tok + " --input " + p("ids.txt"));
  ASSERT_EQ(d.code, 0) << d.err;
  EXPECT_EQ(d.out, slurp(text_path));
  // Merges made the text shorter than one token per byte.
  EXPECT_LT(std::count(e.out.begin(), e.out.end(), ' ') + 1, static_cast<long>(d.out.size()));

  // Standard input, --json, and the special token (the last id).
  write("in.txt", "The cat<|endoftext|>");
  const CmdResult j = forge("tokenizer encode" + tok + " --json", p("in.txt"));
  ASSERT_EQ(j.code, 0) << j.err;
  const std::vector<int> ids = nlohmann::json::parse(j.out)["ids"].get<std::vector<int>>();
  ASSERT_FALSE(ids.empty());
  EXPECT_EQ(ids.back(), 299);
  std::string list;
  for (const int id : ids) list += (list.empty() ? "" : ",") + std::to_string(id);
  const CmdResult back = forge("tokenizer decode" + tok + " --ids " + list);
  EXPECT_EQ(back.out, "The cat<|endoftext|>");
  write("ids.json", j.out);
  EXPECT_EQ(forge("tokenizer decode" + tok, p("ids.json")).out, "The cat<|endoftext|>");
}

TEST_F(TokenizerCli, TrainRefusesToOverwrite) {
  const std::string in = corpus();
  const std::string base = "tokenizer train --input " + in + " --out " + p("t.json");
  ASSERT_EQ(forge(base + " --vocab-size 260").code, 0);
  const std::string before = slurp(p("t.json"));
  expect_user_error(forge(base + " --vocab-size 270"), "exists; pass --force");
  EXPECT_EQ(slurp(p("t.json")), before);
  EXPECT_EQ(forge(base + " --vocab-size 270 --force --pattern gpt4 --special '<|a|>' '<|b|>'").code,
            0);
  EXPECT_NE(slurp(p("t.json")), before);
}

TEST_F(TokenizerCli, OneLineErrors) {
  const std::string in = corpus();
  expect_user_error(forge("tokenizer frob"), "unknown action 'frob'");
  expect_user_error(forge("tokenizer train --vocab-size 300 --out " + p("t.json")),
                    "--input is required");
  expect_user_error(forge("tokenizer train --input " + in + " --out " + p("t.json")),
                    "--vocab-size is required");
  expect_user_error(
      forge("tokenizer train --input " + in + " --vocab-size 100 --out " + p("t.json")),
      "vocab size 100 is too small");
  expect_user_error(
      forge("tokenizer train --input " + p("nope.txt") + " --vocab-size 300 --out " + p("t.json")),
      "nope.txt: no such file");
  expect_user_error(forge("tokenizer train --input " + in +
                          " --vocab-size 300 --pattern gpt9 --out " + p("t.json")),
                    "gpt9");
  EXPECT_FALSE(fs::exists(p("t.json")));
  ASSERT_EQ(forge("tokenizer train --input " + in + " --vocab-size 260 --out " + p("t.json")).code,
            0);
  expect_user_error(forge("tokenizer encode --tokenizer " + p("missing.json") + " --input " + in),
                    "missing.json");
  expect_user_error(forge("tokenizer decode --tokenizer " + p("t.json") + " --ids 1,x"),
                    "bad token id 'x'");
  expect_user_error(forge("tokenizer decode --tokenizer " + p("t.json") + " --ids 1,99999"),
                    "99999");
  expect_user_error(forge("bench generate --batches 1,0"), "--batches: expected an integer in [1, 4096], got '0'");
  expect_user_error(forge("bench gemm --batch 0"),
                    "--batch: expected an integer in [1, 2147483647], got '0'");
  expect_user_error(forge("bench attention --causal maybe"), "--causal must be yes, no or both");
  expect_user_error(forge("bench attention --shapes 4x16x4096"), "is not BxHxTxD");
  expect_user_error(forge("bench gemm --gpus 1"), "--gpus goes with bench train");
  expect_user_error(forge("bench train --algos"), "--algos goes with bench gemm (without --rows)");
  expect_user_error(forge("bench gemm --rows 1 --algos"), "--algos goes with bench gemm (without --rows)");
  expect_user_error(forge("bench gemm --fp8 --algos"), "--fp8 goes with bench gemm (without --rows or --algos)");
  expect_user_error(forge("bench train --gpus 1 --sft"), "--gpus and --sft do not go together");
  expect_user_error(forge("bench frob"), "unknown benchmark 'frob'");
  expect_user_error(forge("data frob"), "unknown action 'frob'");
}

TEST_F(TokenizerCli, DataPrepareShardsDecodeToTheDocuments) {
  const std::string in = corpus();
  ASSERT_EQ(forge("tokenizer train --input " + in + " --vocab-size 300 --out " + p("t.json")).code,
            0);
  const std::string args = "data prepare --tokenizer " + p("t.json") + " --input " + in +
                           " --format lines --val-fraction 0.1 --out " + p("data");
  const CmdResult r = forge(args);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("prepared 200 documents (180 train, 20 val)"), std::string::npos) << r.out;
  EXPECT_EQ(r.err.back(), '\n');  // the progress bar ends its line

  // Documents 1, 11, 21, ... are val (k = 10); every document follows <|endoftext|>.
  std::istringstream lines(slurp(in));
  std::string line, want_train, want_val;
  for (int g = 0; std::getline(lines, line); ++g)
    (g % 10 == 1 ? want_val : want_train) += "<|endoftext|>" + line;
  const tok::Tokenizer t = tok::Tokenizer::load(p("t.json"));
  auto decode_shard = [&](const std::string& path) {
    const Shard s = Shard::open(path, t.vocab_size());
    std::vector<int32_t> ids(s.size());
    s.read(0, s.size(), ids.data());
    return t.decode(ids);
  };
  EXPECT_EQ(decode_shard(p("data/train_000000.bin")), want_train);
  EXPECT_EQ(decode_shard(p("data/val_000000.bin")), want_val);

  expect_user_error(forge(args), "already holds shards");
  write("bad.jsonl", "{\"text\": \"a\"}\nnot json\n");
  expect_user_error(forge("data prepare --tokenizer " + p("t.json") + " --input " + p("bad.jsonl") +
                          " --format jsonl --out " + p("d2")),
                    p("bad.jsonl") + ":2: malformed JSON");
  expect_user_error(forge("data prepare --tokenizer " + p("t.json") + " --input " + in +
                          " --eot '<|eos|>' --out " + p("d3")),
                    "no special token '<|eos|>'");
}

TEST_F(TokenizerCli, BenchTokenizerWritesJson) {
  const std::string in = corpus();
  const CmdResult r = forge("bench tokenizer --input " + in +
                            " --vocab-size 280 --threads 2 --json-out " + p("b.json"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("13.5 s @2 threads"), std::string::npos) << r.out;
  const auto j = nlohmann::json::parse(slurp(p("b.json")));
  EXPECT_EQ(j["input_bytes"].get<int64_t>(), static_cast<int64_t>(fs::file_size(in)));
  EXPECT_EQ(j["train_vocab_size"].get<int>(), 280);
  EXPECT_GT(j["encode_mb_s_1_thread"].get<double>(), 0);
  EXPECT_GT(j["train_seconds"].get<double>(), 0);
  EXPECT_EQ(j["threads"].get<int>(), 2);
}

}  // namespace
}  // namespace forge
