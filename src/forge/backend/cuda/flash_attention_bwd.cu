// Flash attention backward on tensor cores, without atomics (FlashAttention-2's mathematics,
// split the way the seeds' section 6 and MFA do it so that every output has one writer):
//   preprocess   D_i = rowsum(dO_i ∘ O_i)          (flash_attention.cu, one warp per row)
//   dQ kernel    one block per (query tile, query head, batch), looping over key tiles:
//                S = Q·Kᵀ, P = exp2(S·scale·log2e − lse_i·log2e), dP = dO·Vᵀ,
//                dS = P ∘ (dP − D_i),  dQ += dS·K;  finally dQ ·= scale
//   dK/dV kernel one block per (key tile, kv head, batch), looping over the NH/NKV query heads
//                of its group and their query tiles, computing the transposed products:
//                Sᵀ = K·Qᵀ, Pᵀ, dV += Pᵀ·dO, dPᵀ = V·dOᵀ, dSᵀ = Pᵀ ∘ (dPᵀ − D), dK += dSᵀ·Q
// Both recompute P from the forward's log-sum-exp. Each warp owns 16 rows of its block's output
// tile and keeps them in f32 registers for the whole loop; every sum runs in a fixed order, so
// two runs are bit-identical, and GQA's sum over the group's query heads happens in registers
// (no K/V copies, no dK/dV scratch). The price of having no atomics is recomputing S and dP in
// both kernels: 7 tile products where FlashAttention-2's atomic dQ needs 5.
//
// ptxas (sm_90a, CUDA 13.0, -O3), registers / spill bytes, 0 stack frame, same for bf16 and f16:
//   flash_bwd_dq_kernel   HS 64  (64 rows, BK 32)  126 / 0    HS 128 (64 rows, BK 64)  246 / 0
//   flash_bwd_dkv_kernel  HS 64  (64 rows, BQ 32)  165 / 0    HS 128 (64 rows, BQ 32)  255 / 0
//   HS 32 / 80 / 96: dQ 94 / 225 / 236, dK/dV 96 / 168 / 222, all 0 spill
//   with segments (kSeg, ptxas -v on the PTX, CUDA 13.0), HS 32 / 64 / 80 / 96 / 128: dQ
//   96 / 126 / 246 / 255 / 255, 0 spill; dK/dV 121 / 168 / 209 / 226 / 255, 16 bytes spilled at
//   HS 128. Without segments the PTX is unchanged.
// Measured (ncu, GPT-2 124M shape 64·12·1024·64 causal): both kernels are latency-bound at 2–3
// resident blocks per SM (tensor pipe 27–32% busy, 0.5–0.9 eligible warps per scheduler).
//
// Masking as in the forward (flash_attention.cu), except that masked entries of P are set to 0
// directly: lse of a row with no visible key is −FLT_MAX and must not enter an exp2. Segments
// (kSeg): the dQ kernel bounds its key tiles as the forward does; the dK/dV kernel stops at the
// first query row whose segment starts after its last key (seg_rows_end), a warp skips query
// tiles whose first row's segment starts after its keys.
#include <cfloat>

#include "forge/backend/cuda/check.h"
#include "forge/backend/cuda/context.h"
#include "forge/backend/cuda/flash_mma.cuh"
#include "forge/backend/cuda/ops.h"

