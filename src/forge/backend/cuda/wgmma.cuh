// Hopper warpgroup MMA (wgmma, sm_90a) for the flash-attention kernels: shared-memory tile
// layout, matrix descriptors, and the asynchronous m64nNk16 products with f32 accumulators.
//
// A warpgroup is four consecutive warps (the first one's index divisible by 4). One wgmma
// computes a 64 × N × 16 product: A (64 × 16) comes from shared memory through a descriptor, or
// from registers; B (16 × N) always from shared memory. Warp w of the group holds rows 16w ..
// 16w + 15 of the accumulator in the same per-warp layout as mma.sync's m16n8 tiles
// (flash_mma.cuh): d[nt][0..1] = row g, columns 8nt + c, c + 1; d[nt][2..3] = row g + 8. The
// register A fragment of a k-step is mma.sync's A fragment, so acc_to_a() makes it from an
// accumulator.
//
// Tile layout ("SW128"): an R × D tile of 16-bit elements is D/64 column blocks of R rows × 128
// bytes, block b at byte offset b·R·128, and within a row the eight 16-byte chunks are permuted
// by XOR with (row mod 8) — the hardware's 128-byte swizzle, so the tile base must be 1024-byte
// aligned. The same tile is read two ways:
//   K-major (reduction along a row): Q·Kᵀ-type products; descriptor start = the k-step's
//     column block + 32 bytes per k-step inside it, stride between 8-row groups (SBO) 1024.
//   MN-major (reduction down the rows, .trans): P·V-type products; start = the k-step's first
//     row (16 rows = 2048 bytes per k-step), SBO 1024 between 8-row groups, LBO R·128 between
//     column blocks.
// Ordering: the tiles arrive by TMA (async proxy, like wgmma's reads), completing on mbarriers;
// registers written between wgmmas need wgmma_fence() first.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <type_traits>

#include "forge/backend/cuda/flash_mma.cuh"

