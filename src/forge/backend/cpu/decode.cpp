// CPU KV-cache decode ops (ops/decode.h): the reference for the CUDA twins, and what the model
// runs on the CPU. Plain loops; every output element is written by exactly one thread, so
// results do not depend on the thread count.
//
//  - embedding_at and rope_at are embedding_fwd and rope_fwd with a position per row instead of
//    t. rope_at repeats rope_fwd's arithmetic exactly (inv_freq from rope_inv_freq in double,
//    angle = pos·inv_freq, cos and sin in double, rounded to T, then the same rotation
//    expressions), so a row rotated here is bit-identical to rope_fwd's row at t = pos.
//  - decode_attention is flash_attention_fwd's loop for one query row per (slot, head) over the
//    slot's cache rows [0, min(pos + 1, cap)): scores, max, exponentials, their sum, then
//    acc += (e / sum)·v in T, in row order. OpenMP over (slot, head), one score row per thread.
#include "forge/ops/decode.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "forge/core/error.h"

namespace forge::cpu {
namespace {

void check_decode_shape(const DecodeShape& s, const char* op) {
  if (s.S < 0 || s.NH <= 0 || s.NKV <= 0 || s.HS <= 0 || s.cap <= 0 || s.NH % s.NKV != 0)
    throw Error(str("[", op, "] bad shape S=", s.S, " NH=", s.NH, " NKV=", s.NKV, " HS=", s.HS,
                    " cap=", s.cap, " (want S >= 0, NH, NKV, HS, cap > 0, NH % NKV == 0)"));
}

// `stride` (0 = dense `width`) between rows; a stride shorter than the row would overlap rows.
int64_t row_stride(int64_t stride, int64_t width, const char* op, const char* what) {
  if (stride == 0) return width;
  if (stride < width)
    throw Error(
        str("[", op, "] ", what, " stride ", stride, " is shorter than the row (", width, ")"));
  return stride;
}

// Cache row (slot, row) of a (S, cap, NKV, HS) cache.
template <typename P>
P* cache_row(P* cache, int slot, int row, const DecodeShape& s) {
  return cache + (static_cast<int64_t>(slot) * s.cap + row) * s.NKV * s.HS;
}

}  // namespace

template <typename T>
void embedding_at(T* out, const int32_t* tokens, const int32_t* pos, const T* wte, const T* wpe,
                  int N, int C) {
  if (N < 0 || C < 0) throw Error(str("[embedding_at] negative dims N=", N, " C=", C));
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    T* o = out + static_cast<int64_t>(n) * C;                // (C)
    const T* e = wte + static_cast<int64_t>(tokens[n]) * C;  // (C)
    if (wpe != nullptr) {
      const T* p = wpe + static_cast<int64_t>(pos[n]) * C;  // (C)
      for (int c = 0; c < C; ++c) o[c] = e[c] + p[c];
    } else {
      for (int c = 0; c < C; ++c) o[c] = e[c];
    }
  }
}

template <typename T>
void rope_at(T* x, const int32_t* pos, int N, int H, int HS, const Rope& rope, int64_t stride) {
  if (N < 0 || H < 0 || HS <= 0 || HS % 2 != 0)
    throw Error(str("[rope_at] bad shape N=", N, " H=", H, " HS=", HS, " (want an even HS > 0)"));
  const int64_t rs = row_stride(stride, static_cast<int64_t>(H) * HS, "rope_at", "row");
  const int half = HS / 2;
  const std::vector<double> inv_freq = rope_inv_freq(rope, HS);  // (HS/2), exactly rope_fwd's
  const int stride_i = rope.style == RopeStyle::kRotateHalf ? 1 : 2;
  const int partner = rope.style == RopeStyle::kRotateHalf ? half : 1;
#pragma omp parallel
  {
    std::vector<T> cs(half), sn(half);  // (HS/2) this row's cos, sin rounded to T
#pragma omp for schedule(static)
    for (int n = 0; n < N; ++n) {
      for (int i = 0; i < half; ++i) {
        const double angle = static_cast<double>(pos[n]) * inv_freq[i];
        cs[i] = static_cast<T>(std::cos(angle));
        sn[i] = static_cast<T>(std::sin(angle));
      }
      for (int h = 0; h < H; ++h) {
        T* xh = x + n * rs + static_cast<int64_t>(h) * HS;  // (HS)
        for (int i = 0; i < half; ++i) {
          T& a = xh[i * stride_i];
          T& b = xh[i * stride_i + partner];
          const T c = cs[i], s = sn[i];
          const T x0 = a, x1 = b;
          a = x0 * c - x1 * s;
          b = x0 * s + x1 * c;
        }
      }
    }
  }
}

