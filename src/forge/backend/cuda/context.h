// The one explicit CUDA context (STYLE.md: no hidden globals): device, stream, cuBLASLt handle,
// workspace and plan cache, the caching allocator. Everything that launches work takes a Context&; all of
// it goes to the one stream, in order, so nothing in a training step needs a host sync.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <memory>

#include "forge/backend/cuda/allocator.h"
#include "forge/core/gemm_algo.h"

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
  // How cuBLASLt algorithms are chosen (core/gemm_algo.h; CudaModelOptions::gemm_algo): the
  // heuristic's first, or timed on each plan's first eager call (gemm.cu). Plans already built
  // keep their algorithm.
  GemmAlgo gemm_algo() const { return gemm_algo_; }
  void set_gemm_algo(GemmAlgo a) { gemm_algo_ = a; }
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
  GemmAlgo gemm_algo_ = GemmAlgo::kHeuristic;
  Allocator allocator_;
  struct GemmPlanCacheDeleter {
    void operator()(GemmPlanCache* p) const;
  };
  // Per context, not per process: a plan is chosen for this device, and a runner per device
  // (multi-GPU) must not share one.
  std::unique_ptr<GemmPlanCache, GemmPlanCacheDeleter> gemm_plans_;
};

}  // namespace forge::cuda
