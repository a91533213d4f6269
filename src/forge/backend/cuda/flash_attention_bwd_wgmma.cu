// Flash attention backward on Hopper's warpgroup MMA (wgmma, sm_90a): flash_attention_bwd.cu's
// two atomic-free kernels (the mathematics, masking and determinism are described there), with
// every tile product a warpgroup-wide wgmma over 64 rows (wgmma.cuh):
//   dQ kernel    per 64 query rows: S = Q·Kᵀ and dP = dO·Vᵀ issued together (shared memory,
//                K-major), then dQ += dS·K (dS from registers, K read MN-major)
//   dK/dV kernel per 64 key rows:   Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ together, then dV += Pᵀ·dO and
//                dK += dSᵀ·Q together (Pᵀ, dSᵀ from registers, dO and Q read MN-major)
// Warp-specialized like the forward (flash_attention_wgmma.cu): a producer warpgroup copies the
// block's resident tiles once and streams the others through a ring of stages with TMA; the
// consumer warpgroups wait on each stage's "full" mbarrier and release it on its "empty" one.
// In the dK/dV kernel the producer's other threads copy the tile's lse and D rows into the
// stage (the stage's "full" barrier counts all 128 producer threads).
// Segments (kSeg instantiations) bound the tiles as the mma.sync kernels do; skips stay
// warpgroup-uniform (g_lo, g_hi), the per-element test per warp.
//
// ptxas (sm_90a, CUDA 13.0), bf16 = f16: both kernels 168 registers at launch (384 threads),
// consumers raised to 240 and the producer lowered to 24 by setmaxnreg. dQ: 0 spill bytes, 0
// stack. dK/dV: HS 64 12 bytes spilled (32 loaded back, 16-byte frame), HS 128 8 (28, 8) —
// since the mask moved to its own loop and the statistics became 8-byte loads; the kernel got
// 30–55% faster with them, so they stay. The kSeg instantiations (segments): 168 registers at
// launch, 0 spill bytes in both kernels (ptxas -v on the PTX).
//
// Measured (forge bench attention, bf16, H200), backward TFLOP/s causal / full, against
// PyTorch's FlashAttention-2 (ANCHORS.md): 4·16·4096·128 346 / 365 (257 / 289), 8·12·2048·64
// 242 / 323 (186 / 244), 2·32·8192·128 366 / 374 (287 / 302); mma.sync kernels 131–176.
// What mattered: (1) the producer warpgroup — the first version (every thread loading with
// cp.async, a __syncthreads per tile) reached 132–225; (2) keeping the per-element mask test
// out of the P loop (a separate loop run only on edge tiles): with `if (masked && !vis(..))`
// inside it the compiler evaluated the visibility test on every element of every tile — head
// size 64 went from 166 / 208 to 242 / 323, head size 128 from 275–323 to 346–374.
// Measured no better (±3%) before (2): dQ BK 128, dK/dV BQ 64 at head size 64, three dQ
// warpgroups, three stages, a software-pipelined dQ loop (next tile's S and dP issued before
// this tile's dS; 3–7% slower at head size 128).
#include <cfloat>

#include "forge/backend/cuda/check.h"
#include "forge/backend/cuda/context.h"
#include "forge/backend/cuda/tensor_map.h"
#include "forge/backend/cuda/wgmma.cuh"

