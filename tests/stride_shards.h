// The CLI tests' token data: ids (i·7 + i/13) mod 50 (a deterministic, not quite periodic
// stream over a vocabulary of 50), written as dir/train_000000.bin (`train` tokens) and
// dir/val_000000.bin (the first `val` of them), as `forge data prepare` writes shards.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <vector>

#include "forge/data/shard.h"

namespace forge::testing {

inline void write_stride_shards(const std::filesystem::path& dir, size_t train = 6000, size_t val = 800) {
  std::vector<uint32_t> t(train);
  for (size_t i = 0; i < t.size(); ++i) t[i] = static_cast<uint32_t>((i * 7 + i / 13) % 50);
  write_shard((dir / "train_000000.bin").string(), t);
  t.resize(val);
  write_shard((dir / "val_000000.bin").string(), t);
}

}  // namespace forge::testing
