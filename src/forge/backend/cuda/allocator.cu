#include <cuda_runtime.h>

#include "forge/backend/cuda/allocator.h"
#include "forge/backend/cuda/check.h"
#include "forge/backend/out_of_memory.h"
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

namespace {

// Takes a block of class `size` from `pool`, or returns nullptr.
void* take(BlockPool& pool, size_t size) {
  auto it = pool.find(size);
  if (it == pool.end() || it->second.empty()) return nullptr;
  void* p = it->second.back();
  it->second.pop_back();
  return p;
}

// cudaMalloc that a capture in progress tolerates: in the default (global / thread-local)
// capture modes cudaMalloc is a "potentially unsafe" call that invalidates the capture. The
// block is not part of the captured work (the graph's pool keeps it), so relaxed mode is right.
cudaError_t malloc_during_capture(void** p, size_t size) {
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  FORGE_CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
  const cudaError_t err = cudaMalloc(p, size);
  FORGE_CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
  return err;
}

}  // namespace

void* Allocator::alloc(size_t bytes) {
  if (bytes == 0) return nullptr;
  const size_t size = round_size(bytes);
  ++stats_.allocations;
  void* p = capturing_ ? take(capture_pool_, size) : nullptr;
  if (p != nullptr) {
    stats_.pooled -= size;
  } else {
    p = take(cache_, size);
  }
  if (p != nullptr) {
    ++stats_.cache_hits;
  } else {
    FORGE_CUDA_CHECK(cudaSetDevice(device_));
    cudaError_t err = capturing_ ? malloc_during_capture(&p, size) : cudaMalloc(&p, size);
    stats_.capture_mallocs += capturing_;
    if (err == cudaErrorMemoryAllocation && !capturing_) {  // cudaFree is not allowed in a capture
      cudaGetLastError();
      release_cache();  // cached blocks of other sizes may be what stands in the way
      err = cudaMalloc(&p, size);
    }
    if (err == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      throw Error(device_out_of_memory(device_, size, "", stats_.reserved));
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
  if (capturing_) {
    capture_pool_[it->second].push_back(p);
    stats_.pooled += it->second;
  } else {
    cache_[it->second].push_back(p);
  }
  live_.erase(it);
}

void Allocator::begin_capture() {
  FORGE_CHECK(!capturing_, "Allocator::begin_capture: a capture is already in progress");
  capturing_ = true;
}

BlockPool Allocator::end_capture() {
  FORGE_CHECK(capturing_, "Allocator::end_capture without begin_capture");
  capturing_ = false;
  return std::move(capture_pool_);
}

void Allocator::release_pool(BlockPool& pool) {
  for (auto& [size, blocks] : pool) {
    for (void* p : blocks) {
      cache_[size].push_back(p);
      stats_.pooled -= size;
    }
  }
  pool.clear();
}

void* pinned_alloc(size_t bytes) {
  if (bytes == 0) return nullptr;
  void* p = nullptr;
  const cudaError_t err = cudaHostAlloc(&p, bytes, cudaHostAllocDefault);
  if (err == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    throw Error(
        str("cannot allocate ", gib(bytes), " of page-locked host memory; lower batch_size"));
  }
  FORGE_CUDA_CHECK(err);
  return p;
}

void pinned_free(void* p) {
  if (p != nullptr) FORGE_CUDA_CHECK(cudaFreeHost(p));
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

std::string device_out_of_memory(int device, size_t requested, const char* where,
                                 size_t forge_bytes) {
  DeviceMemoryReport r;
  r.device = device;
  r.requested = requested;
  r.where = where;
  r.forge_bytes = forge_bytes;
  if (cudaMemGetInfo(&r.free_bytes, &r.total_bytes) != cudaSuccess) cudaGetLastError();
  return out_of_memory_message(r);
}

}  // namespace forge::cuda
