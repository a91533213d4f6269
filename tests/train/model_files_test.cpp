// What every model a run saves carries, and how it is written: the tokenizer's files (from an
// --init-from model, or from the data directory that `forge data prepare` wrote) byte for
// byte in model/ and each checkpoint, through a resume whose sources are gone; which source
// wins when both have one; and the save settings (save_dtype: the final model only;
// save_shard_size: every save). Files are compared as bytes and read with the safetensors
// reader, not with the code under test.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "forge/core/error.h"
#include "forge/io/bf16.h"
#include "forge/io/safetensors.h"
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

// A Hugging Face chat model's tokenizer companions, as transformers 4 and 5 write them.
const char* const kTokenizerConfig =
    "{\n  \"add_bos_token\": false,\n  \"bos_token\": \"<|endoftext|>\",\n  \"chat_template\": "
    "\"{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}\",\n  \"eos_token\": "
    "\"<|im_end|>\",\n  \"model_max_length\": 2048,\n  \"tokenizer_class\": \"GPT2Tokenizer\"\n}";
const char* const kSpecialTokensMap =
    "{\n  \"bos_token\": \"<|endoftext|>\",\n  \"eos_token\": \"<|im_end|>\"\n}\n";
const char* const kChatTemplate =
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] "
    "}}<|im_end|>\n{% endfor %}";

class ModelFilesTest : public testing::CountingCorpusRun {
 protected:
  ModelFilesTest() : CountingCorpusRun("forge_modelfiles") {}
  // A byte-level tokenizer.json with <|endoftext|> = 256 and <|im_end|> = `im_end`.
  static std::string tokenizer_json(int32_t im_end) {
    std::vector<std::string> bytes;
    for (int b = 0; b < 256; ++b) bytes.emplace_back(1, static_cast<char>(b));
    const fs::path tmp = fs::temp_directory_path() /
                         ("forge_modelfiles_tok_" + std::to_string(::getpid()) + ".json");
    tok::Tokenizer::from_bpe(bytes, {}, {{"<|endoftext|>", 256}, {"<|im_end|>", im_end}},
                             tok::SplitPattern::kGpt2)
        .save_json(tmp.string());
    std::string text = bytes_of(tmp);
    fs::remove(tmp);
    return text;
  }
  // The four tokenizer files (the tokenizer differing by `im_end`) written into `d`.
  static io::FileSet write_tokenizer_files(const fs::path& d, int32_t im_end) {
    const io::FileSet files = {{"tokenizer.json", tokenizer_json(im_end)},
                               {"tokenizer_config.json", kTokenizerConfig},
                               {"special_tokens_map.json", kSpecialTokensMap},
                               {"chat_template.jinja", kChatTemplate}};
    fs::create_directories(d);
    for (const auto& [name, text] : files) std::ofstream(d / name, std::ios::binary) << text;
    return files;
  }
  void expect_files(const std::vector<fs::path>& dirs, const io::FileSet& files) {
    for (const fs::path& d : dirs)
      for (const auto& [name, text] : files) EXPECT_EQ(bytes_of(d / name), text) << d / name;
  }

};

TEST_F(ModelFilesTest, InitFromCarriesTheTokenizerFilesIntoEveryModelThroughResume) {
  const std::string data = (dir_ / "data").string();
  train(model(), config(2, 0), data, (dir_ / "src").string());
  const io::FileSet files = write_tokenizer_files(dir_ / "src/model", 257);
  const fs::path ft = dir_ / "ft";
  train_from((dir_ / "src/model").string(), config(3, 2), data, ft.string());
  fs::remove_all(dir_ / "src");  // the run keeps its own copies
  resume(ft.string(), 5);
  const std::vector<fs::path> dirs = saved_models(ft);
  ASSERT_EQ(dirs.size(), 4u);  // model/ and steps 3, 4, 5 (keep_checkpoints 3)
  expect_files(dirs, files);
  // generation_config.json follows tokenizer_config.json's eos_token.
  for (const fs::path& d : dirs)
    EXPECT_EQ(json::parse(bytes_of(d / "generation_config.json"))["eos_token_id"], 257) << d;
  const json rc = json::parse(bytes_of(ft / "config.json"));
  EXPECT_EQ(rc["tokenizer_files"], json({"chat_template.jinja", "special_tokens_map.json",
                                         "tokenizer.json", "tokenizer_config.json"}));
}

