// The commands that go through Tokenizer, with a SentencePiece-style tokenizer.json (Llama 2's
// form, tests/data/tokenizer/sentencepiece/llama2.json): forge tokenizer encode/decode give the
// ids and text of `tokenizers` (expected.json), forge data prepare writes each document's
// encode_ordinary ids, forge generate encodes a prompt with the post-processor's <s> and prints
// the generated tokens' text.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cli_runner.h"
#include "forge/data/shard.h"
#include "forge/generate/text_stream.h"
#include "forge/io/model_files.h"
#include "forge/model/config.h"
#include "forge/model/model_dir.h"
#include "forge/tokenizer/tokenizer.h"

namespace forge {
namespace {

namespace fs = std::filesystem;
using testing::CmdResult;
using testing::slurp;
using json = nlohmann::json;
using Ids = std::vector<int32_t>;

const std::string kTokenizer = FORGE_SOURCE_DIR "/tests/data/tokenizer/sentencepiece/llama2.json";

class SentencePieceCli : public testing::CliTest {
 protected:
  // The golden case of variant "llama2" for `text`.
  static json golden(const std::string& text) {
    const json e =
        json::parse(slurp(FORGE_SOURCE_DIR "/tests/data/tokenizer/sentencepiece/expected.json"));
    for (const json& c : e["variants"][0]["cases"])
      if (c["text"] == text) return c;
    ADD_FAILURE() << "no golden case for '" << text << "'";
    return json();
  }
};

TEST_F(SentencePieceCli, EncodeAndDecodeMatchTokenizers) {
  for (const std::string text : {"Café naïve façade résumé — déjà vu",
                                 "emoji 😀🎉👍🏽 and 👨‍👩‍👧 family",
                                 "Hello <s> world", "line one\nline two\n\nline four\n"}) {
    const json c = golden(text);
    const CmdResult enc = forge("tokenizer encode --json --tokenizer " + kTokenizer + " --input " +
                                write("in.txt", text));
    ASSERT_EQ(enc.code, 0) << enc.err;
    EXPECT_EQ(json::parse(enc.out)["ids"], c["ids"]) << text;
    std::string ids;
    for (const json& id : c["ids"]) ids += (ids.empty() ? "" : ",") + std::to_string(id.get<int>());
    const CmdResult dec = forge("tokenizer decode --tokenizer " + kTokenizer + " --ids " + ids);
    ASSERT_EQ(dec.code, 0) << dec.err;
    EXPECT_EQ(dec.out, c["decode"].get<std::string>()) << text;
  }
}

TEST_F(SentencePieceCli, DataPrepareWritesEachDocumentsIds) {
  const std::vector<std::string> docs = {"The quick brown fox jumps over the lazy dog.", "中文测试",
                                         "  two leading spaces", "a literal <s> stays"};
  std::string lines;
  for (const std::string& d : docs) lines += d + "\n";
  const CmdResult r =
      forge("data prepare --tokenizer " + kTokenizer + " --input " + write("docs.txt", lines) +
            " --format lines --val-fraction 0 --eot '</s>'" + " --out " + p("data"));
  ASSERT_EQ(r.code, 0) << r.err;
  const tok::Tokenizer t = tok::Tokenizer::load(kTokenizer);
  Ids want;
  for (const std::string& d : docs) {
    want.push_back(*t.special_id("</s>"));
    const Ids ids = t.encode_ordinary(d);
    want.insert(want.end(), ids.begin(), ids.end());
  }
  const Shard s = Shard::open(p("data/train_000000.bin"), t.vocab_size());
  Ids got(s.size());
  s.read(0, s.size(), got.data());
  EXPECT_EQ(got, want);
  EXPECT_EQ(std::count(got.begin(), got.end(), *t.special_id("<s>")), 0);  // text, not a token
}

TEST_F(SentencePieceCli, GenerateEncodesThePromptWithBosAndPrintsText) {
  ModelConfig cfg = preset_config("tiny");
  const tok::Tokenizer t = tok::Tokenizer::load(kTokenizer);
  cfg.vocab_size = t.vocab_size();
  cfg.max_seq_len = 64;
  cfg.n_layer = 2;
  cfg.n_embd = 32;
  cfg.n_head = cfg.n_kv_head = 2;
  cfg.ffn_hidden = 64;
  Transformer<float> model(cfg);
  model.init_weights(7);
  save_model_dir(p("model"), model, {.files = {{"tokenizer.json", io::read_file(kTokenizer)}}});

  const std::string g = " --max-new-tokens 12 --temperature 0 --ignore-eos --json";
  const json c = golden("Café naïve façade résumé — déjà vu");
  std::string ids;
  for (const json& id : c["with_special"])
    ids += (ids.empty() ? "" : ",") + std::to_string(id.get<int>());
  ASSERT_EQ(c["with_special"][0], 1);  // <s> from the TemplateProcessing post-processor
  const CmdResult from_text = forge("generate --model " + p("model") +
                                    " --prompt 'Café naïve façade résumé — déjà vu'" + g);
  const CmdResult from_ids = forge("generate --model " + p("model") + " --ids " + ids + g);
  ASSERT_EQ(from_text.code, 0) << from_text.err;
  ASSERT_EQ(from_ids.code, 0) << from_ids.err;
  const json a = json::parse(from_text.out), b = json::parse(from_ids.out);
  EXPECT_EQ(a["ids"], b["ids"]);
  // The printed text is the tokens' text as a stream makes it: ▁ as spaces, bytes as UTF-8.
  TextStream stream(t, {}, /*skip_special=*/true);
  std::string text;
  for (const json& id : a["ids"]) text += stream.push(id.get<int32_t>());
  text += stream.finish();
  EXPECT_EQ(a["text"], text);
  EXPECT_EQ(a["ids"].size(), 12u);
}

}  // namespace
}  // namespace forge