namespace forge::cuda {
namespace flash {

void launch_delta(Context& ctx, DType dt, const FlashParams& p);  // flash_attention.cu

namespace {

constexpr float kLog2e = 1.4426950408889634f;

// ---- dQ ------------------------------------------------------------------------------------

template <int D, int kWarps, int BK>
struct DqConfig {
  static constexpr int kThreads = kWarps * 32;
  static constexpr int BQ = kWarps * 16;
  static constexpr int kStageBytes = 2 * BK * TileLayout<D>::kRowBytes;  // K then V
  static constexpr int kSmem = 2 * BQ * TileLayout<D>::kRowBytes + 2 * kStageBytes;  // Q, dO, two stages
};

template <typename T, int D, int kWarps, int BK, bool kSeg>
__global__ void __launch_bounds__(kWarps * 32) flash_bwd_dq_kernel(FlashParams p) {
  using Cfg = DqConfig<D, kWarps, BK>;
  constexpr int BQ = Cfg::BQ, NT = BK / 8, DT = D / 8, kThreads = Cfg::kThreads;
  extern __shared__ __align__(128) uint8_t smem[];
  const uint32_t sQ = smem_addr(smem);
  const uint32_t sdO = sQ + BQ * TileLayout<D>::kRowBytes;
  const uint32_t sKV = sdO + BQ * TileLayout<D>::kRowBytes;

  const int T_ = p.T_;
  const int n_qt = (T_ + BQ - 1) / BQ;
  const int qt = p.causal ? n_qt - 1 - static_cast<int>(blockIdx.x) : static_cast<int>(blockIdx.x);
  const int h = blockIdx.y, b = blockIdx.z, kvh = h / (p.NH / p.NKV);
  const int q0 = qt * BQ;
  const int64_t bT = static_cast<int64_t>(b) * T_;
  const T* q = static_cast<const T*>(p.q) + bT * p.ld_q + h * D;
  const T* dout = static_cast<const T*>(p.dout) + bT * p.ld_o + h * D;
  const T* k = static_cast<const T*>(p.k) + bT * p.ld_k + kvh * D;
  const T* v = static_cast<const T*>(p.v) + bT * p.ld_v + kvh * D;

  const TileRange kr = key_tiles<BQ, BK>(p, q0);
  // Segments: as in the forward, key tiles below the first row's bound are not visited.
  const int kt_begin = kSeg ? max(kr.begin, seg_lo<kSeg>(p, b, q0) / BK) : kr.begin, kt_end = kr.end;

  load_tile<BQ, D, kThreads>(sQ, q, p.ld_q, q0, T_);
  load_tile<BQ, D, kThreads>(sdO, dout, p.ld_o, q0, T_);
  if (kt_begin < kt_end) {
    load_kv<BK, D, kThreads>(sKV, k, v, p.ld_k, p.ld_v, kt_begin * BK, T_);
  }
  cp_async_commit();

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, c = 2 * (lane % 4);
  const int wrow = warp * 16;
  const int wq_lo = q0 + wrow, wq_hi = wq_lo + 15;
  const Visibility vis{T_, p.causal, p.window};
  const float sl2 = p.scale_log2;

  // Per-row statistics of rows g and g + 8.
  float lse2[2], dlt[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int i = wq_lo + g + 8 * r;
    const int64_t at = (static_cast<int64_t>(b) * p.NH + h) * T_ + i;
    lse2[r] = i < T_ ? p.lse[at] * kLog2e : 0.0f;
    dlt[r] = i < T_ ? p.delta[at] : 0.0f;
  }

  float dq[DT][4];
  zero_acc(dq);

  for (int kt = kt_begin; kt < kt_end; ++kt) {
    const uint32_t sK = sKV + ((kt - kt_begin) & 1) * Cfg::kStageBytes;
    const uint32_t sV = sK + BK * TileLayout<D>::kRowBytes;
    if (kt + 1 < kt_end) {
      const uint32_t nK = sKV + ((kt + 1 - kt_begin) & 1) * Cfg::kStageBytes;
      load_kv<BK, D, kThreads>(nK, k, v, p.ld_k, p.ld_v, (kt + 1) * BK, T_);
    }
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();

    const int k0 = kt * BK;
    const bool skip = (p.causal && k0 > wq_hi) || (p.window > 0 && k0 + BK - 1 <= wq_lo - p.window) ||
                      (kSeg && k0 + BK - 1 < seg_lo<kSeg>(p, b, wq_lo));
    if (!skip) {
      float s[NT][4], dp[NT][4];
      zero_acc(s);
      zero_acc(dp);
      mma_abt<T, D, NT>(s, sQ, wrow, sK, lane);    // S = Q·Kᵀ
      mma_abt<T, D, NT>(dp, sdO, wrow, sV, lane);  // dP = dO·Vᵀ
      const bool masked = k0 + BK > T_ || wq_hi >= T_ || (p.causal && k0 + BK - 1 > wq_lo) ||
                          (p.window > 0 && k0 <= wq_hi - p.window) || (kSeg && k0 < seg_lo<kSeg>(p, b, wq_hi));
      // dS = P ∘ (dP − D), into s.
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int r = e >> 1;
          float pv = fast_exp2<(D <= 64)>(fmaf(s[nt][e], sl2, -lse2[r]));
          if (masked && !vis(wq_lo + g + 8 * r, k0 + nt * 8 + c + (e & 1))) pv = 0.0f;
          if (kSeg && masked && k0 + nt * 8 + c + (e & 1) < seg_lo<kSeg>(p, b, wq_lo + g + 8 * r)) pv = 0.0f;
          s[nt][e] = pv * (dp[nt][e] - dlt[r]);
        }
      mma_pb<T, D, NT>(dq, s, sK, lane);  // dQ += dS·K
    }
    __syncthreads();
  }
  cp_async_wait<0>();

