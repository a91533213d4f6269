// Tensor maps for the bulk tensor copy engine (TMA, sm_90): the descriptor a kernel passes to
// cp.async.bulk.tensor to copy a box of a global tensor into shared memory.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "forge/core/dtype.h"

namespace forge::cuda {

// A (B, T, W) tensor of 16-bit elements (bf16 or f16) at `base`, W contiguous columns per token,
// `ld` elements between tokens and T·ld between batches: boxes of 64 columns × `box_rows`
// tokens × 1 batch, written to shared memory with the 128-byte swizzle (wgmma.cuh's SW128
// column block). Rows past T (and columns past W) read as zeros. Throws forge::Error when the
// driver refuses (alignment: base and ld·2 bytes must be multiples of 16).
CUtensorMap make_tile_map(const void* base, DType dt, int64_t W, int64_t ld, int64_t T, int64_t B, int box_rows);

}  // namespace forge::cuda
