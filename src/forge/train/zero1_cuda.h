// ZeRO-1 for the CUDA runner (train/runner_cuda.cpp): the optimizer part of a data-parallel step
// over a communicator of GPU ranks (NcclComm, whose collectives run on the runner's stream).
//
// Each rank holds the whole model, its gradients and (16-bit modes) its working copy; the flat
// buffer of P parameters is cut into buckets and shards as dist/buckets.h says (the CPU
// runner's layout): rank r owns piece r of every bucket. Per step:
//   1. during the last micro-batch's backward, once a layer's backward is done
//      (layer_done(), the model's layer-gradients hook), every bucket that layer completes is
//      reduce-scattered (sum) on the communication stream, beside the backward of the layers
//      below; the bottom bucket (the embedding, final only at the end) and any bucket not yet
//      started go in step(); then × 1/W (exact for W a power of two), so rank r holds the mean
//      gradient of its shard — the CPU runner's rule (train/runner_cpu.cpp);
//   2. each rank packs a record (Σ g² of its shard, its micro-batches' loss sums and target
//      counts; backend/cuda/zero1.h), the records are all-gathered (no arithmetic in the
//      collective) and summed in rank order on the device: every rank gets the same global Σ g²
//      and loss sums bit for bit, so the same clipping factor and the same guard decision;
//   3. the guard (ops/step_guard.h), AdamW over this rank's parts of the f32 master with Adam's
//      m and v of its shard only (1/W of the optimizer state), and f16's loss-scale update,
//      with the backend's kernels and device state;
//   4. the updated parts are all-gathered bucket by bucket, in place: the 16-bit working copy in
//      bf16/f16 modes (what the kernels read; the f32 master stays current on this rank's parts
//      only), the master itself in fp32. The top bucket, which reaches into the zero padding
//      past P, goes through staging buffers both ways.
// Everything is enqueued without a host sync (the communication stream forks from and joins the
// runner's stream through events), so the runner captures it in its step's CUDA graph with the
// forward and backward (NCCL supports capturing collectives; the runner's first step of a shape
// runs eagerly, which sets NCCL's connections up before any capture).
// Layer 0's bucket waits for step() too: the runner's fault injection (a testing hook) writes the
// first gradient after the backward, and that bucket would overlap only the embedding's backward.
//
// LoRA: with adapters (CudaBackend::set_adapter) the backend's ZeRO-1 buffers are the adapter
// buffer's (master, working copy, gradients, tensors), so the same steps train the adapters over
// ranks; the frozen base is never reduced or gathered.
//
// With a world of one the same code runs (the tests force it): the reduce-scatter and all-gathers
// are copies, × 1 and + 0 are exact, and the AdamW calls are the single-rank runner's, so the
// results equal the plain runner's bit for bit.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "forge/backend/cuda/allocator.h"
#include "forge/backend/cuda/backend.h"
#include "forge/backend/cuda/context.h"
#include "forge/dist/buckets.h"
#include "forge/dist/communicator.h"

namespace forge {

class Zero1Cuda {
 public:
  // `be` was built without Adam state (CudaModelOptions::adam_state = false); comm is an NCCL
  // communicator (its stream is switched per collective); both must outlive this.
  // layer_starts: the trained buffer's layer starts (Model::trained_layer_starts());
  // bucket_elems: the smallest bucket (dist/buckets.h).
  Zero1Cuda(cuda::Context& ctx, CudaBackend& be, Communicator& comm,
            const std::vector<int64_t>& layer_starts, size_t bucket_elems);
  ~Zero1Cuda();
  Zero1Cuda(const Zero1Cuda&) = delete;
  Zero1Cuda& operator=(const Zero1Cuda&) = delete;

  const BucketPlan& plan() const { return plan_; }
  // The next backward is the step's last: its layer_done() calls start buckets.
  void arm();
  // The model's layer-gradients hook: layer l's backward is enqueued.
  void layer_done(int l);

  int world() const { return comm_.size(); }
  // Room for steps of up to `micros` micro-batches; growing moves the metric buffers (a captured
  // graph that used them must be dropped).
  void reserve(int micros);
  // Device (micros doubles): the target counts of the step's micro-batches, which the host
  // uploads before the step.
  double* counts() const { return counts_.data(); }
  // Enqueues steps 1–4 above (the buckets not started yet first). loss_sums: this rank's per-micro-batch loss sums (device).
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
  // Reduce-scatters bucket b on comm_stream_ after what ctx's stream has enqueued so far.
  void start(size_t b);
  void set_stream(cudaStream_t st);

  cuda::Context& ctx_;
  CudaBackend& be_;
  Communicator& comm_;
  BucketPlan plan_;
  size_t P_ = 0, valid_ = 0;                    // trained parameters; real elements of the shard
  int micros_ = 0;                              // capacity of the metric buffers
  bool armed_ = false;                          // arm() called, step() not yet
  std::vector<bool> started_;                   // per bucket, this step
  cudaStream_t comm_stream_ = nullptr;          // the reduce-scatters
  std::vector<cudaEvent_t> ready_;              // per bucket: its gradients are enqueued
  cudaEvent_t reduced_ = nullptr;               // every reduce-scatter is enqueued
  cuda::DeviceBuffer<float> tail_;              // (top bucket) its gradients, zero padded
  cuda::DeviceBuffer<float> grad_shard_;        // (s) this rank's mean gradients
  cuda::DeviceBuffer<float> m_, v_;             // (s) Adam state of the shard
  cuda::DeviceBuffer<uint8_t> send_;            // (top piece) this rank's updated top part
  cuda::DeviceBuffer<uint8_t> gathered_;        // (top bucket) every rank's top part
  cuda::DeviceBuffer<float> sq_, global_sq_;    // (1) Σ g² of the shard; global
  cuda::DeviceBuffer<double> record_, records_, global_loss_, counts_;
};

}  // namespace forge
