// Caching device allocator. cudaMalloc/cudaFree synchronise the device and cost tens of
// microseconds, so blocks are kept after free and handed out again for requests of the same
// size class: 512-byte steps up to 1 MiB, 2 MiB steps above. With one stream per context every
// kernel that used a freed block was enqueued before any kernel that reuses it, so reuse needs
// no events. Out of memory (after releasing the cache and retrying once) is the user's problem
// and a forge::Error that says what was asked, what is in use, and what to lower.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <unordered_map>
#include <vector>

namespace forge::cuda {

struct AllocatorStats {
  size_t in_use = 0;         // bytes handed out now (rounded to size classes)
  size_t peak_in_use = 0;
  size_t reserved = 0;       // bytes held from the driver (in use + cached)
  size_t peak_reserved = 0;
  int64_t allocations = 0;   // alloc() calls
  int64_t cache_hits = 0;    // served without cudaMalloc
};

class Allocator {
 public:
  explicit Allocator(int device) : device_(device) {}
  ~Allocator();
  Allocator(const Allocator&) = delete;
  Allocator& operator=(const Allocator&) = delete;

  // Returns device memory of at least `bytes` (256-byte aligned; nullptr for 0 bytes).
  void* alloc(size_t bytes);
  // Returns a block to the cache. nullptr is ignored; a pointer not from alloc() aborts.
  void free(void* p);
  // Gives every cached (free) block back to the driver.
  void release_cache();
  const AllocatorStats& stats() const { return stats_; }

  // The size class of a request (exposed for tests).
  static size_t round_size(size_t bytes);

 private:
  int device_;
  std::map<size_t, std::vector<void*>> cache_;   // size class → free blocks
  std::unordered_map<void*, size_t> live_;       // block → size class
  AllocatorStats stats_;
};

// An owning device array of n elements of T, returned to its allocator on destruction.
template <typename T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(Allocator& a, size_t n) : alloc_(&a), n_(n), p_(static_cast<T*>(a.alloc(n * sizeof(T)))) {}
  ~DeviceBuffer() { reset(); }
  DeviceBuffer(DeviceBuffer&& o) noexcept : alloc_(o.alloc_), n_(o.n_), p_(o.p_) { o.p_ = nullptr; o.n_ = 0; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      reset();
      alloc_ = o.alloc_;
      n_ = o.n_;
      p_ = o.p_;
      o.p_ = nullptr;
      o.n_ = 0;
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void reset() {
    if (p_) alloc_->free(p_);
    p_ = nullptr;
    n_ = 0;
  }
  T* data() const { return p_; }
  size_t size() const { return n_; }
  size_t bytes() const { return n_ * sizeof(T); }

 private:
  Allocator* alloc_ = nullptr;
  size_t n_ = 0;
  T* p_ = nullptr;
};

}  // namespace forge::cuda
