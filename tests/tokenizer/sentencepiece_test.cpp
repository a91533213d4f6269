// SentencePiece-style tokenizer.json files (character-level BPE with byte fallback: Llama 2,
// Mistral and their variants) against Hugging Face `tokenizers`: the ids of encode(), of
// with_special_tokens() and of encode_ordinary(), and the text of decode(), for every input and
// id sequence in tests/data/tokenizer/sentencepiece/expected.json (made by
// tools/make_sp_tokenizer_reference.py); then behaviour the data implies (byte fallback for
// invalid UTF-8, token_bytes for streams, save_json) and the components Forge refuses.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "forge/core/error.h"
#include "forge/generate/text_stream.h"
#include "forge/tokenizer/tokenizer.h"
#include "testing.h"

namespace forge::tok {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using Ids = std::vector<int32_t>;

const std::string kDir = FORGE_SOURCE_DIR "/tests/data/tokenizer/sentencepiece";

json read_json(const std::string& path) {
  std::ifstream f(path);
  EXPECT_TRUE(f.good()) << path;
  return json::parse(f);
}

const json& expected() {
  static const json e = read_json(kDir + "/expected.json");
  return e;
}

// The first difference of two id lists, for a failure message that fits on a screen.
::testing::AssertionResult same_ids(const Ids& got, const Ids& want) {
  for (size_t i = 0; i < std::max(got.size(), want.size()); ++i) {
    if (i < got.size() && i < want.size() && got[i] == want[i]) continue;
    auto at = [i](const Ids& v) { return i < v.size() ? std::to_string(v[i]) : "(end)"; };
    return ::testing::AssertionFailure()
           << "first difference at [" << i << "]: got " << at(got) << ", want " << at(want)
           << " (lengths " << got.size() << " and " << want.size() << ")";
  }
  return ::testing::AssertionSuccess();
}

class SentencePieceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("forge_sp_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string write(const std::string& name, const json& j) {
    const std::string path = (dir_ / name).string();
    std::ofstream(path) << j.dump();
    return path;
  }
  // A variant's tokenizer.json: its base file with its JSON merge patch applied.
  json variant_json(const json& v) {
    json j = read_json(kDir + "/" + v["base"].get<std::string>());
    j.merge_patch(v["patch"]);
    return j;
  }
  Tokenizer load_variant(const json& v) {
    return Tokenizer::load(write(v["name"].get<std::string>() + ".json", variant_json(v)));
  }
  // The message of the forge::Error that loading `j` throws ("" if it loads).
  std::string load_error(const json& j) {
    try {
      Tokenizer::load(write("tokenizer.json", j));
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  }
  json llama2() { return read_json(kDir + "/llama2.json"); }
  json mistral() { return read_json(kDir + "/mistral.json"); }

  fs::path dir_;
};

TEST_F(SentencePieceTest, EncodesAsTokenizersDoes) {
  ASSERT_EQ(expected()["variants"].size(), 9u);
  for (const json& v : expected()["variants"]) {
    const std::string name = v["name"];
    const Tokenizer t = load_variant(v);
    EXPECT_TRUE(t.post_processor().problem.empty()) << name << ": " << t.post_processor().problem;
    for (const json& c : v["cases"]) {
      const std::string text = c["text"];
      const Ids ids = t.encode(text);
      EXPECT_TRUE(same_ids(ids, c["ids"].get<Ids>())) << name << " encode '" << text << "'";
      EXPECT_TRUE(same_ids(t.with_special_tokens(ids), c["with_special"].get<Ids>()))
          << name << " with_special_tokens '" << text << "'";
      EXPECT_TRUE(same_ids(t.encode_ordinary(text), c["ordinary"].get<Ids>()))
          << name << " encode_ordinary '" << text << "'";
    }
  }
}

TEST_F(SentencePieceTest, DecodesAsTokenizersDoes) {
  for (const json& v : expected()["variants"]) {
    const std::string name = v["name"];
    const Tokenizer t = load_variant(v);
    for (const json& c : v["cases"])
      EXPECT_EQ(t.decode(c["ids"].get<Ids>()), c["decode"].get<std::string>())
          << name << " decode(encode('" << c["text"].get<std::string>() << "'))";
    for (const json& d : v["decodes"])
      EXPECT_EQ(t.decode(d["ids"].get<Ids>()), d["text"].get<std::string>())
          << name << " decode " << d["ids"].dump();
  }
}

TEST_F(SentencePieceTest, RoundTripsWhereTokenizersDoes) {
  int round_trips = 0, not_round_trips = 0;
  for (const json& v : expected()["variants"]) {
    const Tokenizer t = load_variant(v);
    for (const json& c : v["cases"]) {
      const std::string text = c["text"];
      if (!c["round_trips"].get<bool>()) {
        ++not_round_trips;
        continue;
      }
      ++round_trips;
      EXPECT_EQ(t.decode(t.encode(text)), text) << v["name"].get<std::string>();
    }
  }
  // Both kinds occur: <unk>, Llama 2's space after a special token, Metaspace eating spaces.
  EXPECT_GT(round_trips, 200);
  EXPECT_GT(not_round_trips, 20);
}

// The golden data would pass a tokenizer that ignored a flag if no case depended on it: check
// that each flag the variants set changes some ids.
TEST_F(SentencePieceTest, GoldenDataDependsOnEveryOption) {
  std::map<std::string, const json*> by_name;
  for (const json& v : expected()["variants"]) by_name[v["name"]] = &v;
  auto ids_of = [&](const std::string& name) {
    std::vector<Ids> all;
    for (const json& c : (*by_name.at(name))["cases"]) all.push_back(c["ids"].get<Ids>());
    return all;
  };
  EXPECT_NE(ids_of("llama2"), ids_of("llama2_unk_fused"));              // byte_fallback
  EXPECT_NE(ids_of("llama2_unk_fused"), ids_of("llama2_unk_unfused"));  // fuse_unk
  EXPECT_NE(ids_of("llama2"), ids_of("llama2_metaspace_first"));        // Prepend vs Metaspace
  EXPECT_NE(ids_of("llama2_metaspace_first"), ids_of("llama2_metaspace_first_split"));  // split
  EXPECT_NE(ids_of("mistral"), ids_of("metaspace_always_split"));  // prepend_scheme
  EXPECT_NE(ids_of("mistral"), ids_of("replace_only"));            // no prepend at all

  json v = *by_name.at("metaspace_never_ignore_merges");
  const Tokenizer with = load_variant(v);
  v["patch"]["model"]["ignore_merges"] = false;
  const Tokenizer without = load_variant(v);
  EXPECT_NE(with.encode("xyzzy plugh xyzzy xyzzy."), without.encode("xyzzy plugh xyzzy xyzzy."));
}

TEST_F(SentencePieceTest, ByteFallbackSpellsCharactersWithoutATokenInBytes) {
  const Tokenizer t = Tokenizer::load(kDir + "/llama2.json");
  const auto id = [&](const std::string& s) {
    const auto it = std::find(t.vocab().begin(), t.vocab().end(), s);
    EXPECT_NE(it, t.vocab().end()) << s;
    return static_cast<int32_t>(it - t.vocab().begin());
  };
  EXPECT_EQ(t.vocab()[3], "<0x00>");
  EXPECT_EQ(t.encode_ordinary("中"), (Ids{id("▁"), id("<0xE4>"), id("<0xB8>"), id("<0xAD>")}));
  // Invalid UTF-8, which `tokenizers` cannot be given: each bad byte is a character of its own.
  EXPECT_EQ(t.encode_ordinary("\xFF"), (Ids{id("▁"), id("<0xFF>")}));
  EXPECT_EQ(t.decode(t.encode_ordinary("a\xFF\xE4\xB8 b")),
            "a\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD b");

  json j = llama2();
  j["model"]["byte_fallback"] = false;
  const Tokenizer unk = Tokenizer::load(write("unk.json", j));
  EXPECT_EQ(unk.encode_ordinary("\xFF\xFE"), (Ids{id("▁"), 0}));  // fuse_unk: one <unk>
  j["model"]["unk_token"] = nullptr;  // no unk token: `tokenizers` drops the characters
  const Tokenizer drop = Tokenizer::load(write("drop.json", j));
  EXPECT_EQ(drop.encode_ordinary("\xFF中"), (Ids{id("▁")}));
}

// token_bytes is what a stream (forge generate) concatenates: the text with the ▁ turned into
// spaces and byte tokens into bytes; the only difference from decode is Llama 2's first space.
TEST_F(SentencePieceTest, TokenBytesAreWhatAStreamPrints) {
  const Tokenizer t = Tokenizer::load(kDir + "/llama2.json");
  EXPECT_EQ(t.token_bytes(*t.special_id("<s>")), "<s>");
  const std::string text = "Café naïve 中文 😀 and\ttabs\n  two spaces";
  const Ids ids = t.encode_ordinary(text);
  std::string joined;
  for (const int32_t id : ids) joined += t.token_bytes(id);
  EXPECT_EQ(joined, " " + text);
  EXPECT_EQ(t.decode(ids), text);

  TextStream stream(t, {"spaces"});
  std::string streamed;
  for (const int32_t id : ids) streamed += stream.push(id);
  streamed += stream.finish();
  EXPECT_EQ(streamed, " Café naïve 中文 😀 and\ttabs\n  two ");
}

TEST_F(SentencePieceTest, MergesReadInBothForms) {
  json j = mistral();
  ASSERT_TRUE(j["model"]["merges"][0].is_array());
  const Tokenizer pairs = Tokenizer::load(write("pairs.json", j));
  for (json& m : j["model"]["merges"]) m = m[0].get<std::string>() + " " + m[1].get<std::string>();
  const Tokenizer strings = Tokenizer::load(write("strings.json", j));
  EXPECT_EQ(strings.merges(), pairs.merges());
  const std::string text = "The quick brown fox jumps over the lazy dog.";
  EXPECT_EQ(strings.encode(text), pairs.encode(text));
}

TEST_F(SentencePieceTest, SaveJsonRoundTrips) {
  for (const json& v : expected()["variants"]) {
    const std::string name = v["name"];
    const Tokenizer t = load_variant(v);
    const std::string path = (dir_ / (name + "_saved.json")).string();
    t.save_json(path);
    const Tokenizer u = Tokenizer::load(path);
    EXPECT_EQ(u.vocab(), t.vocab()) << name;
    EXPECT_EQ(u.merges(), t.merges()) << name;
    for (const json& c : v["cases"]) {
      const std::string text = c["text"];
      EXPECT_TRUE(same_ids(u.with_special_tokens(u.encode(text)), c["with_special"].get<Ids>()))
          << name << " '" << text << "'";
      EXPECT_EQ(u.decode(c["ids"].get<Ids>()), c["decode"].get<std::string>()) << name;
    }
    const json saved = read_json(path);
    const json original = variant_json(v);
    for (const char* key : {"normalizer", "pre_tokenizer", "decoder"})  // a patch may delete one
      EXPECT_EQ(saved.value(key, json()), original.value(key, json())) << name << " " << key;
    for (const char* key : {"byte_fallback", "fuse_unk", "unk_token"})
      EXPECT_EQ(saved["model"][key], original["model"][key]) << name << " " << key;
  }
}

// Every component Forge does not apply is refused with one line naming it.
TEST_F(SentencePieceTest, RefusesWhatItDoesNotApply) {
  auto expect_refused = [&](const json& j, const std::string& name) {
    const std::string e = load_error(j);
    EXPECT_NE(e.find(name), std::string::npos) << "want '" << name << "' in: " << e;
    EXPECT_EQ(e.find('\n'), std::string::npos) << e;
  };
  json j = llama2();
  j["normalizer"]["normalizers"].push_back({{"type", "NFKC"}});
  expect_refused(j, "normalizer 'NFKC'");
  j = llama2();
  j["normalizer"] = {{"type", "NFC"}};
  expect_refused(j, "normalizer 'NFC'");
  j = llama2();
  j["normalizer"]["normalizers"][1]["pattern"] = {{"Regex", " +"}};
  expect_refused(j, "Replace: pattern {\"Regex\"");
  j = llama2();
  j["pre_tokenizer"] = {{"type", "Whitespace"}};
  expect_refused(j, "pre_tokenizer 'Whitespace'");
  j = mistral();
  j["pre_tokenizer"] = {{"type", "Sequence"}, {"pretokenizers", {j["pre_tokenizer"]}}};
  expect_refused(j, "pre_tokenizer 'Sequence'");
  j = llama2();
  j["decoder"]["decoders"].push_back({{"type", "WordPiece"}, {"prefix", "##"}});
  expect_refused(j, "decoder 'WordPiece'");
  j = llama2();
  j["decoder"] = {{"type", "CTC"}};
  expect_refused(j, "decoder 'CTC'");
  j = mistral();
  j["decoder"] = {{"type", "ByteLevel"}};
  expect_refused(j,
                 "decoder ByteLevel needs a ByteLevel pre-tokenizer, and pre_tokenizer is "
                 "Metaspace");
  j = llama2();
  j["decoder"]["decoders"][3]["content"] = "ab";
  expect_refused(j, "Strip: content \"ab\" is not one character");
  j = llama2();
  j["model"]["dropout"] = 0.1;
  expect_refused(j, "model.dropout 0.1 is not supported");
  j = llama2();
  j["model"]["unk_token"] = "<oov>";
  expect_refused(j, "unk_token '<oov>' is not in the vocabulary");
  j = llama2();
  j["model"]["continuing_subword_prefix"] = "##";
  expect_refused(j, "continuing_subword_prefix");
  j = mistral();
  j["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "▁"}, {"add_prefix_space", false}};
  expect_refused(j, "add_prefix_space false does not match prepend_scheme");
  j = mistral();
  j["pre_tokenizer"]["prepend_scheme"] = "First";
  expect_refused(j, "prepend_scheme \"First\"");
  j = mistral();
  j["pre_tokenizer"]["replacement"] = "__";
  expect_refused(j, "replacement '__' is not one character");

  // What `tokenizers` reads the same way loads: dropout null or 0, legacy add_prefix_space.
  j = llama2();
  j["model"]["dropout"] = 0.0;
  EXPECT_EQ(load_error(j), "");
  j = mistral();
  j["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "▁"}, {"add_prefix_space", true}};
  EXPECT_EQ(Tokenizer::load(write("legacy.json", j)).encode("hi there"),
            Tokenizer::load(write("always.json",
                                  [&] {
                                    json k = mistral();
                                    k["pre_tokenizer"]["prepend_scheme"] = "always";
                                    k["pre_tokenizer"]["split"] = true;
                                    return k;
                                  }()))
                .encode("hi there"));
}

}  // namespace
}  // namespace forge::tok
