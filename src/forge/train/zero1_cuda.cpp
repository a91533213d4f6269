// ZeRO-1 for the CUDA runner (train/zero1_cuda.h).
#include "forge/train/zero1_cuda.h"

#include <cuda_runtime.h>

#include <algorithm>

#include "forge/backend/cuda/check.h"
#include "forge/backend/cuda/ops.h"
#include "forge/backend/cuda/zero1.h"
#include "forge/core/error.h"
#include "forge/dist/nccl_comm.h"

namespace forge {

namespace {

constexpr size_t kShardAlign = 64;  // elements: 256 bytes of f32, an even count of 16-bit

void copy_async(cuda::Context& ctx, void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  if (bytes > 0) FORGE_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kind, ctx.stream()));
}

void zero(cuda::Context& ctx, void* p, size_t bytes) {
  if (bytes > 0) FORGE_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, ctx.stream()));
}

}  // namespace

Zero1Cuda::Zero1Cuda(cuda::Context& ctx, CudaBackend& be, Communicator& comm,
                     const std::vector<int64_t>& layer_starts, size_t bucket_elems)
    : ctx_(ctx),
      be_(be),
      comm_(comm),
      plan_(static_cast<size_t>(be.num_params()), comm.size(), layer_starts, bucket_elems, kShardAlign) {
  FORGE_CHECK(be_.grads_data() != nullptr && be_.master_data() != nullptr,
              "ZeRO-1 needs a backend with gradients and an f32 master");
  P_ = plan_.size();
  valid_ = plan_.valid(comm_.rank());
  const size_t s = plan_.shard();
  const GradBucket& top = plan_.buckets().back();
  auto& a = ctx_.allocator();
  const size_t es = be_.work_data() != nullptr ? dtype_size(be_.dtype()) : sizeof(float);
  tail_ = cuda::DeviceBuffer<float>(a, top.end - top.begin);
  grad_shard_ = cuda::DeviceBuffer<float>(a, s);
  m_ = cuda::DeviceBuffer<float>(a, s);
  v_ = cuda::DeviceBuffer<float>(a, s);
  send_ = cuda::DeviceBuffer<uint8_t>(a, top.piece * es);
  gathered_ = cuda::DeviceBuffer<uint8_t>(a, (top.end - top.begin) * es);
  sq_ = cuda::DeviceBuffer<float>(a, 1);
  global_sq_ = cuda::DeviceBuffer<float>(a, 1);
  // The padding of every buffer stays zero: nothing below writes past the real elements.
  zero(ctx_, tail_.data(), tail_.size() * sizeof(float));
  zero(ctx_, grad_shard_.data(), s * sizeof(float));
  zero(ctx_, m_.data(), s * sizeof(float));
  zero(ctx_, v_.data(), s * sizeof(float));
  zero(ctx_, send_.data(), send_.size());
  zero(ctx_, sq_.data(), sizeof(float));
  zero(ctx_, global_sq_.data(), sizeof(float));
  // The highest priority: when a backward kernel's blocks retire, the block scheduler gives the
  // freed SMs to a waiting collective first, instead of letting it wait for the kernel's last wave.
  int least = 0, greatest = 0;
  FORGE_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  FORGE_CUDA_CHECK(cudaStreamCreateWithPriority(&comm_stream_, cudaStreamNonBlocking, greatest));
  ready_.resize(plan_.buckets().size());
  for (cudaEvent_t& e : ready_) FORGE_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  FORGE_CUDA_CHECK(cudaEventCreateWithFlags(&reduced_, cudaEventDisableTiming));
  started_.assign(plan_.buckets().size(), false);
  reserve(1);
  ctx_.synchronize();
}

Zero1Cuda::~Zero1Cuda() {
  cudaStreamSynchronize(comm_stream_);
  for (cudaEvent_t e : ready_) cudaEventDestroy(e);
  cudaEventDestroy(reduced_);
  cudaStreamDestroy(comm_stream_);
}

void Zero1Cuda::reserve(int micros) {
  if (micros <= micros_) return;
  ctx_.synchronize();  // the old buffers may still be read
  auto& a = ctx_.allocator();
  const size_t rec = cuda::zero1_record_size(micros);
  record_ = cuda::DeviceBuffer<double>(a, rec);
  records_ = cuda::DeviceBuffer<double>(a, rec * comm_.size());
  global_loss_ = cuda::DeviceBuffer<double>(a, micros);
  counts_ = cuda::DeviceBuffer<double>(a, micros);
  zero(ctx_, counts_.data(), micros * sizeof(double));
  micros_ = micros;
}

