#include <cstdio>
#include <cstdlib>

#include "forge/backend/cuda/allocator.h"
#include "forge/backend/cuda/check.h"
#include "forge/backend/cuda/runtime.h"
#include "forge/core/error.h"

namespace forge::cuda {

namespace {

// An allocation that failed inside a CUDA or cuBLAS call is the user's problem, not a bug:
// the out-of-memory line (backend/out_of_memory.h) and exit code 1, as the CLI ends on a
// forge::Error. Exiting here rather than throwing: these checks sit in destructors and other
// places that must not throw.
[[noreturn]] void out_of_memory_exit(const char* expr, int dev) {
  std::fprintf(stderr, "forge: error: %s\n", device_out_of_memory(dev, 0, expr, 0).c_str());
  std::fflush(stderr);
  std::exit(1);
}

}  // namespace

void cuda_failed(const char* expr, const char* file, int line, cudaError_t err) {
  int dev = -1;
  cudaGetDevice(&dev);
  if (err == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    out_of_memory_exit(expr, dev);
  }
  std::fprintf(stderr, "forge: CUDA error %s (%s) in %s at %s:%d on device %d\n",
               cudaGetErrorName(err), cudaGetErrorString(err), expr, file, line, dev);
  std::fflush(stderr);
  std::abort();
}

void cublas_failed(const char* expr, const char* file, int line, cublasStatus_t st) {
  int dev = -1;
  cudaGetDevice(&dev);
  if (st == CUBLAS_STATUS_ALLOC_FAILED) out_of_memory_exit(expr, dev);
  std::fprintf(stderr, "forge: cuBLAS error %d in %s at %s:%d on device %d\n", static_cast<int>(st),
               expr, file, line, dev);
  std::fflush(stderr);
  std::abort();
}

bool compiled() {
  return true;
}

bool available() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error
    return false;
  }
  return n > 0;
}

std::string device_summary() {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess || n == 0) {
    cudaGetLastError();
    return str("no CUDA device (", err == cudaSuccess ? "none found" : cudaGetErrorString(err),
               ")");
  }
  cudaDeviceProp p{};
  FORGE_CUDA_CHECK(cudaGetDeviceProperties(&p, 0));
  char buf[256];
  std::snprintf(buf, sizeof(buf), "%s (sm_%d%d, %d SMs, %.1f GiB)", p.name, p.major, p.minor,
                p.multiProcessorCount, p.totalGlobalMem / 1073741824.0);
  return buf;
}

}  // namespace forge::cuda
