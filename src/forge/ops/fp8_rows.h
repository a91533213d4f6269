// Per-row scaled FP8 operands (the "rows" FP8 recipe of training, cuda::CudaBackend): each row of
// a matrix gets its own power-of-two scale, computed from the row's own amax when the row is
// cast, so no scale history is kept and no row's range depends on another's.
//
// For a row with amax = max |x| (finite, > 0): s = 2^e, e the largest integer with
// amax · 2^e ≤ the format's largest finite value (448 for E4M3, 57344 for E5M2), clamped to
// [-126, 126]; the row is stored as fp8(x · s) (io/fp8.h's rounding: to nearest even,
// saturating) and its descale 1/s = 2^-e, exact, is what the GEMM multiplies the product by
// (gemm.h's row scales). A row whose amax is 0, inf or NaN gets s = 1 (inf then saturates, NaN
// stays NaN). A power of two keeps x · s exact, so the twins agree bit for bit however they
// multiply, and costs at most one bit of the format's range (amax · s ∈ (max/2, max]).
//
// Shared by both twins: cpu::cast_fp8_rows includes it as C++, backend/cuda/fp8_rows.cu as
// device code.
#pragma once

#include <cstdint>

#include "forge/ops/sample_math.h"  // FORGE_HOST_DEVICE, bits_of, float_of

namespace forge::fp8_rows {

// The header's e for a row's amax; the format's largest finite value is 1.75 · 2^kTopExp (kTopExp
// 8 for E4M3, 15 for E5M2). 0 (s = 1) where amax is 0, inf or NaN.
template <int kTopExp>
FORGE_HOST_DEVICE inline int scale_exponent(float amax) {
  const uint32_t b = sampling::bits_of(amax) & 0x7fffffffu;
  if (b == 0u || b >= 0x7f800000u) return 0;  // zero, inf, NaN: s = 1
  const int field = static_cast<int>(b >> 23);
  if (field == 0) return 126;  // f32 subnormal amax: as large a scale as allowed
  const int E = field - 127;   // amax = m · 2^E, m ∈ [1, 2)
  // amax · 2^e ≤ 1.75 · 2^kTopExp: e = kTopExp − E where m ≤ 1.75 (fraction ≤ 0.75), one less
  // otherwise.
  const int e = ((b & 0x7fffffu) <= 0x600000u ? kTopExp : kTopExp - 1) - E;
  return e < -126 ? -126 : (e > 126 ? 126 : e);
}

// 2^e for e ∈ [-126, 126], exact.
FORGE_HOST_DEVICE inline float pow2(int e) {
  return sampling::float_of(static_cast<uint32_t>(e + 127) << 23);
}

// max(m, |v|), a NaN kept (its bits order above every other magnitude's).
FORGE_HOST_DEVICE inline float fold_abs(float m, float v) {
  const uint32_t a = sampling::bits_of(v) & 0x7fffffffu, bm = sampling::bits_of(m);
  return a > bm ? sampling::float_of(a) : m;
}

}  // namespace forge::fp8_rows
