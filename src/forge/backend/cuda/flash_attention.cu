// Flash attention forward (FlashAttention-2, arXiv 2307.08691) on tensor cores, and the
// backward's preprocess D = rowsum(dO ∘ O). The backward kernels are in flash_attention_bwd.cu;
// the MMA/ldmatrix/cp.async building blocks and fragment layouts in flash_mma.cuh.
//
// Forward. One block per (query tile of BQ rows, query head, batch); kWarps warps, each owning
// 16·kMT query rows, so a row's softmax statistics live in the four lanes that hold it (two
// shuffles, no shared-memory reductions). The block loads its Q tile once and streams K/V tiles
// of BK keys through a two-stage cp.async pipeline. Per key tile, per warp:
//   S = Q·Kᵀ (f32), m' = max(m, rowmax S), p = exp2(S·scale·log2e − m'·scale·log2e),
//   l = l·exp2((m − m')·c) + rowsum p, O = O·exp2((m − m')·c) + P·V  (P rounded to bf16/f16)
// and once at the end O /= l and lse = m·scale + ln l. GQA: query head h reads kv head
// h / (NH / NKV) — a pointer offset, nothing is copied.
//
// Masking. Only the key tiles a query tile can see are visited (causal: up to the diagonal;
// sliding window: from the window's start), and only tiles crossing the diagonal, the window's
// edge or the end of the sequence pay the per-element test. A warp whose 16·kMT rows see none
// of a tile skips its arithmetic. Masked scores become −FLT_MAX — finite, so exp2 of the
// difference is 0, never NaN — and a row whose running max is still −FLT_MAX uses 0 as its
// reference, so nothing visible means p = 0, l = 0, output 0 (not reachable when causal).
// Causal grids run the heaviest (last) query tiles first.
// Segments (packed rows, seg_start non-null): one more per-row lower bound, seg_lo(i) (see
// flash_mma.cuh); key tiles below the tile's first row's bound are not visited, a warp skips
// tiles below its first row's bound and pays the per-element test on tiles below its last
// row's. A separate instantiation (kSeg), so the kernels without segments are unchanged.
//
// ptxas (sm_90a, CUDA 13.0, -O3), registers / spill bytes, 0 stack frame, same for bf16 and f16:
//   flash_fwd_kernel  HS 64  (4 warps × 32 rows, BK 64, 48 KiB shared)   254 / 0
//                     HS 128 (4 warps × 32 rows, BK 32, 64 KiB shared)   255 / 0
//   flash_bwd_delta_kernel (16-byte loads, D/8 lanes per row)            26 / 0
//   HS 32 / 80 / 96 (padded rows; the configurations of HS 64 / 128 / 128): 180 / 184 / 221, 0
//   with segments (kSeg, ptxas -v on the PTX, CUDA 13.0): HS 32 / 64 / 80 / 96 / 128
//   168 / 252 / 200 / 221 / 255 registers, 0 spill; without, the PTX is unchanged.
#include <cfloat>

#include "forge/backend/cuda/check.h"
#include "forge/backend/cuda/context.h"
#include "forge/backend/cuda/flash_mma.cuh"
#include "forge/backend/cuda/ops.h"

