// CUDA row sampler: the GPU twin of backend/cpu/sample.cpp (algorithm in ops/sample.h), one
// block of 1024 threads per row, every input read from device memory, no allocation and no host
// sync, so the decode step's graph captures it.
//
// Agreement with the CPU. Both twins run the arithmetic of ops/sample_math.h — IEEE-exact
// operations only (the _rn intrinsics here), their own log and exp instead of libm's, top-p
// weights in 2^-40 fixed point summed as integers — so the penalty, z, the thresholds and every
// Gumbel score are the same bits on both, and so is the chosen id: the GPU's reduction order
// cannot change an integer sum, a max or an argmax with the lowest id winning ties. The tests
// require equal ids, no tolerance.
//
// Per row (blockIdx.x = s), in passes over the row. Each pass re-reads the row from L2 and
// recomputes z = l / T rather than staging it: 152k f32 values do not fit in shared memory, and
// a global copy would need a scratch argument.
//  1. temperature <= 0: greedy, taken first. One pass of 16-byte loads (4 per thread in flight),
//     a (value, id) argmax in shuffles. The batch-1 decode path does nothing else.
//  2. m = max z, only when top-p or min-p needs it (one plain pass, ~18 µs at V = 152k).
//  3. Thresholds without a sort: radix select over order keys (sample_math.h's order_key,
//     a < b ⇔ key(a) < key(b)), three passes over the key digits 31..20, 19..8 and 7..0. Each
//     builds a shared-memory histogram (4096 or 256 bins) of the elements whose key matches the
//     digits chosen so far, then scans it from the top bin down (a block scan, 4 bins per
//     thread) for the bin where the running sum first satisfies the predicate. top-k counts
//     elements (predicate ≥ k); top-p sums fixed-point weights over the top-k set (predicate
//     ≥ top_p · total, the total read off the first histogram). Three passes give the exact key
//     of the k-th largest z, or of τ, where bisection over the key would take 32. The 12-bit
//     first digit (sign, exponent and 3 mantissa bits) spreads logits over dozens of bins, which
//     keeps same-address atomics down. The histograms are 32-bit words: with 64-bit shared
//     atomicAdd (apparently a compare-and-swap loop on sm_90) top-k took 300 µs at V = 152k,
//     with a count in one word and a weight sum as hi·2^32 + lo (the add that wraps lo carries
//     into hi) 123 µs. min-p's threshold is computed: m + ln(min_p), at most m.
//  4. Gumbel-max over {key(z) ≥ max of the thresholds}: each thread takes 4 consecutive ids
//     per Philox block; a candidate whose z plus its noise bucket's bound (gumbel_bucket_bound,
//     256 floats in shared memory) is below the thread's best score skips the two logarithms,
//     as nearly all do once a thread has seen a few candidates. A block argmax; thread 0 writes
//     out[s] and sets seen[s, id].
//
// Measured on the H200 (bf16 logits, random normal rows, per call in a graph of 100 calls):
//   greedy       S=1  V=49152    5.7 µs     greedy       S=1  V=151936  13.5 µs
//   greedy       S=64 V=151936  14.1 µs     temperature  S=1  V=49152   32.7 µs
//   temperature  S=1  V=151936  75.6 µs     top_k=50     S=1  V=151936   123 µs
//   top_p=0.9    S=1  V=49152   79.8 µs     top_p=0.9    S=1  V=151936   216 µs
//   top_k+top_p  S=1  V=151936   228 µs     min_p=0.05   S=1  V=151936  93.5 µs
//   top_p=0.9    S=64 V=151936   222 µs
// Two Philox chains per iteration and 6 loads in flight in the greedy pass measured the same
// (75.6 vs 75.1 µs, 5.69 vs 5.70 µs), so the simpler loops stayed. One block per row keeps the
// passes free of grid-wide synchronisation, so S = 1 runs on one SM: the sampling passes are
// bound by that SM's throughput, and splitting each row over several blocks (partial
// histograms and argmaxes in a scratch buffer, one more kernel per pass) is the next step if
// sampling shows up in the decode profile.
//
// ptxas (sm_90a, CUDA 13.0, -Xptxas=-v): sample_rows_kernel<float, bf16, f16> 64 registers each
// (the cap for 1024 threads), 0 spill, 0 stack, 34,320 bytes of static shared memory.
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>