template <typename T>
void kv_append(T* cache_k, T* cache_v, const T* k, const T* v, const int32_t* pos,
               const DecodeShape& s, int64_t k_stride, int64_t v_stride) {
  check_decode_shape(s, "kv_append");
  const int64_t width = static_cast<int64_t>(s.NKV) * s.HS;
  const int64_t ks = row_stride(k_stride, width, "kv_append", "k");
  const int64_t vs = row_stride(v_stride, width, "kv_append", "v");
  for (int slot = 0; slot < s.S; ++slot) {
    const int row = static_cast<int>(pos[slot] % s.cap);
    std::copy_n(k + slot * ks, width, cache_row(cache_k, slot, row, s));
    std::copy_n(v + slot * vs, width, cache_row(cache_v, slot, row, s));
  }
}

template <typename T>
void decode_attention(T* out, const T* q, const T* cache_k, const T* cache_v, const int32_t* pos,
                      const DecodeShape& s, int64_t q_stride) {
  check_decode_shape(s, "decode_attention");
  const int64_t qs =
      row_stride(q_stride, static_cast<int64_t>(s.NH) * s.HS, "decode_attention", "q");
  const int group = s.NH / s.NKV;
  const T scale = static_cast<T>(1.0 / std::sqrt(static_cast<double>(s.HS)));
#pragma omp parallel
  {
    std::vector<T> score(s.cap);  // (cap) logits, then exponentials
    std::vector<T> acc(s.HS);     // (HS)
#pragma omp for collapse(2) schedule(static)
    for (int slot = 0; slot < s.S; ++slot) {
      for (int h = 0; h < s.NH; ++h) {
        const int kvh = h / group;
        const int n = std::clamp(pos[slot] + 1, 0, s.cap);             // visible cache rows
        const T* qh = q + slot * qs + static_cast<int64_t>(h) * s.HS;  // (HS)
        T* oh = out + (static_cast<int64_t>(slot) * s.NH + h) * s.HS;  // (HS)
        std::fill(acc.begin(), acc.end(), T(0));
        if (n > 0) {
          T mx = -INFINITY;
          for (int j = 0; j < n; ++j) {
            const T* kj = cache_row(cache_k, slot, j, s) + static_cast<int64_t>(kvh) * s.HS;
            T d = 0;
            for (int c = 0; c < s.HS; ++c) d += qh[c] * kj[c];
            score[j] = scale * d;
            mx = std::max(mx, score[j]);
          }
          T sum = 0;
          for (int j = 0; j < n; ++j) {
            score[j] = std::exp(score[j] - mx);
            sum += score[j];
          }
          for (int j = 0; j < n; ++j) {
            const T p = score[j] / sum;
            const T* vj = cache_row(cache_v, slot, j, s) + static_cast<int64_t>(kvh) * s.HS;
            for (int c = 0; c < s.HS; ++c) acc[c] += p * vj[c];
          }
        }
        std::copy(acc.begin(), acc.end(), oh);
      }
    }
  }
}

template <typename T>
void rope_kv_append(T* qkv, int64_t stride, T* cache_k, T* cache_v, const int32_t* pos,
                    const DecodeShape& s, const Rope& rope) {
  T* k = qkv + static_cast<int64_t>(s.NH) * s.HS;
  T* v = k + static_cast<int64_t>(s.NKV) * s.HS;
  rope_at<T>(qkv, pos, s.S, s.NH, s.HS, rope, stride);
  rope_at<T>(k, pos, s.S, s.NKV, s.HS, rope, stride);
  kv_append<T>(cache_k, cache_v, k, v, pos, s, stride, stride);
}

void advance_positions(int32_t* pos, int S, int32_t limit) {
  for (int s = 0; s < S; ++s) pos[s] = std::min(pos[s] + 1, limit);
}

#define FORGE_INSTANTIATE(T)                                                                       \
  template void embedding_at<T>(T*, const int32_t*, const int32_t*, const T*, const T*, int, int); \
  template void rope_at<T>(T*, const int32_t*, int, int, int, const Rope&, int64_t);               \
  template void kv_append<T>(T*, T*, const T*, const T*, const int32_t*, const DecodeShape&,       \
                             int64_t, int64_t);                                                    \
  template void decode_attention<T>(T*, const T*, const T*, const T*, const int32_t*,              \
                                    const DecodeShape&, int64_t);                                  \
  template void rope_kv_append<T>(T*, int64_t, T*, T*, const int32_t*, const DecodeShape&,         \
                                  const Rope&);
FORGE_INSTANTIATE(float)
FORGE_INSTANTIATE(double)
#undef FORGE_INSTANTIATE

}  // namespace forge::cpu
