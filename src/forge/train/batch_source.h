// Where a training run's batches come from, as the trainer loop sees it: token shards
// (pretraining: random windows, data/loader.h) or SFT examples (data/sft_data.h). Both give
// (B, T) inputs and targets with -1 where nothing is trained, and count the targets that are
// trained, so that the loss is the mean over trained tokens of the whole step (trainer.cpp).
// Packed SFT rows (--pack) also give each token's position and segment id (data/sft_data.h).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "forge/data/sft_data.h"

namespace forge {

class BatchSource {
 public:
  virtual ~BatchSource() = default;
  // The next training batch: inputs and targets (B, T), and when packed() positions and segment
  // ids (B, T) into pos and seg (null otherwise). Returns the targets that are not -1.
  virtual int64_t next_batch(int B, int32_t* inputs, int32_t* targets, int32_t* pos, int32_t* seg) = 0;
  // Several examples per row: next_batch() fills pos and seg.
  virtual bool packed() const { return false; }
  // The whole data state, which a checkpoint records (trainer_state.json's loader_rng_offset)
  // and a resumed run restores: the loader's RNG offset, or the SFT examples consumed.
  virtual uint64_t position() const = 0;
  virtual void set_position(uint64_t p) = 0;
  // Validation items (windows or examples), the same ones at every evaluation; item i's inputs
  // and targets (T); returns its trained targets.
  virtual int64_t val_count() const = 0;
  virtual int64_t val_item(int64_t i, int32_t* inputs, int32_t* targets) const = 0;
  // "data 1.23M train / 0.06M val tokens", for the run's log.
  virtual std::string describe() const = 0;
  // Training examples per epoch: SFT's train examples; 0 for shards (no epochs).
  virtual int64_t epoch_size() const { return 0; }
  // Optimizer steps of `rows` rows each that `epochs` passes over the examples take (SFT).
  virtual int64_t steps_for_epochs(int64_t epochs, int64_t rows) {
    return (epochs * epoch_size() + rows - 1) / rows;
  }
  // Input tokens of the examples at positions [from, to) (SFT: padding excluded); 0 for shards.
  virtual int64_t example_tokens(uint64_t, uint64_t) { return 0; }
};

// The --data of a pretraining run (Dataset::open: a directory of shards or one .bin).
std::unique_ptr<BatchSource> open_shard_source(const std::string& data, int64_t vocab_size,
                                               int T_, uint64_t seed);
// An SFT run's JSONL, encoded with the tokenizer and chat template of `tokenizer_dir` (its
// tokenizer.json; chat_template.h's choice of template). Prints the data's summary line.
std::unique_ptr<BatchSource> open_sft_source(const std::string& jsonl,
                                             const std::string& tokenizer_dir,
                                             int64_t vocab_size, const SftSettings& s);

}  // namespace forge