namespace forge::cuda::flash {
namespace {

constexpr float kLog2e = 1.4426950408889634f;

// ---- dQ ------------------------------------------------------------------------------------

template <int D, int kWG, int BK, int kStages>
struct WgDqConfig {
  static constexpr int kConsumers = kWG * 128;
  static constexpr int kThreads = kConsumers + 128;
  static constexpr int BQ = kWG * 64;
  static constexpr int kStageBytes = 2 * BK * D * 2;  // K then V
  static constexpr int kBars = 2 * BQ * D * 2 + kStages * kStageBytes;  // after Q, dO, the stages
  static constexpr int kSmem = kBars + 8 * (1 + 2 * kStages);
};

template <typename T, int D, int kWG, int BK, int kStages, bool kSeg>
__global__ void __launch_bounds__(kWG * 128 + 128, 1)
    flash_bwd_dq_wgmma_kernel(const __grid_constant__ FlashParams p, const __grid_constant__ FlashMaps maps) {
  using Cfg = WgDqConfig<D, kWG, BK, kStages>;
  constexpr int BQ = Cfg::BQ, NT = BK / 8, DT = D / 8;
  constexpr bool kFtz = D <= 64;
  extern __shared__ __align__(1024) uint8_t smem[];
  const uint32_t sQ = smem_addr(smem);
  const uint32_t sdO = sQ + BQ * D * 2;
  const uint32_t sKV = sdO + BQ * D * 2;
  const uint32_t bar_q = sQ + Cfg::kBars, bar_full = bar_q + 8, bar_empty = bar_full + 8 * kStages;

  const int T_ = p.T_;
  const int n_qt = (T_ + BQ - 1) / BQ;
  const int qt = p.causal ? n_qt - 1 - static_cast<int>(blockIdx.x) : static_cast<int>(blockIdx.x);
  const int h = blockIdx.y, b = blockIdx.z, kvh = h / (p.NH / p.NKV);
  const int q0 = qt * BQ;
  const int64_t bT = static_cast<int64_t>(b) * T_;
  const TileRange kr = key_tiles<BQ, BK>(p, q0);
  // Segments: key tiles below the first row's bound are not visited (producer and consumers).
  const int kt_begin = kSeg ? max(kr.begin, seg_lo<kSeg>(p, b, q0) / BK) : kr.begin;
  const int n_kt = max(0, kr.end - kt_begin);

  init_stage_barriers<kStages>(bar_q, 1, Cfg::kConsumers);

  const int wg = threadIdx.x / 128;
  if (wg == kWG) {  // producer
    setmaxnreg_dec<kProducerRegs>();
    if (threadIdx.x == Cfg::kConsumers) {
      mbar_expect_tx(bar_q, 2 * BQ * D * 2);
      tma_tile<BQ, D>(sQ, &maps.q, h * D, q0, b, bar_q);
      tma_tile<BQ, D>(sdO, &maps.o, h * D, q0, b, bar_q);
      produce_kv<BK, D, kStages>(sKV, bar_full, bar_empty, maps, kvh, b, kt_begin, n_kt);
    }
    return;
  }
  setmaxnreg_inc<consumer_regs<kWG>()>();

  const int warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
  const int g = lane / 4, c = 2 * (lane % 4);
  const int g_lo = q0 + wg * 64, g_hi = g_lo + 63;
  const int wq_lo = g_lo + warp * 16, wq_hi = wq_lo + 15;
  const Visibility vis{T_, p.causal, p.window};
  const float sl2 = p.scale_log2;

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

  mbar_wait(bar_q, 0);
  for (int i = 0; i < n_kt; ++i) {
    const int kt = kt_begin + i, st = i % kStages;
    const uint32_t sK = sKV + st * Cfg::kStageBytes;
    const uint32_t sV = sK + BK * D * 2;
    mbar_wait(bar_full + 8 * st, (i / kStages) & 1);

    const int k0 = kt * BK;
    const bool skip = (p.causal && k0 > g_hi) || (p.window > 0 && k0 + BK - 1 <= g_lo - p.window) ||
                      (kSeg && k0 + BK - 1 < seg_lo<kSeg>(p, b, g_lo));  // warpgroup-uniform
    if (!skip) {
      float s[NT][4], dp[NT][4];
      wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < D / 16; ++ks)
        wgmma_ss<T, 0>(s, desc_k<BQ>(sQ, wg * 64, ks), desc_k<BK>(sK, 0, ks), ks);
#pragma unroll
      for (int ks = 0; ks < D / 16; ++ks)
        wgmma_ss<T, 0>(dp, desc_k<BQ>(sdO, wg * 64, ks), desc_k<BK>(sV, 0, ks), ks);
      wgmma_commit();
      wgmma_wait<0>();
      fence_acc(s);
      fence_acc(dp);
      const bool masked = k0 + BK > T_ || wq_hi >= T_ || (p.causal && k0 + BK - 1 > wq_lo) ||
                          (p.window > 0 && k0 <= wq_hi - p.window) || (kSeg && k0 < seg_lo<kSeg>(p, b, wq_hi));
      uint32_t da[BK / 16][4];
      // P, the mask in its own loop (only edge tiles pay the per-element test), dS = P ∘ (dP − D).
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[nt][e] = fast_exp2<kFtz>(fmaf(s[nt][e], sl2, -lse2[e >> 1]));
      if (masked) {
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int qi = wq_lo + g + 8 * (e >> 1), kj = k0 + nt * 8 + c + (e & 1);  // query, key
            if (!vis(qi, kj) || (kSeg && kj < seg_lo<kSeg>(p, b, qi))) s[nt][e] = 0.0f;
          }
      }
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[nt][e] *= dp[nt][e] - dlt[e >> 1];
#pragma unroll
      for (int kk = 0; kk < BK / 16; ++kk) acc_to_a<T, NT>(da[kk], s, kk);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < BK / 16; ++kk) wgmma_rs<T, 1>(dq, da[kk], desc_mn<BK>(sK, kk), 1);
      wgmma_commit();
      wgmma_wait<0>();
      fence_acc(dq);
    }
    mbar_arrive(bar_empty + 8 * st);
  }

  store_rows<T>(static_cast<T*>(p.dq) + bT * p.ld_q + h * D, p.ld_q, dq, p.scale, wq_lo + g, T_, c);
}