void Zero1Cuda::set_stream(cudaStream_t st) {
  set_nccl_stream(comm_, st);
}

void Zero1Cuda::arm() {
  armed_ = true;
  started_.assign(plan_.buckets().size(), false);
}

void Zero1Cuda::layer_done(int l) {
  if (!armed_ || l <= 0) return;  // layer 0's bucket: see the header
  const auto& buckets = plan_.buckets();
  for (size_t b = 0; b < buckets.size(); ++b)
    if (buckets[b].ready_after_layer == l && !started_[b]) start(b);
}

void Zero1Cuda::start(size_t b) {
  const GradBucket& k = plan_.buckets()[b];
  FORGE_CUDA_CHECK(cudaEventRecord(ready_[b], ctx_.stream()));
  FORGE_CUDA_CHECK(cudaStreamWaitEvent(comm_stream_, ready_[b], 0));
  const float* in = be_.grads_data() + k.begin;
  if (k.end > P_) {  // the top bucket: through the zero-padded staging buffer
    FORGE_CUDA_CHECK(cudaMemcpyAsync(tail_.data(), in, (P_ - k.begin) * sizeof(float),
                                     cudaMemcpyDeviceToDevice, comm_stream_));
    in = tail_.data();
  }
  set_stream(comm_stream_);
  comm_.reduce_scatter_sum(in, grad_shard_.data() + k.offset, k.piece);
  set_stream(ctx_.stream());
  started_[b] = true;
}

void Zero1Cuda::step(const AdamWFactors* factors, float max_norm, const double* loss_sums,
                     int micros) {
  FORGE_CHECK(micros >= 1 && micros <= micros_, "Zero1Cuda::step: ", micros,
              " micro-batches, room for ", micros_);
  if (!armed_) started_.assign(plan_.buckets().size(), false);
  armed_ = false;
  const int W = comm_.size();
  const int rank = comm_.rank();
  const auto& buckets = plan_.buckets();
  // 1. Mean gradient of this rank's shard: the buckets not started during the backward, from
  // the top down; then the reduce-scatters join the step's stream.
  for (size_t b = buckets.size(); b-- > 0;)
    if (!started_[b]) start(b);
  FORGE_CUDA_CHECK(cudaEventRecord(reduced_, comm_stream_));
  FORGE_CUDA_CHECK(cudaStreamWaitEvent(ctx_.stream(), reduced_, 0));
  cuda::scale_inplace(ctx_, grad_shard_.data(), 1.0f / static_cast<float>(W), static_cast<int64_t>(valid_));
  // 2. Global Σ g² and loss sums, in rank order.
  if (valid_ > 0)
    cuda::sum_squares(ctx_, sq_.data(), grad_shard_.data(), static_cast<int64_t>(valid_));
  cuda::zero1_pack_record(ctx_, record_.data(), sq_.data(), loss_sums, counts_.data(), micros);
  // Records travel as f32 words (an all-gather moves bits; doubles are 2 words each).
  const size_t rec = cuda::zero1_record_size(micros);
  comm_.allgather(reinterpret_cast<const float*>(record_.data()),
                  reinterpret_cast<float*>(records_.data()), 2 * rec);
  cuda::zero1_reduce_records(ctx_, global_sq_.data(), global_loss_.data(), records_.data(), W, micros);
  // 3. Guard, AdamW on this rank's parts, f16's loss scale.
  LossScaleState* ls = be_.loss_scale_state_data();
  StepGuardState* guard = be_.step_guard_data();
  cuda::step_guard_check(ctx_, guard, global_loss_.data(), micros, global_sq_.data(), ls != nullptr);
  float* master = be_.master_data();
  uint8_t* work = be_.work_data();
  const DType dt = be_.dtype();
  const size_t es = work != nullptr ? dtype_size(dt) : sizeof(float);
  for (const GradBucket& k : buckets) {
    const size_t part_lo = plan_.part_begin(k, rank), part_hi = plan_.part_end(k, rank);
    for (const ParamInfo& info : be_.params()) {
      const size_t lo = std::max<size_t>(info.offset, part_lo);
      const size_t hi = std::min<size_t>(info.offset + info.numel(), part_hi);
      if (lo >= hi) continue;
      const size_t j = k.offset + (lo - part_lo);
      cuda::adamw_update(ctx_, master + lo, m_.data() + j, v_.data() + j, grad_shard_.data() + j,
                         work != nullptr ? work + lo * es : nullptr, dt, static_cast<int64_t>(hi - lo),
                         factors + (info.decay ? 0 : 1), static_cast<uint64_t>(lo), global_sq_.data(),
                         max_norm, ls, guard);
    }
  }
  if (ls != nullptr) cuda::loss_scale_step(ctx_, ls, global_sq_.data(), guard);
  // 4. Every rank's updated parts → the whole working copy (the master in fp32), a bucket at a
  // time, in place (NCCL's in-place all-gather: this rank's part already sits at its place in
  // the output); the top bucket through send_ and gathered_.
  uint8_t* full = work != nullptr ? work : reinterpret_cast<uint8_t*>(master);
  for (const GradBucket& k : buckets) {
    const size_t words = k.piece * es / sizeof(float);
    if (k.end <= P_) {
      const uint8_t* mine = full + (k.begin + static_cast<size_t>(rank) * k.piece) * es;
      comm_.allgather(reinterpret_cast<const float*>(mine), reinterpret_cast<float*>(full + k.begin * es),
                      words);
      continue;
    }
    const size_t lo = plan_.part_begin(k, rank), hi = plan_.part_end(k, rank);
    copy_async(ctx_, send_.data(), full + lo * es, (hi - lo) * es, cudaMemcpyDeviceToDevice);
    comm_.allgather(reinterpret_cast<const float*>(send_.data()),
                    reinterpret_cast<float*>(gathered_.data()), words);
    copy_async(ctx_, full + k.begin * es, gathered_.data(), (P_ - k.begin) * es, cudaMemcpyDeviceToDevice);
  }
}

