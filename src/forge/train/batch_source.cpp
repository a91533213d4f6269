#include "forge/train/batch_source.h"

#include <cstdio>
#include <filesystem>

#include "forge/core/error.h"
#include "forge/data/loader.h"

namespace forge {

namespace {

class ShardSource : public BatchSource {
 public:
  ShardSource(const std::string& data, int64_t vocab_size, int T_, uint64_t seed)
      : ds_(Dataset::open(data, vocab_size)),
        loader_(&ds_.shards, ds_.train, T_, seed),
        val_(&ds_.shards, ds_.val, T_),
        T_(T_) {}

  int64_t next_batch(int B, int32_t* inputs, int32_t* targets, int32_t*, int32_t*) override {
    loader_.next_batch(B, inputs, targets);
    return static_cast<int64_t>(B) * T_;  // every target of a window is a token
  }
  uint64_t position() const override { return loader_.rng_offset(); }
  void set_position(uint64_t p) override { loader_.set_rng_offset(p); }
  int64_t val_count() const override { return val_.count(); }
  int64_t val_item(int64_t i, int32_t* inputs, int32_t* targets) const override {
    val_.window(i, inputs, targets);
    return T_;
  }
  std::string describe() const override {
    char buf[96];
    std::snprintf(buf, sizeof(buf), "data %.2fM train / %.2fM val tokens",
                  ds_.train_tokens() / 1e6, ds_.val_tokens() / 1e6);
    return buf;
  }

 private:
  Dataset ds_;  // the loaders point into its shards: this object never moves (unique_ptr)
  TrainLoader loader_;
  EvalWindows val_;
  int T_;
};

class SftSource : public BatchSource {
 public:
  explicit SftSource(SftData data) : data_(std::move(data)) {}

  int64_t next_batch(int B, int32_t* inputs, int32_t* targets, int32_t* pos, int32_t* seg) override {
    return data_.next_batch(position_, B, inputs, targets, pos, seg);
  }
  bool packed() const override { return data_.packed(); }
  int64_t steps_for_epochs(int64_t epochs, int64_t rows) override {
    return data_.steps_for_epochs(epochs, rows);
  }
  int64_t example_tokens(uint64_t from, uint64_t to) override { return data_.input_tokens(from, to); }
  uint64_t position() const override { return position_; }
  void set_position(uint64_t p) override { position_ = p; }
  int64_t val_count() const override { return data_.val_count(); }
  int64_t val_item(int64_t i, int32_t* inputs, int32_t* targets) const override {
    return data_.val_row(i, inputs, targets);
  }
  std::string describe() const override { return "SFT data " + data_.summary().describe(); }
  int64_t epoch_size() const override { return data_.train_count(); }

 private:
  SftData data_;
  uint64_t position_ = 0;
};

}  // namespace

std::unique_ptr<BatchSource> open_shard_source(const std::string& data, int64_t vocab_size,
                                               int T_, uint64_t seed) {
  return std::make_unique<ShardSource>(data, vocab_size, T_, seed);
}

std::unique_ptr<BatchSource> open_sft_source(const std::string& jsonl,
                                             const std::string& tokenizer_dir,
                                             int64_t vocab_size, const SftSettings& s) {
  std::error_code ec;
  if (tokenizer_dir.empty() ||
      !std::filesystem::is_regular_file(tokenizer_dir + "/tokenizer.json", ec))
    throw Error(str("--sft needs the model's tokenizer to encode ", jsonl,
                    ": --init-from a model directory that has a tokenizer.json"));
  const tok::Tokenizer tok = tok::Tokenizer::load(tokenizer_dir + "/tokenizer.json");
  const chat::ChatTemplate tmpl = chat::ChatTemplate::load(tokenizer_dir);
  std::printf("SFT data %s: chat template %s\n", jsonl.c_str(), tmpl.description().c_str());
  std::fflush(stdout);
  return std::make_unique<SftSource>(SftData::load(jsonl, tmpl, tok, vocab_size, s));
}

}  // namespace forge
