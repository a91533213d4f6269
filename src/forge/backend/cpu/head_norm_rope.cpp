// CPU per-head RMSNorm + RoPE (Qwen3's q/k norm in training): the reference for the CUDA fused
// op, composed of the unfused kernels in the order the model ran them before the fusion —
// rmsnorm_fwd over the B·T·H heads of HS, then rope_fwd in place; backward rope_bwd on a copy of
// dx, then rmsnorm_bwd into a zeroed dx_raw. The copy lets dx_raw alias dx and leaves dx as it
// was when it does not. Strided views (ld > H·HS) are gathered into dense copies and the result
// scattered back, so a view gives the dense op's bits.
#include "forge/ops/head_norm_rope.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "forge/core/error.h"
#include "forge/ops/rmsnorm.h"

namespace forge::cpu {
namespace {

// The (B·T, H·HS) view with row stride ld as a dense copy, and back.
template <typename T>
std::vector<T> gather_rows(const T* x, int64_t rows, int64_t width, int64_t ld) {
  std::vector<T> d(static_cast<size_t>(rows * width));
  for (int64_t r = 0; r < rows; ++r) std::copy_n(x + r * ld, width, d.data() + r * width);
  return d;
}

template <typename T>
void scatter_rows(T* x, const std::vector<T>& d, int64_t rows, int64_t width, int64_t ld) {
  for (int64_t r = 0; r < rows; ++r) std::copy_n(d.data() + r * width, width, x + r * ld);
}

}  // namespace

template <typename T>
void head_norm_rope_fwd(T* x, T* rstd, const T* x_raw, const T* weight, int B, int T_, int H,
                        int HS, float eps, const Rope* rope, const int32_t* pos, int64_t ld, int H0) {
  FORGE_CHECK(B >= 0 && T_ >= 0 && H > 0 && HS > 0, "[head_norm_rope_fwd] bad shape B=", B,
              " T=", T_, " H=", H, " HS=", HS);
  FORGE_CHECK(H0 >= 0 && H0 < H, "[head_norm_rope_fwd] first group of ", H0, " heads outside [0, ", H, ")");
  const int64_t width = int64_t{H} * HS, bt = int64_t{B} * T_;
  FORGE_CHECK(ld == 0 || ld >= width, "[head_norm_rope_fwd] row stride ", ld, " below H·HS = ", width);
  if (H0 > 0) {  // the two groups as two views of the same rows (the contract: exactly two calls)
    const int64_t l = ld > 0 ? ld : width, off = int64_t{H0} * HS;
    head_norm_rope_fwd<T>(x, rstd, x_raw, weight, B, T_, H0, HS, eps, rope, pos, l);
    head_norm_rope_fwd<T>(x + off, rstd + bt * H0, x_raw + off, weight + HS, B, T_, H - H0, HS, eps, rope, pos, l);
    return;
  }
  if (ld > width) {
    const std::vector<T> xr = gather_rows(x_raw, bt, width, ld);
    std::vector<T> d(xr.size());
    head_norm_rope_fwd<T>(d.data(), rstd, xr.data(), weight, B, T_, H, HS, eps, rope, pos);
    scatter_rows(x, d, bt, width, ld);
    return;
  }
  FORGE_CHECK(x != x_raw, "[head_norm_rope_fwd] x must not alias x_raw (the backward reads x_raw)");
  const int64_t rows = static_cast<int64_t>(B) * T_ * H;
  FORGE_CHECK(rows < (int64_t{1} << 31), "[head_norm_rope_fwd] B·T·H = ", rows,
              " exceeds int32 rows");
  rmsnorm_fwd<T>(x, rstd, x_raw, weight, static_cast<int>(rows), HS, eps);
  if (rope != nullptr) rope_fwd<T>(x, B, T_, H, HS, *rope, 0, pos);
}

template <typename T>
void head_norm_rope_bwd(T* dx_raw, T* dweight, const T* dx, const T* x_raw, const T* weight,
                        const T* rstd, int B, int T_, int H, int HS, const Rope* rope,
                        const int32_t* pos, int64_t ld, int H0) {
  FORGE_CHECK(B >= 0 && T_ >= 0 && H > 0 && HS > 0, "[head_norm_rope_bwd] bad shape B=", B,
              " T=", T_, " H=", H, " HS=", HS);
  FORGE_CHECK(H0 >= 0 && H0 < H, "[head_norm_rope_bwd] first group of ", H0, " heads outside [0, ", H, ")");
  const int64_t width = int64_t{H} * HS, bt = int64_t{B} * T_;
  FORGE_CHECK(ld == 0 || ld >= width, "[head_norm_rope_bwd] row stride ", ld, " below H·HS = ", width);
  if (H0 > 0) {
    const int64_t l = ld > 0 ? ld : width, off = int64_t{H0} * HS;
    head_norm_rope_bwd<T>(dx_raw, dweight, dx, x_raw, weight, rstd, B, T_, H0, HS, rope, pos, l);
    head_norm_rope_bwd<T>(dx_raw + off, dweight ? dweight + HS : nullptr, dx + off, x_raw + off, weight + HS,
                          rstd + bt * H0, B, T_, H - H0, HS, rope, pos, l);
    return;
  }
  if (ld > width) {
    const std::vector<T> g = gather_rows(dx, bt, width, ld), xr = gather_rows(x_raw, bt, width, ld);
    std::vector<T> d(g.size());
    head_norm_rope_bwd<T>(d.data(), dweight, g.data(), xr.data(), weight, rstd, B, T_, H, HS, rope, pos);
    scatter_rows(dx_raw, d, bt, width, ld);
    return;
  }
  const int64_t rows = static_cast<int64_t>(B) * T_ * H;
  FORGE_CHECK(rows < (int64_t{1} << 31), "[head_norm_rope_bwd] B·T·H = ", rows,
              " exceeds int32 rows");
  const size_t n = static_cast<size_t>(rows) * HS;
  std::vector<T> dnorm(dx, dx + n);  // (B, T, H, HS): the gradient of the norm's output
  if (rope != nullptr) rope_bwd<T>(dnorm.data(), B, T_, H, HS, *rope, 0, pos);
  std::fill_n(dx_raw, n, T(0));
  rmsnorm_bwd<T>(dx_raw, dweight, dnorm.data(), x_raw, weight, rstd, static_cast<int>(rows), HS);
}

#define FORGE_INSTANTIATE(T)                                                                    \
  template void head_norm_rope_fwd<T>(T*, T*, const T*, const T*, int, int, int, int, float,    \
                                      const Rope*, const int32_t*, int64_t, int);               \
  template void head_norm_rope_bwd<T>(T*, T*, const T*, const T*, const T*, const T*, int, int, \
                                      int, int, const Rope*, const int32_t*, int64_t, int);
FORGE_INSTANTIATE(float)
FORGE_INSTANTIATE(double)
#undef FORGE_INSTANTIATE

}  // namespace forge::cpu
