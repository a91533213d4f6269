// Flash attention forward on Hopper's warpgroup MMA (wgmma, sm_90a): the mathematics, masking
// and outputs of flash_attention.cu's mma.sync kernel, with the two products of a key tile
// issued per warpgroup of 64 query rows:
//   S = Q·Kᵀ   m64n{BK}k16, Q and K from shared memory (K-major)
//   O += P·V   m64n{D}k16,  P from registers (the S accumulator rounded to bf16/f16), V from
//                           shared memory read transposed (MN-major)
// Warp-specialized and persistent: one block an SM takes query tiles from a counter; its
// producer warpgroup's first thread copies each tile's Q (two buffers) and its K/V tiles into a
// ring of kStages stages that runs across tiles, with the bulk tensor copy engine (TMA, rows
// outside [0, T) zero-filled), and kWG consumer warpgroups wait on a stage's "full" mbarrier and
// release it on its "empty" one. No block-wide barrier in the loop, so the consumer warpgroups
// drift apart and one's softmax overlaps another's products. A warpgroup whose 64 rows see none
// of a key tile skips its arithmetic (wgmma is warpgroup-wide, so the skip is too); per-element
// masks as in the mma.sync kernel, segments (kSeg) too.
//
// ptxas (sm_90a, CUDA 13.0), bf16 = f16: HS 64 (3 consumer warpgroups × 64 rows, BK 128, 512
// threads) 128 registers at launch, 0 spill bytes; HS 128 (2 × 64 rows, BK 128, 384 threads)
// 168, the producer's 36–48 spilled bytes (WgFwdConfig). setmaxnreg then gives the producer 32
// (HS 64) or 24 and each consumer consumer_regs(): 160 and 240.
//
// Measured (forge bench attention, bf16, H200), forward TFLOP/s causal / full, against the
// mma.sync kernel in the same run: 4·16·4096·128 484 / 574 (241 / 279), 8·12·2048·64 276 / 408
// (218 / 285), 2·32·8192·128 560 / 577 (267 / 283). The first wgmma version (all threads loading
// with cp.async, a __syncthreads per key tile, no producer) reached 297 / 349, 199 / 281 and
// 342 / 372: the warpgroups in lock step left the tensor cores idle during every softmax.
#include <algorithm>
#include <cfloat>

#include "forge/backend/cuda/allocator.h"
#include "forge/backend/cuda/check.h"
#include "forge/backend/cuda/context.h"
#include "forge/backend/cuda/tensor_map.h"
#include "forge/backend/cuda/wgmma.cuh"