#include "forge/backend/cuda/context.h"
#include "forge/backend/cuda/kernel_utils.cuh"
#include "forge/backend/cuda/sample.h"
#include "forge/core/error.h"
#include "forge/ops/sample_math.h"

namespace forge::cuda {
namespace {

using namespace kernels;
using namespace forge::sampling;

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;  // = 32: one warp can read every warp's partial
constexpr int kBins = 4096;            // the 12-bit radix digits
constexpr int kUnroll = 4;             // loads in flight per thread in the row passes
constexpr unsigned kFull = 0xffffffffu;

struct SampleShared {
  // Radix histogram in 32-bit words (shared-memory atomics are native for 32 bits; a 64-bit add
  // is a compare-and-swap loop, which the first, contended pass spent ~200 µs in at V = 152k):
  // a count in lo; a weight sum as hi·2^32 + lo, the add that wraps lo carrying into hi.
  uint32_t hist_lo[kBins];
  uint32_t hist_hi[kBins];
  float bound[256];  // gumbel_bucket_bound per top byte of the Philox word
  unsigned long long red64[kWarps];
  float redf[kWarps];
  int redi[kWarps];
  uint32_t sel_digit;
  unsigned long long sel_above;
};

// One row's view: penalty (seen is null when it is off) and temperature.
template <typename T>
struct Row {
  const T* logits;      // (Vp)
  const uint8_t* seen;  // (V) or null
  float rp, temperature;
  int V;
  __device__ float logit(float raw, int i) const {
    return penalized(raw, rp, seen != nullptr && seen[i] != 0);
  }
  __device__ float z(float raw, int i) const { return scaled(logit(raw, i), temperature); }
};

// (a, ia) beats (b, ib): larger value, then lower id. Values are never NaN here.
__device__ __forceinline__ bool better(float a, int ia, float b, int ib) {
  return a > b || (a == b && ia < ib);
}

// The block's best (value, id); valid in every thread.
__device__ int block_argmax(float v, int id, SampleShared& sh) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(kFull, v, o);
    const int oi = __shfl_xor_sync(kFull, id, o);
    if (better(ov, oi, v, id)) v = ov, id = oi;
  }
  __syncthreads();  // redf / redi may still be read by a previous call
  if (lane == 0) sh.redf[warp] = v, sh.redi[warp] = id;
  __syncthreads();
  v = sh.redf[lane], id = sh.redi[lane];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(kFull, v, o);
    const int oi = __shfl_xor_sync(kFull, id, o);
    if (better(ov, oi, v, id)) v = ov, id = oi;
  }
  return id;
}

__device__ float block_max(float v, SampleShared& sh) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(kFull, v, o));
  __syncthreads();
  if (lane == 0) sh.redf[warp] = v;
  __syncthreads();
  v = sh.redf[lane];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(kFull, v, o));
  return v;
}

// Exclusive prefix sum of x in thread order; *total = the block's sum. Integer: exact.
__device__ unsigned long long block_exclusive_scan(unsigned long long x, SampleShared& sh,
                                                   unsigned long long* total) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  unsigned long long incl = x;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const unsigned long long y = __shfl_up_sync(kFull, incl, o);
    if (lane >= o) incl += y;
  }
  __syncthreads();
  if (lane == 31) sh.red64[warp] = incl;
  __syncthreads();
  const unsigned long long mine = sh.red64[lane];
  unsigned long long t = mine;  // every warp scans the 32 warp sums itself
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const unsigned long long y = __shfl_up_sync(kFull, t, o);
    if (lane >= o) t += y;
  }
  const unsigned long long warp_incl = __shfl_sync(kFull, t, warp);
  const unsigned long long warp_own = __shfl_sync(kFull, mine, warp);
  *total = __shfl_sync(kFull, t, 31);
  return warp_incl - warp_own + incl - x;
}

