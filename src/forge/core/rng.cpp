#include "forge/core/rng.h"

#include <cmath>

namespace forge {

PhiloxCounter philox4x32_10(PhiloxCounter c, PhiloxKey k) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = static_cast<uint64_t>(kM0) * c[0];
    const uint64_t p1 = static_cast<uint64_t>(kM1) * c[2];
    const uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    const uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
    c = {hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0};
    k[0] += kW0;
    k[1] += kW1;
  }
  return c;
}

namespace {

PhiloxCounter block_at(uint64_t seed, uint32_t stream, uint64_t block) {
  return philox4x32_10({static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32), stream, 0},
                       {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)});
}

}  // namespace

float philox_normal(uint64_t seed, uint32_t stream, uint64_t index) {
  const PhiloxCounter r = block_at(seed, stream, index);
  // u1 in (0, 1] so that log(u1) is finite.
  const double u1 = (static_cast<double>(r[0] >> 8) + 1.0) / 16777216.0;
  const double u2 = static_cast<double>(r[1] >> 8) / 16777216.0;
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2));
}

uint32_t Rng::next_u32() {
  const PhiloxCounter r = block_at(seed_, stream_, offset_ / 4);
  const uint32_t word = r[offset_ % 4];
  ++offset_;
  return word;
}

uint64_t Rng::below(uint64_t n) {
  const uint64_t hi = next_u32(), lo = next_u32();
  return ((hi << 32) | lo) % n;
}

}  // namespace forge