namespace forge::cuda::flash {

// The tensor maps of a call (tensor_map.h): q, k, v, and o = the output's layout (dout in the
// backward). Passed by value as a __grid_constant__ kernel parameter.
struct FlashMaps {
  CUtensorMap q, k, v, o;
};

// Registers per producer thread, and per consumer thread for kWG consumer warpgroups.
// setmaxnreg moves registers within the block's launch allocation (the __launch_bounds__ cap
// times the threads), not the whole register file: with 384 threads (cap 168) a 24-register
// producer frees exactly the 2 × 128 × 72 that lifts two consumer warpgroups to 240. A build
// with a 32-register producer and 240-register consumers hung in its first wgmma test on the
// H200: the consumers' setmaxnreg.inc waits for registers nobody frees.
constexpr int kProducerRegs = 24;
template <int kWG>
constexpr int launch_regs() {
  return 65536 / ((kWG + 1) * 128) / 8 * 8;
}
template <int kWG>
constexpr int consumer_regs() {
  const int pool = launch_regs<kWG>() * (kWG + 1) * 128 - 128 * kProducerRegs;
  const int r = pool / (kWG * 128) / 8 * 8;
  return r > 256 ? 256 : r;
}
static_assert(consumer_regs<2>() == 240 && consumer_regs<3>() == 160, "the configurations measured on the H200");

// Byte offset of element (row, col) in an SW128 tile of R rows; col % 8 == 0.
template <int R>
__device__ __forceinline__ uint32_t sw128(int row, int col) {
  return (col >> 6) * (R * 128) + row * 128 + ((((col >> 3) & 7) ^ (row & 7)) << 4);
}

// Descriptor of an SW128 operand starting at shared address `addr` (see the header).
__device__ __forceinline__ uint64_t sw128_desc(uint32_t addr, uint32_t lbo_bytes) {
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | (static_cast<uint64_t>(lbo_bytes >> 4) << 16) |
         (static_cast<uint64_t>(1024 >> 4) << 32) | (1ull << 62);
}
// K-major: rows [row0, row0 + 64 or N) of an R-row tile, k-step ks (columns 16ks .. 16ks + 15).
template <int R>
__device__ __forceinline__ uint64_t desc_k(uint32_t tile, int row0, int ks) {
  return sw128_desc(tile + (ks >> 2) * (R * 128) + row0 * 128 + (ks & 3) * 32, 16);
}
// MN-major: rows 16ks .. 16ks + 15 of an R-row tile (the reduction), all its columns (N).
template <int R>
__device__ __forceinline__ uint64_t desc_mn(uint32_t tile, int ks) {
  return sw128_desc(tile + ks * 2048, R * 128);
}

// wgmma exists only in the sm_90a target; the build's portable compute_90 PTX gets traps in its
// place (never reached: use_wgmma() picks these kernels on a 9.x device only, which runs the
// sm_90a code).
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define FORGE_WGMMA_ENABLED 1
#else
#define FORGE_WGMMA_ENABLED 0
#endif

__device__ __forceinline__ void wgmma_fence() {
#if FORGE_WGMMA_ENABLED
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wgmma_commit() {
#if FORGE_WGMMA_ENABLED
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
template <int N>
__device__ __forceinline__ void wgmma_wait() {
#if FORGE_WGMMA_ENABLED
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}

// ---- mbarriers, bulk tensor copies (TMA), register reallocation ----------------------------
// The kernels are warp-specialized: one producer warpgroup whose first thread issues TMA copies
// that complete on a stage's "full" mbarrier (expect_tx bytes), and consumer warpgroups that
// wait on it and arrive on the stage's "empty" mbarrier when their wgmmas have read it.

__device__ __forceinline__ void mbar_init(uint32_t bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// Makes the initialised barriers visible to the copy engine; a __syncthreads() must follow.
__device__ __forceinline__ void mbar_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// Blocks until the barrier's phase with the given parity has completed.
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred done;\nWAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}
// Box (x = first column, y = first token, z = batch) of a tensor map (tensor_map.h) into shared
// memory at dst, completing on bar.
__device__ __forceinline__ void tma_load(uint32_t dst, const void* map, int x, int y, int z, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], "
      "[%5];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(x), "r"(y), "r"(z), "r"(bar)
      : "memory");
}
// An R-row SW128 tile of D columns (D/64 boxes) from rows [row0, row0 + R) at column col0.
template <int R, int D>
__device__ __forceinline__ void tma_tile(uint32_t dst, const void* map, int col0, int row0, int batch, uint32_t bar) {
#pragma unroll
  for (int cb = 0; cb < D / 64; ++cb) tma_load(dst + cb * R * 128, map, col0 + cb * 64, row0, batch, bar);
}
// The barriers of a warp-specialized kernel, 8 bytes each from bar_resident: the resident
// tiles' barrier (loaded once; one arrival with their bytes), then full[kStages] (full_count
// arrivals each) and empty[kStages] (one arrival per consumer thread). Thread 0 initialises;
// every thread of the block must call (it ends in a __syncthreads).
template <int kStages>
__device__ __forceinline__ void init_stage_barriers(uint32_t bar_resident, int full_count, int consumers) {
  if (threadIdx.x == 0) {
    mbar_init(bar_resident, 1);
    for (int s = 0; s < kStages; ++s) {
      mbar_init(bar_resident + 8 + 8 * s, full_count);
      mbar_init(bar_resident + 8 + 8 * (kStages + s), consumers);
    }
    mbar_init_fence();
  }
  __syncthreads();
}

// The producer thread's stream of the forward and dQ kernels: key tiles kt_begin .. kt_begin +
// n_kt − 1 of kv head kvh, K then V (BK × D each), tile i into stage i % kStages at sKV once
// the consumers have released its previous use.
template <int BK, int D, int kStages>
__device__ __forceinline__ void produce_kv(uint32_t sKV, uint32_t bar_full, uint32_t bar_empty, const FlashMaps& maps,
                                           int kvh, int b, int kt_begin, int n_kt) {
  constexpr int kStageBytes = 2 * BK * D * 2;
  for (int i = 0; i < n_kt; ++i) {
    const int s = i % kStages;
    if (i >= kStages) mbar_wait(bar_empty + 8 * s, (i / kStages - 1) & 1);
    const uint32_t sK = sKV + s * kStageBytes;
    mbar_expect_tx(bar_full + 8 * s, kStageBytes);
    tma_tile<BK, D>(sK, &maps.k, kvh * D, (kt_begin + i) * BK, b, bar_full + 8 * s);
    tma_tile<BK, D>(sK + BK * D * 2, &maps.v, kvh * D, (kt_begin + i) * BK, b, bar_full + 8 * s);
  }
}

// A barrier among `threads` threads (a multiple of 32) of the block, id 1..15 (0 is
// __syncthreads'); the consumer warpgroups use it without stopping the producer.
__device__ __forceinline__ void named_bar_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
// Orders this thread's earlier shared-memory stores (generic proxy) before later reads by wgmma
// or TMA (async proxy); a barrier after it extends that to the threads that pass it.
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

template <int N>
__device__ __forceinline__ void setmaxnreg_dec() {
#if FORGE_WGMMA_ENABLED
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
#endif
}
template <int N>
__device__ __forceinline__ void setmaxnreg_inc() {
#if FORGE_WGMMA_ENABLED
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
#endif
}

// Keeps the compiler from moving accesses of an accumulator across a wgmma's issue and wait.
template <int NT>
__device__ __forceinline__ void fence_acc(float (&d)[NT][4]) {
#pragma unroll
  for (int i = 0; i < NT; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+f"(d[i][e])::"memory");
}

// d (64 × N, f32) = A·B (+ d when accumulate ≠ 0), one k-step of 16. wgmma_ss: A from shared
// memory (K-major); wgmma_rs: A from registers. kTransB = 0: B K-major; 1: B MN-major.
#define FORGE_ACC4(d, i) "+f"(d[i][0]), "+f"(d[i][1]), "+f"(d[i][2]), "+f"(d[i][3])

#define FORGE_WGMMA(TY) \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n" \
               "wgmma.mma_async.sync.aligned.m64n32k16.f32." TY "." TY " " \
               "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, " \
               "%16, %17, p, 1, 1, 0, %19;\n}\n" \
               : FORGE_ACC4(d, 0), FORGE_ACC4(d, 1), FORGE_ACC4(d, 2), FORGE_ACC4(d, 3) \
               : "l"(da), "l"(db), "r"(accumulate), "n"(kTransB))
template <typename T, int kTransB>
__device__ __forceinline__ void wgmma_ss(float (&d)[4][4], uint64_t da, uint64_t db, int accumulate) {
#if FORGE_WGMMA_ENABLED
  if constexpr (std::is_same_v<T, bf16>) FORGE_WGMMA("bf16");
  else FORGE_WGMMA("f16");
#else
  __trap();
#endif
}
#undef FORGE_WGMMA

#define FORGE_WGMMA(TY) \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n" \
               "wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY " " \
               "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, " \
               "%32, %33, p, 1, 1, %36, %35;\n}\n" \
               : FORGE_ACC4(d, 0), FORGE_ACC4(d, 1), FORGE_ACC4(d, 2), FORGE_ACC4(d, 3), FORGE_ACC4(d, 4), FORGE_ACC4(d, 5), FORGE_ACC4(d, 6), FORGE_ACC4(d, 7) \
               : "l"(da), "l"(db), "r"(accumulate), "n"(kTransB), "n"(kTransA))