namespace forge::cuda::flash {
namespace {

template <int D, int kWG, int BK, int kStages>
struct WgFwdConfig {
  static constexpr int kConsumers = kWG * 128;
  static constexpr int kThreads = kConsumers + 128;
  static constexpr int BQ = kWG * 64;
  static constexpr int kQBytes = BQ * D * 2;
  static constexpr int kStageBytes = 2 * BK * D * 2;  // K then V
  static constexpr int kBars = 2 * kQBytes + kStages * kStageBytes;
  // q_full[2], q_empty[2], full[kStages], empty[kStages], then the two slots' tile numbers.
  static constexpr int kSmem = kBars + 8 * (4 + 2 * kStages) + 8;
  // The producer's tile loop spills at 24 registers (ptxas: 8–32 bytes at HS 64, 36–48 at HS 128).
  // Three consumer warpgroups at 160 leave it 32 of the launch allocation; two at 240 leave 24.
  static constexpr int kProducerRegs = kWG == 3 ? 32 : flash::kProducerRegs;
  static_assert(kProducerRegs * 128 + consumer_regs<kWG>() * kConsumers <= launch_regs<kWG>() * kThreads,
                "setmaxnreg would ask for registers the launch does not hold");
};

// Tile t of a call: query tile x of (b, h), x fastest, as the blocks of a plain grid launch
// would run them; causal calls take the longest query tiles (the last) first. Query tile qt
// covers rows [q0, q0 + BQ) with q0 = qt·BQ − shift, shift = n_qt·BQ − T: the last tile ends at
// T and the first one is the partial one, its rows below 0 zero-filled by the copy engine and
// never stored. Causal, the partial tile then sees one key tile instead of all of them: at T =
// 1024 and BQ 192 (GPT-2) a (b, h) takes 27 block-iterations instead of 32, at 2048 96 instead
// of 101.
struct FwdTile {
  int q0, h, b;
};
template <int BQ>
__device__ __forceinline__ FwdTile fwd_tile(const FlashParams& p, int n_qt, int t) {
  const int x = t % n_qt, bh = t / n_qt;
  const int qt = p.causal ? n_qt - 1 - x : x;
  return {qt * BQ - (n_qt * BQ - p.T_), bh % p.NH, bh / p.NH};
}
// The key tiles of the query tile at q0 of batch row b: [kt_begin, kt_begin + count). Segments:
// no row of the tile sees a key below seg_lo(q0); producer and consumers share the range.
template <int BQ, int BK, bool kSeg>
__device__ __forceinline__ int fwd_key_range(const FlashParams& p, int q0, int b, int& kt_begin) {
  const TileRange kr = key_tiles<BQ, BK>(p, q0);
  kt_begin = kSeg ? max(kr.begin, seg_lo<kSeg>(p, b, q0) / BK) : kr.begin;
  return max(0, kr.end - kt_begin);
}

template <typename T, int D, int kWG, int BK, int kStages, bool kSeg>
__global__ void __launch_bounds__(kWG * 128 + 128, 1)
    flash_fwd_wgmma_kernel(const __grid_constant__ FlashParams p, const __grid_constant__ FlashMaps maps) {
  using Cfg = WgFwdConfig<D, kWG, BK, kStages>;
  constexpr int BQ = Cfg::BQ, NT = BK / 8, DT = D / 8;
  constexpr bool kFtz = D <= 64;
  extern __shared__ __align__(1024) uint8_t smem[];
  const uint32_t sQ = smem_addr(smem);  // two Q tiles: slot j % 2 holds the block's j-th tile
  const uint32_t sKV = sQ + 2 * Cfg::kQBytes;
  const uint32_t bar_qfull = sQ + Cfg::kBars, bar_qempty = bar_qfull + 16;
  const uint32_t bar_full = bar_qempty + 16, bar_empty = bar_full + 8 * kStages;
  volatile int* tile_of_slot = reinterpret_cast<volatile int*>(smem + Cfg::kBars + 8 * (4 + 2 * kStages));

  const int T_ = p.T_;
  const int n_qt = (T_ + BQ - 1) / BQ;
  const int n_tiles = n_qt * p.NH * p.B;
  if (threadIdx.x == 0) {
    for (int s = 0; s < 2; ++s) {
      mbar_init(bar_qfull + 8 * s, 1);
      mbar_init(bar_qempty + 8 * s, Cfg::kConsumers);
    }
    for (int s = 0; s < kStages; ++s) {
      mbar_init(bar_full + 8 * s, 1);
      mbar_init(bar_empty + 8 * s, Cfg::kConsumers);
    }
    mbar_init_fence();
  }
  __syncthreads();

  const int wg = threadIdx.x / 128;
  if (wg == kWG) {  // producer
    setmaxnreg_dec<Cfg::kProducerRegs>();
    if (threadIdx.x != Cfg::kConsumers) return;
    // The block's j-th tile comes from the call's counter (so blocks finishing early take more:
    // the balance of a plain launch); its number goes to slot j % 2 with the Q tile, and its K/V
    // tiles continue the stage ring, so the next tile's Q and first K/V load while the consumers
    // finish this one.
    uint32_t it = 0;  // key tiles streamed so far
    for (int j = 0;; ++j) {
      const int slot = j & 1;
      if (j >= 2) mbar_wait(bar_qempty + 8 * slot, ((j >> 1) - 1) & 1);
      const int t = static_cast<int>(atomicAdd(p.tile_ctr, 1u));
      tile_of_slot[slot] = t;
      if (t >= n_tiles) {
        mbar_arrive(bar_qfull + 8 * slot);
        return;
      }
      const FwdTile tile = fwd_tile<BQ>(p, n_qt, t);
      int kt_begin;
      const int n_kt = fwd_key_range<BQ, BK, kSeg>(p, tile.q0, tile.b, kt_begin);
      mbar_expect_tx(bar_qfull + 8 * slot, Cfg::kQBytes);
      tma_tile<BQ, D>(sQ + slot * Cfg::kQBytes, &maps.q, tile.h * D, tile.q0, tile.b, bar_qfull + 8 * slot);
      const int col = tile.h / (p.NH / p.NKV) * D, b = tile.b;  // the kv head's first column
      for (int k0 = kt_begin * BK, k_end = (kt_begin + n_kt) * BK; k0 < k_end; k0 += BK, ++it) {
        const int st = it % kStages;
        if (it >= kStages) mbar_wait(bar_empty + 8 * st, (it / kStages - 1) & 1);
        const uint32_t sK = sKV + st * Cfg::kStageBytes, full = bar_full + 8 * st;
        mbar_expect_tx(full, Cfg::kStageBytes);
        tma_tile<BK, D>(sK, &maps.k, col, k0, b, full);
        tma_tile<BK, D>(sK + BK * D * 2, &maps.v, col, k0, b, full);
      }
    }
  }
  setmaxnreg_inc<consumer_regs<kWG>()>();

  const int warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
  const int g = lane / 4, c = 2 * (lane % 4);
  const Visibility vis{T_, p.causal, p.window};
  const float sl2 = p.scale_log2;

  uint32_t it = 0;  // key tiles consumed so far, as the producer counts them
  for (int j = 0;; ++j) {
    const int slot = j & 1;
    mbar_wait(bar_qfull + 8 * slot, (j >> 1) & 1);
    const int t = tile_of_slot[slot];
    if (t >= n_tiles) return;
    const FwdTile tile = fwd_tile<BQ>(p, n_qt, t);
    const int b = tile.b;
    int kt_begin;
    const int n_kt = fwd_key_range<BQ, BK, kSeg>(p, tile.q0, b, kt_begin);
    const uint32_t sQs = sQ + slot * Cfg::kQBytes;
    const int g_lo = tile.q0 + wg * 64, g_hi = g_lo + 63;  // the warpgroup's query rows
    const int wq_lo = g_lo + warp * 16, wq_hi = wq_lo + 15;

    // A warpgroup whose rows all lie before the sequence (the first query tile's: at T = 1024
    // with BQ 192 two of its three) has nothing to store; it only passes the stages on (its
    // arrivals are part of each stage's "empty" count).
    if (g_hi < 0) {
      for (int i = 0; i < n_kt; ++i, ++it) {
        const int st = it % kStages;
        mbar_wait(bar_full + 8 * st, (it / kStages) & 1);
        mbar_arrive(bar_empty + 8 * st);
      }
      mbar_arrive(bar_qempty + 8 * slot);
      continue;
    }

    float o[DT][4];
    zero_acc(o);
    float m[2] = {-FLT_MAX, -FLT_MAX}, l[2] = {0.0f, 0.0f};
    for (int i = 0; i < n_kt; ++i, ++it) {
      const int kt = kt_begin + i, st = it % kStages;
      const uint32_t sK = sKV + st * Cfg::kStageBytes;
      const uint32_t sV = sK + BK * D * 2;
      mbar_wait(bar_full + 8 * st, (it / kStages) & 1);

      const int k0 = kt * BK;
      const bool skip = (p.causal && k0 > g_hi) || (p.window > 0 && k0 + BK - 1 <= g_lo - p.window) ||
                        (kSeg && k0 + BK - 1 < seg_lo<kSeg>(p, b, g_lo));  // warpgroup-uniform
      if (!skip) {
        float s[NT][4];
        wgmma_fence();
#pragma unroll
        for (int ks = 0; ks < D / 16; ++ks)
          wgmma_ss<T, 0>(s, desc_k<BQ>(sQs, wg * 64, ks), desc_k<BK>(sK, 0, ks), ks);
        wgmma_commit();
        wgmma_wait<0>();
        fence_acc(s);

        const bool masked = k0 + BK > T_ || (p.causal && k0 + BK - 1 > wq_lo) ||
                            (p.window > 0 && k0 <= wq_hi - p.window) || (kSeg && k0 < seg_lo<kSeg>(p, b, wq_hi));
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
                if (nt * 8 + e < lo || nt * 8 + e >= hi) s[nt][2 * r + e] = -FLT_MAX;
          }
        }
        // Online softmax, rows g (r = 0) and g + 8 (r = 1) of the warp's 16.
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          float mx = m[r];
#pragma unroll
          for (int nt = 0; nt < NT; ++nt) mx = fmaxf(mx, fmaxf(s[nt][2 * r], s[nt][2 * r + 1]));
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
          const float ref = mx == -FLT_MAX ? 0.0f : mx * sl2;
          const float corr = fast_exp2<kFtz>(m[r] * sl2 - ref);
          m[r] = mx;
          float sum = 0.0f;
#pragma unroll
          for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const float pv = fast_exp2<kFtz>(fmaf(s[nt][2 * r + e], sl2, -ref));
              s[nt][2 * r + e] = pv;
              sum += pv;
            }
          l[r] = l[r] * corr + sum;
#pragma unroll
          for (int dt = 0; dt < DT; ++dt) {
            o[dt][2 * r] *= corr;
            o[dt][2 * r + 1] *= corr;
          }
        }
        // O += P·V.
        uint32_t pa[BK / 16][4];
#pragma unroll
        for (int kk = 0; kk < BK / 16; ++kk) acc_to_a<T, NT>(pa[kk], s, kk);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < BK / 16; ++kk) wgmma_rs<T, 1>(o, pa[kk], desc_mn<BK>(sV, kk), 1);
        wgmma_commit();
        wgmma_wait<0>();
        fence_acc(o);
      }
      mbar_arrive(bar_empty + 8 * st);  // this warpgroup's reads of the stage are done
    }
    // The tile's batch row and head again from its slot (fewer registers live through the loop),
    // read before the arrival that lets the producer reuse the slot.
    const FwdTile done = fwd_tile<BQ>(p, n_qt, tile_of_slot[slot]);
    mbar_arrive(bar_qempty + 8 * slot);  // this warpgroup's reads of the Q tile are done

    T* out = static_cast<T*>(p.o) + static_cast<int64_t>(done.b) * T_ * p.ld_o + done.h * D;
    float* lse = p.lse + (static_cast<int64_t>(done.b) * p.NH + done.h) * T_;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float sum = l[r];
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      const int i = wq_lo + g + 8 * r;
      if (i < 0) continue;  // rows of the partial first tile before the sequence
      const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
      T* row = out + static_cast<int64_t>(i) * p.ld_o;
