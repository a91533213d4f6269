// Kernels of the data-parallel CUDA runner's ZeRO-1 step (train/zero1_cuda.h): the mean of the
// reduce-scattered gradients, and the step's per-rank metrics packed into one record per rank
// (all-gathered, so no arithmetic happens in the collective) and summed in rank order on the
// device, so that every rank computes the same global Σ g² and loss sums bit for bit — the CPU
// runner's rule (dist/communicator.h's allgather_sum_in_rank_order), independent of NCCL's
// algorithm. All graph-capturable, no host sync.
#pragma once

#include <cstdint>

#include "forge/backend/cuda/context.h"

namespace forge::cuda {

// x[i] *= s for i < n.
void scale_inplace(Context& ctx, float* x, float s, int64_t n);

// A rank's record: zero1_record_size(micros) doubles,
//   [0] Σ g² of this rank's shard (the f32 value, widened), [1] the micro-batch count,
//   [2, 2 + micros) the micro-batches' loss sums, [2 + micros, 2 + 2·micros) their target counts.
inline int zero1_record_size(int micros) { return 2 + 2 * micros; }
// One thread: writes `record` from this rank's f32 Σ g² (device), loss sums (device, micros)
// and target counts (device, micros doubles).
void zero1_pack_record(Context& ctx, double* record, const float* sum_sq, const double* loss_sums,
                       const double* counts, int micros);
// One thread, over `world` records laid out one after another (what an all-gather of the records
// gives): global_sq[0] = (f32) Σ_r Σ g²_r and loss_sums[i] = Σ_r loss sum i of rank r, each
// added in f64 in rank order starting from 0 (x + 0 is exact, so a world of one reproduces its
// own values bit for bit).
void zero1_reduce_records(Context& ctx, float* global_sq, double* loss_sums, const double* records,
                          int world, int micros);

}  // namespace forge::cuda
