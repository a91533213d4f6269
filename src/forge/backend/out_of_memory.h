// The one line Forge prints when the GPU runs out of memory, in one place: the caching allocator
// (backend/cuda/allocator.h) throws it as a forge::Error, which the CLI prints with exit code 1;
// a failed allocation inside a CUDA or cuBLAS call (FORGE_CUDA_CHECK / FORGE_CUBLAS_CHECK: graph
// instantiation, cuBLASLt's own buffers) prints it and exits 1 instead of aborting. Host code
// with no CUDA in it, so the CPU build compiles it and its tests check the wording.
//
// What the user can lower, for every command that allocates on the GPU: the batch (train's
// batch_size, eval's --batch), the sequence length (seq_len, --seq-len) and, for a run in fp32,
// the precision (--precision bf16 halves the activations); for training, the recompute setting
// (model/recompute.h: fewer activations kept, the same results); grad_accum keeps the tokens per
// step when the batch shrinks.
#pragma once

#include <cstddef>
#include <string>

namespace forge {

struct DeviceMemoryReport {
  int device = 0;
  size_t requested = 0;   // bytes asked for; 0: not known (an allocation inside a library)
  std::string where;      // the call that failed, when requested is 0 (may be empty)
  size_t free_bytes = 0;  // cudaMemGetInfo's free and total: the whole device, all processes
  size_t total_bytes = 0;
  size_t forge_bytes = 0;  // held by Forge's caching allocator (in use + cached); 0: unknown
};

// "CUDA out of memory on device 0: asked for 2.00 GiB (2147483648 bytes); 139.10 GiB of
// 139.81 GiB in use (forge holds 120.50 GiB); lower batch_size / --batch or seq_len /
// --seq-len (grad_accum keeps the tokens per step), train with recompute=mlp, attn or full (the
// backward recomputes activations), or train in --precision bf16 instead of fp32"
std::string out_of_memory_message(const DeviceMemoryReport& r);

}  // namespace forge