// ---- dK, dV --------------------------------------------------------------------------------

template <int D, int kWG, int BQ, int kStages>
struct WgDkvConfig {
  static constexpr int kConsumers = kWG * 128;
  static constexpr int kThreads = kConsumers + 128;
  static constexpr int BK = kWG * 64;
  // Q, dO, then lse·log2(e) and D of the tile's BQ rows; stages start 1024-byte aligned (SW128).
  static constexpr int kStageBytes = (2 * BQ * D * 2 + 2 * BQ * 4 + 1023) / 1024 * 1024;
  static constexpr int kBars = 2 * BK * D * 2 + kStages * kStageBytes;  // after K, V, the stages
  static constexpr int kSmem = kBars + 8 * (1 + 2 * kStages);
  static_assert(BQ <= 128, "one producer thread per row statistic");
};

template <typename T, int D, int kWG, int BQ, int kStages, bool kSeg>
__global__ void __launch_bounds__(kWG * 128 + 128, 1)
    flash_bwd_dkv_wgmma_kernel(const __grid_constant__ FlashParams p, const __grid_constant__ FlashMaps maps) {
  using Cfg = WgDkvConfig<D, kWG, BQ, kStages>;
  constexpr int BK = Cfg::BK, NT = BQ / 8, DT = D / 8;
  constexpr bool kFtz = D <= 64;
  extern __shared__ __align__(1024) uint8_t smem[];
  const uint32_t sK = smem_addr(smem);
  const uint32_t sV = sK + BK * D * 2;
  const uint32_t sStage = sV + BK * D * 2;
  const uint32_t bar_kv = sK + Cfg::kBars, bar_full = bar_kv + 8, bar_empty = bar_full + 8 * kStages;
  float* stage_f = reinterpret_cast<float*>(smem + 2 * BK * D * 2);

  const int T_ = p.T_;
  const int kt = blockIdx.x, kvh = blockIdx.y, b = blockIdx.z;
  const int group = p.NH / p.NKV;
  const int k0 = kt * BK;
  const int64_t bT = static_cast<int64_t>(b) * T_;

  const int q_begin = p.causal ? k0 : 0;
  int q_end = p.window > 0 ? min(T_, k0 + BK - 1 + p.window) : T_;
  // Segments: rows from the end of the tile's last key's segment on see none of its keys (k0 < T);
  // computed before the producer/consumer split, so both run the same iterations.
  if constexpr (kSeg) q_end = min(q_end, seg_rows_end(p, b, min(k0 + BK - 1, T_ - 1)));
  const int qt_begin = q_begin / BQ, qt_end = (q_end + BQ - 1) / BQ;
  const int n_qt = max(0, qt_end - qt_begin);
  const int n_it = n_qt * group;

  init_stage_barriers<kStages>(bar_kv, 128, Cfg::kConsumers);  // full: every producer thread

  const int wg = threadIdx.x / 128;
  if (wg == kWG) {  // producer: Q, dO by TMA, lse and D rows by the warpgroup's threads
    setmaxnreg_dec<kProducerRegs>();
    const int pt = threadIdx.x - Cfg::kConsumers;
    if (pt == 0) {
      mbar_expect_tx(bar_kv, 2 * BK * D * 2);
      tma_tile<BK, D>(sK, &maps.k, kvh * D, k0, b, bar_kv);
      tma_tile<BK, D>(sV, &maps.v, kvh * D, k0, b, bar_kv);
    }
    // Iteration it covers query head kvh·group + it / n_qt, query tile qt_begin + it % n_qt.
    for (int it = 0; it < n_it; ++it) {
      const int s = it % kStages, h = kvh * group + it / n_qt, q0 = (qt_begin + it % n_qt) * BQ;
      if (it >= kStages) mbar_wait(bar_empty + 8 * s, (it / kStages - 1) & 1);
      const uint32_t st = sStage + s * Cfg::kStageBytes;
      if (pt < BQ) {
        const int64_t at = (static_cast<int64_t>(b) * p.NH + h) * T_ + q0 + pt;
        const bool in = q0 + pt < T_;
        float* stats = stage_f + s * (Cfg::kStageBytes / 4) + 2 * BQ * D * 2 / 4;
        stats[pt] = in ? p.lse[at] * kLog2e : 0.0f;
        stats[BQ + pt] = in ? p.delta[at] : 0.0f;
      }
      if (pt == 0) {
        mbar_expect_tx(bar_full + 8 * s, 2 * BQ * D * 2);
        tma_tile<BQ, D>(st, &maps.q, h * D, q0, b, bar_full + 8 * s);
        tma_tile<BQ, D>(st + BQ * D * 2, &maps.o, h * D, q0, b, bar_full + 8 * s);
      } else {
        mbar_arrive(bar_full + 8 * s);
      }
    }
    return;
  }
  setmaxnreg_inc<consumer_regs<kWG>()>();

  const int warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
  const int g = lane / 4, c = 2 * (lane % 4);
  const int g_lo = k0 + wg * 64, g_hi = g_lo + 63;  // the warpgroup's keys
  const int wk_lo = g_lo + warp * 16, wk_hi = wk_lo + 15;
  const Visibility vis{T_, p.causal, p.window};
  const float sl2 = p.scale_log2;

  float dk[DT][4], dv[DT][4];
  zero_acc(dk);
  zero_acc(dv);

  mbar_wait(bar_kv, 0);
  for (int it = 0; it < n_it; ++it) {
    const int s_ = it % kStages;
    const uint32_t sQ = sStage + s_ * Cfg::kStageBytes;
    const uint32_t sdO = sQ + BQ * D * 2;
    const float* s_lse = stage_f + s_ * (Cfg::kStageBytes / 4) + 2 * BQ * D * 2 / 4;
    const float* s_dlt = s_lse + BQ;
    mbar_wait(bar_full + 8 * s_, (it / kStages) & 1);

    const int q0 = (qt_begin + it % n_qt) * BQ, q_hi = q0 + BQ - 1;
    const bool skip = (p.causal && g_lo > q_hi) || (p.window > 0 && g_hi <= q0 - p.window) ||
                      (kSeg && seg_lo<kSeg>(p, b, q0) > g_hi);  // warpgroup-uniform
    if (!skip) {
      float s[NT][4], dp[NT][4];
      wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < D / 16; ++ks)
        wgmma_ss<T, 0>(s, desc_k<BK>(sK, wg * 64, ks), desc_k<BQ>(sQ, 0, ks), ks);
#pragma unroll
      for (int ks = 0; ks < D / 16; ++ks)
        wgmma_ss<T, 0>(dp, desc_k<BK>(sV, wg * 64, ks), desc_k<BQ>(sdO, 0, ks), ks);
      wgmma_commit();
      wgmma_wait<0>();
      fence_acc(s);
      fence_acc(dp);
      const bool masked = wk_hi >= T_ || q0 + BQ > T_ || (p.causal && wk_hi > q0) ||
                          (p.window > 0 && wk_lo <= q_hi - p.window) || (kSeg && seg_lo<kSeg>(p, b, q_hi) > wk_lo);
      // Pᵀ into pa, dSᵀ = Pᵀ ∘ (dPᵀ − D) into da.
      // The statistics of columns nt·8 + c and + 1 are one 8-byte load each (c is even); lse is
      // stored pre-multiplied by log2(e).
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const float2 l2 = *reinterpret_cast<const float2*>(s_lse + nt * 8 + c);
#pragma unroll
        for (int e = 0; e < 4; ++e) s[nt][e] = fast_exp2<kFtz>(fmaf(s[nt][e], sl2, -((e & 1) ? l2.y : l2.x)));
      }
      if (masked) {
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int qi = q0 + nt * 8 + c + (e & 1), kj = wk_lo + g + 8 * (e >> 1);  // query, key
            if (!vis(qi, kj) || (kSeg && kj < seg_lo<kSeg>(p, b, qi))) s[nt][e] = 0.0f;
          }
      }
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const float2 d2 = *reinterpret_cast<const float2*>(s_dlt + nt * 8 + c);
#pragma unroll
        for (int e = 0; e < 4; ++e) dp[nt][e] = s[nt][e] * (dp[nt][e] - ((e & 1) ? d2.y : d2.x));
      }
      uint32_t pa[BQ / 16][4], da[BQ / 16][4];
