// Pieces the two CPU attention implementations share (attention.cpp, the naive reference, and
// flash_attention.cpp, the flash kernels' twin): the shape check, the visible key range of a
// query row, and the double dot product. Internal to backend/cpu.
#pragma once

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "forge/core/error.h"
#include "forge/ops/attention.h"
#include "forge/ops/attention_mask.h"

namespace forge::cpu::attention_rows {

inline void check_shape(const AttentionShape& s, const char* op) {
  FORGE_CHECK(s.B >= 0 && s.T >= 0 && s.NH > 0 && s.NKV > 0 && s.HS > 0, "[", op,
              "] bad shape B=", s.B, " T=", s.T, " NH=", s.NH, " NKV=", s.NKV, " HS=", s.HS);
  FORGE_CHECK(s.NH % s.NKV == 0, "[", op, "] NH=", s.NH, " is not a multiple of NKV=", s.NKV);
  FORGE_CHECK(s.window >= 0, "[", op, "] negative window ", s.window);
}

// Visible keys of query i (0 <= i < T): [lo, hi), lo >= 0 — the rule of ops/attention_mask.h,
// which the GPU kernels' masks use too. Masking by range, never by −inf.
using KeyRange = IndexRange;

inline KeyRange visible_keys(int i, const AttentionShape& s) {
  const IndexRange r = keys_seen_by(i, s.T, s.causal, s.window);
  return {std::max(0, r.lo), r.hi};
}

// `omp simd` lets the compiler vectorise the reduction (it may reassociate within the vector
// lanes; the order is still fixed by the build, so results stay deterministic). Without it the
// double accumulation is one serial dependency chain: attention was ~40% of a tiny-preset
// training step on the CPU.
template <typename T>
double dot(const T* a, const T* b, int n) {
  double acc = 0;
#pragma omp simd reduction(+ : acc)
  for (int d = 0; d < n; ++d) acc += static_cast<double>(a[d]) * static_cast<double>(b[d]);
  return acc;
}

// exp of a max-subtracted score: expf for the float path (the double exp cost ~5% of a CPU
// step); sums stay double.
template <typename T>
double exp_of(double x) {
  if constexpr (std::is_same_v<T, float>) return std::exp(static_cast<float>(x));
  else return std::exp(x);
}

}  // namespace forge::cpu::attention_rows
