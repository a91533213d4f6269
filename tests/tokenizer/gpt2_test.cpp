// GPT-2's real tokenizer against reference ids from tiktoken, Hugging Face `tokenizers` and
// openai/gpt-2's encoder.py (all three agree; tools/make_gpt2_reference.py made the file).
// Needs GPT-2's encoder.json + vocab.bpe in ../shared/data/gpt2 next to the repository; skips
// without them.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "forge/core/error.h"
#include "forge/tokenizer/tokenizer.h"
#include "testing.h"
#include "tokenizer/random_text.h"

namespace forge::tok {
namespace {

namespace fs = std::filesystem;

const std::string kGpt2Dir = FORGE_SOURCE_DIR "/../shared/data/gpt2";
const std::string kReference = FORGE_SOURCE_DIR "/tests/data/tokenizer/gpt2_reference.json";

struct Reference {
  std::string text;
  std::vector<int32_t> ids;
  bool specials;
};

std::vector<Reference> load_reference() {
  std::ifstream f(kReference);
  EXPECT_TRUE(f.good()) << "cannot open " << kReference;
  const nlohmann::json j = nlohmann::json::parse(f);
  std::vector<Reference> refs;
  for (const auto& e : j)
    refs.push_back({e["text"].get<std::string>(), e["ids"].get<std::vector<int32_t>>(),
                    e["specials"].get<bool>()});
  return refs;
}

class Gpt2Test : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (fs::exists(kGpt2Dir + "/encoder.json") && fs::exists(kGpt2Dir + "/vocab.bpe"))
      gpt2_ = new Tokenizer(Tokenizer::load(kGpt2Dir));
  }
  static void TearDownTestSuite() {
    delete gpt2_;
    gpt2_ = nullptr;
  }
  void SetUp() override {
    if (gpt2_ == nullptr)
      GTEST_SKIP() << "GPT-2's encoder.json/vocab.bpe not found in " << kGpt2Dir;
  }

  // Compares every reference entry; reports the first differing position of each mismatch.
  static void expect_reference_ids(const Tokenizer& t) {
    const std::vector<Reference> refs = load_reference();
    ASSERT_GT(refs.size(), 40u);
    for (const Reference& r : refs) {
      const std::vector<int32_t> got = r.specials ? t.encode(r.text) : t.encode_ordinary(r.text);
      if (got != r.ids) {
        size_t i = 0;
        while (i < got.size() && i < r.ids.size() && got[i] == r.ids[i]) ++i;
        ADD_FAILURE() << "text " << ::testing::PrintToString(r.text) << ": " << got.size()
                      << " ids vs " << r.ids.size() << " expected; first difference at [" << i
                      << "]: got " << (i < got.size() ? std::to_string(got[i]) : "(end)")
                      << " want " << (i < r.ids.size() ? std::to_string(r.ids[i]) : "(end)");
      }
      EXPECT_EQ(t.decode(r.ids), r.text);
    }
  }

  static Tokenizer* gpt2_;
};
Tokenizer* Gpt2Test::gpt2_ = nullptr;

TEST_F(Gpt2Test, LoadsTheVocabulary) {
  EXPECT_EQ(gpt2_->vocab_size(), 50257);
  EXPECT_EQ(gpt2_->eot_id(), 50256);
  EXPECT_EQ(gpt2_->merges().size(), 50000u);
  EXPECT_EQ(gpt2_->vocab()[262], " the");  // "Ġthe" in encoder.json
  EXPECT_EQ(gpt2_->vocab()[198], "\n");    // "Ċ"
}

TEST_F(Gpt2Test, MatchesReferenceIds) {
  expect_reference_ids(*gpt2_);
}

TEST_F(Gpt2Test, SavedTokenizerJsonEncodesIdentically) {
  const std::string path =
      (fs::temp_directory_path() / ("forge_gpt2_" + std::to_string(::getpid()) + ".json")).string();
  gpt2_->save_json(path);
  const Tokenizer t = Tokenizer::load(path);
  fs::remove(path);
  EXPECT_EQ(t.vocab(), gpt2_->vocab());
  EXPECT_EQ(t.merges(), gpt2_->merges());
  EXPECT_EQ(t.eot_id(), 50256);
  expect_reference_ids(t);
}

TEST_F(Gpt2Test, DecodeInvertsEncodeOnRandomText) {
  Rng rng(2024, 9);
  const Tokenizer gpt4_split =
      Tokenizer::from_bpe(gpt2_->vocab(), gpt2_->merges(), gpt2_->specials(), SplitPattern::kGpt4);
  for (const Tokenizer* t : {static_cast<const Tokenizer*>(gpt2_), &gpt4_split}) {
    for (int trial = 0; trial < 300; ++trial) {
      const std::string text = trial % 3 == 0 ? testing::random_raw_bytes(rng, rng.below(400))
                                              : testing::random_utf8(rng, rng.below(200));
      ASSERT_EQ(t->decode(t->encode(text)), text);
    }
  }
}

}  // namespace
}  // namespace forge::tok
