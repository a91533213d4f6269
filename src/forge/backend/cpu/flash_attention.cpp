// CPU twin of the flash-attention kernels (ops/attention.h): the contract the model runs on both
// backends. The forward keeps one log-sum-exp per query row instead of the T×T probabilities;
// the backward recomputes each probability as exp(q·k·scale − lse) and uses
// D_i = rowsum(dout_i ∘ out_i) for the softmax backward (equal to Σ_j P_ij·dP_ij, without a
// second pass over the keys) — FlashAttention-2's algorithm, row by row.
//
// Masking by key range, as in attention.cpp: query i sees keys [lo(i), hi(i)); a row with no
// visible key gets lse = lowest() and zeros. Segments (packed rows) raise lo(i) to the first
// token of i's segment (SegmentStarts), which keeps every other segment's keys out.
//
// Accumulation in double for both instantiations; values are rounded to T when stored.
//
// Threads and determinism: the forward runs over (b, h), each thread owning whole rows; the
// backward is one pass over (b, kv head), one thread computing each probability row once and
// summing all NH/NKV query heads of the group (head order, then query order) into dk and dv in
// a double scratch, then writing once: one q·k product, one dout·v product and an exp per
// visible (i, j).
//
// Saved probabilities (optional): the forward can also write P (B, NH, T, T), and the backward
// then reads it instead of recomputing q·k and the exp, which leaves one dout·v product per
// (i, j). The CPU backend does this where P is small (it is the CPU's speed, ~half a tiny-preset
// training step is attention); the results differ from recomputation in rounding only. No element is written by two
// threads and every sum has a fixed order: bit-identical for any thread count.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "forge/backend/cpu/attention_rows.h"
#include "forge/core/error.h"
#include "forge/ops/attention.h"

