// The training tests' corpus: a learnable language of runs of a random start token counting up
// mod 16 (the next token is determined by the previous one except at run boundaries), written
// as dir/train_000000.bin (20,000 tokens) and dir/val_000000.bin (2,000), as `forge data`
// writes them.
#pragma once

#include <cstdint>
#include <filesystem>
#include <vector>

#include "forge/core/rng.h"
#include "forge/data/shard.h"

namespace forge::testing {

inline void write_counting_corpus(const std::filesystem::path& dir) {
  Rng rng(3);
  std::vector<uint32_t> train, val;
  for (auto* v : {&train, &val}) {
    while (v->size() < (v == &train ? 20000u : 2000u)) {
      uint32_t t = static_cast<uint32_t>(rng.below(16));
      for (int k = 0; k < 24; ++k) v->push_back(t = (t + 1) % 16);
    }
  }
  write_shard((dir / "train_000000.bin").string(), train);
  write_shard((dir / "val_000000.bin").string(), val);
}

}  // namespace forge::testing