#pragma unroll
      for (int kk = 0; kk < BQ / 16; ++kk) {
        acc_to_a<T, NT>(pa[kk], s, kk);
        acc_to_a<T, NT>(da[kk], dp, kk);
      }
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < BQ / 16; ++kk) wgmma_rs<T, 1>(dv, pa[kk], desc_mn<BQ>(sdO, kk), 1);
#pragma unroll
      for (int kk = 0; kk < BQ / 16; ++kk) wgmma_rs<T, 1>(dk, da[kk], desc_mn<BQ>(sQ, kk), 1);
      wgmma_commit();
      wgmma_wait<0>();
      fence_acc(dv);
      fence_acc(dk);
    }
    mbar_arrive(bar_empty + 8 * s_);
  }

  store_kv_rows<T>(static_cast<T*>(p.dk) + bT * p.ld_k + kvh * D, p.ld_k, dk, p.scale,
                   static_cast<T*>(p.dv) + bT * p.ld_v + kvh * D, p.ld_v, dv, wk_lo + g, T_, c);
}

template <typename T, int D, int kWG, int BK, int kStages, bool kSeg>
void launch_dq(Context& ctx, const FlashParams& p, const FlashMaps& maps) {
  using Cfg = WgDqConfig<D, kWG, BK, kStages>;
  const dim3 grid((p.T_ + Cfg::BQ - 1) / Cfg::BQ, p.NH, p.B);
  launch_with_smem<flash_bwd_dq_wgmma_kernel<T, D, kWG, BK, kStages, kSeg>>(ctx, grid, Cfg::kThreads, Cfg::kSmem, p,
                                                                           maps);
}

