#include "forge/data/loader.h"

#include <algorithm>

#include "forge/core/error.h"

namespace forge {

TrainLoader::TrainLoader(std::vector<Shard>* shards, std::vector<ShardRange> ranges, int T_,
                         uint64_t seed)
    : shards_(shards), T_(T_), rng_(seed, kRngStream) {
  int64_t total = 0;
  for (const auto& r : ranges) {
    const int64_t starts = (r.end - r.begin) - T_;  // valid window starts: len − (T + 1) + 1
    if (starts <= 0) continue;
    ranges_.push_back(r);
    total += starts;
    cumulative_.push_back(total);
  }
  if (ranges_.empty())
    throw Error(str("training data too short: no shard holds a window of ", T_ + 1,
                    " tokens (sequence length ", T_, " + 1)"));
}

void TrainLoader::next_batch(int B, int32_t* inputs, int32_t* targets) {
  std::vector<int32_t> window(T_ + 1);
  for (int b = 0; b < B; ++b) {
    const int64_t pick = static_cast<int64_t>(rng_.below(static_cast<uint64_t>(cumulative_.back())));
    const size_t r = std::upper_bound(cumulative_.begin(), cumulative_.end(), pick) - cumulative_.begin();
    const int64_t before = r == 0 ? 0 : cumulative_[r - 1];
    const ShardRange& range = ranges_[r];
    (*shards_)[range.shard].read(range.begin + (pick - before), T_ + 1, window.data());
    std::copy_n(window.begin(), T_, inputs + static_cast<size_t>(b) * T_);
    std::copy_n(window.begin() + 1, T_, targets + static_cast<size_t>(b) * T_);
  }
}

EvalWindows::EvalWindows(std::vector<Shard>* shards, std::vector<ShardRange> ranges, int T_)
    : shards_(shards), T_(T_) {
  for (const auto& r : ranges) {
    const int64_t n = (r.end - r.begin - 1) / T_;  // windows of T + 1 tokens, stride T
    if (n <= 0) continue;
    ranges_.push_back(r);
    total_ += n;
    cumulative_.push_back(total_);
  }
}

void EvalWindows::window(int64_t i, int32_t* inputs, int32_t* targets) const {
  FORGE_CHECK(i >= 0 && i < total_, "eval window ", i, " of ", total_);
  const size_t r = std::upper_bound(cumulative_.begin(), cumulative_.end(), i) - cumulative_.begin();
  const int64_t k = i - (r == 0 ? 0 : cumulative_[r - 1]);
  const ShardRange& range = ranges_[r];
  std::vector<int32_t> w(T_ + 1);
  (*shards_)[range.shard].read(range.begin + k * T_, T_ + 1, w.data());
  std::copy_n(w.begin(), T_, inputs);
  std::copy_n(w.begin() + 1, T_, targets);
}

Dataset Dataset::open(const std::string& data, int64_t vocab_size, double holdout) {
  Dataset d;
  const auto train = list_shards(data, "train");
  if (train.empty()) throw Error(str(data, ": no train_*.bin shards in this directory"));
  const bool single_file = train.size() == 1 && train[0] == data;
  for (const auto& p : train) {
    d.shards.push_back(Shard::open(p, vocab_size));
    const int64_t n = d.shards.back().size();
    const int idx = static_cast<int>(d.shards.size()) - 1;
    if (single_file) {
      const int64_t cut = n - static_cast<int64_t>(static_cast<double>(n) * holdout);
      d.train.push_back({idx, 0, cut});
      d.val.push_back({idx, cut, n});
    } else {
      d.train.push_back({idx, 0, n});
    }
  }
  if (!single_file) {
    for (const auto& p : list_shards(data, "val")) {
      d.shards.push_back(Shard::open(p, vocab_size));
      d.val.push_back({static_cast<int>(d.shards.size()) - 1, 0, d.shards.back().size()});
    }
  }
  return d;
}

int64_t Dataset::train_tokens() const {
  int64_t n = 0;
  for (const auto& r : train) n += r.end - r.begin;
  return n;
}

int64_t Dataset::val_tokens() const {
  int64_t n = 0;
  for (const auto& r : val) n += r.end - r.begin;
  return n;
}

}  // namespace forge