  store_rows<T>(static_cast<T*>(p.dq) + bT * p.ld_q + h * D, p.ld_q, dq, p.scale, wq_lo + g, T_, c);
}

// ---- dK, dV --------------------------------------------------------------------------------

template <int D, int kWarps, int BQ>
struct DkvConfig {
  static constexpr int kThreads = kWarps * 32;
  static constexpr int BK = kWarps * 16;
  // Q, dO, then lse and D of the tile's BQ rows.
  static constexpr int kStageBytes = 2 * BQ * TileLayout<D>::kRowBytes + 2 * BQ * 4;
  static constexpr int kSmem = 2 * BK * TileLayout<D>::kRowBytes + 2 * kStageBytes;  // K, V, two stages
};

// BQ f32 values src[row0 ..] into shared memory (0 past T), 4 bytes per cp.async.
template <int BQ, int kThreads>
__device__ __forceinline__ void load_row_stats(uint32_t dst, const float* __restrict__ src, int row0, int T_) {
  for (int r = threadIdx.x; r < BQ; r += kThreads) {
    const bool in = row0 + r < T_;
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst + r * 4),
                 "l"(in ? src + row0 + r : src), "r"(in ? 4 : 0));
  }
}

template <typename T, int D, int kWarps, int BQ, bool kSeg>
__global__ void __launch_bounds__(kWarps * 32) flash_bwd_dkv_kernel(FlashParams p) {
  using Cfg = DkvConfig<D, kWarps, BQ>;
  constexpr int BK = Cfg::BK, NT = BQ / 8, DT = D / 8, kThreads = Cfg::kThreads;
  extern __shared__ __align__(128) uint8_t smem[];
  const uint32_t sK = smem_addr(smem);
  const uint32_t sV = sK + BK * TileLayout<D>::kRowBytes;
  const uint32_t sStage = sV + BK * TileLayout<D>::kRowBytes;
  const float* stage_f = reinterpret_cast<const float*>(smem + 2 * BK * TileLayout<D>::kRowBytes);

  const int T_ = p.T_;
  const int kt = blockIdx.x, kvh = blockIdx.y, b = blockIdx.z;
  const int group = p.NH / p.NKV;
  const int k0 = kt * BK;
  const int64_t bT = static_cast<int64_t>(b) * T_;
  const T* k = static_cast<const T*>(p.k) + bT * p.ld_k + kvh * D;
  const T* v = static_cast<const T*>(p.v) + bT * p.ld_v + kvh * D;

  const int q_begin = p.causal ? k0 : 0;
  int q_end = p.window > 0 ? min(T_, k0 + BK - 1 + p.window) : T_;
  // Segments: rows from the end of the tile's last key's segment on see none of its keys (k0 < T).
  if constexpr (kSeg) q_end = min(q_end, seg_rows_end(p, b, min(k0 + BK - 1, T_ - 1)));
  const int qt_begin = q_begin / BQ, qt_end = (q_end + BQ - 1) / BQ;
  const int n_qt = max(0, qt_end - qt_begin);
  const int n_it = n_qt * group;

  // Iteration it covers query head h0 + it / n_qt, query tile qt_begin + it % n_qt.
  auto issue = [&](int it) {
    const int h = kvh * group + it / n_qt, qt = qt_begin + it % n_qt;
    const uint32_t st = sStage + (it & 1) * Cfg::kStageBytes;
    const T* q = static_cast<const T*>(p.q) + bT * p.ld_q + h * D;
    const T* dout = static_cast<const T*>(p.dout) + bT * p.ld_o + h * D;
    const int64_t at = (static_cast<int64_t>(b) * p.NH + h) * T_;
    load_tile<BQ, D, kThreads>(st, q, p.ld_q, qt * BQ, T_);
    load_tile<BQ, D, kThreads>(st + BQ * TileLayout<D>::kRowBytes, dout, p.ld_o, qt * BQ, T_);
    load_row_stats<BQ, kThreads>(st + 2 * BQ * TileLayout<D>::kRowBytes, p.lse + at, qt * BQ, T_);
    load_row_stats<BQ, kThreads>(st + 2 * BQ * TileLayout<D>::kRowBytes + BQ * 4, p.delta + at, qt * BQ, T_);
  };

  load_tile<BK, D, kThreads>(sK, k, p.ld_k, k0, T_);
  load_tile<BK, D, kThreads>(sV, v, p.ld_v, k0, T_);
  if (n_it > 0) issue(0);
  cp_async_commit();

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, c = 2 * (lane % 4);
  const int wrow = warp * 16;
  const int wk_lo = k0 + wrow, wk_hi = wk_lo + 15;  // the warp's key range
  const Visibility vis{T_, p.causal, p.window};
  const float sl2 = p.scale_log2;

  float dk[DT][4], dv[DT][4];
  zero_acc(dk);
  zero_acc(dv);

  for (int it = 0; it < n_it; ++it) {
    const uint32_t sQ = sStage + (it & 1) * Cfg::kStageBytes;
    const uint32_t sdO = sQ + BQ * TileLayout<D>::kRowBytes;
    const float* s_lse = stage_f + (it & 1) * (Cfg::kStageBytes / 4) + 2 * BQ * TileLayout<D>::kRowBytes / 4;
    const float* s_dlt = s_lse + BQ;
    if (it + 1 < n_it) issue(it + 1);
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();

    const int q0 = (qt_begin + it % n_qt) * BQ, q_hi = q0 + BQ - 1;
    const bool skip = (p.causal && wk_lo > q_hi) || (p.window > 0 && wk_hi <= q0 - p.window) ||
                      (kSeg && seg_lo<kSeg>(p, b, q0) > wk_hi);
    if (!skip) {
      // Sᵀ = K·Qᵀ, then Pᵀ (in s).
      float s[NT][4];
      zero_acc(s);
      mma_abt<T, D, NT>(s, sK, wrow, sQ, lane);
      const bool masked = wk_hi >= T_ || q0 + BQ > T_ || (p.causal && wk_hi > q0) ||
                          (p.window > 0 && wk_lo <= q_hi - p.window) || (kSeg && seg_lo<kSeg>(p, b, q_hi) > wk_lo);
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int iq = nt * 8 + c + (e & 1);  // query within the tile: the column
          float pv = fast_exp2<(D <= 64)>(fmaf(s[nt][e], sl2, -s_lse[iq] * kLog2e));
          const int j = wk_lo + g + 8 * (e >> 1);  // the key: the row
          if (masked && (!vis(q0 + iq, j) || (kSeg && j < seg_lo<kSeg>(p, b, q0 + iq)))) pv = 0.0f;
          s[nt][e] = pv;
        }
      mma_pb<T, D, NT>(dv, s, sdO, lane);  // dV += Pᵀ·dO
      // dPᵀ = V·dOᵀ, then dSᵀ = Pᵀ ∘ (dPᵀ − D) (in s).
      float dp[NT][4];
      zero_acc(dp);
      mma_abt<T, D, NT>(dp, sV, wrow, sdO, lane);
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[nt][e] *= dp[nt][e] - s_dlt[nt * 8 + c + (e & 1)];
      mma_pb<T, D, NT>(dk, s, sQ, lane);  // dK += dSᵀ·Q
    }
    __syncthreads();
  }
  cp_async_wait<0>();

  store_kv_rows<T>(static_cast<T*>(p.dk) + bT * p.ld_k + kvh * D, p.ld_k, dk, p.scale,
                   static_cast<T*>(p.dv) + bT * p.ld_v + kvh * D, p.ld_v, dv, wk_lo + g, T_, c);
}