namespace forge::cpu {
namespace {

using attention_rows::check_shape;
using attention_rows::dot;
using attention_rows::exp_of;

// Row (b, t, head h) of a strided (B, T, H·HS) view with `stride` elements between tokens.
struct View {
  int64_t stride;  // elements between tokens
  int T;
  template <typename P>
  P* row(P* base, int b, int t, int h, int HS) const {
    return base + (static_cast<int64_t>(b) * T + t) * stride + static_cast<int64_t>(h) * HS;
  }
};

struct Views {
  View q, k, v, o;
};

Views views_of(const AttentionShape& s, const AttentionStrides& st) {
  const int64_t dq = static_cast<int64_t>(s.NH) * s.HS, dkv = static_cast<int64_t>(s.NKV) * s.HS;
  return {{st.q ? st.q : dq, s.T}, {st.k ? st.k : dkv, s.T}, {st.v ? st.v : dkv, s.T}, {st.o ? st.o : dq, s.T}};
}

int hi_key(int i, const AttentionShape& s) { return attention_rows::visible_keys(i, s).hi; }

// The first token of each token's segment, (B, T): a run of equal ids of seg in a row; 0
// everywhere without segments. lo(b, i) = max(the shape's lo, that start).
struct SegmentStarts {
  std::vector<int> start;
  SegmentStarts(const int32_t* seg, const AttentionShape& s) {
    if (seg == nullptr) return;
    start.resize(static_cast<size_t>(s.B) * s.T);
    for (int b = 0; b < s.B; ++b)
      for (int t = 0; t < s.T; ++t) {
        const size_t i = static_cast<size_t>(b) * s.T + t;
        start[i] = t > 0 && seg[i] == seg[i - 1] ? start[i - 1] : t;
      }
  }
  int lo(int b, int i, const AttentionShape& s) const {
    const int lo = attention_rows::visible_keys(i, s).lo;
    return start.empty() ? lo : std::max(lo, start[static_cast<size_t>(b) * s.T + i]);
  }
};

template <typename T>
T* lse_row(T* lse, int b, int h, int i, const AttentionShape& s) {
  return lse + (static_cast<int64_t>(b) * s.NH + h) * s.T + i;
}

// p[j] = P_ij for the visible keys j of query i (from the saved lse, or read from the saved row
// of probabilities when there is one), and dS_ij / scale into ds.
template <typename T>
void probs_and_dscores(double* p, double* ds, const T* qi, const T* dout_i, double D, double lse,
                       const T* prow, const T* k, const T* v, int b, int i, int lo, int kvh, const Views& w,
                       double scale, const AttentionShape& s) {
  for (int j = lo; j < hi_key(i, s); ++j) {
    p[j] = prow ? static_cast<double>(prow[j])
                : exp_of<T>(scale * dot(qi, w.k.row(k, b, j, kvh, s.HS), s.HS) - lse);
    const double dp = dot(dout_i, w.v.row(v, b, j, kvh, s.HS), s.HS);
    ds[j] = p[j] * (dp - D);
  }
}

}  // namespace

template <typename T>
T* probs_row(T* probs, int b, int h, int i, const AttentionShape& s) {
  return probs ? probs + ((static_cast<int64_t>(b) * s.NH + h) * s.T + i) * s.T : nullptr;
}

template <typename T>
void flash_attention_fwd(T* out, T* lse, const T* q, const T* k, const T* v, const AttentionShape& s,
                         const AttentionStrides& st, T* probs, const int32_t* seg) {
  check_shape(s, "flash_attention_fwd");
  const Views w = views_of(s, st);
  const SegmentStarts segs(seg, s);
  const int group = s.NH / s.NKV;
  const double scale = 1.0 / std::sqrt(static_cast<double>(s.HS));
#pragma omp parallel
  {
    std::vector<double> score(s.T);  // (T) one row of logits, then exponentials
    std::vector<double> acc(s.HS);   // (HS)
#pragma omp for collapse(2) schedule(static)
    for (int b = 0; b < s.B; ++b) {
      for (int h = 0; h < s.NH; ++h) {
        const int kvh = h / group;
        for (int i = 0; i < s.T; ++i) {
          const T* qi = w.q.row(q, b, i, h, s.HS);
          T* oi = w.o.row(out, b, i, h, s.HS);
          std::fill(acc.begin(), acc.end(), 0.0);
          const int lo = segs.lo(b, i, s), hi = hi_key(i, s);
          double row_lse = std::numeric_limits<T>::lowest();
          if (lo < hi) {
            double mx = -INFINITY;
            for (int j = lo; j < hi; ++j) {
              score[j] = scale * dot(qi, w.k.row(k, b, j, kvh, s.HS), s.HS);
              mx = std::max(mx, score[j]);
            }
            double sum = 0;
            for (int j = lo; j < hi; ++j) {
              score[j] = exp_of<T>(score[j] - mx);
              sum += score[j];
            }
            T* prow = probs_row(probs, b, h, i, s);
            for (int j = lo; j < hi; ++j) {
              const double p = score[j] / sum;
              if (prow) prow[j] = static_cast<T>(p);
              const T* vj = w.v.row(v, b, j, kvh, s.HS);
              for (int d = 0; d < s.HS; ++d) acc[d] += p * static_cast<double>(vj[d]);
            }
            row_lse = mx + std::log(sum);
          }
          *lse_row(lse, b, h, i, s) = static_cast<T>(row_lse);
          for (int d = 0; d < s.HS; ++d) oi[d] = static_cast<T>(acc[d]);
        }
      }
    }
  }
}

template <typename T>
void flash_attention_bwd(T* dq, T* dk, T* dv, const T* dout, const T* q, const T* k, const T* v,
                         const T* out, const T* lse, const AttentionShape& s,
                         const AttentionStrides& st, const T* probs, const int32_t* seg) {
  check_shape(s, "flash_attention_bwd");
  const Views w = views_of(s, st);
  const SegmentStarts segs(seg, s);
  const int group = s.NH / s.NKV;
  const double scale = 1.0 / std::sqrt(static_cast<double>(s.HS));
  // D_i = dout_i · out_i for query row i of head h.
  auto delta = [&](int b, int i, int h) {
    return dot(w.o.row(dout, b, i, h, s.HS), w.o.row(out, b, i, h, s.HS), s.HS);
  };

  // One pass over (b, kv head): for each query head h of the group and each query row i, the
  // probabilities and dS of the row are computed once, then
  //   dq_i = scale · Σ_j dS_ij · k_j                      (written: the row is this task's)
  //   dk_j += scale · dS_ij · q_i,  dv_j += P_ij · dout_i  (double scratch, written at the end)
  // The task owns dq of the group's query heads and dk/dv of its kv head.
#pragma omp parallel
  {
    std::vector<double> p(s.T), ds(s.T), acc(s.HS);
    std::vector<double> dk_acc(static_cast<size_t>(s.T) * s.HS), dv_acc(static_cast<size_t>(s.T) * s.HS);
#pragma omp for collapse(2) schedule(static)
    for (int b = 0; b < s.B; ++b) {
      for (int kvh = 0; kvh < s.NKV; ++kvh) {
        std::fill(dk_acc.begin(), dk_acc.end(), 0.0);
        std::fill(dv_acc.begin(), dv_acc.end(), 0.0);
        for (int h = kvh * group; h < (kvh + 1) * group; ++h) {
          for (int i = 0; i < s.T; ++i) {
            const T* qi = w.q.row(q, b, i, h, s.HS);
            const T* dout_i = w.o.row(dout, b, i, h, s.HS);
            const int lo = segs.lo(b, i, s);
            probs_and_dscores(p.data(), ds.data(), qi, dout_i, delta(b, i, h),
                              static_cast<double>(*lse_row(lse, b, h, i, s)), probs_row(probs, b, h, i, s), k, v,
                              b, i, lo, kvh, w, scale, s);
            std::fill(acc.begin(), acc.end(), 0.0);
            for (int j = lo; j < hi_key(i, s); ++j) {
              const T* kj = w.k.row(k, b, j, kvh, s.HS);
              double* dkj = dk_acc.data() + static_cast<size_t>(j) * s.HS;
              double* dvj = dv_acc.data() + static_cast<size_t>(j) * s.HS;
              for (int d = 0; d < s.HS; ++d) {
                acc[d] += ds[j] * static_cast<double>(kj[d]);
                dkj[d] += ds[j] * static_cast<double>(qi[d]);
                dvj[d] += p[j] * static_cast<double>(dout_i[d]);
              }
            }
            T* dqi = w.q.row(dq, b, i, h, s.HS);
            for (int d = 0; d < s.HS; ++d) dqi[d] = static_cast<T>(scale * acc[d]);
          }
        }
        for (int j = 0; j < s.T; ++j) {
          T* dkj = w.k.row(dk, b, j, kvh, s.HS);
          T* dvj = w.v.row(dv, b, j, kvh, s.HS);
          for (int d = 0; d < s.HS; ++d) {
            dkj[d] = static_cast<T>(scale * dk_acc[static_cast<size_t>(j) * s.HS + d]);
            dvj[d] = static_cast<T>(dv_acc[static_cast<size_t>(j) * s.HS + d]);
          }
        }
      }
    }
  }
}

#define FORGE_INSTANTIATE(T)                                                                      \
  template void flash_attention_fwd<T>(T*, T*, const T*, const T*, const T*, const AttentionShape&, \
                                       const AttentionStrides&, T*, const int32_t*);              \
  template void flash_attention_bwd<T>(T*, T*, T*, const T*, const T*, const T*, const T*, const T*, \
                                       const T*, const AttentionShape&, const AttentionStrides&, const T*, \
                                       const int32_t*);
FORGE_INSTANTIATE(float)
FORGE_INSTANTIATE(double)
#undef FORGE_INSTANTIATE

}  // namespace forge::cpu
