// FORGE_CUDA_CHECK / FORGE_CUBLAS_CHECK: a failed CUDA or cuBLAS call is a broken invariant
// (STYLE.md): print the statement, file:line, the device and the error, then abort. The one
// user-facing CUDA failure, running out of memory, is reported by the allocator as a
// forge::Error instead, with what to lower; an allocation failure inside any other checked call
// (cudaErrorMemoryAllocation, CUBLAS_STATUS_ALLOC_FAILED) prints the same line
// (backend/out_of_memory.h) and exits with code 1, without an abort.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

namespace forge::cuda {

[[noreturn]] void cuda_failed(const char* expr, const char* file, int line, cudaError_t err);
[[noreturn]] void cublas_failed(const char* expr, const char* file, int line, cublasStatus_t st);

}  // namespace forge::cuda

#define FORGE_CUDA_CHECK(expr)                                                       \
  do {                                                                               \
    const cudaError_t forge_err_ = (expr);                                           \
    if (forge_err_ != cudaSuccess) ::forge::cuda::cuda_failed(#expr, __FILE__, __LINE__, forge_err_); \
  } while (0)

#define FORGE_CUBLAS_CHECK(expr)                                                        \
  do {                                                                                  \
    const cublasStatus_t forge_st_ = (expr);                                            \
    if (forge_st_ != CUBLAS_STATUS_SUCCESS) ::forge::cuda::cublas_failed(#expr, __FILE__, __LINE__, forge_st_); \
  } while (0)

// After every kernel launch: catches bad launch configurations immediately.
#define FORGE_CUDA_CHECK_LAUNCH() FORGE_CUDA_CHECK(cudaGetLastError())
