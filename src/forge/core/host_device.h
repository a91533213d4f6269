// FORGE_HOST_DEVICE: marks a function of a header shared by the CPU and CUDA code (the op twins'
// common arithmetic) as callable on both sides; empty for the host compiler.
#pragma once

#if defined(__CUDACC__)
#define FORGE_HOST_DEVICE __host__ __device__
#else
#define FORGE_HOST_DEVICE
#endif
