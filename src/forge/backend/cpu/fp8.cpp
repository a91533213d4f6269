#include "forge/ops/fp8.h"

#include <cmath>

#include "forge/core/error.h"
#include "forge/io/fp8.h"
#include "forge/ops/fp8_rows.h"

namespace forge::cpu {

namespace {

using Encode = uint8_t (*)(float);

Encode encoder(DType t, const char* op) {
  if (t == DType::kF8E4M3) return f32_to_e4m3;
  if (t == DType::kF8E5M2) return f32_to_e5m2;
  throw Error(str("[", op, "] the output type must be f8e4m3 or f8e5m2, not ", dtype_name(t)));
}

// max(a, |v|) that lets a NaN through (std::fmax would drop it).
float max_abs(float a, float v) {
  const float m = std::fabs(v);
  return (std::isnan(m) || m > a) ? m : a;
}

}  // namespace

float cast_fp8(DType y_t, uint8_t* y, const float* x, int64_t n, float scale) {
  const Encode enc = encoder(y_t, "cast_fp8");
  float amax = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    y[i] = enc(x[i] * scale);
    if (!std::isnan(amax)) amax = max_abs(amax, x[i]);
  }
  return amax;
}

float cast_transpose_fp8(DType y_t, uint8_t* y, const float* x, int rows, int cols, float scale) {
  const Encode enc = encoder(y_t, "cast_transpose_fp8");
  float amax = 0.0f;
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) {
      const float v = x[static_cast<int64_t>(r) * cols + c];
      y[static_cast<int64_t>(c) * rows + r] = enc(v * scale);
      if (!std::isnan(amax)) amax = max_abs(amax, v);
    }
  return amax;
}

namespace {

// The descale of a row with this amax in format t (ops/fp8_rows.h), and its scale through *s.
float row_descale(DType t, float amax, float* s) {
  const int e = t == DType::kF8E4M3 ? fp8_rows::scale_exponent<8>(amax) : fp8_rows::scale_exponent<15>(amax);
  *s = fp8_rows::pow2(e);
  return fp8_rows::pow2(-e);
}

}  // namespace

void cast_fp8_rows(DType y_t, uint8_t* y, float* descale, const float* x, int rows, int cols) {
  const Encode enc = encoder(y_t, "cast_fp8_rows");
  for (int r = 0; r < rows; ++r) {
    const float* xr = x + static_cast<int64_t>(r) * cols;
    float amax = 0.0f, s;
    for (int c = 0; c < cols; ++c) amax = fp8_rows::fold_abs(amax, xr[c]);
    descale[r] = row_descale(y_t, amax, &s);
    for (int c = 0; c < cols; ++c) y[static_cast<int64_t>(r) * cols + c] = enc(xr[c] * s);
  }
}

void cast_transpose_fp8_rows(DType y_t, uint8_t* y, float* descale, const float* x, int rows, int cols) {
  const Encode enc = encoder(y_t, "cast_transpose_fp8_rows");
  for (int c = 0; c < cols; ++c) {
    float amax = 0.0f, s;
    for (int r = 0; r < rows; ++r) amax = fp8_rows::fold_abs(amax, x[static_cast<int64_t>(r) * cols + c]);
    descale[c] = row_descale(y_t, amax, &s);
    for (int r = 0; r < rows; ++r) y[static_cast<int64_t>(c) * rows + r] = enc(x[static_cast<int64_t>(r) * cols + c] * s);
  }
}

}  // namespace forge::cpu
