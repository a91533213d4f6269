// Batches of token windows for pretraining. A window is T + 1 consecutive tokens; inputs are
// the first T, targets the last T (inputs shifted by one).
//  - TrainLoader: random windows from a seeded Philox stream, the shard chosen in proportion to
//    its size. Its whole state is the RNG offset, so a checkpoint can resume it exactly.
//  - EvalWindows: consecutive windows k = tokens[k·T, k·T + T] of each shard in turn, as
//    `forge eval` defines them, so validation losses are comparable across runs.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "forge/core/rng.h"
#include "forge/data/shard.h"

namespace forge {

// A token range [begin, end) of one shard.
struct ShardRange {
  int shard = 0;
  int64_t begin = 0, end = 0;
};

class TrainLoader {
 public:
  // The Philox stream its windows are drawn from (weight initialisation uses stream 0), named
  // in a checkpoint's trainer_state.json next to the seed and offset.
  static constexpr uint32_t kRngStream = 1;

  // Throws forge::Error when a shard is invalid or no range holds a window of T + 1 tokens.
  TrainLoader(std::vector<Shard>* shards, std::vector<ShardRange> ranges, int T_, uint64_t seed);
  // inputs, targets: (B, T).
  void next_batch(int B, int32_t* inputs, int32_t* targets);
  uint64_t rng_offset() const { return rng_.offset(); }
  void set_rng_offset(uint64_t o) { rng_.set_offset(o); }

 private:
  std::vector<Shard>* shards_;
  std::vector<ShardRange> ranges_;
  std::vector<int64_t> cumulative_;  // cumulative window-start counts per range
  int T_;
  Rng rng_;
};

class EvalWindows {
 public:
  EvalWindows(std::vector<Shard>* shards, std::vector<ShardRange> ranges, int T_);
  int64_t count() const { return total_; }
  // Window i (0 <= i < count()): inputs and targets (T).
  void window(int64_t i, int32_t* inputs, int32_t* targets) const;

 private:
  std::vector<Shard>* shards_;
  std::vector<ShardRange> ranges_;
  std::vector<int64_t> cumulative_;
  int T_;
  int64_t total_ = 0;
};

// The data a run trains and validates on, from a --data argument: a directory's train_*.bin and
// val_*.bin shards; or a single shard file, whose last `holdout` fraction becomes the
// validation range. Ids are checked against vocab_size when the shards open.
struct Dataset {
  std::vector<Shard> shards;
  std::vector<ShardRange> train, val;
  static Dataset open(const std::string& data, int64_t vocab_size, double holdout = 0.05);
  int64_t train_tokens() const;
  int64_t val_tokens() const;
};

}  // namespace forge
