// ZeRO-1 for the CUDA runner (train/runner_cuda.cpp): the optimizer part of a data-parallel step
// over a communicator of GPU ranks (NcclComm, whose collectives run on the runner's stream).
//
// Each rank holds the whole model, its gradients and (16-bit modes) its working copy; the flat
// buffer of P parameters is cut into W shards of s elements (s = ceil(P / W) rounded up to 64,
// the zero padding at the end: equal counts for NCCL, and a 16-bit shard an even number of
// elements so that it travels as f32 words). Rank r owns [r·s, min(P, (r+1)·s)). Per step, after
// the micro-batches' backward:
//   1. the gradients are copied into a padded buffer and reduce-scattered (sum), then × 1/W
//      (exact for W a power of two), so rank r holds the mean gradient of its shard — the CPU
//      runner's rule (train/runner_cpu.cpp);
//   2. each rank packs a record (Σ g² of its shard, its micro-batches' loss sums and target
//      counts; backend/cuda/zero1.h), the records are all-gathered (no arithmetic in the
//      collective) and summed in rank order on the device: every rank gets the same global Σ g²
//      and loss sums bit for bit, so the same clipping factor and the same guard decision;
//   3. the guard (ops/step_guard.h), AdamW over this rank's shard of the f32 master with Adam's
//      m and v of that shard only (1/W of the optimizer state), and f16's loss-scale update,
//      with the backend's kernels and device state;
//   4. the updated shard is all-gathered: the 16-bit working copy in bf16/f16 modes (what the
//      kernels read; the f32 master stays current on its shard only), the master itself in
//      fp32.
// Everything is enqueued on the runner's stream without a host sync, so the runner captures it
// in its step's CUDA graph with the forward and backward (NCCL supports capturing collectives;
// the runner's first step of a shape runs eagerly, which sets NCCL's connections up before any
// capture). Not done yet: buckets reduce-scattered while the backward still runs (the issue's
// overlap); each step reduce-scatters once, after the last micro-batch.
//
// LoRA: with adapters (CudaBackend::set_adapter) the backend's ZeRO-1 buffers are the adapter
// buffer's (master, working copy, gradients, tensors), so the same steps train the adapters over
// ranks; the frozen base is never reduced or gathered.
//
// With a world of one the same code runs (the tests force it): the reduce-scatter and all-gathers
// are copies, × 1 and + 0 are exact, and the AdamW calls are the single-rank runner's, so the
// results equal the plain runner's bit for bit.
#pragma once

#include <cstdint>
#include <vector>

#include "forge/backend/cuda/allocator.h"
#include "forge/backend/cuda/backend.h"
#include "forge/backend/cuda/context.h"
#include "forge/dist/communicator.h"

namespace forge {

class Zero1Cuda {
 public:
  // `be` was built without Adam state (CudaModelOptions::adam_state = false); comm's collectives
  // must run on ctx's stream (set_nccl_stream). Both must outlive this.
  Zero1Cuda(cuda::Context& ctx, CudaBackend& be, Communicator& comm);

  int world() const { return comm_.size(); }
  // Room for steps of up to `micros` micro-batches; growing moves the metric buffers (a captured
  // graph that used them must be dropped).
  void reserve(int micros);
  // Device (micros doubles): the target counts of the step's micro-batches, which the host
  // uploads before the step.
  double* counts() const { return counts_.data(); }
  // Enqueues steps 1–4 above. loss_sums: this rank's per-micro-batch loss sums (device).
  void step(const AdamWFactors* factors, float max_norm, const double* loss_sums, int micros);
  // After step(): the global Σ g² (1 f32), the global loss sums (micros) and every rank's record
  // (world · zero1_record_size(micros) doubles), on the device.
  const float* global_sq() const { return global_sq_.data(); }
  const double* global_loss_sums() const { return global_loss_.data(); }
  const double* records() const { return records_.data(); }

  // Collective (every rank calls them, in the same order): the full f32 master and Adam
  // moments, gathered from every rank's shard.
  std::vector<float> weights();
  std::vector<float> adam_m() { return gather(m_.data()); }
  std::vector<float> adam_v() { return gather(v_.data()); }
  // Full buffers (P each); this rank keeps its shard. Not collective.
  void set_adam_state(const std::vector<float>& m, const std::vector<float>& v);

 private:
  std::vector<float> gather(const float* shard);

  cuda::Context& ctx_;
  CudaBackend& be_;
  Communicator& comm_;
  size_t P_ = 0, s_ = 0, begin_ = 0, end_ = 0;  // shard [begin_, end_) of P_, s_ per rank
  int micros_ = 0;                              // capacity of the metric buffers
  cuda::DeviceBuffer<float> grad_pad_;          // (W·s) the gradients, zero padded
  cuda::DeviceBuffer<float> grad_shard_;        // (s) this rank's mean gradients
  cuda::DeviceBuffer<float> m_, v_;             // (s) Adam state of the shard
  cuda::DeviceBuffer<uint8_t> send_;            // (s elements) the updated shard to all-gather
  cuda::DeviceBuffer<uint8_t> gathered_;        // (W·s elements) every rank's shard
  cuda::DeviceBuffer<float> sq_, global_sq_;    // (1) Σ g² of the shard; global
  cuda::DeviceBuffer<double> record_, records_, global_loss_, counts_;
};

}  // namespace forge
