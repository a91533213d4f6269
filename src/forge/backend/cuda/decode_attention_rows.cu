// The one-pass decode attention kernel for short caches: one block per (kv head chunk, slot), a
// warp per 32 rows. decode_attention.cu holds the entry points of decode.h and picks this kernel
// where rows_kernel_takes says so; decode_attention.cuh has the arguments.
//
// The split kernel (decode_attention.cu) walks its rows as a chain of dependent steps (tile
// load, barrier, scores, barrier, softmax, barrier, P·V, barrier, then the partials through
// global memory and the last split's combine): 11–12 µs a layer at a 130–380-row cache
// (dev/decode_timeline.cpp, H200, batch 1), half of a SmolLM2 decode step's kernel time. This kernel is for caches of up
// to kRowsMaxCap rows and grids of at most one wave (rows_kernel_takes): warp w copies the
// cache rows 32·c … 32·c + 31 of chunk c = w, w + 16, … into its key and value tiles in shared
// memory (cp.async, whole 128-byte rows), and the first chunk's copies do not depend on the
// position: one HBM round trip for the block, before the PDL wait where it can be. Lane l
// scores row 32·c + l against q (broadcast from shared memory), the softmax is warp shuffles,
// and the 16 warps' (max, sum, accumulator) are combined in shared memory once. No scratch, no
// second pass. Each warp rotates its own copy of q (no block barrier before the rows), and the
// warp whose chunk holds the new row rotates its key, puts it in its tiles and appends it to the
// cache (docs/perf-notes.md has each step's figures).
// P·V on tensor cores as Vᵀ·Pᵀ: eight m16n8k16 MMAs a chunk, head g's P the B operand's column
// g (rounded to T), V from a swizzled tile by ldmatrix.trans. (It was each lane's two channels
// over the chunk's rows, P broadcast by a shuffle a row and head; at a 1,536–1,792-row cache,
// where a warp walks 3–4 chunks, the MMA form is ~12% faster a step at batch 1 and ~6% at 32,
// H200: docs/perf-notes.md.)
// ptxas (sm_90a, CUDA 13.0): one head a block 112 registers, or 64 and 40 bytes spilled under
// the 2-blocks-an-SM bounds (launch_rows picks); four heads 119; 0 spill otherwise.
// Rows at or past n are loaded (inside the cache) but masked: their score is −inf and their
// value row is zeroed in the tile (P is 0 there, but 0 · NaN is NaN), so stale or NaN contents
// cannot leak in.
// The code is kept small on purpose (rolled loops): a kernel that runs for a few µs once per
// layer pays for every instruction-cache miss, and the first, fully unrolled version of this
// kernel (~4k instructions) took as long as the split kernel.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "forge/backend/cuda/check.h"
#include "forge/backend/cuda/decode_attention.cuh"
#include "forge/backend/cuda/flash_mma.cuh"
#include "forge/backend/cuda/kernel_utils.cuh"
#include "forge/backend/cuda/pdl.cuh"

