#include <cstdio>
#include <cstdlib>

#include "forge/backend/cuda/check.h"
#include "forge/backend/cuda/runtime.h"
#include "forge/core/error.h"

namespace forge::cuda {

void cuda_failed(const char* expr, const char* file, int line, cudaError_t err) {
  int dev = -1;
  cudaGetDevice(&dev);
  std::fprintf(stderr, "forge: CUDA error %s (%s) in %s at %s:%d on device %d\n",
               cudaGetErrorName(err), cudaGetErrorString(err), expr, file, line, dev);
  std::fflush(stderr);
  std::abort();
}

void cublas_failed(const char* expr, const char* file, int line, cublasStatus_t st) {
  int dev = -1;
  cudaGetDevice(&dev);
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
