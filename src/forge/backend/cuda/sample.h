// The CUDA twin of cpu::sample_rows (ops/sample.h): the same algorithm and, through
// ops/sample_math.h, the same f32 arithmetic, so both choose the same id from the same logits.
// Everything lives in device memory and nothing is allocated or synchronised, so the call can be
// captured in the decode step's CUDA graph; replays pick up new settings and positions from the
// arrays they point to.
#pragma once

#include <cstdint>

#include "forge/core/dtype.h"
#include "forge/ops/sample.h"

namespace forge::cuda {

class Context;

// out (S) = the chosen id of each row of logits (S, Vp) of dtype dt (f32, bf16 or f16);
// settings (S); seen (S, V) flags or null; pos (S) keys the noise. All pointers are device memory.
void sample_rows(Context& ctx, DType dt, int32_t* out, const void* logits,
                 const SamplerSettings* settings, uint8_t* seen, const int32_t* pos, int S, int V,
                 int Vp);

// g (n, f32, device) = the Gumbel noise the sampler adds to id i at (seed, pos): for tests that
// compare it with the CPU's bit for bit.
void sample_gumbel_noise(Context& ctx, float* g, uint64_t seed, int32_t pos, int n);

}  // namespace forge::cuda
