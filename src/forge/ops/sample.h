// Choosing the next token from logits, one row per decode slot, on the CPU and (twin,
// backend/cuda/sample.h) on the GPU with every input in device memory, so the sampler is part of
// the captured decode step and nothing but the chosen ids needs to reach the host.
//
// The algorithm is defined exactly so both twins choose the same id from the same logits:
//  1. l_i = logits[s, i] as f32 for i < V (the padding columns [V, Vp) never win).
//     Repetition penalty (rp != 1, seen non-null, seen[s·V + i] != 0): l_i = l_i > 0 ? l_i / rp
//     : l_i · rp (the CTRL / Hugging Face rule).
//  2. temperature <= 0: greedy — the largest l_i, the lowest id among equals. Done.
//  3. z_i = l_i / temperature; m = max z. The kept set K starts as all i < V, then
//     - top_k in (0, V): keep z_i >= the k-th largest z (ties at that value all stay);
//     - top_p < 1: with p_i = exp(z_i − m) / Σ_{j∈K} exp(z_j − m), keep z_i >= τ where τ is the
//       largest value of z over K with Σ_{j∈K, z_j >= τ} p_j >= top_p (the smallest head of the
//       sorted distribution holding top_p of the mass; ties at τ all stay);
//     - min_p > 0: keep z_i >= m + ln(min_p) (p_i >= min_p · p_max).
//  4. Gumbel-max: the id in K with the largest z_i + g_i, g_i = −ln(−ln u_i), lowest id among
//     equals, which samples K's renormalised softmax exactly. u_i = ((w >> 8) + 0.5) / 2^24 where
//     w is word i % 4 of philox4x32_10(counter {i / 4, pos[s], 0, kSampleStream}, key {seed low
//     32 bits, seed high 32 bits}) (core/rng.h): the noise depends on (seed, position, id) only —
//     not on the slot, the batch or the backend — so a sequence replays exactly.
// When seen is non-null, seen[s·V + chosen] is set to 1 afterwards (the penalty's memory).
#pragma once

#include <cstdint>

namespace forge {

inline constexpr uint32_t kSampleStream = 0x5A4D504C;  // "SMPL": Philox counter word 3

// One slot's sampling settings (a plain struct: the GPU reads an array of them).
struct SamplerSettings {
  float temperature = 0.0f;         // <= 0: greedy
  int32_t top_k = 0;                // 0: off
  float top_p = 1.0f;               // (0, 1]; 1: off
  float min_p = 0.0f;               // [0, 1); 0: off
  float repetition_penalty = 1.0f;  // > 0; 1: off
  uint32_t pad_ = 0;
  uint64_t seed = 0;
};

}  // namespace forge

namespace forge::cpu {

// out (S) = the chosen id of each row of logits (S, Vp); settings (S); seen (S, V) flags or null;
// pos (S) = the position the chosen token will take (keys the noise).
template <typename T>
void sample_rows(int32_t* out, const T* logits, const SamplerSettings* settings, uint8_t* seen, const int32_t* pos,
                 int S, int V, int Vp);

}  // namespace forge::cpu
