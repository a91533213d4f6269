// Helpers for the CUDA op tests that run one body for both activation dtypes (f32, bf16): a
// device tensor of either dtype filled from / read back into host f32 vectors, the input
// rounding the kernel sees, and the per-dtype tolerance table.
#pragma once

#include <cstring>
#include <vector>

#include "cuda_testing.h"
#include "forge/core/dtype.h"

namespace forge::cuda::testing {

using forge::testing::Tol;

// Weight gradients are f32 in both modes, so their only error is the f32 summation order:
// sums over a few thousand rows of O(1) products reach partial sums of ~|20|, an absolute
// error of ~1e-5 in a different order than the CPU's double accumulation.
inline constexpr Tol kTolWgrad{1e-4, 1e-4};

inline Tol tol_for(DType dt) {
  return dt == DType::kF32 ? forge::testing::kTolF32 : dt == DType::kF16 ? kTolF16 : kTolBf16;
}
inline const char* dt_name(DType dt) {
  return dt == DType::kF32 ? "f32" : dt == DType::kF16 ? "f16" : "bf16";
}

// v as the kernel sees it in dtype dt (rounded to bf16 or f16 for the 16-bit types).
inline std::vector<float> as_dt(DType dt, const std::vector<float>& v) {
  return round_to(dt, v);
}

// A device array of dtype dt (f32, bf16 or f16; both 16-bit types live in b16).
struct DevTensor {
  DeviceBuffer<float> f32;
  DeviceBuffer<uint16_t> b16;
  void* data() const {
    return f32.data() ? static_cast<void*>(f32.data()) : static_cast<void*>(b16.data());
  }
  // Element i of the array, for offset (misaligned) views.
  void* at(size_t i) const {
    return f32.data() ? static_cast<void*>(f32.data() + i) : static_cast<void*>(b16.data() + i);
  }
};

template <typename Base>
class DtypeTest : public Base, public ::testing::WithParamInterface<DType> {
 protected:
  DType dt() const { return this->GetParam(); }
  DevTensor up(const std::vector<float>& v) {
    DevTensor t;
    if (dt() == DType::kF32)
      t.f32 = this->upload(v);
    else
      t.b16 = this->upload(dt() == DType::kF16 ? to_f16(v) : to_bf16(v));
    return t;
  }
  DevTensor poison(size_t n) {
    DevTensor t;
    if (dt() == DType::kF32)
      t.f32 = this->template poisoned<float>(n);
    else
      t.b16 = this->template poisoned<uint16_t>(n);
    return t;
  }
  std::vector<float> down(const DevTensor& t) {
    if (t.f32.data()) return this->download(t.f32);
    return dt() == DType::kF16 ? from_f16(this->download(t.b16)) : from_bf16(this->download(t.b16));
  }
};

// Bitwise equality (determinism checks): NaN patterns and signed zeros count.
template <typename T>
bool bit_identical(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// bit_identical as an assertion: on failure, the first elements that differ in value.
inline ::testing::AssertionResult same_bits(const std::vector<float>& got,
                                            const std::vector<float>& want) {
  if (bit_identical(got, want)) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << "not bit-identical; " << all_close(got, want, Tol{0, 0}).message();
}

}  // namespace forge::cuda::testing
