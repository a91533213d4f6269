// Caching device allocator. cudaMalloc/cudaFree synchronise the device and cost tens of
// microseconds, so blocks are kept after free and handed out again for requests of the same
// size class: 512-byte steps up to 1 MiB, 2 MiB steps above. With one stream per context every
// kernel that used a freed block was enqueued before any kernel that reuses it, so reuse needs
// no events. Out of memory (after releasing the cache and retrying once) is the user's problem
// and a forge::Error that says what was asked, what is in use, and what to lower.
//
// CUDA graphs (graph.h): the addresses of the temporaries an op allocates and frees while its
// work is being captured are baked into the graph, and every replay writes them again. Such a
// block must not go back to the cache, where later code could take it and keep data in it across
// a replay. So between begin_capture() and end_capture() freed blocks go to a capture pool:
// later allocations of the same capture reuse them (one stream: the graph runs its nodes in
// capture order, as eager execution would), and end_capture() hands the pool to the graph, which
// returns it with release_pool() when it is destroyed. A capture is meant to run after the same
// work ran eagerly once, so every request is a cache hit; a miss still works (cudaMalloc in
// relaxed capture mode: a plain cudaMalloc would invalidate the capture) and is counted in
// AllocatorStats::capture_mallocs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

namespace forge::cuda {

struct AllocatorStats {
  size_t in_use = 0;  // bytes handed out now (rounded to size classes)
  size_t peak_in_use = 0;
  size_t reserved = 0;  // bytes held from the driver (in use + cached)
  size_t peak_reserved = 0;
  int64_t allocations = 0;      // alloc() calls
  int64_t cache_hits = 0;       // served without cudaMalloc
  int64_t capture_mallocs = 0;  // cudaMalloc calls made while a graph was being captured
  size_t pooled = 0;            // bytes held by captured graphs' pools (not in use, not cached)
};

// Blocks owned by a captured graph: free, but reserved for its replays. Size class → blocks.
using BlockPool = std::map<size_t, std::vector<void*>>;

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

  // Graph capture (see the header comment). Captures do not nest.
  void begin_capture();
  BlockPool end_capture();
  // Returns a graph's pool to the cache. Safe once the graph's last launch is enqueued: only
  // work enqueued later on the stream can reuse the blocks.
  void release_pool(BlockPool& pool);

  // The size class of a request (exposed for tests).
  static size_t round_size(size_t bytes);

 private:
  int device_;
  BlockPool cache_;                         // size class → free blocks
  std::unordered_map<void*, size_t> live_;  // block → size class
  bool capturing_ = false;
  BlockPool capture_pool_;  // blocks freed during the current capture
  AllocatorStats stats_;
};

// out_of_memory_message (backend/out_of_memory.h) for `device`, with cudaMemGetInfo's figures;
// requested = 0 names `where` (the failed call) instead.
std::string device_out_of_memory(int device, size_t requested, const char* where,
                                 size_t forge_bytes);

// Page-locked host memory (cudaHostAlloc) for staging host↔device copies: a cudaMemcpyAsync
// from or to it is a true DMA that returns at once and overlaps with the host, where pageable
// memory is first copied through a driver buffer. The host must not write a region while a copy
// from it may still be pending (the CUDA runner double-buffers, one slot per step in flight).
void* pinned_alloc(size_t bytes);
void pinned_free(void* p);

template <typename T>
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  explicit PinnedBuffer(size_t n) : n_(n), p_(static_cast<T*>(pinned_alloc(n * sizeof(T)))) {}
  ~PinnedBuffer() { pinned_free(p_); }
  PinnedBuffer(PinnedBuffer&& o) noexcept : n_(o.n_), p_(o.p_) {
    o.p_ = nullptr;
    o.n_ = 0;
  }
  PinnedBuffer& operator=(PinnedBuffer&& o) noexcept {
    if (this != &o) {
      pinned_free(p_);
      n_ = o.n_;
      p_ = o.p_;
      o.p_ = nullptr;
      o.n_ = 0;
    }
    return *this;
  }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;

  T* data() const { return p_; }
  size_t size() const { return n_; }
  size_t bytes() const { return n_ * sizeof(T); }

 private:
  size_t n_ = 0;
  T* p_ = nullptr;
};

// An owning device array of n elements of T, returned to its allocator on destruction.
template <typename T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(Allocator& a, size_t n)
      : alloc_(&a), n_(n), p_(static_cast<T*>(a.alloc(n * sizeof(T)))) {}
  ~DeviceBuffer() { reset(); }
  DeviceBuffer(DeviceBuffer&& o) noexcept : alloc_(o.alloc_), n_(o.n_), p_(o.p_) {
    o.p_ = nullptr;
    o.n_ = 0;
  }
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
