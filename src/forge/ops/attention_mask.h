// The masking rule of ops/attention.h (causal: key j <= query i; window > 0: also j > i − window;
// only 0 <= i, j < T) as intervals, for host and device code: the keys a query sees and the
// queries a key is seen by. The wgmma flash kernels test a masked tile's elements against these
// bounds (two compares an element) instead of the rule's four tests.
#pragma once

#include "forge/core/host_device.h"

namespace forge {

struct IndexRange {
  int lo, hi;  // [lo, hi); empty when hi <= lo
};

// The keys j (0 <= j) query i sees: [lo, hi); empty for i >= T. (A negative i, a padding row of
// a kernel's partial tile, gets the rule's answer too: nothing when causal.)
FORGE_HOST_DEVICE inline IndexRange keys_seen_by(int i, int T, bool causal, int window) {
  if (i >= T) return {0, 0};
  return {window > 0 ? i - window + 1 : 0, causal ? i + 1 : T};
}

// The queries i (0 <= i) that see key j: [lo, hi); empty for j >= T.
FORGE_HOST_DEVICE inline IndexRange queries_seeing(int j, int T, bool causal, int window) {
  if (j >= T) return {0, 0};
  const int hi = window > 0 && j + window < T ? j + window : T;
  return {causal ? j : 0, hi};
}

}  // namespace forge
