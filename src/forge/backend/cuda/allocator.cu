#include <cuda_runtime.h>

#include "forge/backend/cuda/allocator.h"
#include "forge/backend/cuda/check.h"
#include "forge/core/error.h"

namespace forge::cuda {

namespace {

std::string gib(size_t bytes) {
  return str(static_cast<double>(bytes) / 1073741824.0, " GiB");
}

}  // namespace

size_t Allocator::round_size(size_t bytes) {
  constexpr size_t kSmallStep = 512, kLargeStep = 2u << 20, kSmallMax = 1u << 20;
  if (bytes <= kSmallMax) return (bytes + kSmallStep - 1) / kSmallStep * kSmallStep;
  return (bytes + kLargeStep - 1) / kLargeStep * kLargeStep;
}

void* Allocator::alloc(size_t bytes) {
  if (bytes == 0) return nullptr;
  const size_t size = round_size(bytes);
  ++stats_.allocations;
  void* p = nullptr;
  auto it = cache_.find(size);
  if (it != cache_.end() && !it->second.empty()) {
    p = it->second.back();
    it->second.pop_back();
    ++stats_.cache_hits;
  } else {
    FORGE_CUDA_CHECK(cudaSetDevice(device_));
    cudaError_t err = cudaMalloc(&p, size);
    if (err == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      release_cache();  // cached blocks of other sizes may be what stands in the way
      err = cudaMalloc(&p, size);
    }
    if (err == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      size_t free_b = 0, total_b = 0;
      cudaMemGetInfo(&free_b, &total_b);
      throw Error(str("CUDA out of memory on device ", device_, ": asked for ", gib(size), " with ",
                      gib(stats_.in_use), " in use by forge (peak ", gib(stats_.peak_in_use), "), ",
                      gib(free_b), " free of ", gib(total_b),
                      "; lower batch_size or seq_len (grad_accum keeps the tokens per step)"));
    }
    FORGE_CUDA_CHECK(err);
    stats_.reserved += size;
    stats_.peak_reserved = std::max(stats_.peak_reserved, stats_.reserved);
  }
  live_[p] = size;
  stats_.in_use += size;
  stats_.peak_in_use = std::max(stats_.peak_in_use, stats_.in_use);
  return p;
}

void Allocator::free(void* p) {
  if (p == nullptr) return;
  auto it = live_.find(p);
  FORGE_CHECK(it != live_.end(), "freeing a pointer this allocator did not hand out");
  stats_.in_use -= it->second;
  cache_[it->second].push_back(p);
  live_.erase(it);
}

void Allocator::release_cache() {
  FORGE_CUDA_CHECK(cudaSetDevice(device_));
  for (auto& [size, blocks] : cache_) {
    for (void* p : blocks) {
      FORGE_CUDA_CHECK(cudaFree(p));
      stats_.reserved -= size;
    }
    blocks.clear();
  }
}

Allocator::~Allocator() {
  cudaSetDevice(device_);
  for (auto& [size, blocks] : cache_)
    for (void* p : blocks) cudaFree(p);
  for (auto& [p, size] : live_) cudaFree(p);
}

}  // namespace forge::cuda