template <typename T, int D, int kWG, int BQ, int kStages, bool kSeg>
void launch_dkv(Context& ctx, const FlashParams& p, const FlashMaps& maps) {
  using Cfg = WgDkvConfig<D, kWG, BQ, kStages>;
  const dim3 grid((p.T_ + Cfg::BK - 1) / Cfg::BK, p.NKV, p.B);
  launch_with_smem<flash_bwd_dkv_wgmma_kernel<T, D, kWG, BQ, kStages, kSeg>>(ctx, grid, Cfg::kThreads, Cfg::kSmem,
                                                                            p, maps);
}

// Tile configurations (forge bench attention, bf16, H200; backward TFLOP/s causal / full). The
// comparison was made before the mask moved out of the P loop (see the header), on the kernels
// that were then 25–45% slower; with the final kernels the chosen ones give 242 / 323 at
// 8·12·2048·64 and 346 / 365 at 4·16·4096·128; the alternatives were not re-measured.
//   HS 64:  dQ 2 consumer warpgroups × BK 64, dK/dV 2 × BQ 128 — then 162 / 205 at 8·12·2048·64,
//           against 160 / 195 with dK/dV BQ 64, 159 / 201 with dQ BK 128, 163 / 213 with 3 dQ
//           warpgroups (but 135 against 140 at 64·12·1024·64), 160 / 196 with 3 stages.
//   HS 128: dQ 2 × BK 64, dK/dV 2 × BQ 64 — then 274 / 302 at 4·16·4096·128.
// The tensor maps' boxes follow the tiles: 64·kWG rows for the resident operand, BK or BQ for
// the streamed ones.
template <typename T, int D, int kWG, int BK, int BQ, int kStages>
void launch_bwd(Context& ctx, DType dt, const FlashParams& p) {
  const int64_t wq = static_cast<int64_t>(p.NH) * D, wkv = static_cast<int64_t>(p.NKV) * D;
  FlashMaps dq{}, dkv{};
  dq.q = make_tile_map(p.q, dt, wq, p.ld_q, p.T_, p.B, kWG * 64);
  dq.o = make_tile_map(p.dout, dt, wq, p.ld_o, p.T_, p.B, kWG * 64);
  dq.k = make_tile_map(p.k, dt, wkv, p.ld_k, p.T_, p.B, BK);
  dq.v = make_tile_map(p.v, dt, wkv, p.ld_v, p.T_, p.B, BK);
  dkv.q = make_tile_map(p.q, dt, wq, p.ld_q, p.T_, p.B, BQ);
  dkv.o = make_tile_map(p.dout, dt, wq, p.ld_o, p.T_, p.B, BQ);
  dkv.k = make_tile_map(p.k, dt, wkv, p.ld_k, p.T_, p.B, kWG * 64);
  dkv.v = make_tile_map(p.v, dt, wkv, p.ld_v, p.T_, p.B, kWG * 64);
  if (p.seg_start != nullptr) {
    launch_dq<T, D, kWG, BK, kStages, true>(ctx, p, dq);
    launch_dkv<T, D, kWG, BQ, kStages, true>(ctx, p, dkv);
  } else {
    launch_dq<T, D, kWG, BK, kStages, false>(ctx, p, dq);
    launch_dkv<T, D, kWG, BQ, kStages, false>(ctx, p, dkv);
  }
}

template <typename T>
void dispatch(Context& ctx, DType dt, const FlashParams& p) {
  if (p.HS == 64) launch_bwd<T, 64, 2, 64, 128, 2>(ctx, dt, p);
  else launch_bwd<T, 128, 2, 64, 64, 2>(ctx, dt, p);
}

}  // namespace

void bwd_wgmma(Context& ctx, DType dt, const FlashParams& p) {
  if (dt == DType::kBF16) dispatch<bf16>(ctx, dt, p);
  else dispatch<f16>(ctx, dt, p);
}

}  // namespace forge::cuda::flash
