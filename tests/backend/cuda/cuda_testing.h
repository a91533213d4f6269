// CUDA test fixture: skips cleanly without a device (CI compiles these tests but has no GPU),
// and moves data between host vectors and device buffers. The CPU twin in backend/cpu is the
// reference; inputs are rounded to the kernel's dtype before the reference sees them, so the
// tolerance measures the kernel, not the rounding (STYLE.md, after ThunderKittens).
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "forge/backend/cuda/check.h"
#include "forge/backend/cuda/context.h"
#include "forge/backend/cuda/runtime.h"
#include "forge/core/dtype.h"
#include "forge/io/bf16.h"
#include "testing.h"

namespace forge::cuda::testing {

using forge::DType;
using forge::dtype_size;

using forge::testing::all_close;
using forge::testing::random_normal;

// bf16 tolerance: 8 mantissa bits per input, f32 accumulation → ~1e-2 relative.
inline constexpr forge::testing::Tol kTolBf16{1e-2, 2e-2};
// f16 tolerance: 11 mantissa bits (one rounding is ≤ 2^-11 ≈ 4.9e-4 relative), the same ~5×
// margin over one output rounding as kTolBf16 has over bf16's 2^-8.
inline constexpr forge::testing::Tol kTolF16{2e-3, 3e-3};

inline std::vector<uint16_t> to_bf16(const std::vector<float>& v) {
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = f32_to_bf16(v[i]);
  return out;
}
inline std::vector<float> from_bf16(const std::vector<uint16_t>& v) {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = bf16_to_f32(v[i]);
  return out;
}
// v rounded to bf16 and back: what a bf16 kernel actually sees.
inline std::vector<float> round_bf16(const std::vector<float>& v) { return from_bf16(to_bf16(v)); }

inline std::vector<uint16_t> to_f16(const std::vector<float>& v) {
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = f32_to_f16(v[i]);
  return out;
}
inline std::vector<float> from_f16(const std::vector<uint16_t>& v) {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = f16_to_f32(v[i]);
  return out;
}
// v as a kernel of dtype dt sees it: rounded to bf16 or f16 and back (f32: unchanged).
inline std::vector<float> round_to(DType dt, const std::vector<float>& v) {
  if (dt == DType::kBF16) return round_bf16(v);
  if (dt == DType::kF16) return from_f16(to_f16(v));
  return v;
}

class CudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!available()) GTEST_SKIP() << "no CUDA device: " << device_summary();
    ctx_ = std::make_unique<Context>(0);
  }

  Context& ctx() { return *ctx_; }

  template <typename T>
  DeviceBuffer<T> upload(const std::vector<T>& host) {
    DeviceBuffer<T> d(ctx().allocator(), host.size());
    // On the context's stream and waited for: a plain cudaMemcpy from pageable memory may
    // return before its DMA lands, and the kernels run on a non-blocking stream that does not
    // wait for the legacy default stream (seen on the H200: a test read half-copied inputs).
    FORGE_CUDA_CHECK(cudaMemcpyAsync(d.data(), host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice,
                                     ctx().stream()));
    ctx().synchronize();
    return d;
  }
  // A device buffer filled with NaN-patterned bytes, so an element a kernel forgets to write
  // fails the comparison instead of passing as zero.
  template <typename T>
  DeviceBuffer<T> poisoned(size_t n) {
    DeviceBuffer<T> d(ctx().allocator(), n);
    FORGE_CUDA_CHECK(cudaMemsetAsync(d.data(), 0xFF, n * sizeof(T), ctx().stream()));
    return d;
  }
  template <typename T>
  std::vector<T> download(const DeviceBuffer<T>& d) {
    ctx().synchronize();
    std::vector<T> host(d.size());
    FORGE_CUDA_CHECK(cudaMemcpy(host.data(), d.data(), d.bytes(), cudaMemcpyDeviceToHost));
    return host;
  }

  // A device copy of v in dtype dt (f32, or rounded to bf16 / f16), and back to f32 values.
  DeviceBuffer<char> to_device(DType dt, const std::vector<float>& v) {
    DeviceBuffer<char> d(ctx().allocator(), v.size() * dtype_size(dt));
    const std::vector<uint16_t> h16 = dt == DType::kBF16  ? to_bf16(v)
                                      : dt == DType::kF16 ? to_f16(v)
                                                          : std::vector<uint16_t>{};
    const void* src = dt == DType::kF32 ? static_cast<const void*>(v.data()) : h16.data();
    FORGE_CUDA_CHECK(cudaMemcpyAsync(d.data(), src, d.bytes(), cudaMemcpyHostToDevice, ctx().stream()));
    ctx().synchronize();  // see upload()
    return d;
  }
  std::vector<float> to_host(DType dt, const DeviceBuffer<char>& d) {
    const std::vector<char> raw = download(d);
    const size_t n = raw.size() / dtype_size(dt);
    std::vector<float> out(n);
    if (dt == DType::kF32) {
      std::memcpy(out.data(), raw.data(), raw.size());
      return out;
    }
    std::vector<uint16_t> h(n);
    std::memcpy(h.data(), raw.data(), raw.size());
    return dt == DType::kF16 ? from_f16(h) : from_bf16(h);
  }

  std::unique_ptr<Context> ctx_;
};

}  // namespace forge::cuda::testing