// kTransA = 1: A MN-major (desc_mn of a tile whose rows are the reduction), as B with kTransB.
template <typename T, int kTransB, int kTransA = 0>
__device__ __forceinline__ void wgmma_ss(float (&d)[8][4], uint64_t da, uint64_t db, int accumulate) {
#if FORGE_WGMMA_ENABLED
  if constexpr (std::is_same_v<T, bf16>) FORGE_WGMMA("bf16");
  else FORGE_WGMMA("f16");
#else
  __trap();
#endif
}
#undef FORGE_WGMMA

#define FORGE_WGMMA(TY) \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n" \
               "wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY " " \
               "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, " \
               "{%32, %33, %34, %35}, %36, p, 1, 1, %38;\n}\n" \
               : FORGE_ACC4(d, 0), FORGE_ACC4(d, 1), FORGE_ACC4(d, 2), FORGE_ACC4(d, 3), FORGE_ACC4(d, 4), FORGE_ACC4(d, 5), FORGE_ACC4(d, 6), FORGE_ACC4(d, 7) \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(accumulate), "n"(kTransB))
template <typename T, int kTransB>
__device__ __forceinline__ void wgmma_rs(float (&d)[8][4], const uint32_t (&a)[4], uint64_t db, int accumulate) {
#if FORGE_WGMMA_ENABLED
  if constexpr (std::is_same_v<T, bf16>) FORGE_WGMMA("bf16");
  else FORGE_WGMMA("f16");
#else
  __trap();
#endif
}
#undef FORGE_WGMMA