template <typename T, int D, int kWarps, int BK, bool kSeg>
void launch_dq(Context& ctx, const FlashParams& p) {
  using Cfg = DqConfig<D, kWarps, BK>;
  const dim3 grid((p.T_ + Cfg::BQ - 1) / Cfg::BQ, p.NH, p.B);
  launch_with_smem<flash_bwd_dq_kernel<T, D, kWarps, BK, kSeg>>(ctx, grid, Cfg::kThreads, Cfg::kSmem, p);
}

template <typename T, int D, int kWarps, int BQ, bool kSeg>
void launch_dkv(Context& ctx, const FlashParams& p) {
  using Cfg = DkvConfig<D, kWarps, BQ>;
  const dim3 grid((p.T_ + Cfg::BK - 1) / Cfg::BK, p.NKV, p.B);
  launch_with_smem<flash_bwd_dkv_kernel<T, D, kWarps, BQ, kSeg>>(ctx, grid, Cfg::kThreads, Cfg::kSmem, p);
}

// Tile configurations measured on the H200 (forge bench attention, bf16, backward ms):
//   HS 64:  dQ 64 query rows × BK 32, dK/dV 64 key rows × BQ 32 — 2.107 causal / 3.573 full at
//           64·12·1024·64 (GPT-2 124M), against 2.179 / 3.675 with BK = BQ = 64 (219 registers,
//           2 blocks per SM) and 2.341 / 3.835 with 8-warp dK/dV blocks.
//   HS 128: dQ 64 × 64, dK/dV 64 × 32 (BQ 64 spills) — 4.32 / 8.13 at 4·16·4096·128; the
//           alternatives measured within 1%.
// Head sizes 32, 80 and 96 take the configuration of the nearest measured size.
template <typename T, int D, int kDqBK>
void bwd_launch(Context& ctx, const FlashParams& p) {
  if (p.seg_start != nullptr) {
    launch_dq<T, D, 4, kDqBK, true>(ctx, p);
    launch_dkv<T, D, 4, 32, true>(ctx, p);
  } else {
    launch_dq<T, D, 4, kDqBK, false>(ctx, p);
    launch_dkv<T, D, 4, 32, false>(ctx, p);
  }
}
template <typename T>
void bwd_dispatch(Context& ctx, const FlashParams& p) {
  switch (p.HS) {
    case 32: bwd_launch<T, 32, 32>(ctx, p); break;
    case 64: bwd_launch<T, 64, 32>(ctx, p); break;
    case 80: bwd_launch<T, 80, 64>(ctx, p); break;
    case 96: bwd_launch<T, 96, 64>(ctx, p); break;
    default: bwd_launch<T, 128, 64>(ctx, p); break;
  }
}

}  // namespace
}  // namespace flash

