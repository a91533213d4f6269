// The backward of a model-width RMSNorm or LayerNorm row and its weight (and bias) gradient in
// one kernel, for rmsnorm.cu and layernorm.cu. Private to those files (CUDA headers).
//
// Why: the row kernel reads x and dout to form dinp, and channel_grad's partial pass then read
// both again for dweight (and dbias). At a training step's sizes (N = 65,536 rows of C = 768 in
// bf16: 100 MB a tensor, twice the L2) that second read comes from DRAM: 54–58 µs a call on the
// H200 (the timelines of 2026-12-03), ~1.4 ms a step for llama-100m's 25 RMSNorms and GPT-2's 25
// LayerNorms. Here the rows' sums are kept while dinp is formed.
//
// Layout: one block per split, the splits fixed row ranges as channel_grad cuts them
// (norm_bwd_splits: a function of N alone, so the summation order is too); 8 warps, warp w
// takes rows r0 + w, r0 + w + 8, ...; lane l owns the channels (l + 32·j)·kN .. + kN − 1 of every
// row, j < kChunks (C ≤ 32·kN·kChunks), and keeps their sums in registers for the whole split.
// The row arithmetic is the row kernels' (two sweeps over the row); each warp's next row is
// copied into shared memory (cp.async) while the current one is computed, and both sweeps read
// the row from there.
// At the end the 8 warps' sums are added in warp order through shared memory and the block
// writes its partial row (kAcc rows of C floats); kernels::channel_grad_finish adds the splits
// in a fixed order. No atomics: bit-identical reruns.
#pragma once

#include <type_traits>

#include "forge/backend/cuda/flash_mma.cuh"  // cp.async
#include "forge/backend/cuda/kernel_utils.cuh"

