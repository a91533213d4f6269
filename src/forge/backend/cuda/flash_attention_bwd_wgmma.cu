// Flash attention backward on Hopper's warpgroup MMA (wgmma, sm_90a). Head size 64 (causal, or
// full attention without a window or segments): one kernel for dK, dV and dQ ("dK, dV (and dQ)"
// below). Otherwise flash_attention_bwd.cu's two atomic-free kernels (the mathematics, masking
// and determinism are described there), with every tile product a warpgroup-wide wgmma over 64
// rows (wgmma.cuh):
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
// launch, 0 spill bytes in both kernels (ptxas -v on the PTX). The one-kernel backward (kDq,
// HS 64, with and without kSeg): 44–48 bytes spilled (48–52 loaded back), part of it the
// writer thread's at 24 registers.
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
#include <climits>

#include "forge/backend/cuda/allocator.h"
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
      if (masked) {  // row r's visible keys as bounds on the column offset nt * 8 + (e & 1)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int qi = wq_lo + g + 8 * r;
          IndexRange kv = vis.keys_of(qi);
          if constexpr (kSeg) kv.lo = max(kv.lo, seg_lo<kSeg>(p, b, qi));
          const int lo = kv.lo - (k0 + c), hi = kv.hi - (k0 + c);
#pragma unroll
          for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int e = 0; e < 2; ++e)
              if (nt * 8 + e < lo || nt * 8 + e >= hi) s[nt][2 * r + e] = 0.0f;
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

// ---- dK, dV (and dQ) ---------------------------------------------------------------------
// kDq: the same kernel also computes dQ, so S and dP are computed once (5 tile products against
// the two kernels' 7). Each iteration's dSᵀ goes to shared memory; warpgroup w then computes
// the partial dQ of the query tile's rows 64w .. 64w + 63 over the block's BK keys, dS·K (A = dS
// read MN-major from the dSᵀ tile, B = K MN-major), and hands it to a writer thread of the
// producer warpgroup through shared memory.
// Determinism: the key tiles that add to a query tile's dQ add in a fixed order (DqOrder), so the
// sums are the same bits on every run. The first stores its partial into an f32 buffer (bulk
// copy), each later one waits on the tile's counter until its predecessor has published
// (counter = predecessor's kt + 1) and adds (bulk add at L2); the last reads the sum, adds its
// own in registers and writes dq in T. The order is chosen so that a block's predecessor reached
// the same query tile a whole query tile of iterations earlier (the waits are rarely waited):
//   causal: blocks walk their query tiles upwards from the diagonal; a tile's adders are the key
//     tiles from its diagonal down (kt + 1 before kt);
//   not causal (no window, no segments): block kt walks query tiles kt, kt + 1, ... cyclically;
//     tile qt's adders are kt = qt, qt − 1, ... cyclically.
// Blocks take their tile from a ticket in launch order, kt from the last down, so a causal block
// only ever waits for a block that started before it: no deadlock whatever order the hardware
// starts blocks in. The cyclic order's block n − 1 waits for block 0, which starts last of its
// kv head: safe while the key tiles of one kv head fit on the GPU at once (bwd_wgmma checks;
// otherwise the two kernels run).

template <int D, int kWG, int BQ, int kStages, bool kDq>
struct WgDkvConfig {
  static constexpr int kConsumers = kWG * 128;
  static constexpr int kThreads = kConsumers + 128;
  static constexpr int BK = kWG * 64;
  // Q, dO, then lse·log2(e) and D of the tile's BQ rows; stages start 1024-byte aligned (SW128).
  static constexpr int kStageBytes = (2 * BQ * D * 2 + 2 * BQ * 4 + 1023) / 1024 * 1024;
  // kDq: two dSᵀ tiles (BK rows × BQ columns, SW128), used by alternate iterations, then two
  // f32 dQ partials (64 × D) per consumer warpgroup for the writer warp.
  static constexpr int kDsBytes = kDq ? BK * BQ * 2 : 0;
  static constexpr int kDqBytes = kDq ? 64 * D * 4 : 0;
  static constexpr int kDs = 2 * BK * D * 2 + kStages * kStageBytes;
  static constexpr int kDqBuf = kDs + 2 * kDsBytes;
  static constexpr int kBars = kDqBuf + 2 * kWG * kDqBytes;  // after K, V, the stages, dSᵀ, dQ
  // Barriers: K/V, full and empty per stage, then (kDq) dq_full and dq_empty per warpgroup and
  // buffer, then the ticket.
  static constexpr int kBarBytes = 8 * (1 + 2 * kStages) + (kDq ? 8 * 4 * kWG : 0);
  static constexpr int kSmem = kBars + kBarBytes + 8;
  // Producer threads that load a stage (each arrives on its "full" barrier); with kDq the last
  // warp is the dQ writer.
  static constexpr int kLoaders = kDq ? 96 : 128;
  static_assert(BQ <= 128, "one producer thread per row statistic");
  static_assert(!kDq || BQ == kWG * 64, "each consumer warpgroup owns 64 of the tile's dQ rows");
};

