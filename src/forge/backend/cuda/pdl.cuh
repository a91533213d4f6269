// Programmatic dependent launch (PDL, Hopper and later): a kernel launched with the
// programmatic-stream-serialization attribute may start while the kernel before it on the stream
// is still running, and waits for it (its completion and its memory) at pdl_wait(). A captured
// CUDA graph keeps these edges, so a replay overlaps each kernel's launch and its first weight
// loads with the tail of the kernel before.
//
// Why: a batch-1 decode step is ~150–300 small kernels, each bound by launch and one HBM round
// trip (~3 µs a graph node measured in small_gemm.cu, for work of ~0.2 µs at HBM speed). With PDL
// a kernel's launch, its block scheduling and its weight loads (weights do not depend on the
// kernel before) happen while the previous kernel finishes.
//
// The rules every kernel launched through launch_pdl() keeps:
//  - before pdl_wait() it reads only data no kernel of the step writes (weights, constants):
//    the kernel before — and, transitively, any earlier one — may still be running;
//  - it writes nothing before pdl_wait();
//  - it calls pdl_launch_dependents() early (at its start), letting the next kernel launch;
//    without it the next one launches at this one's completion (correct, no overlap).
// A kernel holding these instructions and launched without the attribute runs as before: wait
// returns at once (no programmatic dependency), launch_dependents does nothing.
// Context::pdl() switches the attribute (on for compute capability ≥ 9; forge bench generate
// --no-pdl turns it off to measure what it gives).
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "forge/backend/cuda/check.h"
#include "forge/backend/cuda/context.h"

namespace forge::cuda {

__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// kernel<<<grid, block, smem, ctx.stream()>>>(args...), with the PDL attribute when ctx.pdl().
template <typename... KArgs, typename... Args>
void launch_pdl(Context& ctx, void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem,
                Args&&... args) {
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = ctx.stream();
  cfg.attrs = attr;
  cfg.numAttrs = ctx.pdl() ? 1 : 0;
  FORGE_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
}

}  // namespace forge::cuda