#pragma unroll
      for (int dt = 0; dt < DT; ++dt)
        *reinterpret_cast<uint32_t*>(row + dt * 8 + c) = pack2<T>(o[dt][2 * r] * inv, o[dt][2 * r + 1] * inv);
      if (lane % 4 == 0) lse[i] = sum > 0.0f ? m[r] * p.scale + logf(sum) : -FLT_MAX;
    }
  }
}

// Persistent blocks, one an SM (the kernel's registers allow no second), taking tiles from a
// counter zeroed in stream order.
template <typename T, int D, int kWG, int BK, int kStages>
void launch(Context& ctx, FlashParams p, const FlashMaps& maps) {
  using Cfg = WgFwdConfig<D, kWG, BK, kStages>;
  const int64_t tiles = static_cast<int64_t>((p.T_ + Cfg::BQ - 1) / Cfg::BQ) * p.NH * p.B;
  FORGE_CHECK(tiles < (int64_t{1} << 31) - 65536, "flash_attention_fwd: ", tiles, " query tiles are too many");
  DeviceBuffer<uint32_t> ctr(ctx.allocator(), 1);
  FORGE_CUDA_CHECK(cudaMemsetAsync(ctr.data(), 0, sizeof(uint32_t), ctx.stream()));
  p.tile_ctr = ctr.data();
  const dim3 grid(static_cast<unsigned>(std::min<int64_t>(tiles, ctx.num_sms())));
  if (p.seg_start != nullptr)
    launch_with_smem<flash_fwd_wgmma_kernel<T, D, kWG, BK, kStages, true>>(ctx, grid, Cfg::kThreads, Cfg::kSmem, p,
                                                                            maps);
  else
    launch_with_smem<flash_fwd_wgmma_kernel<T, D, kWG, BK, kStages, false>>(ctx, grid, Cfg::kThreads, Cfg::kSmem, p,
                                                                             maps);
}