namespace forge::cuda::decode_attn {
namespace {

using namespace kernels;

constexpr int kRowsWarps = 16;
// Caches up to 2,048 rows (the serving default: each slot a model context's rows, of which a
// request uses its length; the loop stops there). Up to 1,024 until 2026-12-04, when `forge
// serve`'s 2,048-row slots still ran the split kernel (docs/serving.md).
constexpr int kRowsMaxCap = 2048;
constexpr int kRowsHS = 64;
constexpr int kRowsMaxHeads = 4;  // query heads per block: keeps a lane's registers under 128
// At most one wave of blocks (the H200's 132 SMs, one 512-thread block each with 136 KB (one
// head a block) or 161 KB (four) of shared memory): more slots than that run the split kernel,
// whose 128-thread blocks pack better (batch 128, measured with the kernel's earlier version
// that loaded rows into registers: 2,141 µs a step with it, 1,657 with the split kernel).
constexpr int kRowsMaxBlocks = 132;

// Dynamic shared memory of decode_attention_rows_kernel<T, kH> (kH query heads per block), bytes.
template <int kH>
struct RowsSmem {
  static constexpr int kK = 0;                                        // (16, 32, 8) 16 B, swizzled
  static constexpr int kV = kK + kRowsWarps * 32 * kRowsHS * 2;       // (16, 32, HS) T
  static constexpr int kQ = kV + kRowsWarps * 32 * kRowsHS * 2;       // (16, kH, HS) f32
  static constexpr int kAcc = kQ + kRowsWarps * kH * kRowsHS * 4;     // (16, kH, HS) f32
  static constexpr int kStat = kAcc + kRowsWarps * kH * kRowsHS * 4;  // (2, 16, kH) f32
  static constexpr int kWt = kStat + 2 * kRowsWarps * kH * 4;         // (kH, 16) f32
  static constexpr int kBytes = kWt + kH * kRowsWarps * 4;
};

// kMinBlocks: the launch bounds' blocks per SM, i.e. registers at most 64 (2) or 128 (1): see
// launch_rows.
template <typename T, int kH, int kMinBlocks>
__global__ void __launch_bounds__(32 * kRowsWarps, kMinBlocks)
    decode_attention_rows_kernel(const AttnArgs<T> a, const __grid_constant__ RopeFreqs f) {
  pdl_launch_dependents();
  constexpr int HS = kRowsHS, kKV = HS * static_cast<int>(sizeof(T)) / 16;  // 16 B chunks a row
  static_assert(sizeof(T) == 2 && kKV == 8, "16-bit storage, HS 64: a row is 8 chunks of 16 B");
  const int slot = blockIdx.y, lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int kvh = blockIdx.x / a.chunks, chunk = blockIdx.x - kvh * a.chunks;
  const int h0 = kvh * a.group + chunk * a.chunk_heads;               // first query head
  const int G = min(a.chunk_heads, a.group - chunk * a.chunk_heads);  // its query heads
  extern __shared__ __align__(16) unsigned char smem[];
  using L = RowsSmem<kH>;
  int4* k_t = reinterpret_cast<int4*>(smem + L::kK) + warp * 32 * kKV;  // (32, 8) this warp's
  T* v_s = reinterpret_cast<T*>(smem + L::kV) + warp * 32 * HS;         // (32, HS) this warp's
  float* q_s = reinterpret_cast<float*>(smem + L::kQ) + warp * kH * HS;  // (G, HS) this warp's
  float* acc_w = reinterpret_cast<float*>(smem + L::kAcc);  // (16, kH, HS)
  float* m_w = reinterpret_cast<float*>(smem + L::kStat);   // (16, kH)
  float* l_w = m_w + kRowsWarps * kH;                       // (16, kH)
  float* wt_s = reinterpret_cast<float*>(smem + L::kWt);    // (kH, 16) the combine's weights

  // P·V on tensor cores (below): the value tile is swizzled like the key tile, chunk e of row r
  // at 8·r + (e ^ (r & 7)) in 16-byte units, so that ldmatrix.trans reads 8 rows of one column
  // chunk from 8 bank groups.
  static_assert(kH <= 4, "a head is one column of the MMA's B operand, two per lane of the C fragment");
  auto vidx = [](int r, int d) { return r * HS + 8 * ((d / 8) ^ (r & 7)) + d % 8; };
  const int64_t row_elems = static_cast<int64_t>(a.NKV) * HS;  // between cache rows
  const int64_t base = (static_cast<int64_t>(slot) * a.cap * a.NKV + kvh) * HS;
  // Rows 32·c … 32·c + 31 (those inside the cache, whatever the position; zeros past it) into the
  // warp's tiles with cp.async: instruction i has lane l copy chunk l % 8 of row 4·i + l / 8, so
  // each moves 4 whole 128-byte rows. (Each lane loading its own row into registers — 32 rows a
  // warp instruction — made every instruction touch 32 lines: ~8k L1 wavefronts a block, ~4 µs
  // of a ~8 µs kernel by clock64 probes, H200.) The key tile's chunk e of row r sits at
  // 8·r + (e ^ (r & 7)), so lane r reading chunk e of its own row is conflict-free; the value
  // tile is swizzled the same way (vidx, for ldmatrix.trans). A later chunk's keys are copied as
  // soon as the scores are done with the key tile, its values after P·V.
  auto copy_chunk = [&](int c, bool keys, bool values) {
#pragma unroll
    for (int i = 0; i < 32 / 4; ++i) {
      const int r = 4 * i + lane / 8, e = lane % 8, j = c * 32 + r;
      const bool in = j < a.cap;
      const int64_t off = base + static_cast<int64_t>(in ? j : 0) * row_elems + e * 8;
      const int bytes = in ? 16 : 0;  // 0: the chunk is zero-filled
      const uint32_t k_dst = flash::smem_addr(k_t + kKV * r + (e ^ (r & 7)));
      if (keys) flash::cp_async16(k_dst, a.cache_k + off, bytes);
      if (values) flash::cp_async16(flash::smem_addr(v_s + vidx(r, e * 8)), a.cache_v + off, bytes);
    }
    flash::cp_async_commit();
  };
  // rope_decode_attention (k_new set) reads what does not come from the kernel before it ahead
  // of the PDL wait (one query head a block, below), so those loads overlap that kernel (the
  // q|k|v product): the position, its sin/cos, and the block's first cache rows. In that call
  // the only row of this layer's cache the step writes is row pos % cap, written by this kernel
  // and replaced in the tiles by k_new/v_new below, never read from the cache; the positions
  // change only in the step's last kernel (advance_positions, no PDL) or by a copy from the
  // host. Everything an earlier step wrote is complete: a copy (the ids to the host, a prompt's
  // positions) sits between two steps, which PDL does not reach across, and within eager steps
  // a kernel starts early only once every block of the one before it is resident, so the ~150
  // kernels between this kernel and its previous step's call would have to be resident
  // together. decode_attention (GPT-2: the row was appended by the kernel before) reads
  // everything after the wait.
  // Every warp rotates its own copy of the block's query heads, and no block barrier comes
  // before the rows: lane l takes pair l of each head (HS = 64: 32 pairs, one sin/cos per lane
  // for all heads and the new key), so a warp waits only for its own loads and arithmetic.
  // (It was one shared copy, written by the first G·HS threads — two warps that also rotated
  // the new key — and a __syncthreads every warp waited at: ncu's stall samples put the
  // kernel's largest share at that barrier, behind pos → angle → sin/cos → q.)
  // rope_kv_append's arithmetic: the pair in f32, rounded to T, so q is the unfused path's.
  // Only with one query head a block (S·NH <= 132: batch 1 +15%, batch 8 +12%, H200): with
  // four (batch 32) the early reads measured 2% slower in two GPU runs.
  const bool fresh = a.k_new != nullptr, early = fresh && kH == 1;
  const int i0 = a.rotate_half ? lane : 2 * lane, i1 = a.rotate_half ? lane + HS / 2 : 2 * lane + 1;
  int pos = 0;
  float sn = 0.0f, cs = 1.0f;
  auto prologue = [&] {  // the position, the first rows (in flight together), sin/cos
    pos = a.pos[slot];
    copy_chunk(warp, true, true);
    if (a.rope) rope_sincos(static_cast<double>(pos), f.inv_freq_over_pi[lane], &sn, &cs);
  };
  if (early) prologue();
  pdl_wait();  // q (and otherwise the cache and positions) are the step's own data
  if (!early) prologue();
  const int n = max(0, min(pos + 1, a.cap)), rnew = pos % a.cap;
  auto rotated = [&](const T* head, float* y0, float* y1) {  // channels i0, i1 of one head
    const T x0 = head[i0], x1 = head[i1];
    if (a.rope) {
      const float f0 = to_f32(x0), f1 = to_f32(x1);
      *y0 = to_f32(from_f32<T>(f0 * cs - f1 * sn));
      *y1 = to_f32(from_f32<T>(f0 * sn + f1 * cs));
    } else {
      *y0 = to_f32(x0), *y1 = to_f32(x1);
    }
  };
  const T* qrow = a.q + slot * a.q_stride + static_cast<int64_t>(h0) * HS;
#pragma unroll
  for (int g = 0; g < kH; ++g) {
    if (g >= G) break;
    float y0, y1;
    rotated(qrow + g * HS, &y0, &y1);
    q_s[g * HS + i0] = y0 * a.scale_log2;
    q_s[g * HS + i1] = y1 * a.scale_log2;
  }
  // rope_decode_attention: row rnew comes from qkv, taken by the warp whose chunk holds it (it
  // replaces the row in its tiles below); chunk 0 of the kv head writes it to the cache (the
  // other chunks replace the row, never read it).
  const bool owner = fresh && warp == (rnew / 32) % kRowsWarps;
  T k0{}, k1{}, v0{}, v1{};
  if (owner) {
    const int64_t off = slot * a.q_stride + static_cast<int64_t>(kvh) * HS;
    float y0, y1;
    rotated(a.k_new + off, &y0, &y1);
    k0 = from_f32<T>(y0), k1 = from_f32<T>(y1);  // exact: y0, y1 are T values
    v0 = a.v_new[off + lane], v1 = a.v_new[off + lane + HS / 2];
    if (chunk == 0) {
      const int64_t crow = base + static_cast<int64_t>(rnew) * row_elems;
      a.cache_k[crow + i0] = k0, a.cache_k[crow + i1] = k1;
      a.cache_v[crow + lane] = v0, a.cache_v[crow + lane + HS / 2] = v1;
    }
  }
  __syncwarp();

  float m_run[kH], l_run[kH];
#pragma unroll
  for (int g = 0; g < kH; ++g) m_run[g] = -INFINITY, l_run[g] = 0.0f;
  // The heads' outputs as columns 0 .. kH − 1 of HS / 16 m16n8k16 accumulators (Vᵀ · Pᵀ: the
  // channels are M, head g's P is N's column g): lane (i, q) = (lane / 4, lane % 4) holds
  // channels 16·t + i (elements 0, 1) and 16·t + i + 8 (2, 3) of heads 2q (0, 2) and 2q + 1
  // (1, 3) in tile t; columns kH and up stay zero.
  float acc_t[HS / 16][4] = {};
  const int q4 = lane % 4, i4 = lane / 4;
  for (int c = warp; c * 32 < n; c += kRowsWarps) {
    flash::cp_async_wait<0>();
    __syncwarp();  // every lane's copies of the chunk are in
    if (owner && c == rnew / 32) {  // the new row replaces the cache's (warp-uniform)
      const int r = rnew % 32;
      T* kr = reinterpret_cast<T*>(k_t + kKV * r);
      kr[8 * ((i0 / 8) ^ (r & 7)) + i0 % 8] = k0;
      kr[8 * ((i1 / 8) ^ (r & 7)) + i1 % 8] = k1;
      v_s[vidx(r, lane)] = v0, v_s[vidx(r, lane + HS / 2)] = v1;
      __syncwarp();
    }
    const int j = c * 32 + lane;
    const bool more = c + kRowsWarps < (n + 31) / 32;  // this warp has another chunk
    float p[kH] = {};  // scores, then probabilities
#pragma unroll
    for (int e = 0; e < kKV; ++e) {  // 8 channels at a time
      float kf[8];
      unpack16(k_t[kKV * lane + (e ^ (lane & 7))], kf, T{});
#pragma unroll
      for (int g = 0; g < kH; ++g) {
        const float4 qa = *reinterpret_cast<const float4*>(q_s + g * HS + 8 * e);
        const float4 qb = *reinterpret_cast<const float4*>(q_s + g * HS + 8 * e + 4);
        p[g] += kf[0] * qa.x + kf[1] * qa.y + kf[2] * qa.z + kf[3] * qa.w + kf[4] * qb.x +
                kf[5] * qb.y + kf[6] * qb.z + kf[7] * qb.w;
      }
    }
    if (more) {  // the key tile is free
      __syncwarp();
      copy_chunk(c + kRowsWarps, true, false);
    }
    float alpha_e = 1.0f, alpha_o = 1.0f;  // the rescale of this lane's heads 2q and 2q + 1
#pragma unroll
    for (int g = 0; g < kH; ++g) {
      const float s = j < n && g < G ? p[g] : -INFINITY;
      const float m_new = fmaxf(m_run[g], warp_max(s));  // −inf only for heads g ≥ G
      p[g] = m_new == -INFINITY ? 0.0f : exp2f(s - m_new);
      const float alpha = m_new == -INFINITY ? 1.0f : exp2f(m_run[g] - m_new);  // 0 first time
      l_run[g] = l_run[g] * alpha + warp_sum(p[g]);
      if (g == 2 * q4) alpha_e = alpha;
      if (g == 2 * q4 + 1) alpha_o = alpha;
      m_run[g] = m_new;
    }
#pragma unroll
    for (int t = 0; t < HS / 16; ++t) {
      acc_t[t][0] *= alpha_e, acc_t[t][2] *= alpha_e;
      acc_t[t][1] *= alpha_o, acc_t[t][3] *= alpha_o;
    }
    const int rows = min(32, n - c * 32);
    // Vᵀ (HS × 32) · Pᵀ (32 × kH, P rounded to T as the training kernels round it): two k-steps
    // of 16 rows, HS / 16 m-tiles of channels; head g's P is the B operand's column g, so lane
    // (g, q) takes rows 2q, 2q + 1, 2q + 8, 2q + 9 of the k-step from head g's lanes: 4·kH
    // shuffles a k-step, against kH a row and a serial walk over the 32 rows (the kernel's
    // earlier P·V). A comes from the value tile by ldmatrix.trans (matrix i of an x4: m-half
    // i % 2, k-half i / 2). Value rows at or past n are zeroed first (their P is 0, but 0 · NaN
    // is not).
    if (rows < 32) {
      if (lane >= rows)
#pragma unroll
        for (int e = 0; e < kKV; ++e) reinterpret_cast<int4*>(v_s + lane * HS)[e] = make_int4(0, 0, 0, 0);
      __syncwarp();
    }
    const uint32_t v_tile = flash::smem_addr(v_s);
#pragma unroll
    for (int kk = 0; kk < 2; ++kk) {
      float x[4] = {};  // P of head i4 (0 for i4 >= kH) at rows 2q, 2q + 1, 2q + 8, 2q + 9
#pragma unroll
      for (int g = 0; g < kH; ++g) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float y = __shfl_sync(0xffffffffu, p[g], 16 * kk + 2 * q4 + (e & 1) + (e >> 1) * 8);
          if (g == i4) x[e] = y;
        }
      }
      const uint32_t b0 = flash::pack2<T>(x[0], x[1]), b1 = flash::pack2<T>(x[2], x[3]);
      const int vr = 16 * kk + (lane & 7) + ((lane >> 4) & 1) * 8;  // this lane's row address
#pragma unroll
      for (int t = 0; t < HS / 16; ++t) {
        uint32_t fa[4];
        flash::ldmatrix_x4_trans(fa, flash::swz<HS>(v_tile, vr, 16 * t + ((lane >> 3) & 1) * 8));
        flash::mma<T>(acc_t[t], fa, b0, b1);
      }
    }
    __syncwarp();  // the value tile is rewritten by the next chunk
    if (more) copy_chunk(c + kRowsWarps, false, true);
  }
#pragma unroll
  for (int g = 0; g < kH; ++g) {
    if (lane == 0) m_w[warp * kH + g] = m_run[g], l_w[warp * kH + g] = l_run[g];
    if (g / 2 == q4) {  // heads 2q (elements 0, 2) and 2q + 1 (1, 3)
      float* dst = acc_w + (warp * kH + g) * HS + i4;
#pragma unroll
      for (int t = 0; t < HS / 16; ++t) {
        dst[16 * t] = acc_t[t][g % 2];
        dst[16 * t + 8] = acc_t[t][2 + g % 2];
      }
    }
  }
  __syncthreads();
  // out = Σ_w 2^(m_w − M)·acc_w / Σ_w 2^(m_w − M)·l_w over the warps that saw rows: warp g turns
  // head g's 16 (max, sum) pairs into the weights 2^(m_w − M) / Σ, then every output channel is
  // 16 independent products (a serial walk over the warps here was ~2k cycles of shared-memory
  // latency per thread, measured with ncu).
  if (warp < G) {
    const int g = warp;
    const float lw = lane < kRowsWarps ? l_w[lane * kH + g] : 0.0f;
    const float mw = lw > 0.0f ? m_w[lane * kH + g] : -INFINITY;
    const float M = warp_max(mw);
    const float wt = lw > 0.0f ? exp2f(mw - M) : 0.0f;
    const float l = warp_sum(wt * lw);
    if (lane < kRowsWarps) wt_s[g * kRowsWarps + lane] = l > 0.0f ? wt / l : 0.0f;
  }
  __syncthreads();
  T* orow = a.out + (static_cast<int64_t>(slot) * a.NH + h0) * HS;
  for (int i = threadIdx.x; i < G * HS; i += blockDim.x) {
    const int g = i / HS, d = i % HS;
    float o = 0.0f;
#pragma unroll
    for (int w = 0; w < kRowsWarps; ++w) o += wt_s[g * kRowsWarps + w] * acc_w[(w * kH + g) * HS + d];
    orow[i] = from_f32<T>(o);
  }
}
}  // namespace

