// What a trained model directory holds, from the command line: the tokenizer goes from `forge
// tokenizer train` through `forge data prepare` and `forge train` into the model, so `forge
// generate --prompt` works on it; --save-dtype bf16 and save_shard_size give a BF16, sharded
// model that eval, generate and --init-from read; bad values are one-line errors naming the key.
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "cli_runner.h"
#include "forge/data/shard.h"
#include "forge/io/safetensors.h"
#include "forge/tokenizer/tokenizer.h"
#include "testing.h"

namespace forge {
namespace {

namespace fs = std::filesystem;
using testing::CmdResult;
using testing::slurp;
using json = nlohmann::json;

class SaveCli : public testing::CliTest {
 protected:
  void write_counting_shard(const std::string& path, int n, int mod) {
    fs::create_directories(fs::path(path).parent_path());
    std::vector<uint32_t> t(n);
    for (int i = 0; i < n; ++i) t[i] = static_cast<uint32_t>(i % mod);
    write_shard(path, t);
  }
};

// The tiny preset made smaller (a step takes milliseconds); vocab 0: the preset's, or the
// tokenizer's when the run has one.
std::string small_model(int vocab = 0) {
  return (vocab > 0 ? " vocab_size=" + std::to_string(vocab) : std::string()) +
         " max_seq_len=32 seq_len=32 batch_size=2 n_layer=1 n_embd=32 n_head=2 ffn_hidden=64"
         " eval_every=100 eval_windows=2";
}

TEST_F(SaveCli, PrepareTrainGenerateWithTheDataDirectorysTokenizer) {
  std::string text;
  for (int i = 0; i < 200; ++i)
    text += "hi there, the cat sat on the mat " + std::to_string(i) + ". hi again!\n";
  const std::string corpus = write("corpus.txt", text);
  fs::create_directories(dir_ / "tok");
  ASSERT_EQ(forge("tokenizer train --input " + corpus + " --vocab-size 300 --out " +
                  p("tok/tokenizer.json"))
                .code,
            0);
  const std::string tok_config =
      "{\"chat_template\": \"{% for m in messages %}{{ m['content'] }}<|endoftext|>{% endfor "
      "%}\", \"eos_token\": \"<|endoftext|>\"}";
  write("tok/tokenizer_config.json", tok_config);
  write("tok/chat_template.jinja", "{% for m in messages %}{{ m['content'] }}{% endfor %}");

  const CmdResult prep = forge("data prepare --tokenizer " + p("tok/tokenizer.json") + " --input " +
                               corpus + " --format lines --out " + p("data"));
  ASSERT_EQ(prep.code, 0) << prep.err;
  EXPECT_NE(prep.out.find("(with chat_template.jinja, tokenizer.json, tokenizer_config.json)"),
            std::string::npos)
      << prep.out;
  for (const char* f : {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja"})
    EXPECT_EQ(slurp(dir_ / "data" / f), slurp(dir_ / "tok" / f)) << f;

  // No vocab_size: the model takes the tokenizer's (the preset's 4,096 would let it sample ids
  // the 300-token tokenizer cannot decode).
  const CmdResult t = forge("train --data " + p("data") + " --out " + p("run") +
                            " --steps 3 --save-every 3" + small_model());
  ASSERT_EQ(t.code, 0) << t.err;
  const int vocab = tok::Tokenizer::load(p("tok/tokenizer.json")).vocab_size();
  EXPECT_NE(t.out.find("vocab_size " + std::to_string(vocab) + ", from " + p("data") +
                       "/tokenizer.json (the preset has 4096"),
            std::string::npos)
      << t.out;
  EXPECT_EQ(json::parse(slurp(dir_ / "run/model/config.json"))["vocab_size"], vocab);
  for (const std::string model : {"run/model", "run/checkpoints/step_000003"})
    for (const char* f : {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja"})
      EXPECT_EQ(slurp(dir_ / model / f), slurp(dir_ / "tok" / f)) << model << "/" << f;

  // Greedy and sampled: every id the model can produce decodes.
  for (const std::string how : {"--temperature 0", "--temperature 1 --seed 3"}) {
    const CmdResult g = forge("generate --model " + p("run/model") +
                              " --prompt hi --max-new-tokens 8 --json " + how);
    ASSERT_EQ(g.code, 0) << how << ": " << g.err;
    const json j = json::parse(g.out);
    EXPECT_TRUE(j.contains("text")) << g.out;
    EXPECT_LE(j["ids"].size(), 8u);
  }
  // A vocab_size given is kept.
  const CmdResult t2 =
      forge("train --data " + p("data") + " --out " + p("run2") + " --steps 1" + small_model(512));
  ASSERT_EQ(t2.code, 0) << t2.err;
  EXPECT_EQ(t2.out.find("vocab_size "), std::string::npos) << t2.out;
  EXPECT_EQ(json::parse(slurp(dir_ / "run2/model/config.json"))["vocab_size"], 512);
}

TEST_F(SaveCli, Bf16ShardedModelsLoadEverywhere) {
  write_counting_shard(p("data/train_000000.bin"), 4000, 50);
  write_counting_shard(p("data/val_000000.bin"), 1000, 50);
  const std::string train = "train --data " + p("data") + small_model(50);
  const CmdResult t = forge(train + " --out " + p("run") +
                            " --steps 2 --save-every 2 --save-dtype bf16 save_shard_size=8KB");
  ASSERT_EQ(t.code, 0) << t.err;
  const json index = json::parse(slurp(dir_ / "run/model/model.safetensors.index.json"));
  std::set<std::string> files;
  for (const auto& [name, file] : index["weight_map"].items()) files.insert(file);
  EXPECT_GT(files.size(), 1u);
  for (const std::string& f : files) {
    const auto st = io::SafetensorsFile::open(p("run/model/" + f));
    for (const auto& tensor : st.tensors())
      EXPECT_EQ(tensor.dtype, io::StDType::kBF16) << f << ": " << tensor.name;
  }
  EXPECT_EQ(json::parse(slurp(dir_ / "run/model/config.json"))["torch_dtype"], "bfloat16");
  EXPECT_EQ(json::parse(slurp(dir_ / "run/config.json"))["train"]["save_dtype"], "bf16");

  const CmdResult e =
      forge("eval --model " + p("run/model") + " --data " + p("data") + " --seq-len 16 --json");
  ASSERT_EQ(e.code, 0) << e.err;
  EXPECT_GT(json::parse(e.out)["loss"].get<double>(), 0.0);
  const CmdResult g = forge("generate --model " + p("run/model") +
                            " --ids 1,2,3 --max-new-tokens 3 --temperature 0 --json");
  ASSERT_EQ(g.code, 0) << g.err;
  EXPECT_EQ(json::parse(g.out)["ids"].size(), 3u);
  const CmdResult ft = forge("train --init-from " + p("run/model") + " --data " + p("data") +
                             " --out " + p("ft") + " --steps 1 seq_len=16 batch_size=2");
  ASSERT_EQ(ft.code, 0) << ft.err;
  EXPECT_TRUE(fs::exists(dir_ / "ft/model/model.safetensors"));  // f32, below 5GB: one file
}

TEST_F(SaveCli, BadSaveSettingsAreOneLineErrorsNamingTheKey) {
  write_counting_shard(p("data/train_000000.bin"), 4000, 50);
  const std::string train = "train --data " + p("data") + " --out " + p("run") + small_model(50);
  expect_user_error(forge(train + " --save-dtype fp16"),
                    "--save-dtype: expected f32 or bf16, got 'fp16'");
  expect_user_error(forge(train + " save_dtype=f16"),
                    "save_dtype: expected f32 or bf16, got 'f16'");
  expect_user_error(forge(train + " save_shard_size=5XB"),
                    "save_shard_size: expected a size in bytes >= 1");
  expect_user_error(forge(train + " save_shard_size=0"), "save_shard_size: expected");
  write("bad.json", "{\"save_shard_size\": \"-2GB\"}");
  expect_user_error(forge(train + " --config " + p("bad.json")), "save_shard_size: expected");
  expect_user_error(forge("train --resume " + p("run") + " --save-dtype bf16"),
                    "drop --save-dtype");
  EXPECT_FALSE(fs::exists(dir_ / "run"));
  const CmdResult h = forge("train --help");
  EXPECT_NE(h.out.find("--save-dtype f32|bf16"), std::string::npos) << h.out;
  EXPECT_NE(h.out.find("save_shard_size=BYTES"), std::string::npos) << h.out;
}

}  // namespace
}  // namespace forge
