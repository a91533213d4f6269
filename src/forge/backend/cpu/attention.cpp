// CPU scaled dot-product attention (reference). Naive on purpose: the forward materialises the
// probabilities att (B, NH, T, T) and the backward reads them back, so this file is the ground
// truth the fused CUDA kernels are compared against, not a fast path.
//
// Masking by range, not by −inf: query i sees keys j in [lo(i), hi(i)) with hi = i + 1 when
// causal (else T) and lo = i − window + 1 when window > 0 (else 0). Keys outside the range are
// skipped entirely, so masked entries of att are exactly 0, no exp(−inf) or NaN can appear, and
// a row with no visible key (not reachable with window ≥ 0, kept for safety) outputs zeros.
//
// Accumulation: dot products, softmax sums and gradient sums are carried in double for both
// instantiations; values are rounded to T once when stored.
//
// Threads and determinism: the forward and dq run over (b, h) — each thread owns whole rows of
// out, att and dq. dk and dv run over (b, kv head): one thread sums the contributions of all
// NH/NKV query heads of a group (in head order, then query order) into a double scratch and
// adds it to dk/dv once, so no element is written by two threads, no atomics are needed, and
// the result is bit-identical for any thread count. The price is computing dP = dout·vᵀ in both
// passes: five T²·HS products per head instead of four, irrelevant for a reference.
#include "forge/ops/attention.h"

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <cstdint>
#include <vector>

#include "forge/backend/cpu/attention_rows.h"
#include "forge/core/error.h"