bool rows_kernel_takes(DType dt, const DecodeShape& s) {
  const int64_t blocks =
      static_cast<int64_t>(s.S) * s.NKV * head_chunks(s.NH / s.NKV, kRowsMaxHeads).chunks;
  return (dt == DType::kBF16 || dt == DType::kF16) && s.HS == kRowsHS && s.cap <= kRowsMaxCap &&
         blocks <= kRowsMaxBlocks;
}

template <typename T>
void launch_rows(Context& ctx, AttnArgs<T> a, const RopeFreqs& f, int S) {
  // One query head per block while that fits in one wave (batch 1: 9 blocks for SmolLM2 rather
  // than 3): a warp's chunk then costs one head's dot products and P·V, not four (the four-head
  // kernel is a chain of ~770 instructions per warp at ~19 cycles each, ncu).
  // With one head a block the kernel takes 96–114 registers a thread (by build; P·V's tensor-core
  // path), or 64 with 40 bytes spilled when bounded to 2 blocks an SM. At a few blocks (batch 1: 9 for SmolLM2) the unbounded kernel was faster (+0.8% a
  // step, prompt 128; +4% at 1,536); at batch 8 (72 blocks) 3.5% slower than the bounded one
  // (H200, forge bench generate, one GPU run): a 512-thread block of ~100 registers leaves too
  // few for the neighbouring kernels' blocks that PDL starts early on the same SM. The switch
  // at 32 blocks lies between the two measured points.
  auto go = [&](auto heads, auto min_blocks) {
    constexpr int kH = decltype(heads)::value;
    const HeadChunks rc = head_chunks(a.group, kH);
    a.chunk_heads = rc.heads;
    a.chunks = rc.chunks;
    auto kernel = decode_attention_rows_kernel<T, kH, decltype(min_blocks)::value>;
    FORGE_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          RowsSmem<kH>::kBytes));
    launch_pdl(ctx, kernel, dim3(a.NKV * rc.chunks, S), dim3(32 * kRowsWarps), RowsSmem<kH>::kBytes,
               a, f);
  };
  using One = std::integral_constant<int, 1>;
  using Two = std::integral_constant<int, 2>;
  const int64_t one_head_blocks = static_cast<int64_t>(S) * a.NH;
  if (one_head_blocks <= 32)
    go(One{}, One{});
  else if (one_head_blocks <= kRowsMaxBlocks)
    go(One{}, Two{});
  else
    go(std::integral_constant<int, kRowsMaxHeads>{}, One{});
}

template void launch_rows<bf16>(Context&, AttnArgs<bf16>, const RopeFreqs&, int);
template void launch_rows<f16>(Context&, AttnArgs<f16>, const RopeFreqs&, int);

}  // namespace forge::cuda::decode_attn