// The dQ counters: acquire-poll until the predecessor has published; publish after this
// warpgroup's adds (they reach the thread that publishes through the barrier before it).
__device__ __forceinline__ void dq_wait(const uint32_t* sem, uint32_t value) {
  uint32_t v;
  do {
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(sem) : "memory");
  } while (v != value);
}
__device__ __forceinline__ void dq_publish(uint32_t* sem, uint32_t value) {
  asm volatile("fence.acq_rel.gpu;\nst.relaxed.gpu.global.u32 [%0], %1;\n" ::"l"(sem), "r"(value) : "memory");
}
// The writer's copies of partials from shared memory to global: a bulk store (first) or a bulk
// add (f32, performed at L2); then waits until the sources are read (buffers reusable) and until
// the writes are done and visible to the generic proxy (before the counters are published).
__device__ __forceinline__ void bulk_issue(float* dst, uint32_t src, int bytes, bool store) {
  asm volatile("fence.proxy.async.global;\n" ::: "memory");  // after the predecessor's acquire
  if (store)
    asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n" ::"l"(dst), "r"(src), "r"(bytes)
                 : "memory");
  else
    asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(dst), "r"(src),
                 "r"(bytes)
                 : "memory");
}
__device__ __forceinline__ void bulk_wait_read() {
  asm volatile("cp.async.bulk.commit_group;\ncp.async.bulk.wait_group.read 0;\n" ::: "memory");
}
__device__ __forceinline__ void bulk_wait_done() {
  asm volatile("cp.async.bulk.wait_group 0;\nfence.proxy.async.global;\n" ::: "memory");
}

// The order in which the key tiles add to a query tile's dQ (see the section's comment), for
// block kt: whether it is the first or the last adder of query tile qt, and the counter value
// its predecessor publishes.
struct DqOrder {
  bool cyclic;
  int kt, n;             // this block's key tile, key tiles
  int succ_qt_begin;     // causal: kt + 1's first query tile (INT_MAX when kt is the last tile)
  int pred_qt_end;       // causal: kt − 1's query tiles end (0 when kt = 0)
  __device__ __forceinline__ bool first(int qt) const { return cyclic ? qt == kt : qt < succ_qt_begin; }
  __device__ __forceinline__ bool last(int qt) const { return cyclic ? qt == (kt + n - 1) % n : qt >= pred_qt_end; }
  __device__ __forceinline__ uint32_t pred_value() const { return static_cast<uint32_t>((kt + 1) % n + 1); }
};
// Tiles are BQ = BK rows, so key tile j's first query tile (causal) is j.
template <typename QEnd>
__device__ __forceinline__ DqOrder dq_order(const FlashParams& p, int kt, int n, int BQ, const QEnd& q_end_of) {
  return DqOrder{!p.causal, kt, n, kt + 1 < n ? kt + 1 : INT_MAX, kt > 0 ? (q_end_of(kt - 1) + BQ - 1) / BQ : 0};
}

__device__ __forceinline__ void st_shared_u32(uint32_t addr, uint32_t v) {
  asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
}

