// Every model a run saves (model/ and each checkpoint) carries a generation_config.json naming
// its end-of-text token: made from the run's tokenizer, or the --init-from model's own file
// carried through byte for byte; a resumed run keeps it; a broken source file stops the run
// before it writes anything. The files are read here with nlohmann::json directly, not with
// the reader under test.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "forge/core/error.h"
#include "forge/model/model_dir.h"
#include "forge/tokenizer/tokenizer.h"
#include "forge/train/checkpoint.h"
#include "forge/train/trainer.h"
#include "testing.h"
#include "train/counting_corpus.h"

namespace forge {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

std::string bytes_of(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  EXPECT_TRUE(f.good()) << p;
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

class GenerationConfigSaveTest : public testing::CountingCorpusRun {
 protected:
  GenerationConfigSaveTest() : CountingCorpusRun("forge_gensave") {}
  // A byte-level tokenizer.json with <|endoftext|> at `eot` (the counting corpus's ids are
  // not its text; the trainer never encodes with it).
  void write_tokenizer(const fs::path& path, int32_t eot) {
    std::vector<std::string> bytes;
    for (int b = 0; b < 256; ++b) bytes.emplace_back(1, static_cast<char>(b));
    fs::create_directories(path.parent_path());
    tok::Tokenizer::from_bpe(bytes, {}, {{"<|endoftext|>", eot}}, tok::SplitPattern::kGpt2)
        .save_json(path.string());
  }
};

TEST_F(GenerationConfigSaveTest, FromTheRunsTokenizerIntoEveryModelAndThroughResume) {
  const fs::path run = dir_ / "run";
  write_tokenizer(run / "tokenizer.json", 300);  // as quickstart does: the run dir holds it
  const std::string data = (dir_ / "data").string();
  volatile std::sig_atomic_t stop = 0;
  RunOptions opt;
  opt.stop = &stop;
  stop = 1;  // stop after the first step: a checkpoint, then resume
  train(model(), config(4, 2), data, run.string(), opt);
  ASSERT_FALSE(fs::exists(run / "model"));
  resume(run.string(), 0);
  const std::vector<fs::path> dirs = saved_models(run);
  ASSERT_EQ(dirs.size(), 4u);  // model/, step 1 (the stop), 2 and 4
  for (const fs::path& d : dirs) {
    const json g = json::parse(bytes_of(d / "generation_config.json"));
    EXPECT_EQ(g["eos_token_id"], 300) << d;
    EXPECT_EQ(g["bos_token_id"], 300) << d;
  }
  EXPECT_EQ(bytes_of(run / "generation_config.json"),
            bytes_of(run / "model/generation_config.json"));
}

TEST_F(GenerationConfigSaveTest, InitFromCarriesTheSourceFileThrough) {
  const std::string data = (dir_ / "data").string();
  train(model(), config(2, 0), data, (dir_ / "src").string());
  // A Hugging Face-style file with fields Forge does not read: it must arrive unchanged.
  const std::string source =
      "{\n  \"_from_model_config\": true,\n  \"bos_token_id\": 1,\n  \"eos_token_id\": [2, 3],\n"
      "  \"num_beams\": 4,\n  \"temperature\": 0.3,\n  \"transformers_version\": \"4.46.0\"\n}\n";
  std::ofstream(dir_ / "src/model/generation_config.json") << source;
  write_tokenizer(dir_ / "src/model/tokenizer.json", 7);  // not asked: the file wins
  const fs::path ft = dir_ / "ft";
  train_from((dir_ / "src/model").string(), config(3, 2), data, ft.string());
  resume(ft.string(), 5);  // the source may be gone by now; the run keeps its copy
  fs::remove_all(dir_ / "src");
  resume(ft.string(), 6);
  const std::vector<fs::path> dirs = saved_models(ft);
  ASSERT_GE(dirs.size(), 4u);
  for (const fs::path& d : dirs) EXPECT_EQ(bytes_of(d / "generation_config.json"), source) << d;
}

TEST_F(GenerationConfigSaveTest, InitFromWithoutAFileNamesTheTokenizersEndOfText) {
  const std::string data = (dir_ / "data").string();
  train(model(), config(2, 0), data, (dir_ / "src").string());
  ASSERT_FALSE(fs::exists(dir_ / "src/model/generation_config.json"));  // no tokenizer: none
  write_tokenizer(dir_ / "src/model/tokenizer.json", 5);
  train_from((dir_ / "src/model").string(), config(2, 0), data, (dir_ / "ft").string());
  const json g = json::parse(bytes_of(dir_ / "ft/model/generation_config.json"));
  EXPECT_EQ(g["eos_token_id"], 5);
}

TEST_F(GenerationConfigSaveTest, ABrokenSourceFileStopsTheRunBeforeItStarts) {
  const std::string data = (dir_ / "data").string();
  train(model(), config(2, 0), data, (dir_ / "src").string());
  const fs::path bad = dir_ / "src/model/generation_config.json";
  std::ofstream(bad) << "{\"eos_token_id\": \"two\"}";
  try {
    train_from((dir_ / "src/model").string(), config(2, 0), data, (dir_ / "ft").string());
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(bad.string() + ": eos_token_id:"), std::string::npos)
        << e.what();
  }
  EXPECT_FALSE(fs::exists(dir_ / "ft"));
}

}  // namespace
}  // namespace forge