namespace forge::cuda {
namespace flash {
namespace {

template <typename T, int D, int kWarps, int kMT, int BK>
struct FwdConfig {
  static constexpr int kThreads = kWarps * 32;
  static constexpr int BQ = kWarps * 16 * kMT;
  static constexpr int kStageBytes = 2 * BK * TileLayout<D>::kRowBytes;  // K then V
  static constexpr int kSmem = BQ * TileLayout<D>::kRowBytes + 2 * kStageBytes;
};

template <typename T, int D, int kWarps, int kMT, int BK, bool kSeg>
__global__ void __launch_bounds__(kWarps * 32) flash_fwd_kernel(FlashParams p) {
  using Cfg = FwdConfig<T, D, kWarps, kMT, BK>;
  constexpr int BQ = Cfg::BQ, NT = BK / 8, DT = D / 8, kThreads = Cfg::kThreads;
  extern __shared__ __align__(128) uint8_t smem[];
  const uint32_t sQ = smem_addr(smem);
  const uint32_t sKV = sQ + BQ * TileLayout<D>::kRowBytes;

  const int T_ = p.T_;
  const int n_qt = (T_ + BQ - 1) / BQ;
  const int qt = p.causal ? n_qt - 1 - static_cast<int>(blockIdx.x) : static_cast<int>(blockIdx.x);
  const int h = blockIdx.y, b = blockIdx.z, kvh = h / (p.NH / p.NKV);
  const int q0 = qt * BQ;
  const T* q = static_cast<const T*>(p.q) + static_cast<int64_t>(b) * T_ * p.ld_q + h * D;
  const T* k = static_cast<const T*>(p.k) + static_cast<int64_t>(b) * T_ * p.ld_k + kvh * D;
  const T* v = static_cast<const T*>(p.v) + static_cast<int64_t>(b) * T_ * p.ld_v + kvh * D;

  const TileRange kr = key_tiles<BQ, BK>(p, q0);
  // Segments: no row of the tile sees a key below seg_lo(q0) (q0 < T), so whole tiles below it
  // are skipped; seg_lo(q0) <= q0 keeps kt_begin < kt_end.
  const int kt_begin = kSeg ? max(kr.begin, seg_lo<kSeg>(p, b, q0) / BK) : kr.begin, kt_end = kr.end;

  load_tile<BQ, D, kThreads>(sQ, q, p.ld_q, q0, T_);
  if (kt_begin < kt_end) {
    load_kv<BK, D, kThreads>(sKV, k, v, p.ld_k, p.ld_v, kt_begin * BK, T_);
  }
  cp_async_commit();

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, c = 2 * (lane % 4);
  const int wrow = warp * 16 * kMT;  // the warp's first row within the tile
  const int wq_lo = q0 + wrow, wq_hi = q0 + wrow + 16 * kMT - 1;  // its query range
  const Visibility vis{T_, p.causal, p.window};
  const float sl2 = p.scale_log2;

  float o[kMT][DT][4];
  float m[kMT][2], l[kMT][2];
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int dt = 0; dt < DT; ++dt) o[mt][dt][0] = o[mt][dt][1] = o[mt][dt][2] = o[mt][dt][3] = 0.0f;
    m[mt][0] = m[mt][1] = -FLT_MAX;
    l[mt][0] = l[mt][1] = 0.0f;
  }

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
      float s[kMT][NT][4];
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) s[mt][nt][0] = s[mt][nt][1] = s[mt][nt][2] = s[mt][nt][3] = 0.0f;
#pragma unroll
      for (int ks = 0; ks < D / 16; ++ks) {
        uint32_t qa[kMT][4];
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) load_a<D>(qa[mt], sQ, wrow + mt * 16, ks * 16, lane);
#pragma unroll
        for (int np = 0; np < NT / 2; ++np) {
          uint32_t kb[4];
          load_b<D>(kb, sK, np * 16, ks * 16, lane);
#pragma unroll
          for (int mt = 0; mt < kMT; ++mt) {
            mma<T>(s[mt][2 * np], qa[mt], kb[0], kb[1]);
            mma<T>(s[mt][2 * np + 1], qa[mt], kb[2], kb[3]);
          }
        }
      }
      const bool masked = k0 + BK > T_ || (p.causal && k0 + BK - 1 > wq_lo) ||
                          (p.window > 0 && k0 <= wq_hi - p.window) || (kSeg && k0 < seg_lo<kSeg>(p, b, wq_hi));
      if (masked) {
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
          for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const int i = wq_lo + mt * 16 + g + (e >= 2 ? 8 : 0), j = k0 + nt * 8 + c + (e & 1);
              if (!vis(i, j) || (kSeg && j < seg_lo<kSeg>(p, b, i))) s[mt][nt][e] = -FLT_MAX;
            }
      }
      // Online softmax, per row (r = 0: row g, r = 1: row g + 8 of each m-tile).
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          float mx = m[mt][r];
#pragma unroll
          for (int nt = 0; nt < NT; ++nt) mx = fmaxf(mx, fmaxf(s[mt][nt][2 * r], s[mt][nt][2 * r + 1]));
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
          const float ref = mx == -FLT_MAX ? 0.0f : mx * sl2;
          const float corr = fast_exp2<(D <= 64)>(m[mt][r] * sl2 - ref);
          m[mt][r] = mx;
          float sum = 0.0f;
#pragma unroll
          for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const float pv = fast_exp2<(D <= 64)>(fmaf(s[mt][nt][2 * r + e], sl2, -ref));
              s[mt][nt][2 * r + e] = pv;
              sum += pv;
            }
          l[mt][r] = l[mt][r] * corr + sum;
#pragma unroll
          for (int dt = 0; dt < DT; ++dt) {
            o[mt][dt][2 * r] *= corr;
            o[mt][dt][2 * r + 1] *= corr;
          }
        }
      // O += P·V.
