// CPU rotary position embedding (reference). The angle table is built once per call in double —
// inv_freq_i from rope_inv_freq (ops/rope.cpp: base^(−2i/HS), then the Hugging Face scaling),
// angle = (pos0 + t)·inv_freq_i (or pos[b, t]·inv_freq_i: packed rows), cos and sin of it in double — so the float instantiation
// differs from the double one only by the final rotation rounding, not by the accuracy of
// cos/sin at large positions (at t = 8k, a float angle is off by ~1e-3 rad).
// Forward and backward are one routine: the backward of a rotation by θ is the rotation by −θ,
// i.e. the same pairing with sin negated. Both are in place; OpenMP over (b, t) rows, each
// element is written by exactly one thread, so results do not depend on the thread count.
#include "forge/ops/rope.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "forge/core/error.h"
#include "forge/ops/linear.h"

namespace forge::cpu {
namespace {

// cos and sin of angle (t, i), each (T, HS/2), in double.
struct RopeTable {
  std::vector<double> cos, sin;
};

RopeTable rope_table(int T_, int HS, const Rope& rope, int pos0) {
  const int half = HS / 2;
  const std::vector<double> inv_freq = rope_inv_freq(rope, HS);  // (HS/2)
  RopeTable tab{std::vector<double>(static_cast<size_t>(T_) * half),
                std::vector<double>(static_cast<size_t>(T_) * half)};
  for (int t = 0; t < T_; ++t) {
    for (int i = 0; i < half; ++i) {
      const double angle = static_cast<double>(pos0 + t) * inv_freq[i];
      tab.cos[static_cast<size_t>(t) * half + i] = std::cos(angle);
      tab.sin[static_cast<size_t>(t) * half + i] = std::sin(angle);
    }
  }
  return tab;
}

// Rotates every pair of x (B, T, H, HS) by sign·θ(t, i):
// (x0, x1) → (x0·c − x1·s, x0·s + x1·c).
template <typename T>
void rope_rotate(T* x, int B, int T_, int H, int HS, const Rope& rope, int pos0, const int32_t* pos,
                 double sign, const char* op, int64_t ld = 0) {
  FORGE_CHECK(B >= 0 && T_ >= 0 && H >= 0 && HS > 0, "[", op, "] bad shape B=", B, " T=", T_,
              " H=", H, " HS=", HS);
  FORGE_CHECK(HS % 2 == 0, "[", op, "] head size must be even, got HS=", HS);
  FORGE_CHECK(pos0 >= 0, "[", op, "] negative pos0 ", pos0);
  if (ld == 0) ld = int64_t{H} * HS;
  FORGE_CHECK(ld >= int64_t{H} * HS, "[", op, "] row stride ", ld, " below H·HS = ", H * HS);
  const int half = HS / 2;
  const int64_t rows = static_cast<int64_t>(B) * T_;
  int n_pos = T_;  // table rows: t, or the positions pos holds
  if (pos != nullptr) {
    pos0 = 0;
    n_pos = 0;
    for (int64_t r = 0; r < rows; ++r) {
      FORGE_CHECK(pos[r] >= 0, "[", op, "] negative position ", pos[r], " at ", r);
      n_pos = std::max(n_pos, pos[r] + 1);
    }
  }
  const RopeTable tab = rope_table(n_pos, HS, rope, pos0);
  // Offsets of the two channels of pair i: rotate_half pairs i with i + HS/2, interleaved
  // pairs 2i with 2i + 1.
  const int stride_i = rope.style == RopeStyle::kRotateHalf ? 1 : 2;
  const int partner = rope.style == RopeStyle::kRotateHalf ? half : 1;
#pragma omp parallel for schedule(static)
  for (int64_t row = 0; row < rows; ++row) {
    const int t = pos ? pos[row] : static_cast<int>(row % T_);
    const double* cs = tab.cos.data() + static_cast<size_t>(t) * half;
    const double* sn = tab.sin.data() + static_cast<size_t>(t) * half;
    for (int h = 0; h < H; ++h) {
      T* xh = x + row * ld + h * HS;  // (HS)
      for (int i = 0; i < half; ++i) {
        T& a = xh[i * stride_i];
        T& b = xh[i * stride_i + partner];
        const T c = static_cast<T>(cs[i]);
        const T s = static_cast<T>(sign * sn[i]);
        const T x0 = a, x1 = b;
        a = x0 * c - x1 * s;
        b = x0 * s + x1 * c;
      }
    }
  }
}

}  // namespace

template <typename T>
void rope_fwd(T* x, int B, int T_, int H, int HS, const Rope& rope, int pos0, const int32_t* pos,
              int64_t ld) {
  rope_rotate(x, B, T_, H, HS, rope, pos0, pos, 1.0, "rope_fwd", ld);
}

template <typename T>
void rope_bwd(T* dx, int B, int T_, int H, int HS, const Rope& rope, int pos0, const int32_t* pos,
              int64_t ld) {
  rope_rotate(dx, B, T_, H, HS, rope, pos0, pos, -1.0, "rope_bwd", ld);
}

// The reference of the CUDA fused op: the rotation, then linear.cpp's bias gradient over the
// B·T rows of H·HS.
template <typename T>
void rope_bias_bwd(T* dx, T* dbias, int B, int T_, int H, int HS, const Rope& rope, const int32_t* pos,
                   int64_t ld) {
  rope_rotate(dx, B, T_, H, HS, rope, 0, pos, -1.0, "rope_bias_bwd", ld);
  if (dbias != nullptr) bias_grad<T>(dbias, dx, B * T_, H * HS, ld);
}

#define FORGE_INSTANTIATE(T)                                           \
  template void rope_fwd<T>(T*, int, int, int, int, const Rope&, int, const int32_t*, int64_t); \
  template void rope_bwd<T>(T*, int, int, int, int, const Rope&, int, const int32_t*, int64_t); \
  template void rope_bias_bwd<T>(T*, T*, int, int, int, int, const Rope&, const int32_t*, int64_t);
FORGE_INSTANTIATE(float)
FORGE_INSTANTIATE(double)
#undef FORGE_INSTANTIATE

}  // namespace forge::cpu
