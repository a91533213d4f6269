#include "forge/backend/cuda/check.h"
#include "forge/backend/cuda/context.h"
#include "forge/core/error.h"

namespace forge::cuda {

Context::Context(int device) : device_(device), allocator_(device) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || device < 0 || device >= n) {
    cudaGetLastError();
    throw Error(str("CUDA device ", device, " is not available (", n, " device(s) found)"));
  }
  FORGE_CUDA_CHECK(cudaSetDevice(device));
  FORGE_CUDA_CHECK(cudaGetDeviceProperties(&props_, device));
  set_pdl(true);
  FORGE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  FORGE_CUBLAS_CHECK(cublasLtCreate(&lt_));
  // 32 MiB: what NVIDIA recommends for cuBLASLt on Hopper.
  workspace_bytes_ = 32u << 20;
  if (const cudaError_t err = cudaMalloc(&workspace_, workspace_bytes_);
      err == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    throw Error(device_out_of_memory(device, workspace_bytes_, "", 0));
  } else {
    FORGE_CUDA_CHECK(err);
  }
  gemm_plans_.reset(new_gemm_plan_cache());
}

Context::~Context() {
  cudaSetDevice(device_);
  cudaStreamSynchronize(stream_);
  gemm_plans_.reset();
  cudaFree(workspace_);
  cublasLtDestroy(lt_);
  cudaStreamDestroy(stream_);
}

void Context::synchronize() {
  FORGE_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

}  // namespace forge::cuda