namespace forge::cpu {
namespace {

using attention_rows::check_shape;
using attention_rows::dot;
using attention_rows::KeyRange;
using attention_rows::visible_keys;

// Strided views: row t of head h in a (B, T, H, HS) buffer.
template <typename T>
T* head_row(T* base, int b, int t, int h, int T_, int H, int HS) {
  return base + ((static_cast<int64_t>(b) * T_ + t) * H + h) * HS;
}

// dS_ij = P_ij·(dP_ij − Σ_k P_ik·dP_ik) with dP_ij = dout_i·v_j, for j in the visible range of
// query i; written to ds[j] (unscaled by 1/sqrt(HS)).
template <typename T>
void softmax_grad_row(double* ds, const T* p_row, const T* dout_i, const T* v, int b, int i,
                      int kvh, KeyRange r, const AttentionShape& s) {
  double rowsum = 0;
  for (int j = r.lo; j < r.hi; ++j) {
    ds[j] = dot(dout_i, head_row(v, b, j, kvh, s.T, s.NKV, s.HS), s.HS);  // dP_ij
    rowsum += static_cast<double>(p_row[j]) * ds[j];
  }
  for (int j = r.lo; j < r.hi; ++j) ds[j] = static_cast<double>(p_row[j]) * (ds[j] - rowsum);
}

}  // namespace

template <typename T>
void attention_fwd(T* out, T* att, const T* q, const T* k, const T* v, const AttentionShape& s) {
  check_shape(s, "attention_fwd");
  const int group = s.NH / s.NKV;
  const double scale = 1.0 / std::sqrt(static_cast<double>(s.HS));
#pragma omp parallel
  {
    std::vector<double> score(s.T);  // (T) one row of logits, then probabilities
    std::vector<double> acc(s.HS);   // (HS)
#pragma omp for collapse(2) schedule(static)
    for (int b = 0; b < s.B; ++b) {
      for (int h = 0; h < s.NH; ++h) {
        const int kvh = h / group;
        for (int i = 0; i < s.T; ++i) {
          const T* qi = head_row(q, b, i, h, s.T, s.NH, s.HS);
          T* att_row = att + ((static_cast<int64_t>(b) * s.NH + h) * s.T + i) * s.T;  // (T)
          T* oi = head_row(out, b, i, h, s.T, s.NH, s.HS);
          std::fill(att_row, att_row + s.T, T(0));
          std::fill(acc.begin(), acc.end(), 0.0);
          const KeyRange r = visible_keys(i, s);
          if (r.lo < r.hi) {
            double mx = -INFINITY;
            for (int j = r.lo; j < r.hi; ++j) {
              score[j] = scale * dot(qi, head_row(k, b, j, kvh, s.T, s.NKV, s.HS), s.HS);
              mx = std::max(mx, score[j]);
            }
            double sum = 0;
            for (int j = r.lo; j < r.hi; ++j) {
              score[j] = attention_rows::exp_of<T>(score[j] - mx);
              sum += score[j];
            }
            for (int j = r.lo; j < r.hi; ++j) {
              att_row[j] = static_cast<T>(score[j] / sum);
              // out uses the stored (rounded) probabilities, the same ones the backward reads.
              const double p = static_cast<double>(att_row[j]);
              const T* vj = head_row(v, b, j, kvh, s.T, s.NKV, s.HS);
              for (int d = 0; d < s.HS; ++d) acc[d] += p * static_cast<double>(vj[d]);
            }
          }
          for (int d = 0; d < s.HS; ++d) oi[d] = static_cast<T>(acc[d]);
        }
      }
    }
  }
}

template <typename T>
void attention_bwd(T* dq, T* dk, T* dv, const T* dout, const T* q, const T* k, const T* v,
                   const T* att, const AttentionShape& s) {
  check_shape(s, "attention_bwd");
  const int group = s.NH / s.NKV;
  const double scale = 1.0 / std::sqrt(static_cast<double>(s.HS));

  // Pass 1, over (b, h): dq_i += scale · Σ_j dS_ij · k_j.
#pragma omp parallel
  {
    std::vector<double> ds(s.T);    // (T)
    std::vector<double> acc(s.HS);  // (HS)
#pragma omp for collapse(2) schedule(static)
    for (int b = 0; b < s.B; ++b) {
      for (int h = 0; h < s.NH; ++h) {
        const int kvh = h / group;
        for (int i = 0; i < s.T; ++i) {
          const KeyRange r = visible_keys(i, s);
          const T* p_row = att + ((static_cast<int64_t>(b) * s.NH + h) * s.T + i) * s.T;
          const T* dout_i = head_row(dout, b, i, h, s.T, s.NH, s.HS);
          softmax_grad_row(ds.data(), p_row, dout_i, v, b, i, kvh, r, s);
          std::fill(acc.begin(), acc.end(), 0.0);
          for (int j = r.lo; j < r.hi; ++j) {
            const T* kj = head_row(k, b, j, kvh, s.T, s.NKV, s.HS);
            for (int d = 0; d < s.HS; ++d) acc[d] += ds[j] * static_cast<double>(kj[d]);
          }
          T* dqi = head_row(dq, b, i, h, s.T, s.NH, s.HS);
          for (int d = 0; d < s.HS; ++d) dqi[d] += static_cast<T>(scale * acc[d]);
        }
      }
    }
  }

  // Pass 2, over (b, kv head): dv_j += Σ_{h in group, i} P_ij · dout_i and
  // dk_j += scale · Σ_{h in group, i} dS_ij · q_i, summed in double, then added once.
#pragma omp parallel
  {
    std::vector<double> ds(s.T);                                  // (T)
    std::vector<double> dk_acc(static_cast<size_t>(s.T) * s.HS);  // (T, HS)
    std::vector<double> dv_acc(static_cast<size_t>(s.T) * s.HS);  // (T, HS)
#pragma omp for collapse(2) schedule(static)
    for (int b = 0; b < s.B; ++b) {
      for (int kvh = 0; kvh < s.NKV; ++kvh) {
        std::fill(dk_acc.begin(), dk_acc.end(), 0.0);
        std::fill(dv_acc.begin(), dv_acc.end(), 0.0);
        for (int h = kvh * group; h < (kvh + 1) * group; ++h) {
          for (int i = 0; i < s.T; ++i) {
            const KeyRange r = visible_keys(i, s);
            const T* p_row = att + ((static_cast<int64_t>(b) * s.NH + h) * s.T + i) * s.T;
            const T* dout_i = head_row(dout, b, i, h, s.T, s.NH, s.HS);
            const T* qi = head_row(q, b, i, h, s.T, s.NH, s.HS);
            softmax_grad_row(ds.data(), p_row, dout_i, v, b, i, kvh, r, s);
            for (int j = r.lo; j < r.hi; ++j) {
              const double p = static_cast<double>(p_row[j]);
              double* dkj = dk_acc.data() + static_cast<size_t>(j) * s.HS;
              double* dvj = dv_acc.data() + static_cast<size_t>(j) * s.HS;
              for (int d = 0; d < s.HS; ++d) {
                dkj[d] += ds[j] * static_cast<double>(qi[d]);
                dvj[d] += p * static_cast<double>(dout_i[d]);
              }
            }
          }
        }
        for (int j = 0; j < s.T; ++j) {
          T* dkj = head_row(dk, b, j, kvh, s.T, s.NKV, s.HS);
          T* dvj = head_row(dv, b, j, kvh, s.T, s.NKV, s.HS);
          for (int d = 0; d < s.HS; ++d) {
            dkj[d] += static_cast<T>(scale * dk_acc[static_cast<size_t>(j) * s.HS + d]);
            dvj[d] += static_cast<T>(dv_acc[static_cast<size_t>(j) * s.HS + d]);
          }
        }
      }
    }
  }
}

#define FORGE_INSTANTIATE(T)                                                                   \
  template void attention_fwd<T>(T*, T*, const T*, const T*, const T*, const AttentionShape&); \
  template void attention_bwd<T>(T*, T*, T*, const T*, const T*, const T*, const T*, const T*, \
                                 const AttentionShape&);
FORGE_INSTANTIATE(float)
FORGE_INSTANTIATE(double)
#undef FORGE_INSTANTIATE

}  // namespace forge::cpu