// f(i, z_i) for every i < V of this thread's share, kUnroll rows' worth of loads in flight.
template <typename T, typename F>
__device__ __forceinline__ void for_each_z(const Row<T>& r, F&& f) {
  for (int i0 = threadIdx.x; i0 < r.V; i0 += kUnroll * kThreads) {
    float raw[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int i = i0 + u * kThreads;
      raw[u] = i < r.V ? to_f32(r.logits[i]) : 0.0f;
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int i = i0 + u * kThreads;
      if (i < r.V) f(i, r.z(raw[u], i));
    }
  }
}

// Greedy: the first maximum of the penalised logits.
template <typename T>
__device__ int greedy(const Row<T>& r, bool vec, SampleShared& sh) {
  float best = -kInf;
  int best_id = INT_MAX;
  if (vec) {  // 16-byte loads: the row is 16-byte aligned and Vp·sizeof(T) a multiple of 16
    constexpr int kN = kVec<T>;
    const int nv = (r.V + kN - 1) / kN;
    for (int q0 = threadIdx.x; q0 < nv; q0 += kUnroll * kThreads) {
      float v[kUnroll][kN];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int q = q0 + u * kThreads;
        if (q < nv) load<T, kN>(r.logits + static_cast<int64_t>(q) * kN, v[u]);
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int q = q0 + u * kThreads;
        if (q >= nv) continue;
#pragma unroll
        for (int k = 0; k < kN; ++k) {
          const int i = q * kN + k;
          if (i >= r.V) continue;
          const float l = r.logit(v[u][k], i);
          if (better(l, i, best, best_id)) best = l, best_id = i;
        }
      }
    }
  } else {
    for (int i0 = threadIdx.x; i0 < r.V; i0 += kUnroll * kThreads) {
      float raw[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int i = i0 + u * kThreads;
        raw[u] = i < r.V ? to_f32(r.logits[i]) : 0.0f;
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int i = i0 + u * kThreads;
        if (i >= r.V) continue;
        const float l = r.logit(raw[u], i);
        if (better(l, i, best, best_id)) best = l, best_id = i;
      }
    }
  }
  return block_argmax(best, best_id, sh);
}

__device__ __forceinline__ unsigned long long bin_value(const SampleShared& sh, int b) {
  return (static_cast<unsigned long long>(sh.hist_hi[b]) << 32) | sh.hist_lo[b];
}