namespace forge::cuda::kernels {

inline constexpr int kNormBwdWarps = 8;
inline constexpr int kNormBwdMaxLaneElems = 32;  // kChunks·kN: registers of one sum a lane

// Splits of N rows for the fused kernel: ranges of ≥ 64 rows, at most 1,024 of them (a block
// each: at N = 65,536 that is 64 rows a block, 8 a warp, ~2.6 waves of 3 blocks a SM).
inline int norm_bwd_splits(int N, int* rows_per_split) {
  constexpr int kMaxSplits = 1024, kMinRows = 64;
  int splits = (N + kMinRows - 1) / kMinRows;
  if (splits > kMaxSplits) splits = kMaxSplits;
  *rows_per_split = (N + splits - 1) / splits;
  return (N + *rows_per_split - 1) / *rows_per_split;  // no empty block
}

// dinp += the norm's input gradient (kLayerNorm: rstd·(dnorm − mean(dnorm) − norm·mean(dnorm·
// norm)); kRmsNorm: rstd·(dnorm − norm·mean(dnorm·norm)); dnorm = dout·w, norm = (x − mean)·rstd,
// mean 0 for RMSNorm); partial[split, 0, c] = Σ_rows dout·norm, for LayerNorm
// partial[split, 1, c] = Σ_rows dout, and with kRes the next row Σ_rows dinp (the updated
// values: the bias gradient of the linear layer whose output the residual stream's gradient is).
// Dynamic shared memory: (sums)·C floats.
template <ChannelGrad kKind, bool kRes>
inline constexpr int kNormBwdSums = kChannelAcc<kKind> + (kRes ? 1 : 0);

// Shared memory of the row pipeline: per warp kNormBwdStages rows of x, dout and dinp in 16-byte
// pieces, [stage][tensor][chunk][lane], so lane l reads back exactly the pieces it copied (no
// warp barrier) and a warp's 16-byte reads fall in distinct bank groups.
// Two stages: a third (110.6 KB a block at C ≤ 768, still 2 blocks a SM) measured no faster in
// training (GPT-2 551,054 / 548,229 tokens/s against 553,611 / 548,043 with two; H100, 2026-12-07).
inline constexpr int kNormBwdStages = 2;
inline constexpr int norm_bwd_stage_bytes(int chunks) { return 3 * chunks * 32 * 16; }

template <typename T, int kN, ChannelGrad kKind, int kChunks, bool kRes,
          int kStages = kNormBwdStages>
__global__ void __launch_bounds__(32 * kNormBwdWarps, 2)
    norm_bwd_fused_kernel(T* __restrict__ dinp, float* __restrict__ partial,
                          const T* __restrict__ dout, const T* __restrict__ inp,
                          const T* __restrict__ weight, const float* __restrict__ mean,
                          const float* __restrict__ rstd, int N, int C, int rows_per_split) {
  static_assert(kN * sizeof(T) == 16, "one 16-byte piece per lane and chunk");
  constexpr bool kLN = kKind == ChannelGrad::kLayerNorm;
  constexpr int kAcc = kNormBwdSums<kKind, kRes>;
  constexpr int kResRow = kAcc - 1;  // the row of Σ dinp when kRes
  constexpr int kStageBytes = norm_bwd_stage_bytes(kChunks);
  extern __shared__ __align__(16) unsigned char sh_raw[];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int r0 = blockIdx.x * rows_per_split;
  const int r1 = min(N, r0 + rows_per_split);
  unsigned char* my_rows = sh_raw + warp * kStages * kStageBytes;
  // Piece (stage, tensor 0 x | 1 dout | 2 dinp, chunk j) of this lane.
  auto piece = [&](int stage, int tensor, int j) {
    return my_rows + stage * kStageBytes + ((tensor * kChunks + j) * 32 + lane) * 16;
  };
  float dw[kChunks][kN], db[kChunks][kN], dr[kChunks][kN];
#pragma unroll
  for (int j = 0; j < kChunks; ++j)
#pragma unroll
    for (int k = 0; k < kN; ++k) dw[j][k] = 0.0f, db[j][k] = 0.0f, dr[j][k] = 0.0f;

  // The warp's rows are r0 + warp, + 8, ...: while one row is computed the next one's x, dout and
  // dinp are on their way into the other stage (cp.async, no registers held), so a row costs one
  // memory round trip shared with the previous row's arithmetic rather than two in sequence (x and
  // dout, the reductions, then dinp). The arithmetic is unchanged, and so are the results.
  auto fetch = [&](int row, int stage) {
    if (row < r1) {
      const int64_t off = static_cast<int64_t>(row) * C;
#pragma unroll
      for (int j = 0; j < kChunks; ++j) {
        const int c = (lane + 32 * j) * kN;
        if (c >= C) continue;
        flash::cp_async16(flash::smem_addr(piece(stage, 0, j)), inp + off + c, 16);
        flash::cp_async16(flash::smem_addr(piece(stage, 1, j)), dout + off + c, 16);
        flash::cp_async16(flash::smem_addr(piece(stage, 2, j)), dinp + off + c, 16);
      }
    }
    flash::cp_async_commit();  // an empty group past the end keeps the wait count uniform
  };
  // The row's mean and rstd are loaded one row ahead too (into registers).
  auto stats = [&](int row, float* m, float* s) {
    if (row < r1) *m = kLN ? mean[row] : 0.0f, *s = rstd[row];
  };
  int stage = 0;
  float m_next = 0.0f, s_next = 0.0f;
  stats(r0 + warp, &m_next, &s_next);
#pragma unroll
  for (int i = 0; i + 1 < kStages; ++i) fetch(r0 + warp + i * kNormBwdWarps, i);
  for (int row = r0 + warp; row < r1;
       row += kNormBwdWarps, stage = stage + 1 == kStages ? 0 : stage + 1) {
    const float m = m_next, s = s_next;
    stats(row + kNormBwdWarps, &m_next, &s_next);
    fetch(row + (kStages - 1) * kNormBwdWarps, stage == 0 ? kStages - 1 : stage - 1);
    flash::cp_async_wait<kStages - 1>();  // this lane's pieces of `row` have landed
    T* dx = dinp + static_cast<int64_t>(row) * C;
    float dnorm_sum = 0.0f, dnorm_norm_sum = 0.0f;
#pragma unroll
    for (int j = 0; j < kChunks; ++j) {
      const int c = (lane + 32 * j) * kN;
      if (c >= C) continue;
      float v[kN], g[kN], w[kN];
      load<T, kN>(reinterpret_cast<const T*>(piece(stage, 0, j)), v);
      load<T, kN>(reinterpret_cast<const T*>(piece(stage, 1, j)), g);
      load<T, kN>(weight + c, w);
#pragma unroll
      for (int k = 0; k < kN; ++k) {
        const float dnorm = g[k] * w[k];
        if constexpr (kLN) dnorm_sum += dnorm;
        dnorm_norm_sum += dnorm * ((v[k] - m) * s);
      }
    }
    const float dnorm_mean = kLN ? warp_sum(dnorm_sum) / C : 0.0f;
    const float dnorm_norm_mean = warp_sum(dnorm_norm_sum) / C;
#pragma unroll
    for (int j = 0; j < kChunks; ++j) {
      const int c = (lane + 32 * j) * kN;
      if (c >= C) continue;
      float v[kN], g[kN], w[kN], d[kN];
      load<T, kN>(reinterpret_cast<const T*>(piece(stage, 0, j)), v);
      load<T, kN>(reinterpret_cast<const T*>(piece(stage, 1, j)), g);
      load<T, kN>(weight + c, w);
      load<T, kN>(reinterpret_cast<const T*>(piece(stage, 2, j)), d);
#pragma unroll
      for (int k = 0; k < kN; ++k) {
        const float norm = (v[k] - m) * s;
        d[k] += (g[k] * w[k] - dnorm_mean - norm * dnorm_norm_mean) * s;
        dw[j][k] += g[k] * norm;
        if constexpr (kLN) db[j][k] += g[k];
      }
      store<T, kN>(dx + c, d);
      if constexpr (kRes) {  // the stored values: d rounded to T, as a later pass would read them
#pragma unroll
        for (int k = 0; k < kN; ++k) dr[j][k] += to_f32(from_f32<T>(d[k]));
      }
    }
  }
  flash::cp_async_wait<0>();
  __syncthreads();  // every warp is done with its rows: the stages become the sums' table

  // The warps' sums in warp order: warp 0 writes, each later warp adds its own.
  float* sh_sum = reinterpret_cast<float*>(sh_raw);  // (kAcc, C)
  for (int w = 0; w < kNormBwdWarps; ++w) {
    if (warp == w) {
#pragma unroll
      for (int j = 0; j < kChunks; ++j) {
        const int c = (lane + 32 * j) * kN;
        if (c >= C) continue;
#pragma unroll
        for (int k = 0; k < kN; ++k) {
          sh_sum[c + k] = (w == 0 ? 0.0f : sh_sum[c + k]) + dw[j][k];
          if constexpr (kLN) sh_sum[C + c + k] = (w == 0 ? 0.0f : sh_sum[C + c + k]) + db[j][k];
          if constexpr (kRes)
            sh_sum[kResRow * C + c + k] = (w == 0 ? 0.0f : sh_sum[kResRow * C + c + k]) + dr[j][k];
        }
      }
    }
    __syncthreads();
  }
  float* out = partial + static_cast<int64_t>(blockIdx.x) * kAcc * C;
  for (int i = threadIdx.x; i < kAcc * C; i += blockDim.x) out[i] = sh_sum[i];
}

// Enqueues the fused kernel and the finishing pass when the row fits it (16-byte lanes, C ≤
// 32·kN·kChunks for kChunks·kN ≤ kNormBwdMaxLaneElems); returns false (nothing enqueued) when
// not, for the caller's row kernel + channel_grad. dweight (and dbias for LayerNorm) +=, and
// dres (when not null) += Σ_rows of the updated dinp.
template <typename T, ChannelGrad kKind>
bool norm_bwd_fused(Context& ctx, T* dinp, float* dweight, float* dbias, float* dres, const T* dout,
                    const T* inp, const T* weight, const float* mean, const float* rstd, int N, int C,
                    bool vec) {
  constexpr int kN = kVec<T>;
  constexpr bool kLN = kKind == ChannelGrad::kLayerNorm;
  const int chunks = (C + 32 * kN - 1) / (32 * kN);
  if (!vec || dweight == nullptr || (kLN && dbias == nullptr) || chunks * kN > kNormBwdMaxLaneElems)
    return false;
  const int sums = kChannelAcc<kKind> + (dres ? 1 : 0);
  int rows_per_split = 0;
  const int splits = norm_bwd_splits(N, &rows_per_split);
  DeviceBuffer<float> partial(ctx.allocator(), static_cast<size_t>(splits) * sums * C);
  // The row stages, reused at the end for the warps' sums (3·C floats at most: 12 KB ≤ a stage).
  const size_t smem =
      static_cast<size_t>(kNormBwdWarps) * kNormBwdStages * norm_bwd_stage_bytes(chunks);
  auto go = [&](auto chunks_c) {
    constexpr int kChunks = decltype(chunks_c)::value;
    if constexpr (kChunks * kN <= kNormBwdMaxLaneElems) {
      const dim3 grid(splits), block(32 * kNormBwdWarps);
      auto launch = [&](auto kernel) {
        if (smem > 48 * 1024)
          FORGE_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                static_cast<int>(smem)));
        kernel<<<grid, block, smem, ctx.stream()>>>(dinp, partial.data(), dout, inp, weight, mean,
                                                    rstd, N, C, rows_per_split);
      };
      if (dres)
        launch(norm_bwd_fused_kernel<T, kN, kKind, kChunks, true>);
      else
        launch(norm_bwd_fused_kernel<T, kN, kKind, kChunks, false>);
    }
  };
  switch (chunks) {
    case 1: go(std::integral_constant<int, 1>{}); break;
    case 2: go(std::integral_constant<int, 2>{}); break;
    case 3: go(std::integral_constant<int, 3>{}); break;
    case 4: go(std::integral_constant<int, 4>{}); break;
    case 5: go(std::integral_constant<int, 5>{}); break;
    case 6: go(std::integral_constant<int, 6>{}); break;
    case 7: go(std::integral_constant<int, 7>{}); break;
    default: go(std::integral_constant<int, 8>{}); break;
  }
  FORGE_CUDA_CHECK_LAUNCH();
  if (kLN && dres)
    channel_grad_finish<3>(ctx, FinishOuts{{dweight, dbias, dres}}, partial.data(), splits, C, 1);
  else if (kLN || dres)
    channel_grad_finish<2>(ctx, FinishOuts{{dweight, kLN ? dbias : dres, nullptr}}, partial.data(), splits, C, 1);
  else
    channel_grad_finish<1>(ctx, FinishOuts{{dweight, nullptr, nullptr}}, partial.data(), splits, C, 1);
  // `partial` goes back to the allocator here; only work enqueued later on the stream reuses it.
  return true;
}

}  // namespace forge::cuda::kernels