std::vector<float> Zero1Cuda::gather(const float* shard) {
  cuda::DeviceBuffer<float> all(ctx_.allocator(), plan_.padded());
  comm_.allgather(shard, all.data(), plan_.shard());
  std::vector<float> host(plan_.padded()), full(P_);
  ctx_.synchronize();
  FORGE_CUDA_CHECK(cudaMemcpy(host.data(), all.data(), host.size() * sizeof(float), cudaMemcpyDeviceToHost));
  plan_.shards_to_flat(host.data(), full.data());
  return full;
}

std::vector<float> Zero1Cuda::weights() {
  // fp32: the master is all-gathered every step. 16-bit: only this rank's parts are current.
  if (be_.work_data() == nullptr) return be_.trained_weights_host();
  cuda::DeviceBuffer<float> mine(ctx_.allocator(), plan_.shard());
  zero(ctx_, mine.data(), plan_.shard() * sizeof(float));
  for (const GradBucket& k : plan_.buckets()) {
    const size_t lo = plan_.part_begin(k, comm_.rank()), hi = plan_.part_end(k, comm_.rank());
    copy_async(ctx_, mine.data() + k.offset, be_.master_data() + lo, (hi - lo) * sizeof(float),
               cudaMemcpyDeviceToDevice);
  }
  return gather(mine.data());
}

void Zero1Cuda::set_adam_state(const std::vector<float>& m, const std::vector<float>& v) {
  if (m.empty() && v.empty()) {  // zeros (runner.h): this rank's shard
    ctx_.synchronize();
    FORGE_CUDA_CHECK(cudaMemsetAsync(m_.data(), 0, m_.bytes(), ctx_.stream()));
    FORGE_CUDA_CHECK(cudaMemsetAsync(v_.data(), 0, v_.bytes(), ctx_.stream()));
    ctx_.synchronize();
    return;
  }
  if (m.size() != P_ || v.size() != P_)
    throw Error(str("set_adam_state: ", m.size(), " and ", v.size(), " values for ", P_,
                    " trained parameters"));
  std::vector<float> ms(plan_.shard()), vs(plan_.shard());
  plan_.flat_to_shard(m.data(), comm_.rank(), ms.data());
  plan_.flat_to_shard(v.data(), comm_.rank(), vs.data());
  ctx_.synchronize();
  FORGE_CUDA_CHECK(cudaMemcpyAsync(m_.data(), ms.data(), ms.size() * sizeof(float),
                                   cudaMemcpyHostToDevice, ctx_.stream()));
  FORGE_CUDA_CHECK(cudaMemcpyAsync(v_.data(), vs.data(), vs.size() * sizeof(float),
                                   cudaMemcpyHostToDevice, ctx_.stream()));
  ctx_.synchronize();  // the host vectors may go away
}

}  // namespace forge
