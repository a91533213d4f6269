// Counter-based random numbers: Philox4x32-10 (Salmon et al., SC'11, as in Random123 and
// cuRAND). Counter-based means value i of stream s under seed k is a pure function of (k, s, i):
// the CUDA backend reproduces every stream bit for bit, any element can be drawn in parallel,
// and the whole RNG state of a run is (seed, stream, offset) — three integers in a checkpoint.
#pragma once

#include <array>
#include <cstdint>

namespace forge {

using PhiloxCounter = std::array<uint32_t, 4>;
using PhiloxKey = std::array<uint32_t, 2>;

// One Philox4x32-10 block: 4 random words for (counter, key).
PhiloxCounter philox4x32_10(PhiloxCounter ctr, PhiloxKey key);

// u32 → float in [0, 1) with 24 random bits.
inline float u32_to_unit(uint32_t x) { return static_cast<float>(x >> 8) * (1.0f / 16777216.0f); }

// Standard normal number `index` of stream `stream` under `seed`: Box–Muller on the first two
// words of block (index, stream). Used for weight initialisation.
float philox_normal(uint64_t seed, uint32_t stream, uint64_t index);

// Sequential stream of 32-bit words: word n is word (n % 4) of block (n / 4, stream).
class Rng {
 public:
  explicit Rng(uint64_t seed = 0, uint32_t stream = 0) : seed_(seed), stream_(stream) {}

  uint32_t next_u32();
  // Uniform in [0, 1).
  float uniform() { return u32_to_unit(next_u32()); }
  // Uniform integer in [0, n), n > 0 (64-bit draw, modulo bias below 2^-32 for n < 2^32).
  uint64_t below(uint64_t n);

  uint64_t seed() const { return seed_; }
  uint32_t stream() const { return stream_; }
  // Words consumed so far: with seed and stream, the complete state.
  uint64_t offset() const { return offset_; }
  void set_offset(uint64_t offset) { offset_ = offset; }

 private:
  uint64_t seed_;
  uint32_t stream_;
  uint64_t offset_ = 0;
};

}  // namespace forge