template <typename T, int D, int kWG, int BQ, int kStages, bool kSeg, bool kDq>
__global__ void __launch_bounds__(kWG * 128 + 128, 1)
    flash_bwd_dkv_wgmma_kernel(const __grid_constant__ FlashParams p, const __grid_constant__ FlashMaps maps) {
  using Cfg = WgDkvConfig<D, kWG, BQ, kStages, kDq>;
  constexpr int BK = Cfg::BK, NT = BQ / 8, DT = D / 8;
  constexpr bool kFtz = D <= 64;
  extern __shared__ __align__(1024) uint8_t smem[];
  const uint32_t sK = smem_addr(smem);
  const uint32_t sV = sK + BK * D * 2;
  const uint32_t sStage = sV + BK * D * 2;
  const uint32_t bar_kv = sK + Cfg::kBars, bar_full = bar_kv + 8, bar_empty = bar_full + 8 * kStages;
  float* stage_f = reinterpret_cast<float*>(smem + 2 * BK * D * 2);

  const int T_ = p.T_;
  int kt = blockIdx.x, kvh = blockIdx.y, b = blockIdx.z;
  if constexpr (kDq) {
    uint32_t* ticket = reinterpret_cast<uint32_t*>(smem + Cfg::kBars + Cfg::kBarBytes);
    if (threadIdx.x == 0) *ticket = atomicAdd(p.dq_sem, 1u);
    __syncthreads();
    const int t = static_cast<int>(*ticket);
    kt = gridDim.x - 1 - t % gridDim.x;
    kvh = t / gridDim.x % gridDim.y;
    b = t / (gridDim.x * gridDim.y);
  }
  const int group = p.NH / p.NKV;
  const int k0 = kt * BK;
  const int64_t bT = static_cast<int64_t>(b) * T_;

  // The query rows key tile j's keys are visible from: [q_begin(j), q_end(j)).
  auto q_end_of = [&](int j) {
    int e = p.window > 0 ? min(T_, j * BK + BK - 1 + p.window) : T_;
    // Segments: rows from the end of the tile's last key's segment on see none of its keys.
    if constexpr (kSeg) e = min(e, seg_rows_end(p, b, min(j * BK + BK - 1, T_ - 1)));
    return e;
  };
  const int q_begin = p.causal ? k0 : 0;
  const int q_end = q_end_of(kt);  // computed before the producer/consumer split: both run the same iterations
  const int qt_begin = q_begin / BQ, qt_end = (q_end + BQ - 1) / BQ;
  const int n_qt = max(0, qt_end - qt_begin);
  const int n_it = n_qt * group;
  const int n_qtiles = (T_ + BQ - 1) / BQ;
  // Iteration it covers query tile tile_qt(it) of query head kvh·group + it % group (with kDq;
  // without, head kvh·group + it / n_qt and tile qt_begin + it % n_qt).
  auto tile_qt = [&](int it) {
    if constexpr (kDq) return p.causal ? qt_begin + it / group : (kt + it / group) % n_qtiles;
    else return qt_begin + it % n_qt;
  };
  auto tile_h = [&](int it) { return kvh * group + (kDq ? it % group : it / n_qt); };
  DqOrder order{};
  if constexpr (kDq) order = dq_order(p, kt, static_cast<int>(gridDim.x), BQ, q_end_of);

  // kDq: dq_full[wg][buf] (the warpgroup's 128 threads arrive), dq_empty[wg][buf] (the writer).
  const uint32_t bar_dq_full = bar_empty + 8 * kStages, bar_dq_empty = bar_dq_full + 8 * 2 * kWG;
  if (kDq && threadIdx.x == 0) {
    for (int i = 0; i < 2 * kWG; ++i) {
      mbar_init(bar_dq_full + 8 * i, 128);
      mbar_init(bar_dq_empty + 8 * i, 1);
    }
  }
  init_stage_barriers<kStages>(bar_kv, Cfg::kLoaders, Cfg::kConsumers);  // full: every loader

  const int wg = threadIdx.x / 128;
  if (wg == kWG) {  // producer: Q, dO by TMA, lse and D rows by the warpgroup's threads
    setmaxnreg_dec<kProducerRegs>();
    const int pt = threadIdx.x - Cfg::kConsumers;
    if constexpr (kDq) {
      if (pt >= Cfg::kLoaders) {  // the dQ writer: one thread
        if (pt == Cfg::kLoaders) {
          // Per iteration: both warpgroups' partials issued, their buffers released once read,
          // the counters published once the adds are done.
          for (int it = 0; it < n_it; ++it) {
            const int qt = tile_qt(it);
            const int64_t tile0 = ((static_cast<int64_t>(b) * p.NH + tile_h(it)) * n_qtiles + qt) * kWG;
            const bool first = order.first(qt), last = order.last(qt);
            for (int w = 0; w < kWG; ++w) {
              const int slot = w * 2 + (it & 1);
              mbar_wait(bar_dq_full + 8 * slot, (it >> 1) & 1);
              if (last) continue;
              if (!first) dq_wait(p.dq_sem + 1 + tile0 + w, order.pred_value());
              bulk_issue(p.dq_acc + (tile0 + w) * (64 * D), sK + Cfg::kDqBuf + slot * Cfg::kDqBytes, Cfg::kDqBytes,
                         first);
            }
            bulk_wait_read();
            for (int w = 0; w < kWG; ++w) mbar_arrive(bar_dq_empty + 8 * (w * 2 + (it & 1)));
            if (!last) {
              bulk_wait_done();
              for (int w = 0; w < kWG; ++w) dq_publish(p.dq_sem + 1 + tile0 + w, static_cast<uint32_t>(kt + 1));
            }
          }
        }
        return;
      }
    }
    if (pt == 0) {
      mbar_expect_tx(bar_kv, 2 * BK * D * 2);
      tma_tile<BK, D>(sK, &maps.k, kvh * D, k0, b, bar_kv);
      tma_tile<BK, D>(sV, &maps.v, kvh * D, k0, b, bar_kv);
    }
    for (int it = 0; it < n_it; ++it) {
      const int s = it % kStages, h = tile_h(it), q0 = tile_qt(it) * BQ;
      if (it >= kStages) mbar_wait(bar_empty + 8 * s, (it / kStages - 1) & 1);
      const uint32_t st = sStage + s * Cfg::kStageBytes;
      for (int r = pt; r < BQ; r += Cfg::kLoaders) {
        const int64_t at = (static_cast<int64_t>(b) * p.NH + h) * T_ + q0 + r;
        const bool in = q0 + r < T_;
        float* stats = stage_f + s * (Cfg::kStageBytes / 4) + 2 * BQ * D * 2 / 4;
        stats[r] = in ? p.lse[at] * kLog2e : 0.0f;
        stats[BQ + r] = in ? p.delta[at] : 0.0f;
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

    const int qt = tile_qt(it), h = tile_h(it);
    const int q0 = qt * BQ, q_hi = q0 + BQ - 1;
    const bool skip = (p.causal && g_lo > q_hi) || (p.window > 0 && g_hi <= q0 - p.window) ||
                      (kSeg && seg_lo<kSeg>(p, b, q0) > g_hi);  // warpgroup-uniform
    const uint32_t sdS = sK + Cfg::kDs + (it & 1) * Cfg::kDsBytes;
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
      if (masked) {  // key row r's queries as bounds on the column offset nt * 8 + (e & 1)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int kj = wk_lo + g + 8 * r;
          const IndexRange qv = vis.queries_of(kj);
          const int lo = qv.lo - (q0 + c), hi = qv.hi - (q0 + c);
#pragma unroll
          for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int e = 0; e < 2; ++e)
              if (nt * 8 + e < lo || nt * 8 + e >= hi ||
                  (kSeg && kj < seg_lo<kSeg>(p, b, q0 + nt * 8 + c + e)))
                s[nt][2 * r + e] = 0.0f;
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
      if constexpr (kDq) {
        // This warp's 16 rows of dSᵀ (keys) into the tile: a 4-byte store per fragment register,
        // rows g and g + 8, columns 16kk + c and 16kk + 8 + c (conflict-free under the swizzle).
        const int r0 = wg * 64 + warp * 16 + g;
#pragma unroll
        for (int kk = 0; kk < BQ / 16; ++kk) {
          st_shared_u32(sdS + sw128<BK>(r0, kk * 16) + c * 2, da[kk][0]);
          st_shared_u32(sdS + sw128<BK>(r0 + 8, kk * 16) + c * 2, da[kk][1]);
          st_shared_u32(sdS + sw128<BK>(r0, kk * 16 + 8) + c * 2, da[kk][2]);
          st_shared_u32(sdS + sw128<BK>(r0 + 8, kk * 16 + 8) + c * 2, da[kk][3]);
        }
      }
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < BQ / 16; ++kk) wgmma_rs<T, 1>(dv, pa[kk], desc_mn<BQ>(sdO, kk), 1);
#pragma unroll
      for (int kk = 0; kk < BQ / 16; ++kk) wgmma_rs<T, 1>(dk, da[kk], desc_mn<BQ>(sQ, kk), 1);
      wgmma_commit();
      if constexpr (!kDq) {
        wgmma_wait<0>();
        fence_acc(dv);
        fence_acc(dk);
      }
    } else if constexpr (kDq) {
      const int r0 = wg * 64 + warp * 16 + g;  // a skipped warpgroup's keys add nothing to dQ
#pragma unroll
      for (int kk = 0; kk < BQ / 16; ++kk)
#pragma unroll
        for (int e = 0; e < 4; ++e) st_shared_u32(sdS + sw128<BK>(r0 + 8 * (e & 1), kk * 16 + 8 * (e >> 1)) + c * 2, 0u);
    }
    if constexpr (kDq) {
      fence_proxy_async();
      named_bar_sync(1, Cfg::kConsumers);  // both warpgroups' dSᵀ rows are in the tile
      float dq[DT][4];
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < BK / 16; ++kk)
        wgmma_ss<T, 1, 1>(dq, desc_mn<BK>(sdS + wg * (BK * 128), kk), desc_mn<BK>(sK, kk), kk > 0 ? 1 : 0);
      wgmma_commit();
      wgmma_wait<0>();
      fence_acc(dv);
      fence_acc(dk);
      fence_acc(dq);
      mbar_arrive(bar_empty + 8 * s_);

      // dQ rows q0 + 64·wg + warp·16 + g (+ 8). Not the last key tile for them: the partial goes
      // to the writer through shared memory ([nt][thread] float4s). The last: wait for the sum of
      // the others, add, write dq.
      const int tid = threadIdx.x % 128, slot = wg * 2 + (it & 1);
      const bool first = order.first(qt), last = order.last(qt);
      if (last) {
        if (!first) {
          const int64_t tile = ((static_cast<int64_t>(b) * p.NH + h) * n_qtiles + qt) * kWG + wg;
          if (tid == 0) dq_wait(p.dq_sem + 1 + tile, order.pred_value());
          named_bar_sync(2 + wg, 128);
          const float4* acc = reinterpret_cast<const float4*>(p.dq_acc) + tile * (64 * D / 4);
#pragma unroll
          for (int nt = 0; nt < DT; ++nt) {
            const float4 a = __ldcg(acc + nt * 128 + tid);
            dq[nt][0] += a.x;
            dq[nt][1] += a.y;
            dq[nt][2] += a.z;
            dq[nt][3] += a.w;
          }
        }
        store_rows<T>(static_cast<T*>(p.dq) + bT * p.ld_q + h * D, p.ld_q, dq, p.scale, q0 + wg * 64 + warp * 16 + g,
                      T_, c);
      } else {
        if (it >= 2) mbar_wait(bar_dq_empty + 8 * slot, ((it >> 1) - 1) & 1);
        float4* buf = reinterpret_cast<float4*>(smem + Cfg::kDqBuf + slot * Cfg::kDqBytes);
#pragma unroll
        for (int nt = 0; nt < DT; ++nt) buf[nt * 128 + tid] = make_float4(dq[nt][0], dq[nt][1], dq[nt][2], dq[nt][3]);
        fence_proxy_async();  // before the writer's bulk copy reads them
      }
      mbar_arrive(bar_dq_full + 8 * slot);
    } else {
      mbar_arrive(bar_empty + 8 * s_);
    }
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

template <typename T, int D, int kWG, int BQ, int kStages, bool kSeg, bool kDq>
void launch_dkv(Context& ctx, const FlashParams& p, const FlashMaps& maps) {
  using Cfg = WgDkvConfig<D, kWG, BQ, kStages, kDq>;
  const dim3 grid((p.T_ + Cfg::BK - 1) / Cfg::BK, p.NKV, p.B);
  launch_with_smem<flash_bwd_dkv_wgmma_kernel<T, D, kWG, BQ, kStages, kSeg, kDq>>(ctx, grid, Cfg::kThreads,
                                                                                 Cfg::kSmem, p, maps);
}

// dK, dV and dQ in one kernel (head size 64): the f32 dQ partials, (B, NH, query tiles, kWG)
// blocks of 64 × D, and the ticket + one counter per such block, zeroed in stream order; both
// freed in stream order after the kernel.
template <typename T, int D, int kWG, int kStages, bool kSeg>
void launch_fused(Context& ctx, FlashParams p, const FlashMaps& maps) {
  constexpr int BQ = kWG * 64;
  const size_t blocks = static_cast<size_t>(p.B) * p.NH * ((p.T_ + BQ - 1) / BQ) * kWG;
  DeviceBuffer<float> acc(ctx.allocator(), blocks * 64 * D);
  DeviceBuffer<uint32_t> sem(ctx.allocator(), 1 + blocks);
  FORGE_CUDA_CHECK(cudaMemsetAsync(sem.data(), 0, sem.size() * sizeof(uint32_t), ctx.stream()));
  p.dq_acc = acc.data();
  p.dq_sem = sem.data();
  launch_dkv<T, D, kWG, BQ, kStages, kSeg, true>(ctx, p, maps);
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
void launch_bwd(Context& ctx, DType dt, const FlashParams& p, bool split) {
  const int64_t wq = static_cast<int64_t>(p.NH) * D, wkv = static_cast<int64_t>(p.NKV) * D;
  FlashMaps dq{}, dkv{};
  dkv.q = make_tile_map(p.q, dt, wq, p.ld_q, p.T_, p.B, BQ);
  dkv.o = make_tile_map(p.dout, dt, wq, p.ld_o, p.T_, p.B, BQ);
  dkv.k = make_tile_map(p.k, dt, wkv, p.ld_k, p.T_, p.B, kWG * 64);
  dkv.v = make_tile_map(p.v, dt, wkv, p.ld_v, p.T_, p.B, kWG * 64);
  if constexpr (BQ == kWG * 64) {
    // The one kernel where its order of dQ sums applies (see DqOrder): causal, or full
    // attention whose key tiles of one kv head fit on the GPU at once.
    const bool fits = p.causal || (p.window <= 0 && p.seg_start == nullptr && (p.T_ + BQ - 1) / BQ <= ctx.num_sms());
    if (fits && !split) {
      if (p.seg_start != nullptr) launch_fused<T, D, kWG, kStages, true>(ctx, p, dkv);
      else launch_fused<T, D, kWG, kStages, false>(ctx, p, dkv);
      return;
    }
  }
  // The two kernels: the dQ kernel's maps too.
  dq.q = make_tile_map(p.q, dt, wq, p.ld_q, p.T_, p.B, kWG * 64);
  dq.o = make_tile_map(p.dout, dt, wq, p.ld_o, p.T_, p.B, kWG * 64);
  dq.k = make_tile_map(p.k, dt, wkv, p.ld_k, p.T_, p.B, BK);
  dq.v = make_tile_map(p.v, dt, wkv, p.ld_v, p.T_, p.B, BK);
  if (p.seg_start != nullptr) {
    launch_dq<T, D, kWG, BK, kStages, true>(ctx, p, dq);
    launch_dkv<T, D, kWG, BQ, kStages, true, false>(ctx, p, dkv);
  } else {
    launch_dq<T, D, kWG, BK, kStages, false>(ctx, p, dq);
    launch_dkv<T, D, kWG, BQ, kStages, false, false>(ctx, p, dkv);
  }
}

template <typename T>
void dispatch(Context& ctx, DType dt, const FlashParams& p, bool split) {
  if (p.HS == 64) launch_bwd<T, 64, 2, 64, 128, 2>(ctx, dt, p, split);
  else launch_bwd<T, 128, 2, 64, 64, 2>(ctx, dt, p, split);
}

}  // namespace

void bwd_wgmma(Context& ctx, DType dt, const FlashParams& p, bool split) {
  if (dt == DType::kBF16) dispatch<bf16>(ctx, dt, p, split);
  else dispatch<f16>(ctx, dt, p, split);
}

}  // namespace forge::cuda::flash
