// The positions and segment ids of prompts packed one after another into one row
// (Model::prefill_packed's TokenLayout): prompt i gets positions 0 … segs[i].len − 1 and
// segment id i, so that it attends to itself only.
#pragma once

#include <cstdint>
#include <vector>

#include "forge/model/transformer.h"

namespace forge {

// (2·T) ids, T = Σ segs[i].len: the T positions, then the T segment ids.
inline std::vector<int32_t> packed_prompt_layout(const PrefillSeg* segs, int k) {
  std::vector<int32_t> pos, seg;
  for (int i = 0; i < k; ++i)
    for (int p = 0; p < segs[i].len; ++p) {
      pos.push_back(p);
      seg.push_back(i);
    }
  pos.insert(pos.end(), seg.begin(), seg.end());
  return pos;
}

}  // namespace forge