// Shards from `forge data prepare` carry their tokenizer's files; a run with no tokenizer of
// its own saves them. With --init-from, a model that has a tokenizer.json keeps its own (its
// embedding rows are that tokenizer's ids), and a one-line note says the data's differs. An
// init model without one takes the data's.
TEST_F(ModelFilesTest, DataDirectoryTokenizerUnlessTheInitModelHasOne) {
  const std::string data = (dir_ / "data").string();
  const io::FileSet data_files = write_tokenizer_files(dir_ / "data", 258);
  train(model(), config(2, 2), data, (dir_ / "scratch").string());
  expect_files(saved_models(dir_ / "scratch"), data_files);

  train(model(), config(1, 0), data, (dir_ / "plain").string());
  const std::string init = (dir_ / "plain/model").string();
  for (const auto& [name, text] : data_files) fs::remove(dir_ / "plain/model" / name);
  fs::remove(dir_ / "plain/model/generation_config.json");
  train_from(init, config(1, 0), data, (dir_ / "ft_bare").string());
  expect_files(saved_models(dir_ / "ft_bare"), data_files);

  const io::FileSet init_files = write_tokenizer_files(dir_ / "plain/model", 259);
  ::testing::internal::CaptureStdout();
  train_from(init, config(2, 1), data, (dir_ / "ft").string());
  const std::string out = ::testing::internal::GetCapturedStdout();
  expect_files(saved_models(dir_ / "ft"), init_files);
  EXPECT_NE(out.find("note: the run's tokenizer is " + init + "/tokenizer.json; " + data +
                     "/tokenizer.json differs"),
            std::string::npos)
      << out;
  // Identical tokenizers: no note.
  std::ofstream(dir_ / "data/tokenizer.json", std::ios::binary) << init_files.at("tokenizer.json");
  ::testing::internal::CaptureStdout();
  train_from(init, config(1, 0), data, (dir_ / "ft_same").string());
  EXPECT_EQ(::testing::internal::GetCapturedStdout().find("note:"), std::string::npos);
}

// save_dtype=bf16 makes model/ BF16 (config.json says bfloat16) while checkpoints keep the f32
// master weights, so a resumed run continues exactly; save_shard_size shards both.
TEST_F(ModelFilesTest, SaveDtypeAndShardSize) {
  const std::string data = (dir_ / "data").string();
  TrainConfig c = config(3, 2);
  c.save_dtype = "bf16";
  c.save_shard_size = 1'000;  // the 16x16 embedding is 1,024 bytes in F32, 512 in BF16
  const fs::path run = dir_ / "run";
  train(model(), c, data, run.string());
  auto dtypes_and_files = [](const fs::path& d) {
    std::set<io::StDType> dtypes;
    const json index = json::parse(bytes_of(d / "model.safetensors.index.json"));
    std::set<std::string> files;
    for (const auto& [name, file] : index["weight_map"].items()) files.insert(file);
    for (const std::string& f : files) {
      const auto st = io::SafetensorsFile::open((d / f).string());
      for (const auto& t : st.tensors()) dtypes.insert(t.dtype);
    }
    return std::make_pair(dtypes, files.size());
  };
  const auto [final_dtypes, final_files] = dtypes_and_files(run / "model");
  EXPECT_EQ(final_dtypes, std::set<io::StDType>{io::StDType::kBF16});
  EXPECT_GT(final_files, 2u);
  EXPECT_EQ(json::parse(bytes_of(run / "model/config.json"))["torch_dtype"], "bfloat16");
  for (const auto& [step, path] : list_checkpoints(run.string())) {
    const auto [dtypes, files] = dtypes_and_files(path);
    EXPECT_EQ(dtypes, std::set<io::StDType>{io::StDType::kF32}) << path;
    EXPECT_GT(files, 2u) << path;
    EXPECT_EQ(json::parse(bytes_of(fs::path(path) / "config.json"))["torch_dtype"], "float32");
  }
  // The bf16 model is an --init-from source like any other; the sharded checkpoint resumes.
  const Transformer<float> bf16 = load_model_dir((run / "model").string());
  const Checkpoint ck = load_checkpoint(list_checkpoints(run.string()).back().second);
  for (size_t i = 0; i < bf16.weights().size(); ++i)
    ASSERT_EQ(bf16.weights()[i], bf16_to_f32(f32_to_bf16(ck.model.weights()[i]))) << i;
  train_from((run / "model").string(), config(1, 0), data, (dir_ / "ft").string());
  resume(run.string(), 4);
  EXPECT_EQ(list_checkpoints(run.string()).back().first, 4);
  // The settings are part of the run: resumed with them, recorded in config.json.
  const json rc = json::parse(bytes_of(run / "config.json"));
  EXPECT_EQ(rc["train"]["save_dtype"], "bf16");
  EXPECT_EQ(rc["train"]["save_shard_size"], 1000);
  EXPECT_EQ(dtypes_and_files(run / "model").first, std::set<io::StDType>{io::StDType::kBF16});
}

TEST_F(ModelFilesTest, BadSaveSettingsStopTheRunBeforeItStarts) {
  const std::string data = (dir_ / "data").string();
  TrainConfig c = config(1, 0);
  c.save_dtype = "f16";
  EXPECT_THROW(train(model(), c, data, (dir_ / "a").string()), Error);
  c = config(1, 0);
  c.save_shard_size = 0;
  EXPECT_THROW(train(model(), c, data, (dir_ / "b").string()), Error);
  EXPECT_FALSE(fs::exists(dir_ / "a"));
  EXPECT_FALSE(fs::exists(dir_ / "b"));
}

}  // namespace
}  // namespace forge