// Radix select over the keys of z (elements with key < floor excluded): the largest key t with
// Σ_{key_i >= t} w_i >= target, w_i = 1 (kMass false; target = k) or the fixed-point weight of
// e^(z_i − m) (kMass; target = top_p · Σ w over the floor, known after the first pass). Returns
// false when that target is not positive (no mass to split: the caller keeps key(m)).
template <bool kMass, typename T>
__device__ bool radix_select(const Row<T>& r, uint32_t floor, float m, double k_or_top_p,
                             SampleShared& sh, uint32_t* result) {
  uint32_t prefix = 0;
  unsigned long long above = 0;  // Σ w over keys above the current digit's range
  double target = kMass ? 0.0 : k_or_top_p;
#pragma unroll 1
  for (int pass = 0; pass < 3; ++pass) {
    const int bits = pass == 2 ? 8 : 12, shift = pass == 0 ? 20 : pass == 1 ? 8 : 0;
    const int nb = 1 << bits, hi = shift + bits;  // key bits from `hi` up must match the prefix
    for (int b = threadIdx.x; b < nb; b += kThreads) sh.hist_lo[b] = 0, sh.hist_hi[b] = 0;
    __syncthreads();
    const uint64_t want_hi = static_cast<uint64_t>(prefix) >> hi;
    for_each_z(r, [&](int, float z) {
      const uint32_t key = order_key(z);
      if (key < floor || (static_cast<uint64_t>(key) >> hi) != want_hi) return;
      const uint32_t d = (key >> shift) & static_cast<uint32_t>(nb - 1);
      if constexpr (kMass) {
        const unsigned long long w = mass_fixed(exp_f32(fsub(z, m)));
        if (w == 0) return;
        const uint32_t lo = static_cast<uint32_t>(w), hi = static_cast<uint32_t>(w >> 32);
        const uint32_t old = atomicAdd(&sh.hist_lo[d], lo);
        const uint32_t carry = old + lo < old ? 1u : 0u;  // this add wrapped lo
        if (hi + carry != 0) atomicAdd(&sh.hist_hi[d], hi + carry);
      } else {
        atomicAdd(&sh.hist_lo[d], 1u);
      }
    });
    __syncthreads();
    // Thread t owns `per` bins from nb − 1 − t·per downwards, so thread order is key order
    // from the top and the exclusive scan gives each thread the sum of all higher bins.
    const int per = nb >= kThreads ? nb / kThreads : 1;
    const bool owner = static_cast<int>(threadIdx.x) * per < nb;
    const int top = nb - 1 - static_cast<int>(threadIdx.x) * per;
    unsigned long long own = 0;
    if (owner)
      for (int j = 0; j < per; ++j) own += bin_value(sh, top - j);
    unsigned long long total = 0;
    const unsigned long long higher = block_exclusive_scan(own, sh, &total);
    if (kMass && pass == 0) {
      target = top_p_target(static_cast<float>(k_or_top_p), total);
      if (!(target > 0.0)) return false;  // same in every thread: total is the block's sum
    }
    // The sums are monotone and the predicate fails at `above` (invariant), so exactly one
    // owner sees it turn true inside its bins.
    unsigned long long run = above + higher;
    if (owner && !(static_cast<double>(run) >= target) &&
        static_cast<double>(run + own) >= target) {
      for (int j = 0; j < per; ++j) {
        const unsigned long long h = bin_value(sh, top - j);
        if (static_cast<double>(run + h) >= target) {
          sh.sel_digit = static_cast<uint32_t>(top - j);
          sh.sel_above = run;
          break;
        }
        run += h;
      }
    }
    __syncthreads();
    prefix |= sh.sel_digit << shift;
    above = sh.sel_above;
  }
  *result = prefix;
  return true;
}

