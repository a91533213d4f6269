#include <cstdio>
#include <exception>

#include "forge/backend/cuda/check.h"
#include "forge/backend/cuda/graph.h"
#include "forge/core/error.h"

namespace forge::cuda {

void Graph::capture(Context& ctx, const std::function<void()>& enqueue) {
  reset();
  ctx_ = &ctx;
  // Thread-local: the capture forbids unsafe calls (syncs, cudaMalloc, pageable copies) in this
  // thread, where they would be our bug, and ignores other threads.
  FORGE_CUDA_CHECK(cudaStreamBeginCapture(ctx.stream(), cudaStreamCaptureModeThreadLocal));
  ctx.allocator().begin_capture();
  cudaGraph_t graph = nullptr;
  try {
    enqueue();
  } catch (...) {
    pool_ = ctx.allocator().end_capture();
    cudaStreamEndCapture(ctx.stream(), &graph);
    cudaGetLastError();
    if (graph != nullptr) cudaGraphDestroy(graph);
    reset();
    throw;
  }
  pool_ = ctx.allocator().end_capture();
  const cudaError_t err = cudaStreamEndCapture(ctx.stream(), &graph);
  if (err != cudaSuccess) {
    std::fprintf(stderr,
                 "forge: capturing the training step as a CUDA graph failed; FORGE_CUDA_GRAPH=0 "
                 "runs it eagerly\n");
    cuda_failed("cudaStreamEndCapture", __FILE__, __LINE__, err);
  }
  FORGE_CUDA_CHECK(cudaGraphInstantiate(&exec_, graph, 0));
  FORGE_CUDA_CHECK(cudaGraphDestroy(graph));  // the executable graph is independent of it
  FORGE_CUDA_CHECK(cudaGraphUpload(exec_, ctx.stream()));
}

void Graph::launch() {
  FORGE_CHECK(exec_ != nullptr, "Graph::launch: nothing captured");
  FORGE_CUDA_CHECK(cudaGraphLaunch(exec_, ctx_->stream()));
}

void Graph::reset() {
  if (exec_ != nullptr) {
    ctx_->synchronize();  // no replay in flight when the graph goes (rare: shape changes, exit)
    FORGE_CUDA_CHECK(cudaGraphExecDestroy(exec_));
    exec_ = nullptr;
  }
  if (ctx_ != nullptr) ctx_->allocator().release_pool(pool_);
}

}  // namespace forge::cuda
