// Random packed-row layouts for the tests of packing (model/transformer.h's TokenLayout): each
// row of T split into segments at random boundaries, positions restarting at 0 in each segment
// and segment ids counting up along the row — so positions repeat within a row and across rows.
#pragma once

#include <cstdint>
#include <vector>

#include "forge/core/rng.h"

namespace forge::testing {

struct PackedLayout {
  std::vector<int32_t> pos, seg;  // (B, T)
};

// Segments of 1 to max_len tokens (the last one of a row cut at T).
inline PackedLayout random_packed_layout(int B, int T, int max_len, uint64_t seed) {
  Rng rng(seed, 17);
  PackedLayout l;
  for (int b = 0; b < B; ++b) {
    int32_t s = 0, left = 0, p = 0;
    for (int t = 0; t < T; ++t) {
      if (left == 0) {
        left = 1 + static_cast<int32_t>(rng.below(max_len));
        p = 0;
        if (t > 0) ++s;
      }
      l.pos.push_back(p++);
      l.seg.push_back(s);
      --left;
    }
  }
  return l;
}

}  // namespace forge::testing
