// CPU token (+ position) embedding.
// Forward is a gather, parallel over the B·T positions. Backward must be deterministic with no
// atomics: a token id can occur many times in a batch, so dwte rows are scatter targets shared
// by several positions. We group positions by token id with a stable bucket sort (positions
// of one id stay in (b, t) order), then parallelise over distinct ids: each thread owns whole
// dwte rows and sums that id's dout rows in double in a fixed order. dwpe sums over the batch:
// parallel over t, serial over b, again in double. With per-token positions (packed rows) dwpe
// is one serial pass in (b, t) order into a double table of the positions present. Neither
// depends on the thread count.
#include "forge/ops/embedding.h"

#include <algorithm>
#include <vector>

#include "forge/core/error.h"

namespace forge::cpu {

template <typename T>
void embedding_fwd(T* out, const int32_t* tokens, const T* wte, const T* wpe, int B, int T_,
                   int C, const int32_t* pos) {
  FORGE_CHECK(B >= 0 && T_ >= 0 && C >= 0, "[embedding_fwd] negative dims ", B, " ", T_, " ", C);
#pragma omp parallel for
  for (int64_t bt = 0; bt < static_cast<int64_t>(B) * T_; ++bt) {
    const int t = pos ? pos[bt] : static_cast<int>(bt % T_);
    T* out_bt = out + bt * C;                                       // (C)
    const T* wte_row = wte + static_cast<int64_t>(tokens[bt]) * C;  // (C)
    if (wpe != nullptr) {
      const T* wpe_row = wpe + static_cast<int64_t>(t) * C;  // (C)
      for (int c = 0; c < C; ++c) out_bt[c] = wte_row[c] + wpe_row[c];
    } else {
      for (int c = 0; c < C; ++c) out_bt[c] = wte_row[c];
    }
  }
}

template <typename T>
void embedding_bwd(T* dwte, T* dwpe, const T* dout, const int32_t* tokens, int B, int T_, int C,
                   const int32_t* pos) {
  FORGE_CHECK(B >= 0 && T_ >= 0 && C >= 0, "[embedding_bwd] negative dims ", B, " ", T_, " ", C);
  const int64_t BT = static_cast<int64_t>(B) * T_;

  // Stable bucket sort of positions by token id, with one bucket per distinct id present, so
  // the cost is O(BT log BT) and the memory O(BT) whatever V is.
  std::vector<int32_t> ids(tokens, tokens + BT);
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  const int64_t U = static_cast<int64_t>(ids.size());  // distinct ids
  std::vector<int64_t> start(U + 1, 0);                // (U + 1) offsets into order
  std::vector<int64_t> slot(BT);                       // (BT) index of each position's id
  for (int64_t bt = 0; bt < BT; ++bt) {
    slot[bt] = std::lower_bound(ids.begin(), ids.end(), tokens[bt]) - ids.begin();
    ++start[slot[bt] + 1];
  }
  for (int64_t u = 0; u < U; ++u) start[u + 1] += start[u];
  std::vector<int64_t> order(BT);  // (BT) positions grouped by id, (b, t) order within an id
  std::vector<int64_t> fill(start.begin(), start.end() - 1);
  for (int64_t bt = 0; bt < BT; ++bt) order[fill[slot[bt]]++] = bt;

#pragma omp parallel
  {
    std::vector<double> acc(C);  // (C)
#pragma omp for
    for (int64_t u = 0; u < U; ++u) {
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int64_t k = start[u]; k < start[u + 1]; ++k) {
        const T* dout_bt = dout + order[k] * C;  // (C)
        for (int c = 0; c < C; ++c) acc[c] += dout_bt[c];
      }
      T* dwte_row = dwte + static_cast<int64_t>(ids[u]) * C;  // (C)
      for (int c = 0; c < C; ++c) dwte_row[c] += static_cast<T>(acc[c]);
    }
  }

  if (dwpe == nullptr) return;
  if (pos != nullptr) {
    const int P = BT > 0 ? *std::max_element(pos, pos + BT) + 1 : 0;
    std::vector<double> acc(static_cast<size_t>(P) * C, 0.0);  // (P, C)
    for (int64_t bt = 0; bt < BT; ++bt) {
      double* a = acc.data() + static_cast<size_t>(pos[bt]) * C;
      const T* dout_bt = dout + bt * C;
      for (int c = 0; c < C; ++c) a[c] += dout_bt[c];
    }
    for (size_t i = 0; i < acc.size(); ++i) dwpe[i] += static_cast<T>(acc[i]);
    return;
  }
#pragma omp parallel
  {
    std::vector<double> acc(C);  // (C)
#pragma omp for
    for (int t = 0; t < T_; ++t) {
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int b = 0; b < B; ++b) {
        const T* dout_bt = dout + (static_cast<int64_t>(b) * T_ + t) * C;  // (C)
        for (int c = 0; c < C; ++c) acc[c] += dout_bt[c];
      }
      T* dwpe_row = dwpe + static_cast<int64_t>(t) * C;  // (C)
      for (int c = 0; c < C; ++c) dwpe_row[c] += static_cast<T>(acc[c]);
    }
  }
}

#define FORGE_INSTANTIATE(T)                                                             \
  template void embedding_fwd<T>(T*, const int32_t*, const T*, const T*, int, int, int, const int32_t*); \
  template void embedding_bwd<T>(T*, T*, const T*, const int32_t*, int, int, int, const int32_t*);
FORGE_INSTANTIATE(float)
FORGE_INSTANTIATE(double)
#undef FORGE_INSTANTIATE

}  // namespace forge::cpu
