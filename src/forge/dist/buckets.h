// How data-parallel training (ZeRO-1) cuts the flat buffer of trained parameters into gradient
// buckets and shards, the same for the CPU runner (train/runner_cpu.cpp) and the GPU one
// (train/zero1_cuda.h).
//
// The backward finishes gradients from the top of the flat buffer down: the parameter tables put
// the embedding first, then the layers in order, then the final norm (and an untied head), and
// the backward walks the layers from the last to the first (model/params.h, model/lora.h). A
// bucket is a range of the buffer whose gradients are all final once the backward has finished
// one layer, so its reduce-scatter can start while the layers below are still in the backward
// (on the GPU, on a stream of its own).
//
// Buckets: the flat buffer of n elements is padded with zeros to P = a multiple of W·align
// elements; bucket boundaries are layer starts rounded up to multiples of W·align. Walking the
// layers from the top, a bucket ends where it first holds at least min_elems elements; what is
// left at the bottom (the embedding, and the lowest layers if they are small) is one last
// bucket, reduced after the whole backward. The padding [n, P) is split off into a top bucket of
// its own (W·align elements, the only one that runners stage through padded buffers), with the
// readiness of the bucket it came from. Each bucket has W·piece elements and is
// reduce-scattered on its own: rank r gets piece r, the bucket's elements
// [begin + r·piece, begin + (r + 1)·piece).
//
// Shards: rank r's shard (shard() elements, the same on every rank) is its pieces of all buckets
// one after another in ascending flat order, bucket b's at buckets()[b].offset. Its Adam state
// and mean gradients are laid out the same way. The padding [n, P) lies inside the top bucket,
// which comes last in every shard, so a rank's real elements are the first valid(rank) of its
// shard. With one bucket (min_elems >= n) rank r's shard is [r·s, (r + 1)·s): the plain
// contiguous layout. With one rank the shard is the flat buffer itself, whatever the buckets.
//
// Checkpoints never see this layout: runners gather shards into the full buffer (shards_to_flat)
// and scatter a full buffer into shards (flat_to_shard), so a run resumes on any rank count and
// bucket size.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace forge {

struct GradBucket {
  size_t begin = 0, end = 0;  // [begin, end) of the padded buffer; end − begin = W · piece
  size_t piece = 0;           // each rank's part
  size_t offset = 0;          // where a rank's part sits in its shard (the same on every rank)
  // The backward of this layer finalises every gradient of the bucket; −1: the bottom bucket,
  // final only after the whole backward (the embedding's gradient comes last).
  int ready_after_layer = -1;
};

class BucketPlan {
 public:
  // n: elements of the trained buffer (>= 1); world: ranks (>= 1); layer_starts: the first
  // element of each layer, ascending (layer l's gradients and everything above them are final
  // after layer l's backward); min_elems: the smallest bucket (>= 1; 1 gives a bucket per
  // layer); align: a piece is a multiple of this many elements. Arguments outside those ranges
  // fail an internal check (they come from the parameter tables, never from a user).
  BucketPlan(size_t n, int world, const std::vector<int64_t>& layer_starts, size_t min_elems,
             size_t align = 64);

  size_t size() const { return n_; }
  int world() const { return world_; }
  size_t shard() const { return shard_; }              // elements of every rank's shard
  size_t padded() const { return shard_ * world_; }    // P: the buffer with its padding
  const std::vector<GradBucket>& buckets() const { return buckets_; }  // ascending begin
  // The first elements of rank r's shard that hold real (not padding) elements.
  size_t valid(int rank) const;

  // Rank r's part of bucket b: [lo, hi) of the flat buffer clipped to n (may be empty), at shard
  // offset b.offset.
  size_t part_begin(const GradBucket& b, int rank) const;
  size_t part_end(const GradBucket& b, int rank) const;

  // all: every rank's shard, rank r's at r·shard() (W·shard() elements) → flat (n elements).
  void shards_to_flat(const float* all, float* flat) const;
  // flat (n elements) → rank's shard (shard() elements, padding 0).
  void flat_to_shard(const float* flat, int rank, float* shard) const;

 private:
  size_t n_ = 0, shard_ = 0;
  int world_ = 1;
  std::vector<GradBucket> buckets_;
};

// The dp_bucket training setting's default: 16 MiB of f32 gradients (4 Mi elements). A GPT-2
// 124M layer (7.1M parameters) is then a bucket, two SmolLM2-135M layers (3.5M each) one.
constexpr int64_t kDefaultBucketBytes = int64_t{16} << 20;

// The bucket size a byte count of f32 gradients means (the dp_bucket setting): at least 1.
constexpr size_t bucket_elems_of_bytes(int64_t bytes) {
  return bytes <= 4 ? 1 : static_cast<size_t>((bytes + 3) / 4);
}

}  // namespace forge