// Tile configurations: 64 query rows per consumer warpgroup, BK keys per stage. Head size 64 runs
// three K/V stages (144 KB of shared memory with the two Q tiles; H100, bench attention against
// two: 64·12·1024·64 causal 272.0 → 281.1 TFLOP/s, 32·9·2048·64 346.5 → 348.5, same run; GPT-2
// 124M training +0.5% over three rounds, losses unchanged), head size 128 two (three do not fit).
template <typename T>
void dispatch(Context& ctx, DType dt, const FlashParams& p) {
  constexpr int kWG64 = 3, kWG128 = 2, BK = 128;
  const int box_q = (p.HS == 64 ? kWG64 : kWG128) * 64;
  FlashMaps maps{};
  maps.q = make_tile_map(p.q, dt, static_cast<int64_t>(p.NH) * p.HS, p.ld_q, p.T_, p.B, box_q);
  maps.k = make_tile_map(p.k, dt, static_cast<int64_t>(p.NKV) * p.HS, p.ld_k, p.T_, p.B, BK);
  maps.v = make_tile_map(p.v, dt, static_cast<int64_t>(p.NKV) * p.HS, p.ld_v, p.T_, p.B, BK);
  if (p.HS == 64) launch<T, 64, kWG64, BK, 3>(ctx, p, maps);
  else launch<T, 128, kWG128, BK, 2>(ctx, p, maps);
}

}  // namespace

void fwd_wgmma(Context& ctx, DType dt, const FlashParams& p) {
  if (dt == DType::kBF16) dispatch<bf16>(ctx, dt, p);
  else dispatch<f16>(ctx, dt, p);
}

}  // namespace forge::cuda::flash
