// A CUDA graph of work enqueued on the Context's stream: captured once, replayed with one launch.
// A training step is a few thousand kernels; launched one by one they cost the host ~5 µs each
// and leave the GPU idle whenever the host falls behind (small models, short sequences). A
// replay costs one launch.
//
// What a capture freezes: kernel arguments, pointers and grid sizes. Anything that changes from
// one replay to the next must therefore live in device memory that the captured kernels read
// (tokens, the loss scale, AdamW's lr and step: see train/runner_cuda.cpp). Temporaries that
// ops allocate during the capture stay reserved for the graph (allocator.h's capture pool).
// Capturing needs the same work to have run eagerly once before, so that every host-side
// one-time step (activation planning, cuBLASLt plan caches, allocator cache) has happened: a
// capture may not synchronise or copy from pageable memory.
#pragma once

#include <cuda_runtime.h>

#include <functional>

#include "forge/backend/cuda/allocator.h"
#include "forge/backend/cuda/context.h"

namespace forge::cuda {

class Graph {
 public:
  Graph() = default;
  ~Graph() { reset(); }
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;

  // Captures what `enqueue` puts on ctx.stream() (replacing any previous graph) without running
  // it. If `enqueue` throws, the capture is abandoned and the exception passes through.
  void capture(Context& ctx, const std::function<void()>& enqueue);
  // Enqueues one replay on ctx.stream().
  void launch();
  bool empty() const { return exec_ == nullptr; }
  // Waits for a replay in flight, destroys the graph and returns its pool to the allocator.
  void reset();

 private:
  Context* ctx_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
  BlockPool pool_;
};

}  // namespace forge::cuda
