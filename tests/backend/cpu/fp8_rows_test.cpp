// The per-row scaled FP8 casts' CPU twins (ops/fp8.h, ops/fp8_rows.h) against the scale rule
// computed independently — the largest power of two 2^e with amax · 2^e ≤ the format's largest
// value, found by ldexp and search, not by the exponent-bit arithmetic the twins share with the
// GPU — and the round trip's accuracy: every element decoded and descaled is within half a step
// of the format (2^-4 relative for E4M3, 2^-3 for E5M2) of its input wherever it is not in the
// format's subnormal range.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "forge/io/fp8.h"
#include "forge/ops/fp8.h"
#include "testing.h"

namespace forge {
namespace {

struct Fmt {
  DType t;
  double max;  // largest finite value
  double rel;  // half a step, relative, for normal values
  double min_normal;
  uint8_t (*encode)(float);
  float (*decode)(uint8_t);
};

const Fmt kFormats[] = {
    {DType::kF8E4M3, 448.0, 1.0 / 16, std::ldexp(1.0, -6), f32_to_e4m3, e4m3_to_f32},
    {DType::kF8E5M2, 57344.0, 1.0 / 8, std::ldexp(1.0, -14), f32_to_e5m2, e5m2_to_f32}};

// The scale's exponent by search: the largest e with amax · 2^e ≤ max (0 for a zero or non-finite
// amax), clamped to [-126, 126].
int reference_exponent(double amax, double max) {
  if (!(amax > 0.0) || !std::isfinite(amax)) return 0;
  int e = -140;
  while (e < 140 && std::ldexp(amax, e + 1) <= max) ++e;
  return std::min(126, std::max(-126, e));
}

// Rows spanning magnitudes 1e-6 .. 1e6 (a scale of their own each), one all zero, one with a
// NaN, one with an inf.
std::vector<float> rows_input(int rows, int cols, uint64_t seed) {
  std::vector<float> x = testing::random_normal<float>(static_cast<size_t>(rows) * cols, seed);
  for (int r = 0; r < rows; ++r) {
    const float mag = std::pow(10.0f, static_cast<float>(r % 13) - 6.0f);
    for (int c = 0; c < cols; ++c) x[static_cast<size_t>(r) * cols + c] *= mag;
  }
  for (int c = 0; c < cols; ++c) x[static_cast<size_t>(1) * cols + c] = 0.0f;
  x[static_cast<size_t>(2) * cols + 3] = std::numeric_limits<float>::quiet_NaN();
  x[static_cast<size_t>(3) * cols + 1] = -std::numeric_limits<float>::infinity();
  return x;
}

void check_rows(const Fmt& f, const std::vector<float>& x, int rows, int cols,
                const std::vector<uint8_t>& y, const std::vector<float>& descale) {
  for (int r = 0; r < rows; ++r) {
    SCOPED_TRACE(::testing::Message() << "row " << r);
    double amax = 0.0;
    bool nan = false;
    for (int c = 0; c < cols; ++c) {
      const double v = x[static_cast<size_t>(r) * cols + c];
      nan |= std::isnan(v);
      amax = std::max(amax, std::fabs(v));
    }
    const int e = nan ? 0 : reference_exponent(amax, f.max);
    ASSERT_EQ(descale[r], static_cast<float>(std::ldexp(1.0, -e)));
    if (std::isfinite(amax) && amax > 0.0 && !nan && e > -126 && e < 126) {
      // The largest such power: one more would exceed the format (the scale uses its range).
      EXPECT_GT(std::ldexp(amax, e + 1), f.max);
    }
    for (int c = 0; c < cols; ++c) {
      const float v = x[static_cast<size_t>(r) * cols + c];
      const uint8_t got = y[static_cast<size_t>(r) * cols + c];
      ASSERT_EQ(got, f.encode(static_cast<float>(std::ldexp(static_cast<double>(v), e))))
          << "col " << c << " value " << v;
      const double back = static_cast<double>(f.decode(got)) * descale[r];
      if (std::isfinite(v) && std::fabs(std::ldexp(static_cast<double>(v), e)) >= f.min_normal &&
          !nan && std::isfinite(amax)) {
        EXPECT_LE(std::fabs(back - v), f.rel * std::fabs(v) * (1 + 1e-12)) << "col " << c;
      }
    }
  }
}

TEST(Fp8RowsTest, CastRowsFollowsTheScaleRule) {
  for (const Fmt& f : kFormats)
    for (auto [rows, cols] : {std::pair{26, 40}, std::pair{13, 7}, std::pair{5, 300}}) {
      SCOPED_TRACE(::testing::Message() << dtype_name(f.t) << " " << rows << "x" << cols);
      const std::vector<float> x = rows_input(rows, cols, 11 + rows);
      std::vector<uint8_t> y(x.size());
      std::vector<float> d(rows);
      cpu::cast_fp8_rows(f.t, y.data(), d.data(), x.data(), rows, cols);
      check_rows(f, x, rows, cols, y, d);
    }
}

TEST(Fp8RowsTest, CastTransposeRowsIsTheRowsCastOfTheTranspose) {
  for (const Fmt& f : kFormats) {
    const int rows = 32, cols = 13;
    SCOPED_TRACE(dtype_name(f.t));
    const std::vector<float> xt = rows_input(cols, rows, 5);  // (cols, rows): what y's rows hold
    std::vector<float> x(xt.size());
    for (int r = 0; r < rows; ++r)
      for (int c = 0; c < cols; ++c)
        x[static_cast<size_t>(r) * cols + c] = xt[static_cast<size_t>(c) * rows + r];
    std::vector<uint8_t> y(x.size());
    std::vector<float> d(cols);
    cpu::cast_transpose_fp8_rows(f.t, y.data(), d.data(), x.data(), rows, cols);
    check_rows(f, xt, cols, rows, y, d);
  }
}

TEST(Fp8RowsTest, PowersOfTwoAtTheFormatsEdges) {
  // amax exactly the largest value: scale 1; just above it: 1/2; 1.75 · 2^k: 2^(8-k) (E4M3).
  std::vector<uint8_t> y(1);
  float d = 0;
  const float cases[][2] = {{448.0f, 1.0f},      {448.5f, 2.0f},
                            {1.75f, 1.0f / 256}, {1.0f, 1.0f / 256},
                            {1.76f, 1.0f / 128}, {1e-40f, std::ldexp(1.0f, -126)}};
  for (const auto& [amax, want] : cases) {
    cpu::cast_fp8_rows(DType::kF8E4M3, y.data(), &d, &amax, 1, 1);
    EXPECT_EQ(d, want) << "amax " << amax;
  }
}

}  // namespace
}  // namespace forge