// Gumbel-max over {i : key(z_i) >= floor}: the first maximum of z_i + g_i.
template <typename T>
__device__ int gumbel_max(const Row<T>& r, uint32_t floor, uint64_t seed, int32_t pos,
                          SampleShared& sh) {
  for (int b = threadIdx.x; b < 256; b += kThreads) sh.bound[b] = gumbel_bucket_bound(b);
  __syncthreads();
  const uint2 key = make_uint2(static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
  float best = -kInf;
  int best_id = INT_MAX;
  const int nq = (r.V + 3) / 4;
  for (int q = threadIdx.x; q < nq; q += kThreads) {
    float raw[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) raw[j] = 4 * q + j < r.V ? to_f32(r.logits[4 * q + j]) : 0.0f;
    const uint4 w4 = philox4x32_10(
        make_uint4(static_cast<uint32_t>(q), static_cast<uint32_t>(pos), 0u, kSampleStream), key);
    const uint32_t w[4] = {w4.x, w4.y, w4.z, w4.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int i = 4 * q + j;
      if (i >= r.V) break;
      const float z = r.z(raw[j], i);
      if (order_key(z) < floor || fadd(z, sh.bound[w[j] >> 24]) < best) continue;
      const float score = fadd(z, gumbel(w[j]));
      if (better(score, i, best, best_id)) best = score, best_id = i;
    }
  }
  return block_argmax(best, best_id, sh);
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    sample_rows_kernel(int32_t* __restrict__ out, const T* __restrict__ logits,
                       const SamplerSettings* __restrict__ settings, uint8_t* __restrict__ seen,
                       const int32_t* __restrict__ pos, int V, int Vp, bool vec) {
  __shared__ SampleShared sh;
  const int s = blockIdx.x;
  const SamplerSettings st = settings[s];
  uint8_t* seen_row = seen ? seen + static_cast<int64_t>(s) * V : nullptr;
  const Row<T> r{logits + static_cast<int64_t>(s) * Vp,
                 st.repetition_penalty != 1.0f ? seen_row : nullptr, st.repetition_penalty,
                 st.temperature, V};
  int id;
  if (st.temperature <= 0.0f) {
    id = greedy(r, vec, sh);
  } else {
    const bool top_k = st.top_k > 0 && st.top_k < V, top_p = st.top_p<1.0f, min_p = st.min_p> 0.0f;
    float m = 0.0f;
    if (top_p || min_p) {
      float v = -kInf;
      for_each_z(r, [&](int, float z) { v = fmaxf(v, z); });
      m = block_max(v, sh);
    }
    uint32_t floor = 0;  // keep key(z) >= floor
    if (top_k) radix_select<false>(r, 0u, m, st.top_k, sh, &floor);
    if (top_p) {
      uint32_t tau = 0;
      if (!radix_select<true>(r, floor, m, st.top_p, sh, &tau)) tau = order_key(m);
      floor = max(floor, tau);
    }
    if (min_p)
      floor = max(floor, min(order_key(scaled(fadd(m, log_f32(st.min_p)), 1.0f)), order_key(m)));
    id = gumbel_max(r, floor, st.seed, pos[s], sh);
  }
  if (threadIdx.x == 0) {
    out[s] = id;
    if (seen_row) seen_row[id] = 1;
  }
}

__global__ void gumbel_noise_kernel(float* g, uint64_t seed, int32_t pos, int n) {
  const uint2 key = make_uint2(static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    const uint4 w4 = philox4x32_10(
        make_uint4(static_cast<uint32_t>(i / 4), static_cast<uint32_t>(pos), 0u, kSampleStream),
        key);
    const uint32_t w[4] = {w4.x, w4.y, w4.z, w4.w};
    g[i] = gumbel(w[i % 4]);
  }
}

}  // namespace

void sample_rows(Context& ctx, DType dt, int32_t* out, const void* logits,
                 const SamplerSettings* settings, uint8_t* seen, const int32_t* pos, int S, int V,
                 int Vp) {
  if (S < 0 || V <= 0 || V > Vp)
    throw Error(
        str("[sample_rows] bad shape S=", S, " V=", V, " Vp=", Vp, " (want S >= 0, 0 < V <= Vp)"));
  if (S == 0) return;
  dispatch_dtype(dt, "sample_rows", [&](auto tag) {
    using T = decltype(tag);
    const bool vec = aligned16(logits) && (static_cast<int64_t>(Vp) * sizeof(T)) % 16 == 0;
    sample_rows_kernel<T><<<S, kThreads, 0, ctx.stream()>>>(out, static_cast<const T*>(logits),
                                                            settings, seen, pos, V, Vp, vec);
    FORGE_CUDA_CHECK_LAUNCH();
  });
}

void sample_gumbel_noise(Context& ctx, float* g, uint64_t seed, int32_t pos, int n) {
  if (n <= 0) return;
  gumbel_noise_kernel<<<grid_for(n, 256, ctx.num_sms()), 256, 0, ctx.stream()>>>(g, seed, pos, n);
  FORGE_CUDA_CHECK_LAUNCH();
}

}  // namespace forge::cuda
