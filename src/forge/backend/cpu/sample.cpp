// CPU row sampler (reference; ops/sample.h defines the algorithm). Thresholds are computed by
// definition: the k-th largest z by nth_element, top-p's τ by sorting the candidates and
// accumulating their mass. All f32 arithmetic — penalty, z, the fixed-point top-p weights, the
// Gumbel noise — goes through ops/sample_math.h, the same functions the CUDA kernel runs, so the
// two twins choose the same ids bit for bit (none of it uses libm's logf/expf, whose last-place
// rounding differs from CUDA's).
//
// Thresholds are combined as order keys (sample_math.h's order_key, NaN → −inf, −0 → +0): the
// kept set is {i : key(z_i) >= max(key_k, key_τ, key_min)}, exactly as the GPU tests it.
// Gumbel-max skips the two logarithms of a candidate whose z plus the bound of its noise bucket
// cannot beat the best score so far (gumbel_bucket_bound); the result is unchanged.
//
// Where sample.h leaves a case open, both twins do the same: NaN logits (and NaN z) count as
// −inf; top_p <= 0, or a row whose weights are all 0, keeps only the maximum (τ = m); min_p >= 1
// keeps the maximum too (the kept set is never empty); settings are not validated (they live in
// device memory on the GPU, where nothing can throw).
//
// Rows are independent; OpenMP over rows, so the result does not depend on the thread count.
#include "forge/ops/sample.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "forge/core/error.h"
#include "forge/core/rng.h"
#include "forge/ops/sample_math.h"

namespace forge::cpu {
namespace {

using namespace forge::sampling;

const std::array<float, 256>& gumbel_bounds() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (uint32_t b = 0; b < 256; ++b) t[b] = gumbel_bucket_bound(b);
    return t;
  }();
  return table;
}

// The largest key t over {i : key_i >= floor} with Σ_{key_i >= t} w_i >= target (target > 0),
// by sorting the candidates of nonzero weight: τ always has one (the last group added to the
// head had positive weight, or the head without it would already hold the target).
uint32_t top_p_key(const std::vector<float>& z, uint32_t floor, float m, float top_p) {
  std::vector<std::pair<uint32_t, uint64_t>> cand;  // (key, weight), weight > 0
  uint64_t total = 0;
  for (float zi : z) {
    const uint32_t key = order_key(zi);
    if (key < floor) continue;
    const uint64_t w = mass_fixed(exp_f32(fsub(zi, m)));
    total += w;
    if (w != 0) cand.emplace_back(key, w);
  }
  const double target = top_p_target(top_p, total);
  if (!(target > 0.0)) return order_key(m);  // no mass to split: τ = m, the largest z
  std::sort(cand.begin(), cand.end(),
            [](const auto& a, const auto& b) { return a.first > b.first; });
  uint64_t head = 0;
  for (size_t i = 0; i < cand.size();) {
    const uint32_t key = cand[i].first;
    for (; i < cand.size() && cand[i].first == key; ++i) head += cand[i].second;
    if (static_cast<double>(head) >= target) return key;
  }
  return cand.back().first;  // not reached: head = total >= target at the end
}

template <typename T>
int32_t sample_row(const T* logits, const SamplerSettings& st, const uint8_t* seen, int32_t pos,
                   int V) {
  // 1. l_i with the repetition penalty.
  std::vector<float> l(V);
  const bool penalty = seen != nullptr && st.repetition_penalty != 1.0f;
  for (int i = 0; i < V; ++i)
    l[i] = penalized(static_cast<float>(logits[i]), st.repetition_penalty, penalty && seen[i] != 0);

  // 2. Greedy: the first maximum.
  if (st.temperature <= 0.0f)
    return static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin());

  // 3. z and the kept set's threshold key.
  std::vector<float>& z = l;
  for (int i = 0; i < V; ++i) z[i] = scaled(l[i], st.temperature);
  const float m = *std::max_element(z.begin(), z.end());
  uint32_t floor = 0;  // keep key(z_i) >= floor
  if (st.top_k > 0 && st.top_k < V) {
    std::vector<uint32_t> keys(V);
    for (int i = 0; i < V; ++i) keys[i] = order_key(z[i]);
    std::nth_element(keys.begin(), keys.begin() + (st.top_k - 1), keys.end(), std::greater<>());
    floor = keys[st.top_k - 1];
  }
  if (st.top_p < 1.0f) floor = std::max(floor, top_p_key(z, floor, m, st.top_p));
  if (st.min_p > 0.0f) {
    // Canonical (NaN → −inf); never above m, so that min_p > 1 still keeps the maximum.
    const float t = scaled(fadd(m, log_f32(st.min_p)), 1.0f);
    floor = std::max(floor, std::min(order_key(t), order_key(m)));
  }

  // 4. Gumbel-max over the kept set, the first maximum of z_i + g_i.
  const std::array<float, 256>& bound = gumbel_bounds();
  const PhiloxKey key = {static_cast<uint32_t>(st.seed), static_cast<uint32_t>(st.seed >> 32)};
  float best = -kInf;
  int32_t best_id = -1;
  for (int q = 0; q < (V + 3) / 4; ++q) {
    const PhiloxCounter w = philox4x32_10(
        {static_cast<uint32_t>(q), static_cast<uint32_t>(pos), 0, kSampleStream}, key);
    for (int j = 0; j < 4; ++j) {
      const int i = 4 * q + j;
      if (i >= V || order_key(z[i]) < floor) continue;
      if (best_id >= 0 && fadd(z[i], bound[w[j] >> 24]) < best) continue;
      const float score = fadd(z[i], gumbel(w[j]));
      if (best_id < 0 || score > best) best = score, best_id = i;
    }
  }
  return best_id;  // >= 0: the maximum's key is >= every threshold, so K is never empty
}

}  // namespace

template <typename T>
void sample_rows(int32_t* out, const T* logits, const SamplerSettings* settings, uint8_t* seen,
                 const int32_t* pos, int S, int V, int Vp) {
  if (S < 0 || V <= 0 || V > Vp)
    throw Error(
        str("[sample_rows] bad shape S=", S, " V=", V, " Vp=", Vp, " (want S >= 0, 0 < V <= Vp)"));
#pragma omp parallel for schedule(dynamic, 1)
  for (int s = 0; s < S; ++s) {
    uint8_t* seen_row = seen ? seen + static_cast<int64_t>(s) * V : nullptr;
    out[s] = sample_row(logits + static_cast<int64_t>(s) * Vp, settings[s], seen_row, pos[s], V);
    if (seen_row) seen_row[out[s]] = 1;
  }
}

template void sample_rows<float>(int32_t*, const float*, const SamplerSettings*, uint8_t*,
                                 const int32_t*, int, int, int);
template void sample_rows<double>(int32_t*, const double*, const SamplerSettings*, uint8_t*,
                                  const int32_t*, int, int, int);

}  // namespace forge::cpu
