// ZeRO-1 for the CUDA runner (train/zero1_cuda.h).
#include "forge/train/zero1_cuda.h"

#include <cuda_runtime.h>

#include <algorithm>

#include "forge/backend/cuda/check.h"
#include "forge/backend/cuda/ops.h"
#include "forge/backend/cuda/zero1.h"
#include "forge/core/error.h"

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

Zero1Cuda::Zero1Cuda(cuda::Context& ctx, CudaBackend& be, Communicator& comm)
    : ctx_(ctx), be_(be), comm_(comm) {
  FORGE_CHECK(be_.grads_data() != nullptr && be_.master_data() != nullptr,
              "ZeRO-1 needs a backend with gradients and an f32 master");
  const int W = comm_.size();
  P_ = static_cast<size_t>(be_.num_params());
  s_ = (shard_size(P_, W) + kShardAlign - 1) / kShardAlign * kShardAlign;
  begin_ = std::min(P_, static_cast<size_t>(comm_.rank()) * s_);
  end_ = std::min(P_, begin_ + s_);
  auto& a = ctx_.allocator();
  const size_t es = be_.work_data() != nullptr ? dtype_size(be_.dtype()) : sizeof(float);
  grad_pad_ = cuda::DeviceBuffer<float>(a, W * s_);
  grad_shard_ = cuda::DeviceBuffer<float>(a, s_);
  m_ = cuda::DeviceBuffer<float>(a, s_);
  v_ = cuda::DeviceBuffer<float>(a, s_);
  send_ = cuda::DeviceBuffer<uint8_t>(a, s_ * es);
  gathered_ = cuda::DeviceBuffer<uint8_t>(a, W * s_ * es);
  sq_ = cuda::DeviceBuffer<float>(a, 1);
  global_sq_ = cuda::DeviceBuffer<float>(a, 1);
  // The padding of every buffer stays zero: nothing below writes past the real elements.
  zero(ctx_, grad_pad_.data(), grad_pad_.size() * sizeof(float));
  zero(ctx_, m_.data(), s_ * sizeof(float));
  zero(ctx_, v_.data(), s_ * sizeof(float));
  zero(ctx_, send_.data(), send_.size());
  zero(ctx_, sq_.data(), sizeof(float));
  zero(ctx_, global_sq_.data(), sizeof(float));
  reserve(1);
  ctx_.synchronize();
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

void Zero1Cuda::step(const AdamWFactors* factors, float max_norm, const double* loss_sums,
                     int micros) {
  FORGE_CHECK(micros >= 1 && micros <= micros_, "Zero1Cuda::step: ", micros,
              " micro-batches, room for ", micros_);
  const int W = comm_.size();
  const size_t n = end_ - begin_;
  // 1. Mean gradient of this rank's shard.
  copy_async(ctx_, grad_pad_.data(), be_.grads_data(), P_ * sizeof(float), cudaMemcpyDeviceToDevice);
  comm_.reduce_scatter_sum(grad_pad_.data(), grad_shard_.data(), s_);
  cuda::scale_inplace(ctx_, grad_shard_.data(), 1.0f / static_cast<float>(W), static_cast<int64_t>(n));
  // 2. Global Σ g² and loss sums, in rank order.
  if (n > 0)
    cuda::sum_squares(ctx_, sq_.data(), grad_shard_.data(), static_cast<int64_t>(n));
  cuda::zero1_pack_record(ctx_, record_.data(), sq_.data(), loss_sums, counts_.data(), micros);
  // Records travel as f32 words (an all-gather moves bits; doubles are 2 words each).
  const size_t rec = cuda::zero1_record_size(micros);
  comm_.allgather(reinterpret_cast<const float*>(record_.data()),
                  reinterpret_cast<float*>(records_.data()), 2 * rec);
  cuda::zero1_reduce_records(ctx_, global_sq_.data(), global_loss_.data(), records_.data(), W, micros);
  // 3. Guard, AdamW on the shard, f16's loss scale.
  LossScaleState* ls = be_.loss_scale_state_data();
  StepGuardState* guard = be_.step_guard_data();
  cuda::step_guard_check(ctx_, guard, global_loss_.data(), micros, global_sq_.data(), ls != nullptr);
  float* master = be_.master_data();
  uint8_t* work = be_.work_data();
  const DType dt = be_.dtype();
  const size_t es = work != nullptr ? dtype_size(dt) : sizeof(float);
  for (const ParamInfo& info : be_.params()) {
    const size_t lo = std::max<size_t>(info.offset, begin_);
    const size_t hi = std::min<size_t>(info.offset + info.numel(), end_);
    if (lo >= hi) continue;
    const size_t k = lo - begin_;
    cuda::adamw_update(ctx_, master + lo, m_.data() + k, v_.data() + k, grad_shard_.data() + k,
                       work != nullptr ? work + lo * es : nullptr, dt, static_cast<int64_t>(hi - lo),
                       factors + (info.decay ? 0 : 1), static_cast<uint64_t>(lo), global_sq_.data(),
                       max_norm, ls, guard);
  }
  if (ls != nullptr) cuda::loss_scale_step(ctx_, ls, global_sq_.data(), guard);
  // 4. Every rank's updated shard → the whole working copy (the master in fp32).
  uint8_t* full = work != nullptr ? work : reinterpret_cast<uint8_t*>(master);
  copy_async(ctx_, send_.data(), full + begin_ * es, n * es, cudaMemcpyDeviceToDevice);
  comm_.allgather(reinterpret_cast<const float*>(send_.data()),
                  reinterpret_cast<float*>(gathered_.data()), s_ * es / sizeof(float));
  copy_async(ctx_, full, gathered_.data(), P_ * es, cudaMemcpyDeviceToDevice);
}

std::vector<float> Zero1Cuda::gather(const float* shard) {
  cuda::DeviceBuffer<float> all(ctx_.allocator(), comm_.size() * s_);
  comm_.allgather(shard, all.data(), s_);
  std::vector<float> host(P_);
  ctx_.synchronize();
  FORGE_CUDA_CHECK(cudaMemcpy(host.data(), all.data(), P_ * sizeof(float), cudaMemcpyDeviceToHost));
  return host;
}

std::vector<float> Zero1Cuda::weights() {
  // fp32: the master is all-gathered every step. 16-bit: only this rank's shard is current.
  if (be_.work_data() == nullptr) return be_.trained_weights_host();
  cuda::DeviceBuffer<float> mine(ctx_.allocator(), s_);
  zero(ctx_, mine.data(), s_ * sizeof(float));
  copy_async(ctx_, mine.data(), be_.master_data() + begin_, (end_ - begin_) * sizeof(float),
             cudaMemcpyDeviceToDevice);
  return gather(mine.data());
}

void Zero1Cuda::set_adam_state(const std::vector<float>& m, const std::vector<float>& v) {
  if (m.size() != P_ || v.size() != P_)
    throw Error(str("set_adam_state: ", m.size(), " and ", v.size(), " values for ", P_,
                    " trained parameters"));
  ctx_.synchronize();
  FORGE_CUDA_CHECK(cudaMemcpyAsync(m_.data(), m.data() + begin_, (end_ - begin_) * sizeof(float),
                                   cudaMemcpyHostToDevice, ctx_.stream()));
  FORGE_CUDA_CHECK(cudaMemcpyAsync(v_.data(), v.data() + begin_, (end_ - begin_) * sizeof(float),
                                   cudaMemcpyHostToDevice, ctx_.stream()));
  ctx_.synchronize();  // the host vectors may go away
}

}  // namespace forge