#pragma unroll
      for (int kk = 0; kk < BK / 16; ++kk) {
        uint32_t pa[kMT][4];
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) acc_to_a<T, NT>(pa[mt], s[mt], kk);
#pragma unroll
        for (int dp = 0; dp < D / 16; ++dp) {
          uint32_t vb[4];
          load_b_t<D>(vb, sV, kk * 16, dp * 16, lane);
#pragma unroll
          for (int mt = 0; mt < kMT; ++mt) {
            mma<T>(o[mt][2 * dp], pa[mt], vb[0], vb[1]);
            mma<T>(o[mt][2 * dp + 1], pa[mt], vb[2], vb[3]);
          }
        }
      }
    }
    __syncthreads();  // the next iteration's loads overwrite this stage
  }
  cp_async_wait<0>();

  T* out = static_cast<T*>(p.o) + static_cast<int64_t>(b) * T_ * p.ld_o + h * D;
  float* lse = p.lse + (static_cast<int64_t>(b) * p.NH + h) * T_;
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float sum = l[mt][r];
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      const int i = wq_lo + mt * 16 + g + 8 * r;
      if (i >= T_) continue;
      const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
      T* row = out + static_cast<int64_t>(i) * p.ld_o;
#pragma unroll
      for (int dt = 0; dt < DT; ++dt)
        *reinterpret_cast<uint32_t*>(row + dt * 8 + c) = pack2<T>(o[mt][dt][2 * r] * inv, o[mt][dt][2 * r + 1] * inv);
      if (lane % 4 == 0) lse[i] = sum > 0.0f ? m[mt][r] * p.scale + logf(sum) : -FLT_MAX;
    }
}

// Threads per row of the D kernel: D/8 rounded up to a power of two (a row's lanes stay within
// one warp and reduce by xor shuffles).
constexpr int delta_lanes(int D) {
  int n = 1;
  while (n < D / 8) n *= 2;
  return n;
}

// D[b, h, i] = Σ_d dO·O in f32 (both as stored). delta_lanes(D) threads per (b, i, h) row, 16
// bytes of each operand per thread, summed over the row's lanes by shuffles. (One warp per row
// with 4-byte loads ran at ~1.1 TB/s: 44 µs of a 0.8 ms backward at 8·12·2048·64.)
template <typename T, int D>
__global__ void __launch_bounds__(256) flash_bwd_delta_kernel(FlashParams p) {
  constexpr int kLanes = delta_lanes(D), kRows = 256 / kLanes;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRows + threadIdx.x / kLanes;  // (b, i, h)
  const int part = static_cast<int>(threadIdx.x % kLanes);
  const int64_t rows = static_cast<int64_t>(p.B) * p.T_ * p.NH;
  float acc = 0.0f;
  if (row < rows && part * 8 < D) {
    const int h = static_cast<int>(row % p.NH);
    const int64_t bi = row / p.NH;  // b·T + i
    const uint4 o4 = *reinterpret_cast<const uint4*>(static_cast<const T*>(p.o) + bi * p.ld_o + h * D + part * 8);
    const uint4 d4 = *reinterpret_cast<const uint4*>(static_cast<const T*>(p.dout) + bi * p.ld_o + h * D + part * 8);
    const T* ov = reinterpret_cast<const T*>(&o4);
    const T* dv = reinterpret_cast<const T*>(&d4);
#pragma unroll
    for (int e = 0; e < 8; ++e) acc += static_cast<float>(ov[e]) * static_cast<float>(dv[e]);
  }
#pragma unroll
  for (int off = kLanes / 2; off > 0; off /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, off);
  if (row < rows && part == 0) {
    const int64_t h = row % p.NH, bi = row / p.NH, b = bi / p.T_, i = bi % p.T_;
    p.delta[(b * p.NH + h) * p.T_ + i] = acc;
  }
}

template <typename T, int D, int kWarps, int kMT, int BK>
void launch_fwd(Context& ctx, const FlashParams& p) {
  using Cfg = FwdConfig<T, D, kWarps, kMT, BK>;
  const dim3 grid((p.T_ + Cfg::BQ - 1) / Cfg::BQ, p.NH, p.B);
  if (p.seg_start != nullptr)
    launch_with_smem<flash_fwd_kernel<T, D, kWarps, kMT, BK, true>>(ctx, grid, Cfg::kThreads, Cfg::kSmem, p);
  else
    launch_with_smem<flash_fwd_kernel<T, D, kWarps, kMT, BK, false>>(ctx, grid, Cfg::kThreads, Cfg::kSmem, p);
}

