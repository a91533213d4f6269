// Shared test helpers: random inputs, tolerant comparison that prints the first mismatches,
// and a finite-difference gradient checker.
//
// Tolerance rule (STYLE.md): |a − b| <= atol + rtol·|ref|. Per-dtype defaults in kTol below;
// a test that needs another tolerance writes it (and why) beside the call.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "forge/core/rng.h"

namespace forge::testing {

struct Tol {
  double atol, rtol;
};
// f64 kernels vs f64 reference: rounding only. f32 kernels vs f64 reference: ~1e-5 relative.
inline constexpr Tol kTolF64{1e-10, 1e-9};
inline constexpr Tol kTolF32{1e-5, 1e-4};
// Central finite differences in f64 with step 1e-6: truncation ~1e-12·f''', rounding ~1e-10.
inline constexpr Tol kTolFiniteDiff{1e-6, 1e-5};

// Fresh normal(0, scale) values; every test passes its own seed so failures reproduce.
template <typename T>
std::vector<T> random_normal(size_t n, uint64_t seed, double scale = 1.0) {
  std::vector<T> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<T>(scale * philox_normal(seed, 7, i));
  return v;
}

inline std::vector<int32_t> random_ids(size_t n, int vocab, uint64_t seed) {
  Rng rng(seed, 11);
  std::vector<int32_t> v(n);
  for (auto& x : v) x = static_cast<int32_t>(rng.below(vocab));
  return v;
}

template <typename T>
std::vector<double> to_double(const std::vector<T>& v) {
  return std::vector<double>(v.begin(), v.end());
}

// Checks every element; on failure reports how many mismatched and the first few.
template <typename A, typename B>
::testing::AssertionResult all_close(const std::vector<A>& actual, const std::vector<B>& ref,
                                     Tol tol) {
  if (actual.size() != ref.size())
    return ::testing::AssertionFailure() << "size " << actual.size() << " vs " << ref.size();
  size_t bad = 0;
  std::string first;
  for (size_t i = 0; i < actual.size(); ++i) {
    const double a = static_cast<double>(actual[i]), r = static_cast<double>(ref[i]);
    if (!(std::fabs(a - r) <= tol.atol + tol.rtol * std::fabs(r))) {
      if (bad < 5) first += "\n  [" + std::to_string(i) + "] got " + std::to_string(a) +
                            " want " + std::to_string(r);
      ++bad;
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad << " of " << actual.size()
                                       << " elements differ (atol " << tol.atol << ", rtol "
                                       << tol.rtol << "):" << first;
}

// Central-difference derivative of loss() with respect to every element of x (modified in
// place and restored). loss() must read x. Use on tiny shapes only: 2·n evaluations.
inline std::vector<double> finite_diff(std::vector<double>& x,
                                       const std::function<double()>& loss, double h = 1e-6) {
  std::vector<double> g(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double x0 = x[i];
    x[i] = x0 + h;
    const double lp = loss();
    x[i] = x0 - h;
    const double lm = loss();
    x[i] = x0;
    g[i] = (lp - lm) / (2 * h);
  }
  return g;
}

// Σ out·w: a scalar loss whose gradient with respect to out is w (a fixed random projection,
// so every output element matters and errors cannot cancel).
inline double dot(const std::vector<double>& out, const std::vector<double>& w) {
  double s = 0;
  for (size_t i = 0; i < out.size(); ++i) s += out[i] * w[i];
  return s;
}

}  // namespace forge::testing