#define FORGE_WGMMA(TY) \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n" \
               "wgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY " " \
               "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, " \
               "%64, %65, p, 1, 1, 0, %67;\n}\n" \
               : FORGE_ACC4(d, 0), FORGE_ACC4(d, 1), FORGE_ACC4(d, 2), FORGE_ACC4(d, 3), FORGE_ACC4(d, 4), FORGE_ACC4(d, 5), FORGE_ACC4(d, 6), FORGE_ACC4(d, 7), FORGE_ACC4(d, 8), FORGE_ACC4(d, 9), FORGE_ACC4(d, 10), FORGE_ACC4(d, 11), FORGE_ACC4(d, 12), FORGE_ACC4(d, 13), FORGE_ACC4(d, 14), FORGE_ACC4(d, 15) \
               : "l"(da), "l"(db), "r"(accumulate), "n"(kTransB))
template <typename T, int kTransB>
__device__ __forceinline__ void wgmma_ss(float (&d)[16][4], uint64_t da, uint64_t db, int accumulate) {
#if FORGE_WGMMA_ENABLED
  if constexpr (std::is_same_v<T, bf16>) FORGE_WGMMA("bf16");
  else FORGE_WGMMA("f16");
#else
  __trap();
#endif
}
#undef FORGE_WGMMA

#define FORGE_WGMMA(TY) \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n" \
               "wgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY " " \
               "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, " \
               "{%64, %65, %66, %67}, %68, p, 1, 1, %70;\n}\n" \
               : FORGE_ACC4(d, 0), FORGE_ACC4(d, 1), FORGE_ACC4(d, 2), FORGE_ACC4(d, 3), FORGE_ACC4(d, 4), FORGE_ACC4(d, 5), FORGE_ACC4(d, 6), FORGE_ACC4(d, 7), FORGE_ACC4(d, 8), FORGE_ACC4(d, 9), FORGE_ACC4(d, 10), FORGE_ACC4(d, 11), FORGE_ACC4(d, 12), FORGE_ACC4(d, 13), FORGE_ACC4(d, 14), FORGE_ACC4(d, 15) \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(accumulate), "n"(kTransB))
template <typename T, int kTransB>
__device__ __forceinline__ void wgmma_rs(float (&d)[16][4], const uint32_t (&a)[4], uint64_t db, int accumulate) {
#if FORGE_WGMMA_ENABLED
  if constexpr (std::is_same_v<T, bf16>) FORGE_WGMMA("bf16");
  else FORGE_WGMMA("f16");
#else
  __trap();
#endif
}
#undef FORGE_WGMMA
#undef FORGE_ACC4

}  // namespace forge::cuda::flash