// Tile configurations measured on the H200 (forge bench attention, bf16; ms per call):
//   HS 64:  4 warps × 32 rows (BQ 128), BK 64 — 0.253 causal / 0.393 full at 8·12·2048·64,
//           against 0.272 / 0.466 with 16 rows per warp and 0.313 / 0.523 with 8 warps × 16.
//   HS 128: 4 warps × 32 rows, BK 32 — 1.123 / 1.963 at 4·16·4096·128, against 1.125 / 2.090
//           with 16 rows per warp (BK 64) and 1.222 / 2.224 with 8 warps × 16. 32 rows × 128
//           columns with BK 64 spills (212 bytes), hence BK 32 there.
// Head sizes 32, 80 and 96 (padded rows) take the configuration of the nearest measured size.
template <typename T>
void fwd_dispatch(Context& ctx, const FlashParams& p) {
  switch (p.HS) {
    case 32: launch_fwd<T, 32, 4, 2, 64>(ctx, p); break;
    case 64: launch_fwd<T, 64, 4, 2, 64>(ctx, p); break;
    case 80: launch_fwd<T, 80, 4, 2, 32>(ctx, p); break;
    case 96: launch_fwd<T, 96, 4, 2, 32>(ctx, p); break;
    default: launch_fwd<T, 128, 4, 2, 32>(ctx, p); break;
  }
}

template <typename T>
void delta_dispatch(Context& ctx, const FlashParams& p) {
  const int64_t rows = static_cast<int64_t>(p.B) * p.T_ * p.NH;
  const auto grid = [&](int D) { return dim3(static_cast<unsigned>((rows + 256 / delta_lanes(D) - 1) / (256 / delta_lanes(D)))); };
  switch (p.HS) {
    case 32: flash_bwd_delta_kernel<T, 32><<<grid(32), 256, 0, ctx.stream()>>>(p); break;
    case 64: flash_bwd_delta_kernel<T, 64><<<grid(64), 256, 0, ctx.stream()>>>(p); break;
    case 80: flash_bwd_delta_kernel<T, 80><<<grid(80), 256, 0, ctx.stream()>>>(p); break;
    case 96: flash_bwd_delta_kernel<T, 96><<<grid(96), 256, 0, ctx.stream()>>>(p); break;
    default: flash_bwd_delta_kernel<T, 128><<<grid(128), 256, 0, ctx.stream()>>>(p); break;
  }
  FORGE_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

// Declared in flash_attention_bwd.cu's namespace: the preprocess is launched from there.
void launch_delta(Context& ctx, DType dt, const FlashParams& p) {
  if (dt == DType::kBF16) delta_dispatch<bf16>(ctx, p);
  else delta_dispatch<f16>(ctx, p);
}

}  // namespace flash

namespace flash {
bool use_wgmma(const Context& ctx, FlashKernels kernels, int HS, const char* what) {
  const bool can = ctx.props().major == 9 && (HS == 64 || HS == 128);
  FORGE_CHECK(can || (kernels != FlashKernels::kWgmma && kernels != FlashKernels::kWgmmaSplit), what, ": the wgmma kernels need a compute capability 9.x ",
              "device and head size 64 or 128 (device ", ctx.props().major, ".", ctx.props().minor, ", head size ", HS,
              ")");
  return can && kernels != FlashKernels::kMma;
}
}  // namespace flash

bool flash_attention_supported(DType dt, int HS) {
  return (dt == DType::kBF16 || dt == DType::kF16) && (HS == 32 || HS == 64 || HS == 80 || HS == 96 || HS == 128);
}

void flash_attention_fwd(Context& ctx, DType dt, void* out, float* lse, const void* q, const void* k,
                         const void* v, const AttentionShape& s, const AttentionStrides& st,
                         FlashKernels kernels, const int32_t* seg) {
  const char* what = "flash_attention_fwd";
  flash::FlashParams p{};
  flash::fill_shape(p, dt, s, st.q, st.k, st.v, st.o, what);
  flash::check_aligned(out, what, "out");
  flash::check_aligned(q, what, "q");
  flash::check_aligned(k, what, "k");
  flash::check_aligned(v, what, "v");
  if (s.B == 0 || s.T == 0) return;
  p.q = q;
  p.k = k;
  p.v = v;
  p.o = out;
  p.lse = lse;
  DeviceBuffer<int32_t> starts;  // (B, T), freed in stream order after the kernel
  if (seg != nullptr) {
    starts = DeviceBuffer<int32_t>(ctx.allocator(), static_cast<size_t>(s.B) * s.T);
    segment_starts(ctx, starts.data(), seg, s.B, s.T);
    p.seg_start = starts.data();
  }
  if (flash::use_wgmma(ctx, kernels, s.HS, what)) flash::fwd_wgmma(ctx, dt, p);
  else if (dt == DType::kBF16) flash::fwd_dispatch<flash::bf16>(ctx, p);
  else flash::fwd_dispatch<flash::f16>(ctx, p);
}

}  // namespace forge::cuda
