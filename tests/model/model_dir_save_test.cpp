// Saving model directories as transformers does: the shard plan of huggingface_hub, sharded
// files with an index that covers every tensor once, one file below the limit, a re-save that
// leaves no stale shard (but keeps what a user put there), and BF16 weights. The files are
// checked through their headers and the index JSON, not only through load_model_dir.
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>

#include "forge/core/error.h"
#include "forge/io/bf16.h"
#include "forge/io/safetensors.h"
#include "forge/model/model_dir.h"
#include "testing.h"

namespace forge {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

std::string read(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

class ModelDirSaveTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("forge_mdsave_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // An untied llama: 2 + 9·L tensors of different sizes (embedding and head 100x32).
  static Transformer<float> model(uint64_t seed) {
    ModelConfig c = preset_config("llama-10m");
    c.vocab_size = 100;
    c.max_seq_len = 16;
    c.n_layer = 2;
    c.n_embd = 32;
    c.n_head = 4;
    c.n_kv_head = 2;
    c.ffn_hidden = 40;
    c.tie_embeddings = false;
    Transformer<float> m(c);
    m.init_weights(seed);
    return m;
  }
  // The names of the entries of `d`, sorted.
  static std::set<std::string> names_in(const fs::path& d) {
    std::set<std::string> out;
    for (const auto& e : fs::directory_iterator(d)) out.insert(e.path().filename().string());
    return out;
  }
  // Bytes of every tensor of the model as saved in `elem`-byte elements, by name.
  static std::map<std::string, uint64_t> saved_bytes(const Transformer<float>& m, size_t elem) {
    std::map<std::string, uint64_t> out;
    for (const auto& p : m.table().params()) {
      int64_t n = p.numel();
      if (p.offset == m.table().wte() || p.offset == m.table().lm_head())
        n = int64_t{m.config().vocab_size} * m.config().n_embd;
      out[p.name] = static_cast<uint64_t>(n) * elem;
    }
    return out;
  }

  fs::path dir_;
};

ModelSaveOptions sharded(int64_t shard_size, io::StDType dtype = io::StDType::kF32) {
  ModelSaveOptions o;
  o.shard_size = shard_size;
  o.dtype = dtype;
  return o;
}

// huggingface_hub's documented example ([6, 6, 2, 6, 2, 2] GB at a 10 GB limit gives [6],
// [6+2], [6+2+2]), a tensor over the limit alone and ahead of the file being filled, and a
// file filled exactly to the limit.
TEST(PlanWeightShards, IsHuggingFacesPlan) {
  using Plan = std::vector<std::vector<size_t>>;
  EXPECT_EQ(plan_weight_shards({6, 6, 2, 6, 2, 2}, 10), (Plan{{0}, {1, 2}, {3, 4, 5}}));
  EXPECT_EQ(plan_weight_shards({2, 20, 2}, 10), (Plan{{1}, {0, 2}}));
  EXPECT_EQ(plan_weight_shards({5, 5, 1}, 10), (Plan{{0, 1}, {2}}));
  EXPECT_EQ(plan_weight_shards({1, 2, 3}, 100), (Plan{{0, 1, 2}}));
  EXPECT_EQ(plan_weight_shards({}, 100), Plan{});
}

TEST_F(ModelDirSaveTest, ShardedSaveCoversEveryTensorOnceAndLoadsBackExactly) {
  const Transformer<float> m = model(3);
  const auto bytes = saved_bytes(m, 4);
  uint64_t total = 0, largest = 0;
  for (const auto& [name, b] : bytes) total += b, largest = std::max(largest, b);
  const int64_t limit = 20'000;  // several tensors per file, the 12,800-byte embedding alone
  ASSERT_LT(static_cast<uint64_t>(limit), total / 3);
  const fs::path d = dir_ / "sharded";
  save_model_dir(d.string(), m, sharded(limit));

  EXPECT_FALSE(fs::exists(d / "model.safetensors"));
  const std::string index_text = read(d / "model.safetensors.index.json");
  ASSERT_FALSE(index_text.empty());
  EXPECT_EQ(index_text.back(), '\n');
  EXPECT_EQ(index_text.substr(0, 16), "{\n  \"metadata\": ");  // indent 2, keys sorted
  const json index = json::parse(index_text);
  EXPECT_EQ(index["metadata"]["total_size"].get<uint64_t>(), total);
  EXPECT_EQ(index["metadata"]["total_parameters"].get<uint64_t>(), total / 4);

  // The shard files: model-0000k-of-0000N.safetensors for k = 1..N, nothing else of the kind.
  std::set<std::string> shard_files;
  for (const std::string& name : names_in(d))
    if (name.ends_with(".safetensors")) shard_files.insert(name);
  const size_t n = shard_files.size();
  ASSERT_GE(n, 3u);
  for (size_t k = 1; k <= n; ++k) {
    char want[64];
    std::snprintf(want, sizeof want, "model-%05zu-of-%05zu.safetensors", k, n);
    EXPECT_TRUE(shard_files.count(want)) << want;
  }

  // Every tensor in exactly one file, the one weight_map names; each file within the limit
  // (or a single tensor), and no two neighbours that would have fit into one.
  const json& weight_map = index["weight_map"];
  EXPECT_EQ(weight_map.size(), bytes.size());
  std::map<std::string, int> seen;
  std::vector<uint64_t> file_bytes;
  std::vector<uint64_t> first_tensor;
  for (size_t k = 1; k <= n; ++k) {
    char name[64];
    std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", k, n);
    const auto st = io::SafetensorsFile::open((d / name).string());
    EXPECT_EQ(st.metadata().at("format"), "pt");
    uint64_t sum = 0;
    for (const auto& t : st.tensors()) {
      ++seen[t.name];
      ASSERT_TRUE(weight_map.contains(t.name)) << t.name;
      EXPECT_EQ(weight_map[t.name], name) << t.name;
      EXPECT_EQ(t.dtype, io::StDType::kF32);
      EXPECT_EQ(t.end - t.begin, bytes.at(t.name));
      sum += t.end - t.begin;
    }
    EXPECT_TRUE(sum <= static_cast<uint64_t>(limit) || st.tensors().size() == 1) << name;
    file_bytes.push_back(sum);
    first_tensor.push_back(st.tensors().front().end - st.tensors().front().begin);
  }
  for (const auto& [name, b] : bytes) EXPECT_EQ(seen[name], 1) << name;
  for (size_t k = 0; k + 1 < n; ++k)
    EXPECT_GT(file_bytes[k] + first_tensor[k + 1], static_cast<uint64_t>(limit)) << k;

  const Transformer<float> back = load_model_dir(d.string());
  EXPECT_EQ(back.weights(), m.weights());
}

TEST_F(ModelDirSaveTest, BelowTheLimitOneFileAsBefore) {
  const Transformer<float> m = model(4);
  uint64_t total = 0;
  for (const auto& [name, b] : saved_bytes(m, 4)) total += b;
  for (const int64_t limit : {kDefaultShardSize, static_cast<int64_t>(total)}) {
    const fs::path d = dir_ / std::to_string(limit);
    save_model_dir(d.string(), m, sharded(limit));
    EXPECT_EQ(names_in(d), (std::set<std::string>{"config.json", "model.safetensors"}));
    EXPECT_EQ(json::parse(read(d / "config.json"))["torch_dtype"], "float32");
    EXPECT_EQ(load_model_dir(d.string()).weights(), m.weights());
  }
}

// A re-save replaces the earlier save's files whole: sharded -> one file -> fewer shards leaves
// no stale shard, index or model.safetensors (a loader would read those first), while a file
// and a folder a user keeps in the directory survive every save.
TEST_F(ModelDirSaveTest, ResavingLeavesNoStaleShardsAndKeepsTheUsersFiles) {
  const fs::path d = dir_ / "model";
  const Transformer<float> a = model(5), b = model(6), c = model(7);
  save_model_dir(d.string(), a, {.shard_size = 10'000, .files = {{"tokenizer.json", "{}"}}});
  const size_t many = names_in(d).size();
  ASSERT_GT(many, 5u);
  std::ofstream(d / "README.md") << "my model card";
  fs::create_directories(d / "notes");
  std::ofstream(d / "notes/run.txt") << "lr 1e-3";

  save_model_dir(d.string(), b);
  EXPECT_EQ(names_in(d),
            (std::set<std::string>{"README.md", "config.json", "model.safetensors", "notes"}));
  EXPECT_EQ(load_model_dir(d.string()).weights(), b.weights());

  save_model_dir((d.string() + "/"), c, sharded(30'000));  // a trailing slash too
  std::set<std::string> names = names_in(d);
  EXPECT_FALSE(names.count("model.safetensors"));
  EXPECT_TRUE(names.count("model.safetensors.index.json"));
  const std::regex shard(R"(model-(\d{5})-of-(\d{5})\.safetensors)");
  std::set<std::string> totals;
  for (const std::string& name : names) {
    std::smatch mt;
    if (std::regex_match(name, mt, shard)) totals.insert(mt[2]);
  }
  EXPECT_EQ(totals.size(), 1u);  // all shards of one save
  EXPECT_EQ(load_model_dir(d.string()).weights(), c.weights());
  EXPECT_EQ(read(d / "README.md"), "my model card");
  EXPECT_EQ(read(d / "notes/run.txt"), "lr 1e-3");
  EXPECT_FALSE(fs::exists(d / "tokenizer.json"));     // the earlier save's, not given this time
  for (const auto& e : fs::directory_iterator(dir_))  // no temporary directory left behind
    EXPECT_FALSE(e.path().filename().string().starts_with(".tmp-")) << e.path();
}

TEST_F(ModelDirSaveTest, Bf16SaveHoldsBf16TensorsRoundedFromTheWeights) {
  const Transformer<float> m = model(8);
  const auto bytes = saved_bytes(m, 2);
  for (const int64_t limit : {kDefaultShardSize, int64_t{6'000}}) {
    SCOPED_TRACE(limit);
    const fs::path d = dir_ / ("bf16_" + std::to_string(limit));
    save_model_dir(d.string(), m, sharded(limit, io::StDType::kBF16));
    const json config = json::parse(read(d / "config.json"));
    EXPECT_EQ(config["torch_dtype"], "bfloat16");
    std::vector<std::string> files;
    if (fs::exists(d / "model.safetensors")) {
      EXPECT_EQ(limit, kDefaultShardSize);
      files.push_back("model.safetensors");
    } else {
      EXPECT_NE(limit, kDefaultShardSize);
      const json index = json::parse(read(d / "model.safetensors.index.json"));
      uint64_t total = 0;
      for (const auto& [name, b] : bytes) total += b;
      EXPECT_EQ(index["metadata"]["total_size"].get<uint64_t>(), total);  // BF16 sizes
      for (const auto& [name, file] : index["weight_map"].items()) files.push_back(file);
    }
    size_t tensors = 0;
    for (const std::string& file : std::set<std::string>(files.begin(), files.end())) {
      const auto st = io::SafetensorsFile::open((d / file).string());
      for (const auto& t : st.tensors()) {
        ++tensors;
        ASSERT_EQ(t.dtype, io::StDType::kBF16) << t.name;
        const ParamInfo* p = nullptr;
        for (const auto& q : m.table().params())
          if (q.name == t.name) p = &q;
        ASSERT_NE(p, nullptr) << t.name;
        const size_t n = (t.end - t.begin) / 2;
        for (size_t i = 0; i < n; ++i) {
          uint16_t h;
          std::memcpy(&h, st.data(t) + 2 * i, 2);
          const float w = m.weights()[p->offset + i];
          ASSERT_EQ(h, f32_to_bf16(w)) << t.name << "[" << i << "] of " << w;
        }
      }
    }
    EXPECT_EQ(tensors, bytes.size());
    // Loads back as the bf16 values (the padding rows of the embedding stay zero).
    const Transformer<float> back = load_model_dir(d.string());
    for (size_t i = 0; i < m.weights().size(); ++i)
      ASSERT_EQ(back.weights()[i], bf16_to_f32(f32_to_bf16(m.weights()[i]))) << i;
  }
}

TEST_F(ModelDirSaveTest, BadOptionsAreErrorsThatWriteNothing) {
  const Transformer<float> m = model(9);
  const fs::path d = dir_ / "m";
  EXPECT_THROW(save_model_dir(d.string(), m, sharded(kDefaultShardSize, io::StDType::kF16)), Error);
  EXPECT_THROW(save_model_dir(d.string(), m, sharded(0)), Error);
  EXPECT_FALSE(fs::exists(d));
  EXPECT_TRUE(names_in(dir_).empty());
  std::ofstream(dir_ / "file") << "x";
  EXPECT_THROW(save_model_dir((dir_ / "file").string(), m), Error);
  EXPECT_EQ(read(dir_ / "file"), "x");
  EXPECT_EQ(save_dtype_from_name("bf16"), io::StDType::kBF16);
  EXPECT_EQ(save_dtype_from_name("f32"), io::StDType::kF32);
  EXPECT_THROW(save_dtype_from_name("f16"), Error);
}

}  // namespace
}  // namespace forge
