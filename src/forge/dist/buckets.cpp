// BucketPlan (dist/buckets.h).
#include "forge/dist/buckets.h"

#include <algorithm>
#include <cstring>

#include "forge/core/error.h"

namespace forge {

BucketPlan::BucketPlan(size_t n, int world, const std::vector<int64_t>& layer_starts,
                       size_t min_elems, size_t align)
    : n_(n), world_(world) {
  FORGE_CHECK(n >= 1 && world >= 1 && min_elems >= 1 && align >= 1, "BucketPlan(", n, ", ", world,
              ", min ", min_elems, ", align ", align, ")");
  const size_t unit = static_cast<size_t>(world) * align;
  const size_t P = (n + unit - 1) / unit * unit;
  auto up = [&](int64_t x) { return std::min(P, (static_cast<size_t>(x) + unit - 1) / unit * unit); };
  // From the top down: a bucket [c, end) closes at the first layer start c below which it holds
  // min_elems. Every element of [c, end) is at or above layer l's start, so final after it.
  std::vector<GradBucket> down;
  size_t end = P;
  for (int l = static_cast<int>(layer_starts.size()) - 1; l >= 0; --l) {
    const int64_t s = layer_starts[l];
    FORGE_CHECK(s >= 0 && static_cast<size_t>(s) < n &&
                    (l == 0 || layer_starts[l - 1] <= s),
                "BucketPlan: layer ", l, " starts at ", s, " (", n, " elements; starts ascending)");
    const size_t c = up(s);
    if (c < end && end - c >= min_elems) {
      down.push_back(GradBucket{c, end, 0, 0, l});
      end = c;
    }
  }
  if (end > 0) down.push_back(GradBucket{0, end, 0, 0, -1});
  // The padding [n, P) goes through staging buffers: split it off into a bucket of one unit (same
  // readiness) so that the rest of the top bucket is reduced in place.
  const size_t floor_n = n / unit * unit;
  GradBucket& top = down.front();
  if (floor_n < P && floor_n > top.begin) {
    const GradBucket tail{floor_n, P, 0, 0, top.ready_after_layer};
    top.end = floor_n;
    down.insert(down.begin(), tail);
  }
  buckets_.assign(down.rbegin(), down.rend());
  size_t off = 0;
  for (GradBucket& b : buckets_) {
    b.piece = (b.end - b.begin) / world;
    b.offset = off;
    off += b.piece;
  }
  shard_ = off;
}

size_t BucketPlan::part_begin(const GradBucket& b, int rank) const {
  return std::min(n_, b.begin + static_cast<size_t>(rank) * b.piece);
}

size_t BucketPlan::part_end(const GradBucket& b, int rank) const {
  return std::min(n_, b.begin + static_cast<size_t>(rank + 1) * b.piece);
}

size_t BucketPlan::valid(int rank) const {
  const GradBucket& top = buckets_.back();  // the only bucket with padding
  return top.offset + (part_end(top, rank) - part_begin(top, rank));
}

void BucketPlan::shards_to_flat(const float* all, float* flat) const {
  for (int r = 0; r < world_; ++r)
    for (const GradBucket& b : buckets_) {
      const size_t lo = part_begin(b, r), hi = part_end(b, r);
      if (lo < hi) std::memcpy(flat + lo, all + r * shard_ + b.offset, (hi - lo) * sizeof(float));
    }
}

void BucketPlan::flat_to_shard(const float* flat, int rank, float* shard) const {
  std::fill(shard, shard + shard_, 0.0f);
  for (const GradBucket& b : buckets_) {
    const size_t lo = part_begin(b, rank), hi = part_end(b, rank);
    if (lo < hi) std::memcpy(shard + b.offset, flat + lo, (hi - lo) * sizeof(float));
  }
}

}  // namespace forge
