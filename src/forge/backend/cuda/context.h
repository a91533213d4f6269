// The one explicit CUDA context (STYLE.md: no hidden globals): device, stream, cuBLASLt handle,
// workspace and plan cache, the caching allocator. Everything that launches work takes a Context&; all of
// it goes to the one stream, in order, so nothing in a training step needs a host sync.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <memory>

#include "forge/backend/cuda/allocator.h"

namespace forge::cuda {

// cuBLASLt plans (descriptors and the heuristic's algorithm) of one context, keyed by shape;
// thread-safe. Defined in gemm.cu.
class GemmPlanCache;
GemmPlanCache* new_gemm_plan_cache();

class Context {
 public:
  // Throws forge::Error when the device does not exist.
  explicit Context(int device = 0);
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  int device() const { return device_; }
  cudaStream_t stream() const { return stream_; }
  cublasLtHandle_t lt() const { return lt_; }
  void* workspace() const { return workspace_; }
  size_t workspace_bytes() const { return workspace_bytes_; }
  Allocator& allocator() { return allocator_; }
  GemmPlanCache& gemm_plans() { return *gemm_plans_; }
  const Allocator& allocator() const { return allocator_; }
  const cudaDeviceProp& props() const { return props_; }
  int num_sms() const { return props_.multiProcessorCount; }
  // Whether the decode kernels launch with programmatic dependent launch (pdl.cuh): on by default
  // where the device has it (compute capability >= 9); off to measure what it gives.
  bool pdl() const { return pdl_; }
  void set_pdl(bool on) { pdl_ = on && props_.major >= 9; }
  // Per-channel gradient sums (kernels::channel_grad, head_norm_rope_bwd) finished by the last
  // block of each column strip of their partial kernel instead of a separate finishing kernel
  // (the same additions in the same order): an A/B setting while it is measured
  // (CudaModelOptions::fused_wgrad_finish). On: kFinishCounters ints, zeroed, that those blocks
  // count on and leave zeroed again. Allocates (a host sync): not while a graph is captured.
  static constexpr int kFinishCounters = 1 << 16;
  void set_fused_finish(bool on);
  // The counters for a partial kernel of `strips` column strips, or null (off, or too many
  // strips): then the separate finishing kernel runs. Calls on this context's stream only, so
  // one kernel at a time uses them.
  int* finish_counters(int strips) const {
    return strips <= finish_capacity_ ? finish_counters_ : nullptr;
  }

  // Waits for everything enqueued so far.
  void synchronize();

 private:
  int device_;
  cudaDeviceProp props_{};
  cudaStream_t stream_ = nullptr;
  cublasLtHandle_t lt_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  bool pdl_ = false;
  int* finish_counters_ = nullptr;
  int finish_capacity_ = 0;  // 0 while fused finishing is off
  Allocator allocator_;
  struct GemmPlanCacheDeleter {
    void operator()(GemmPlanCache* p) const;
  };
  // Per context, not per process: a plan is chosen for this device, and a runner per device
  // (multi-GPU) must not share one.
  std::unique_ptr<GemmPlanCache, GemmPlanCacheDeleter> gemm_plans_;
};

}  // namespace forge::cuda