void flash_attention_bwd(Context& ctx, DType dt, void* dq, void* dk, void* dv, const void* dout,
                         const void* q, const void* k, const void* v, const void* out, const float* lse,
                         float* delta, const AttentionShape& s, const AttentionStrides& st,
                         FlashKernels kernels, const int32_t* seg) {
  const char* what = "flash_attention_bwd";
  flash::FlashParams p{};
  flash::fill_shape(p, dt, s, st.q, st.k, st.v, st.o, what);
  const void* ptrs[] = {dq, dk, dv, dout, q, k, v, out};
  const char* names[] = {"dq", "dk", "dv", "dout", "q", "k", "v", "out"};
  for (int i = 0; i < 8; ++i) flash::check_aligned(ptrs[i], what, names[i]);
  if (s.B == 0 || s.T == 0) return;
  p.q = q;
  p.k = k;
  p.v = v;
  p.o = const_cast<void*>(out);  // read only in the backward
  p.dout = dout;
  p.dq = dq;
  p.dk = dk;
  p.dv = dv;
  p.lse = const_cast<float*>(lse);
  p.delta = delta;
  DeviceBuffer<int32_t> starts;  // (B, T), recomputed from seg; freed in stream order
  if (seg != nullptr) {
    starts = DeviceBuffer<int32_t>(ctx.allocator(), static_cast<size_t>(s.B) * s.T);
    segment_starts(ctx, starts.data(), seg, s.B, s.T);
    p.seg_start = starts.data();
  }
  flash::launch_delta(ctx, dt, p);
  if (flash::use_wgmma(ctx, kernels, s.HS, what)) flash::bwd_wgmma(ctx, dt, p, kernels == FlashKernels::kWgmmaSplit);
  else if (dt == DType::kBF16) flash::bwd_dispatch<flash::bf16>(ctx, p);
  else flash::bwd_dispatch<flash::f16>(ctx, p);
}

}  // namespace forge::cuda
